"""The Mosaic GPU index-scores kernel's split count (CTAs per query block, each over S / splits slots) swept around
`config_for`'s choice, bf16 and fp8 keys, at decode's shapes; at T > 1 also auto with `Config.overlap_queries` flipped:

    python -m benchmarks.index_scores_splits --capacity 131072 --batch 64 8 1 --tokens 4 1

Why: `config_for` asks for two CTAs a core, but a CTA holds its 64 KiB q block and four 32 KiB key blocks in flight
(192 KiB of shared memory), so one runs a core; the sparse MLA's splits, swept the same way on the H200
(2026-12-04 18:31, benchmarks/RESULTS.md), were fastest at one wave. Each row beside the bytes floor (the keys and
their scales over the copy bandwidth measured in this run) and checked against XLA's scores on the same keys.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp.indexer import quantize_keys
from jax_mtp.kernels.index_scores import reference as index_scores
from jax_mtp.kernels import index_scores_mgpu as mgpu

I, J = 64, 128  # V3.2's indexer heads and head dim


def candidate_splits(auto: mgpu.Config, steps: int) -> list[int]:
  """Auto's splits, half and a quarter of them, and twice them: the ones the kernel's rule allows
  (`index_scores_mgpu.allowed_splits`)."""
  wanted = {max(1, auto.splits // 4), max(1, auto.splits // 2), auto.splits, auto.splits * 2}
  return sorted(wanted & set(mgpu.allowed_splits(steps)))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, nargs="+", default=[131072])
  parser.add_argument("--batch", type=int, nargs="+", default=[64, 8, 1])
  parser.add_argument("--tokens", type=int, nargs="+", default=[4, 1])
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--backend", default="gpu", choices=["gpu", "interpret"], help="interpret: a CPU smoke run")
  parser.add_argument("--no-sweep", action="store_true", help="auto's splits only (and, at T > 1, overlap_queries flipped)")
  parser.add_argument("--keys-in-registers", action="store_true",
                      help="at T > 1 also auto with keys_in_registers flipped")
  args = parser.parse_args(argv)
  bandwidth = copy_bandwidth()
  print(f"index scores' splits on {jax.devices()[0].device_kind}, jax {jax.__version__}; copy bandwidth "
        f"{bandwidth / 1e12:.2f} TB/s\n", flush=True)
  print("| S | B | T | keys | splits | CTAs | µs | floor µs | floor / time | rel err vs XLA |")
  print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
  for s in args.capacity:
    for b in args.batch:
      for t in args.tokens:
        keys = iter(jax.random.split(jax.random.key(b * 10 + t), 3))
        q = jax.random.normal(next(keys), (b, t, I, J), jnp.float32).astype(jnp.bfloat16)
        k32 = jax.random.normal(next(keys), (b, s, J), jnp.float32)
        w = jax.random.normal(next(keys), (b, t, I), jnp.float32)
        k8, scale = quantize_keys(k32, jnp.float8_e4m3fn)
        for name, k, k_scale in [("bf16", k32.astype(jnp.bfloat16), None), ("fp8", k8, scale)]:
          auto = mgpu.config_for(b, t, s, float8_keys=k_scale is not None)
          query_blocks = b * -(-t // auto.block_tokens)
          xla = index_scores(q, k, w, J**-0.5, k_scale_BS=k_scale, dot_dtype=jnp.bfloat16)
          floor = (k.nbytes + (0 if k_scale is None else k_scale.nbytes)) / bandwidth * 1e6
          configs = [] if args.no_sweep else [dataclasses.replace(auto, splits=d)
                                               for d in candidate_splits(auto, s // auto.block_slots)]
          configs = configs or [auto]
          if t > 1:  # query n + 1's dot overlapping query n's epilogue (auto's), and the queries in turn
            configs.append(dataclasses.replace(auto, overlap_queries=not auto.overlap_queries))
            if args.keys_in_registers:  # the step's keys read once into wgmma's register operand, or not
              configs += [dataclasses.replace(auto, keys_in_registers=not auto.keys_in_registers,
                                              overlap_queries=overlap) for overlap in (True, False)]
          for config in configs:
            splits = config.splits
            fn = jax.jit(lambda q, k, w, ks, config=config: mgpu.index_scores_mgpu(
                q, k, w, J**-0.5, k_scale_BS=ks, config=config, interpret=args.backend == "interpret"))
            out = fn(q, k, w, k_scale)
            err = float(jnp.max(jnp.abs(out - xla)) / jnp.max(jnp.abs(xla)))
            seconds = time_in_loop(fn, (q, k, w, k_scale), args.iters)
            changed = [f"{name} {getattr(config, name)}" for name in ("overlap_queries", "keys_in_registers")
                       if getattr(config, name) != getattr(auto, name)]
            mark = " (auto)" if config == auto else "".join(f", {c}" for c in changed)
            print(f"| {s} | {b} | {t} | {name} | {splits}{mark} | {query_blocks * splits} | {seconds * 1e6:,.1f} | "
                  f"{floor:,.1f} | {floor / seconds / 1e6:.2f} | {err:.1e} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
