"""The sparse-MLA kernel over selections that do not come in whole splits, padded two ways: to the step's multiple
(the model's rule before 2026-12-07) and to `sparse_mla_mgpu.padded_entries`' width (its rule since): the data
behind that rule.

    python -m benchmarks.sparse_mla_padding                       # the default rows below
    python -m benchmarks.sparse_mla_padding --rows 1x1x2050 8x1x1059 --iters 20

Why: the kernel's splits must divide the steps, so index_share_for_mtp_iteration's reused selection (index_topk +
the drafts since step 0: 2,050 at k = 3) padded to whole 64-entry steps is 33 steps, one split, and at B = 1, T = 1
runs on two CTAs of 132 cores; a short request attended over every visible slot (1,059 slots at a 1K prompt) gets
two splits at B = 8. Rows `BxTxENTRIES`: B rows of T queries, ENTRIES real selected slots each (the rest −1); each
width timed and checked against XLA's output over the same selection.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.sparse_mla import C, N, SCALE, _cells, _problem, _time_mosaic, floor_us
from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.kernels import sparse_mla_mgpu as mgpu
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference
from jax_mtp.mla import pad_slots

DEFAULT_ROWS = ["1x1x2050", "1x4x2050", "8x1x2050", "8x1x1059", "64x4x2050"]


def _row(text: str) -> tuple[int, int, int]:
  try:
    b, t, k = (int(x) for x in text.split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not BxTxENTRIES (e.g. 1x1x2050)") from None
  if min(b, t, k) < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: B, T and ENTRIES must be ≥ 1")
  return b, t, k


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=_row, nargs="+", default=[_row(r) for r in DEFAULT_ROWS], metavar="BxTxENTRIES")
  parser.add_argument("--capacity", type=int, default=4096)
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--backend", default="gpu", choices=["gpu", "interpret"], help="interpret: a CPU smoke run")
  args = parser.parse_args(argv)
  bandwidth, flops = measured_ceilings(f"sparse MLA padding, S = {args.capacity},")
  print("| B | T | entries | padding | width | splits | steps a CTA | µs | floor µs | floor / time | rel err vs XLA |")
  print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
  for b, t, k in args.rows:
    q_lat, q_pe, latent, k_pe, slots = _problem(b, t, args.capacity, k)
    xla = jax.jit(lambda ql, qp, lat, kp, sl: sparse_mla_reference(ql, qp, lat, kp, sl, sl >= 0, SCALE,
                                                                   dot_dtype=jnp.bfloat16))
    base = xla(q_lat, q_pe, latent, k_pe, slots)
    floor = floor_us(b, t, bandwidth, flops, k=k)
    seconds = time_in_loop(xla, (q_lat, q_pe, latent, k_pe, slots), args.iters)
    print(f"| {b} | {t} | {k:,} | XLA | {k:,} | | | {seconds * 1e6:,.1f} | {floor:,.1f} | "
          f"{floor / seconds / 1e6:.2f} | |", flush=True)
    step = mgpu.whole_step(b * t, N, k, C)
    widths = {"whole steps": -(-k // step) * step, "padded_entries": mgpu.padded_entries(b * t, N, k, C)}
    for name, width in widths.items():
      config = mgpu.config_for(b * t, N, width, C)
      timed = _time_mosaic((q_lat, q_pe, latent, k_pe, pad_slots(slots, width)), base, config, args.iters,
                           args.backend)
      print(f"| {b} | {t} | {k:,} | {name} | {width:,} | {config.splits} | "
            f"{width // (config.block_entries * config.splits)} | {_cells(timed, floor)} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
