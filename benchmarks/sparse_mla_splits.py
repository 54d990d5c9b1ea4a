"""The sparse-MLA kernel's split count (CTAs per query and head block) swept around `config_for`'s choice, over bf16
and fp8 caches, with the fp8 rows also timed with `ids_before_dots`: the data behind `config_for`'s split rule.

    python -m benchmarks.sparse_mla_splits --batch 64 8 1 --tokens 4 1
    python -m benchmarks.sparse_mla_splits --batch 64 --tokens 4 --only-auto   # auto's splits only

Why: on the H200 (2026-12-04 18:10, RESULTS) half of auto's splits was faster at every shape with more than one
split (B = 8, T = 1: 42.6 against 60.9 µs), which fits one CTA a core (a two-set CTA takes nearly all of a core's
shared memory) rather than the two that `BUSY_CTAS` assumed. Rows: splits from a quarter of auto's to twice it
(powers of two the steps allow, at most 16), each beside the floor (`benchmarks.sparse_mla.floor_us`) and checked
against XLA's output.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from benchmarks.sparse_mla import (C, K_TOP, N, SCALE, _cells, _problem, _time_mosaic, add_sweep_arguments,
                                   floor_us)
from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.kernels import sparse_mla_mgpu as mgpu
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference
from jax_mtp.mla import quantize_latent


def candidate_splits(auto: mgpu.Config) -> list[int]:
  """Powers of two from a quarter of auto's splits to twice them, at most 16, that divide the selection's steps."""
  low, high = max(1, auto.splits // 4), min(16, auto.splits * 2)
  return [s for s in (1, 2, 4, 8, 16) if low <= s <= high and K_TOP % (s * auto.block_entries) == 0]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_sweep_arguments(parser, batch=[64, 8, 1], tokens=[4, 1])
  parser.add_argument("--only-auto", action="store_true", help="auto's splits only")
  args = parser.parse_args(argv)
  bandwidth, flops = measured_ceilings(f"sparse MLA splits, S = {args.capacity},")
  print("| B | T | cache | form | splits | CTAs | ids before dots | µs | floor µs | floor / time | rel err vs XLA |")
  print("|---:|---:|---|---|---:|---:|---|---:|---:|---:|---:|")
  for b in args.batch:
    for t in args.tokens:
      problem = _problem(b, t, args.capacity)
      auto = mgpu.config_for(b * t, N, K_TOP, C)
      codes, scales = quantize_latent(problem[2], 128)
      for cache, operands, latent_scale in [("bf16", problem, None), ("fp8", (*problem[:2], codes, *problem[3:]),
                                                                        scales)]:
        xla = jax.jit(lambda ql, qp, lat, kp, sl, sc: sparse_mla_reference(
            ql, qp, lat, kp, jnp.maximum(sl, 0), sl >= 0, SCALE, dot_dtype=jnp.bfloat16, latent_scale_BSG=sc))
        base = xla(*operands, latent_scale)
        floor = floor_us(b, t, bandwidth, flops, fp8=cache == "fp8")
        seconds = time_in_loop(xla, (*operands, latent_scale), args.iters)
        print(f"| {b} | {t} | {cache} | XLA | | | | {seconds * 1e6:,.1f} | {floor:,.1f} | "
              f"{floor / seconds / 1e6:.2f} | |", flush=True)
        early = [False, True] if cache == "fp8" and b * t < 256 else [False]
        for splits in [auto.splits] if args.only_auto else candidate_splits(auto):
          for ids in early:
            config = dataclasses.replace(auto, splits=splits, ids_before_dots=ids)
            timed = _time_mosaic(operands, base, config, args.iters, args.backend, latent_scale_BSG=latent_scale)
            ctas = b * t * -(-N // mgpu.BLOCK_HEADS) * splits
            mark = " (auto)" if config == auto else ""
            print(f"| {b} | {t} | {cache} | {mgpu.form_of(config)} | {splits}{mark} | {ctas} | {ids} | "
                  f"{_cells(timed, floor)} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
