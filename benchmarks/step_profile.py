"""Where the MTP draft step's time goes: a device trace of the step, its kernels summed per model part.

    python -m benchmarks.step_profile --preset deepseek_v32 --batch 64 8 --weights fp8 bf16

The step is fp8_step's (the same FP8 weights and their bf16 dequantisation, rows at S/2 of a 4K
cache, caches donated). Each (batch, weights) pair is compiled, warmed, timed untraced, then traced
for a few calls with jax.profiler. Every device event that names an HLO instruction (`hlo_op`) is
mapped, through the compiled HLO's metadata, to the JAX name stack of the op it came from (the flax
module path), and summed per part (attention, indexer, router, routed experts, shared expert, head,
...). Printed per pair: the untraced µs / step, the kernel µs / step (their sum; the rest is the
device idle between kernels: launch gaps), a table per part (kernels / step, µs / step, share), and
the top instructions with their op names. `--out DIR` also writes the tables as JSON there.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp

import jax_mtp
from benchmarks.fp8_step import build_params, draft_step, step_inputs
from benchmarks.mtp_step import PRESETS

# (part, pattern in the op's name stack), first match wins; the patterns follow the flax module names.
PARTS = (
    ("head (logits + argmax)", "get_top_tokens"),
    ("indexer: scores", "/indexer/index_scores"),
    ("indexer: top-k", "/indexer/topk"),
    ("indexer", "/indexer"),
    ("attention: sparse core", "/sparse_attention"),
    ("attention (MLA, DSA)", "/self_attn"),
    ("router", "/mlp/gate"),
    ("shared expert", "/mlp/shared_experts"),
    ("routed experts", "/mlp"),
    ("eh_proj", "/eh_proj"),
    ("norms", "norm"),
    ("embedding", "_embed"),
)


# Kernels no HLO instruction names (Pallas's, tokamax's) by their own names: their part, whatever ran before them.
KERNEL_PARTS = (("dsa_sparse_mla", "attention: sparse core"), ("dsa_index_scores", "indexer: scores"),
                ("dsa_scores_mgpu", "indexer: scores"),
                ("ragged_dot", "routed experts"))


def part_of(op_name: str) -> str:
  for part, pattern in PARTS:
    if pattern in op_name:
      return part
  return "other"


def op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> the op_name metadata (JAX name stack) it carries, also under the name its
  GPU kernel gets (XLA writes "gemm_fusion_dot.8"'s kernel as "gemm_fusion_dot_8")."""
  names = dict(re.findall(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]+)"', hlo_text, re.M))
  return {**{re.sub(r"[.\-]", "_", name): op for name, op in names.items()}, **names}


