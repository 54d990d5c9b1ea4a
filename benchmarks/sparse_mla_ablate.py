"""Which of the Mosaic sparse MLA's phases bound its step: the kernel timed with phases removed.

    python -m benchmarks.sparse_mla_ablate --batch 64 --tokens 4 [--fp8] [--rows "" copies ...]

Each row removes the named phases' work from the compiled kernel (`ABLATIONS`) and keeps everything else: the three
warpgroups, their barriers and hand-offs, the other phases. An ablated kernel's output is wrong by construction; the
full kernel's error against XLA is printed beside its time. Where removing a phase saves its own time, that phase is
on the step's critical path; where removing several saves about the sum of their times, they run one after another
rather than overlapped. The profiler (`benchmarks.sparse_mla_profile`) times the phases in place, but its records
more than double the call's time; this times the real kernel. The problem is `benchmarks.sparse_mla`'s (V3.2 widths,
top-2,048 of `--capacity` slots). Compiled only (a GPU)."""

from __future__ import annotations

import argparse
import contextlib

import jax
import jax.numpy as jnp

from jax_mtp.kernels import sparse_mla_mgpu_body as body

# what each removal skips (the barriers' arrivals it would make are kept, so the pipeline's hand-offs still run)
ABLATIONS = {
    "copies": "the gather's TMA copies of the selected rows (the copies' barrier arrivals made without them), or the "
              "direct gather's cp.async copies (its waits then return at once)",
    "relayout": "the gather's re-layout of a landed step into the wgmma operands (and an fp8 cache's dequantisation)",
    "softmax": "the online softmax's arithmetic (P = S, rescale 1; P's store and hand-off kept)",
    "qk": "the scores' wgmma (S = 0)",
    "pv": "both warpgroups' P · latent wgmma",
}
ROWS = ("", "copies", "relayout", "softmax", "qk", "pv", "copies,relayout", "copies,relayout,softmax",
        "copies,relayout,softmax,qk", "relayout,softmax,qk,pv")


def _arrive_without_copies(plan, r, ids, first, stride, lat_to, pe_to, landed):
  from jax.experimental import pallas as pl  # noqa: PLC0415

  del r, ids, lat_to, pe_to
  copies = 1 if plan.config.whole_rows else plan.pieces  # a row's latent copies, then its rope key's

  @pl.loop(first, plan.e, step=stride)
  def _(i):
    del i
    for _ in range(copies + 1):
      plan.plgpu.barrier_arrive(landed)


def _zero_scores(plan, r, slot):
  del r, slot
  return plan.plgpu.layout_cast(jnp.zeros((plan.hb, plan.e), jnp.float32), plan.plgpu.Layout.WGMMA)


def _no_softmax(plan, s, ids, m, l):
  del ids
  return s, m, l, plan.plgpu.layout_cast(jnp.ones((plan.hb,), jnp.float32), plan.wgmma_rows)


# a phase's functions in the body (module, name, replacement)
_REPLACEMENTS = {
    "copies": [(body, "_issue_rows", _arrive_without_copies), (body, "_copy_direct", lambda plan, r, step: None)],
    "relayout": [(body, "_relayout", lambda plan, r, slot: None)],
    "softmax": [(body, "_online_softmax", _no_softmax)],
    "qk": [(body, "_qk", _zero_scores)],
    "pv": [(body, "_accumulate", lambda plan, acc, a, b_ref: acc)],
}


def parse(row: str) -> tuple[str, ...]:
  """A row's removed phases ("" = none), each checked against ABLATIONS."""
  parts = tuple(p for p in row.split(",") if p)
  unknown = [p for p in parts if p not in ABLATIONS]
  if unknown:
    raise ValueError(f"unknown phases {unknown} in row {row!r}; the phases are {sorted(ABLATIONS)}")
  return parts


@contextlib.contextmanager
def ablated(parts: tuple[str, ...]):
  """The kernel body with `parts` removed while inside (kernels built inside are traced from the patched body). The
  kernel's entry is jitted (`mosaic_gpu_common.lowered_once_per_launch`), so jax's caches are cleared on the way in
  and out: a trace cached from the other body is never reused."""
  patches = [patch for p in parts for patch in _REPLACEMENTS[p]]
  saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
  try:
    for module, name, fn in patches:
      setattr(module, name, fn)
    jax.clear_caches()
    yield
  finally:
    for module, name, fn in saved:
      setattr(module, name, fn)
    jax.clear_caches()


def main(argv=None) -> int:
  from benchmarks.sparse_mla import SCALE, add_problem_arguments, kernel_operands  # noqa: PLC0415
  from benchmarks.timing import time_in_loop  # noqa: PLC0415
  from jax_mtp.kernels import sparse_mla_mgpu as mgpu  # noqa: PLC0415
  from jax_mtp.kernels.sparse_mla import reference  # noqa: PLC0415

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_problem_arguments(parser)
  parser.add_argument("--rows", nargs="*", default=list(ROWS), help="comma-joined phases removed a row")
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--direct", action="store_true", help="the direct gather (Config.direct_gather; bf16 cache)")
  args = parser.parse_args(argv)
  rows = [(row, parse(row)) for row in args.rows]
  (ql, qp, latent, kp, slots), operands = kernel_operands(args)
  base = reference(ql, qp, latent, kp, jnp.maximum(slots, 0), slots >= 0, SCALE, dot_dtype=jnp.bfloat16).astype(
      jnp.float32)
  config = mgpu.Config(direct_gather=args.direct)
  print(f"sparse MLA ablation on {jax.devices()[0].device_kind}, jax {jax.__version__}: B = {args.batch}, "
        f"T = {args.tokens}, S = {args.capacity}, {'fp8' if args.fp8 else 'bf16'} cache, {config}\n")
  print("| phases removed | µs a call | of the full kernel | max error vs XLA |\n|---|---:|---:|---:|")
  full = None
  for row, parts in rows:
    with ablated(parts):  # traced and compiled inside: the patched body is what runs
      fn = jax.jit(lambda *a: mgpu.sparse_mla_mgpu(*a[:5], SCALE, latent_scale_BSG=a[5], config=config,
                                                   out_dtype=jnp.bfloat16))
      seconds = time_in_loop(fn, operands, args.iters)
      out = fn(*operands).astype(jnp.float32)
    full = seconds if not parts else full
    error = float(jnp.max(jnp.abs(out - base)) / jnp.max(jnp.abs(base))) if not parts else None
    share = f"{seconds / full:.2f}" if full else ""
    print(f"| {row or 'none (the kernel)'} | {seconds * 1e6:,.1f} | {share} | "
          f"{'' if error is None else f'{error:.1e}'} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
