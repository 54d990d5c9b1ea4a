"""The Mosaic GPU index-scores kernel's split count (CTAs per query block, each over S / splits slots) swept around
`config_for`'s choice, bf16 and fp8 keys, at decode's shapes; at T > 1 also auto with `Config.overlap_queries` flipped:

    python -m benchmarks.index_scores_splits --capacity 131072 --batch 64 8 1 --tokens 4 1

Why: `config_for` asks for two CTAs a core, but a CTA holds its 64 KiB q block and four 32 KiB key blocks in flight
(192 KiB of shared memory), so one runs a core; the sparse MLA's splits, swept the same way on the H200
(2026-12-04 18:31, benchmarks/RESULTS.md), were fastest at one wave. Each row is checked against XLA's scores on
the same operands and stands beside its floor, the larger of
  bytes: the keys and their scales over the copy bandwidth measured in this run, and
  FLOPs: 2 · B · T · I · J · S over the bf16 GEMM rate measured in this run (twice it for a float8 × float8 dot,
         Hopper's dense fp8 rate; not measured),
since from a few queries a call the dot, not the keys' bytes, bounds it (B = 64, T = 4, 128K: 550 GFLOP, ~680 µs at
810 TFLOP/s, against 520 µs of bf16 keys). Key forms: bf16; fp8 (e4m3 keys widened beside bf16 q); fp8 q (e4m3 q
and keys, `indexer.quantize_queries`: the fp8 index cache's path since 2026-12-04).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from benchmarks.timing import measured_ceilings, time_in_loop
from jax_mtp.indexer import quantize_keys, quantize_queries, score_chunk
from jax_mtp.kernels.index_scores import reference as index_scores
from jax_mtp.kernels import index_scores_mgpu as mgpu

I, J = 64, 128  # V3.2's indexer heads and head dim
FORMS = ("bf16", "fp8", "fp8 q")


def candidate_splits(auto: mgpu.Config, steps: int, uneven: bool = False) -> list[int]:
  """Auto's splits (a divisor of the steps or, where none fills two waves, an uneven one), half and a quarter of
  them, and twice them: the divisors the kernel's rule allows (`index_scores_mgpu.allowed_splits`). `uneven`: also
  the split counts that give each CTA ⌈steps / splits⌉ = 4, 6 or 8 key blocks where they do not divide the steps
  (the last CTA fewer; `Config.splits`)."""
  wanted = {max(1, auto.splits // 4), max(1, auto.splits // 2), auto.splits, auto.splits * 2}
  chosen = wanted & set(mgpu.allowed_splits(steps)) | {auto.splits}
  if uneven:
    for per in (4, 6, 8):
      d = -(-steps // per)
      if steps % d and not mgpu.leaves_a_cta_empty(steps, d):
        chosen.add(d)
  return sorted(chosen)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, nargs="+", default=[131072])
  parser.add_argument("--batch", type=int, nargs="+", default=[64, 8, 1])
  parser.add_argument("--tokens", type=int, nargs="+", default=[4, 1])
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--backend", default="gpu", choices=["gpu", "interpret"], help="interpret: a CPU smoke run")
  parser.add_argument("--no-sweep", action="store_true", help="auto's splits only (and, at T > 1, overlap_queries flipped)")
  parser.add_argument("--uneven", action="store_true",
                      help="also split counts that do not divide the row's key blocks (the CLI's capacities)")
  parser.add_argument("--keys-in-registers", action="store_true",
                      help="at T > 1 also auto with keys_in_registers flipped")
  parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS, help="the key forms to time")
  parser.add_argument("--beside-xla", action="store_true",
                      help="also time the model's XLA path (indexer.score_chunk's chunks, a bf16 dot): where "
                           "`auto` should leave the kernel")
  args = parser.parse_args(argv)
  bandwidth, peak = measured_ceilings("index scores' splits")
  print("| S | B | T | keys | splits | CTAs | µs | bytes floor µs | FLOPs floor µs | floor / time | rel err vs XLA |")
  print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
  for s in args.capacity:
    for b in args.batch:
      for t in args.tokens:
        keys = iter(jax.random.split(jax.random.key(b * 10 + t), 3))
        q = jax.random.normal(next(keys), (b, t, I, J), jnp.float32).astype(jnp.bfloat16)
        k32 = jax.random.normal(next(keys), (b, s, J), jnp.float32)
        w = jax.random.normal(next(keys), (b, t, I), jnp.float32)
        k8, scale = quantize_keys(k32, jnp.float8_e4m3fn)
        q8, w8 = quantize_queries(q.astype(jnp.float32), w, jnp.float8_e4m3fn)
        for name, q_, w_, k, k_scale in [("bf16", q, w, k32.astype(jnp.bfloat16), None), ("fp8", q, w, k8, scale),
                                         ("fp8 q", q8, w8, k8, scale)]:
          if name not in args.forms:
            continue
          auto = mgpu.config_for(b, t, s, float8_keys=k_scale is not None)
          query_blocks = b * -(-t // auto.block_tokens)
          xla = index_scores(q_, k, w_, J**-0.5, k_scale_BS=k_scale, dot_dtype=jnp.bfloat16)
          bytes_floor = (k.nbytes + (0 if k_scale is None else k_scale.nbytes)) / bandwidth * 1e6
          flops_floor = 2 * b * t * I * J * s / (peak * (2 if q_.dtype == k.dtype == k8.dtype else 1)) * 1e6
          floor = max(bytes_floor, flops_floor)
          configs = [] if args.no_sweep else [dataclasses.replace(auto, splits=d)
                                               for d in candidate_splits(auto, s // auto.block_slots, args.uneven)]
          configs = configs or [auto]
          if t > 1 and not args.beside_xla:  # query n + 1's dot overlapping query n's epilogue (auto's), and the queries in turn
            configs.append(dataclasses.replace(auto, overlap_queries=not auto.overlap_queries))
            if args.keys_in_registers and q_.dtype != k8.dtype:  # the step's keys read once into wgmma's register
              # operand, or not (16-bit keys only: float8 q multiplies the keys as they landed)
              configs += [dataclasses.replace(auto, keys_in_registers=not auto.keys_in_registers,
                                              overlap_queries=overlap) for overlap in (True, False)]
          for config in configs:
            splits = config.splits
            fn = jax.jit(lambda q, k, w, ks, config=config: mgpu.index_scores_mgpu(
                q, k, w, J**-0.5, k_scale_BS=ks, config=config, interpret=args.backend == "interpret"))
            out = fn(q_, k, w_, k_scale)
            err = float(jnp.max(jnp.abs(out - xla)) / jnp.max(jnp.abs(xla)))
            seconds = time_in_loop(fn, (q_, k, w_, k_scale), args.iters)
            changed = [f"{name} {getattr(config, name)}" for name in ("overlap_queries", "keys_in_registers")
                       if getattr(config, name) != getattr(auto, name)]
            mark = " (auto)" if config == auto else "".join(f", {c}" for c in changed)
            print(f"| {s} | {b} | {t} | {name} | {splits}{mark} | {query_blocks * splits} | {seconds * 1e6:,.1f} | "
                  f"{bytes_floor:,.1f} | {flops_floor:,.1f} | {floor / seconds / 1e6:.2f} | {err:.1e} |", flush=True)
          if args.beside_xla:  # the model's own XLA path: its chunking and its bf16 dot (`Indexer._scores`)
            chunk = score_chunk(b, t, I, s)
            fn = jax.jit(lambda q, k, w, ks, chunk=chunk: index_scores(q, k, w, J**-0.5, chunk=chunk, k_scale_BS=ks,
                                                                       dot_dtype=jnp.bfloat16))
            seconds = time_in_loop(fn, (q_, k, w_, k_scale), args.iters)
            print(f"| {s} | {b} | {t} | {name} | XLA (the model's path) | - | {seconds * 1e6:,.1f} | "
                  f"{bytes_floor:,.1f} | {flops_floor:,.1f} | {floor / seconds / 1e6:.2f} | - |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