def device_events(trace_dir: str) -> list[tuple[float, str, float]]:
  """(start ns, HLO instruction, µs) of every device-plane event, in time order. XLA on GPUs runs a
  step's kernels as one CUDA graph (a command buffer): their events then name the command buffer as `hlo_op`, and the
  kernel's own name, which is its fusion's instruction name, is used instead (`profile` traces a program built
  without them). An event naming no HLO
  instruction is kept as "(kernel) <its name>" (cuBLAS's and cuDNN's kernels). Where the plane
  has CUDA stream lines, only those are read (derived lines would count a kernel twice). XLA's CPU
  client runs the ops on host threads: with no device plane, the host plane is read."""
  (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  planes = list(jax.profiler.ProfileData.from_file(path).planes)
  device = [plane for plane in planes
            if plane.name.startswith("/device:") and plane.name != "/device:CUSTOM:Megascale Trace"]
  events = []
  for plane in device or [plane for plane in planes if plane.name == "/host:CPU"]:
    lines = list(plane.lines)
    streams = [line for line in lines if line.name.startswith("Stream")]
    for line in streams or lines:
      for event in line.events:
        op = dict(event.stats).get("hlo_op")
        if op is not None and str(op).startswith("command_buffer"):
          op = event.name
        if op is not None:
          events.append((event.start_ns, str(op), event.duration_ns / 1e3))
        elif device:  # the host plane also holds Python's and the runtime's events
          events.append((event.start_ns, f"(kernel) {event.name[:60]}", event.duration_ns / 1e3))
  if not events:
    print("planes in the trace:", [(plane.name, [line.name for line in plane.lines][:6]) for plane in planes])
  return sorted(events)


def run_calls(compiled, fixed, state, calls: int):
  """`calls` back-to-back steps, each fed the previous one's (donated) caches; returns the last state
  and the seconds per call."""
  start = time.perf_counter()
  for _ in range(calls):
    out, state = compiled(*fixed, state)
  jax.block_until_ready((out, state))
  return state, (time.perf_counter() - start) / calls


# XLA on GPUs runs a program's kernels as CUDA graphs (command buffers). A graph's cuBLAS kernels then name no HLO
# instruction in the trace, and were placed by the named kernel before them: the output head's GEMM (0.65 ms at
# B = 64 verifying, 2.3 ms at B = 256) counted under "norms", the final norm's part. The traced calls run the same
# program compiled without command buffers, where each kernel's event names its instruction (a cuBLAS GEMM its
# custom call, whose op name is the module's); the untraced timing keeps the graphs, as the user's program has them.
UNGRAPHED = {"xla_gpu_enable_command_buffer": ""}


def profile(lowered, args, calls: int, timed_calls: int = 30):
  """(µs per untraced step of `lowered` compiled as is, device events of `calls` traced steps of it compiled
  without command buffers, that program's instruction → op name map (`op_names`))."""
  compiled, traced = lowered.compile(), lowered.compile(compiler_options=UNGRAPHED)
  *fixed, state = args
  state, _ = run_calls(compiled, fixed, state, 2)  # warm
  state, seconds = run_calls(compiled, fixed, state, timed_calls)
  state, _ = run_calls(traced, fixed, state, 1)  # its first call outside the trace
  trace_dir = tempfile.mkdtemp(prefix="step_profile_")
  with jax.profiler.trace(trace_dir):
    state, _ = run_calls(traced, fixed, state, calls)
  return seconds * 1e6, device_events(trace_dir), op_names(traced.as_text())


def short(op_name: str) -> str:
  return re.sub(r"^jit\([^)]*\)/", "", op_name)


def summarize(events, names: dict[str, str], calls: int, step_us: float, label: str) -> dict:
  """Per part and per kernel: calls and µs per step. A kernel no instruction is named after (Pallas's,
  cuBLAS's) is placed by its own name where KERNEL_PARTS knows it, else by the last named kernel before it: its part,
  and "after <that op>"."""
  by_part = collections.defaultdict(lambda: [0, 0.0])
  by_op = collections.defaultdict(lambda: [0, 0.0, ""])
  anchor = ""
  for _, op, us in events:
    if op in names:
      anchor = names[op]
      key, name = op, short(anchor)
    else:
      key, name = f"{op} after {short(anchor)[-60:]}", ""
    part = next((p for kernel, p in KERNEL_PARTS if kernel in op), part_of(anchor) if anchor else "other")
    by_part[part][0] += 1
    by_part[part][1] += us
    by_op[key][0] += 1
    by_op[key][1] += us
    by_op[key][2] = name
  busy = sum(us for _, _, us in events) / calls
  print(f"\n### {label}: {step_us:,.0f} µs / step untraced; kernels {busy:,.0f} µs / step "
        f"({len(events) / calls:.0f} per step); device idle between them ~{step_us - busy:,.0f} µs\n")
  print("| part | kernels / step | µs / step | share of kernel time |\n|---|---:|---:|---:|")
  for part, (count, us) in sorted(by_part.items(), key=lambda kv: -kv[1][1]):
    print(f"| {part} | {count / calls:.0f} | {us / calls:,.1f} | {us / calls / busy:.1%} |")
  print("\n| instruction (kernel) | calls / step | µs / step | op name |\n|---|---:|---:|---|")
  ranked = sorted(by_op.items(), key=lambda kv: -kv[1][1])
  top = ranked[:40]
  for op, (count, us, name) in top:
    print(f"| {op[:140]} | {count / calls:.0f} | {us / calls:,.1f} | {name[-90:]} |")
  return {"label": label, "step_us": step_us, "kernel_us": busy, "kernels_per_step": len(events) / calls,
          "parts": {p: {"kernels": c / calls, "us": u / calls} for p, (c, u) in by_part.items()},
          "ops": [{"op": op, "name": name, "calls": c / calls, "us": u / calls} for op, (c, u, name) in ranked]}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", default="deepseek_v32", choices=sorted(PRESETS))
  p.add_argument("--batch", type=int, nargs="+", default=[64, 8])
  p.add_argument("--weights", nargs="+", default=["fp8", "bf16"], choices=["fp8", "bf16"])
  p.add_argument("--capacity", type=int, default=4096)
  p.add_argument("--calls", type=int, default=5, help="traced calls per pair")
  p.add_argument("--out", default=None, help="folder for the JSON tables")
  args = p.parse_args()
  cfg = PRESETS[args.preset]()
  trees = dict(zip(("fp8", "bf16"), build_params(cfg)))
  model = jax_mtp.MtpPredictor(cfg)
  print(f"{args.preset} MTP draft step on {jax.devices()[0].device_kind}, jax {jax.__version__}, S = "
        f"{args.capacity}, rows at S/2")
  tables = []
  for batch in args.batch:
    ids, positions, hidden, caches = step_inputs(cfg, batch, args.capacity)
    for weights in args.weights:
      step_args = (trees[weights], ids, positions, hidden, caches)
      step = functools.partial(draft_step, model=model)
      lowered = jax.jit(step, donate_argnums=4).lower(*step_args)
      step_us, events, names = profile(lowered, (*step_args[:-1], jax.tree.map(jnp.copy, caches)), args.calls)
      if not events:
        print(f"\nB = {batch} {weights}: the trace holds no device events")
        continue
      tables.append(summarize(events, names, args.calls, step_us,
                              f"B = {batch}, {weights} weights"))
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step_profile.json"), "w") as f:
      json.dump(tables, f, indent=1)


if __name__ == "__main__":
  main()
