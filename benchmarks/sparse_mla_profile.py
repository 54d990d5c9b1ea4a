"""Where a step of the Mosaic sparse-MLA kernel goes: Mosaic GPU's on-device profiler over the kernel's named phases
(`kernels/sparse_mla_mgpu_body.py`: "gather wait", "relayout", "scores wait", "qk", "softmax", "pv", "values wait",
"values pv"; the direct gather's "copies" and "landing" in place of "relayout"), per warpgroup, at V3.2's widths:

    python -m benchmarks.sparse_mla_profile --batch 64 --tokens 4 [--fp8] [--one-set] [--ids-before-dots] [--direct]

The profiler keeps each warpgroup's first ranges, as many as the shared memory the launch leaves holds
(`sparse_mla_mgpu.profile_ranges`: ~18 with two bf16 buffer sets), so a trace covers a CTA's first steps; the table
gives each phase's mean over its occurrences past each CTA's first `--skip` (the pipeline's fill), in ns, and its
share of its warpgroup's recorded time. A warpgroup whose "wait" dominates is waiting on another; the one with the
least waiting is the step's limit. The profiled call is also timed beside the same launch without the profiler
(the profiler's cost). GPU only (the interpreter does not profile).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile

WARPGROUPS = ("scores", "values", "gather")  # trace index within a CTA: the kernel's warpgroup index (wg 0, 1, 2)


def phase_durations(events: list[dict], skip: int = 0) -> dict[tuple[str, str], list[float]]:
  """{(warpgroup, phase): [ns of each occurrence past each trace's first `skip` of that phase]} from a Mosaic GPU
  profiler trace's events (Chrome trace "B" / "E" pairs, "ts" in µs, one "tid" per warpgroup trace, nested ranges
  closed innermost first). A range the trace's buffer cut off (closed by the profiler at its start) is left out."""
  open_ranges, seen = collections.defaultdict(list), collections.Counter()
  durations = collections.defaultdict(list)
  for event in events:
    tid = event["tid"]
    if event["ph"] == "B":
      open_ranges[tid].append(event)
      continue
    begin = open_ranges[tid].pop()
    if begin["name"] != event["name"]:
      raise ValueError(f"trace {tid}: range {event['name']!r} ends inside {begin['name']!r}")
    if event["ts"] == begin["ts"]:  # the profiler's close of a range its full buffer cut off (recorded times
      continue                      # strictly increase: a real range lasts ≥ 1 ns)
    key = (WARPGROUPS[(tid - 1) % len(WARPGROUPS)], event["name"])
    seen[tid, event["name"]] += 1
    if seen[tid, event["name"]] > skip:
      durations[key].append((event["ts"] - begin["ts"]) * 1e3)
  return dict(durations)


def table(durations: dict[tuple[str, str], list[float]]) -> list[str]:
  """Markdown rows: warpgroup, phase, occurrences, mean ns, share of the warpgroup's recorded time."""
  totals = collections.Counter()
  for (wg, _), values in durations.items():
    totals[wg] += sum(values)
  rows = ["| warpgroup | phase | occurrences | mean ns | share of its recorded time |", "|---|---|---:|---:|---:|"]
  for (wg, phase), values in sorted(durations.items(), key=lambda kv: (WARPGROUPS.index(kv[0][0]), kv[0][1])):
    rows.append(f"| {wg} | {phase} | {len(values)} | {sum(values) / len(values):,.0f} | "
                f"{sum(values) / totals[wg]:.0%} |")
  return rows


def main(argv=None) -> int:
  import jax  # noqa: PLC0415 (the trace summary above runs without a device)
  import jax.numpy as jnp  # noqa: PLC0415

  from benchmarks.sparse_mla import SCALE, add_problem_arguments, kernel_operands  # noqa: PLC0415
  from benchmarks.timing import time_in_loop  # noqa: PLC0415
  from jax_mtp.kernels import sparse_mla_mgpu as mgpu  # noqa: PLC0415

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_problem_arguments(parser)
  parser.add_argument("--one-set", action="store_true", help="one buffer set (64 entries a step)")
  parser.add_argument("--ids-before-dots", action="store_true", help="Config.ids_before_dots")
  parser.add_argument("--direct", action="store_true",
                      help="the direct gather (Config.direct_gather; its phases: copies, landing, gather wait)")
  parser.add_argument("--skip", type=int, default=2, help="each trace's first occurrences of a phase left out")
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--trace-dir", default=None, help="keep the raw traces here (default: a temporary folder)")
  args = parser.parse_args(argv)
  try:  # Mosaic GPU's profiler writes its trace through a host callback, which runs on the CPU platform
    jax.devices("cpu")
  except RuntimeError as e:
    raise SystemExit(f"the profiler needs the CPU platform beside the GPU: JAX_PLATFORMS=cuda,cpu ({e})") from None
  _, operands = kernel_operands(args)
  ql, _, latent, _, slots, _ = operands
  config = mgpu.Config(double_buffered=False if args.one_set else None, ids_before_dots=args.ids_before_dots,
                       direct_gather=args.direct)
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="sparse_mla_profile_")
  os.makedirs(trace_dir, exist_ok=True)

  def call(profile_dir):
    return jax.jit(lambda *a: mgpu.sparse_mla_mgpu(*a[:5], SCALE, latent_scale_BSG=a[5], config=config,
                                                   out_dtype=jnp.bfloat16, profile_dir=profile_dir))

  plain = time_in_loop(call(None), operands, args.iters)
  profiled_fn = call(trace_dir)
  profiled_fn(*operands).block_until_ready()
  jax.effects_barrier()  # the trace is written by a host callback
  traces = sorted(glob.glob(os.path.join(trace_dir, "*trace.json")), key=os.path.getmtime)
  if not traces:
    raise SystemExit(f"no trace written under {trace_dir}")
  with open(traces[-1]) as f:
    events = json.load(f)["traceEvents"]
  profiled = time_in_loop(profiled_fn, operands, min(args.iters, 5))
  launch = mgpu.config_for(args.batch * args.tokens, ql.shape[2], slots.shape[-1], latent.shape[-1], config)
  print(f"sparse MLA profile on {jax.devices()[0].device_kind}, jax {jax.__version__}: B = {args.batch}, "
        f"T = {args.tokens}, S = {args.capacity}, {'fp8' if args.fp8 else 'bf16'} cache, launch {launch}; "
        f"{plain * 1e6:,.1f} µs a call, {profiled * 1e6:,.1f} µs profiled; trace {traces[-1]}\n")
  print("\n".join(table(phase_durations(events, args.skip))))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
