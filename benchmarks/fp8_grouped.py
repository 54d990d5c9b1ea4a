"""The FP8 grouped matmul (kernels/fp8_grouped_matmul.py) at DeepSeek-V3.2's expert shapes on one
device (256 experts: 3.8e9 codes a weight, past int32 byte offsets), in one run:

    python -m benchmarks.fp8_grouped --assignments 8 64 512

1. Correctness at full size: sampled rows of the kernel's output — rows of the highest-numbered
   experts first, whose codes lie past 2^31 bytes — against x times the exactly dequantised weights
   in fp32 (one expert at a time), error relative to the row's largest magnitude.
2. Time per projection (gate/up: K = 7168, N = 2048; down: K = 2048, N = 7168) per assignment count
   (B × 8 top-8 routing, uniform random experts) and Triton launch config, beside its floor (the
   distinct picked experts' codes over the copy bandwidth measured in the same run) and tokamax's
   bf16 grouped matmul on the same weights dequantised (the bf16 path's kernel).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import copy_bandwidth, time_call
from jax_mtp import fp8
from jax_mtp.experts import tokamax_gpu_grouped_matmul
from jax_mtp.kernels.fp8_grouped_matmul import Config, fp8_grouped_matmul, split_k_for

TOP_K = 8
# (num_warps, num_stages, split_k; None = the kernel's choice): 8 warps and 2 ran 0.5-0.6× slower at
# every size on an H200 (12-02 05:42 run), so the sweep is over stages and the K split
CONFIGS = ((4, 3, None), (4, 4, None), (4, 3, 1), (4, 3, 2), (4, 3, 4))


def random_codes(key, experts: int, k: int, n: int):
  """FP8 codes and block scales built a few experts at a time (an fp32 copy of all would be 15 GB)."""
  chunks = []
  for sub in jax.random.split(key, experts // 16):
    chunks.append((jax.random.normal(sub, (16, k, n), jnp.float32) * 64).astype(fp8.FP8))
  codes = jnp.concatenate(chunks)
  scales = jax.random.uniform(jax.random.fold_in(key, 1), (experts, k // 128, n // 128), jnp.float32, 1e-3, 1e-2)
  return codes, scales


def routing(rng, experts: int, assignments: int):
  """Sorted group sizes of `assignments` // 8 tokens each picking 8 distinct experts uniformly."""
  ids = np.concatenate([rng.choice(experts, TOP_K, replace=False) for _ in range(assignments // TOP_K)])
  return np.bincount(ids, minlength=experts).astype(np.int32)


def check_rows(x, codes, scales, sizes, got, rows: int = 6) -> float:
  """Largest error (relative to each row's largest magnitude) over sampled rows — each sampled expert's first and
  last row (a tile's rows past its first are where a wrong copy shows), highest experts first."""
  starts = np.cumsum(sizes) - sizes
  worst = 0.0
  for expert in [e for e in range(len(sizes) - 1, -1, -1) if sizes[e]][:rows]:
    weight = fp8.dequantize(codes[expert], scales[expert], jnp.float32, (128, 128))
    for row in {int(starts[expert]), int(starts[expert] + sizes[expert] - 1)}:
      exact = np.asarray(jnp.dot(x[row].astype(jnp.float32), weight, precision=jax.lax.Precision.HIGHEST))
      worst = max(worst, float(np.max(np.abs(np.asarray(got[row]) - exact)) / np.max(np.abs(exact))))
  return worst


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--assignments", type=int, nargs="+", default=[8, 64, 512])
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--experts", type=int, default=256)
  p.add_argument("--hidden", type=int, default=7168)
  p.add_argument("--intermediate", type=int, default=2048)
  args = p.parse_args()
  gpu = jax.default_backend() == "gpu"  # elsewhere: interpret mode, a smoke run of the script
  configs = CONFIGS if gpu else CONFIGS[:1]
  bandwidth = copy_bandwidth()
  print(f"fp8_grouped_matmul, {args.experts} experts on {jax.devices()[0].device_kind}, "
        f"jax {jax.__version__}, copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  rng = np.random.default_rng(0)
  for name, (k, n) in (("gate/up", (args.hidden, args.intermediate)), ("down", (args.intermediate, args.hidden))):
    codes, scales = random_codes(jax.random.key(k), args.experts, k, n)
    dense = jax.jit(lambda c, s: fp8.dequantize(c, s, jnp.bfloat16, (128, 128)))(codes, scales)
    print(f"### {name}: codes [{args.experts}, {k}, {n}] ({codes.nbytes / 1e9:.2f} GB)\n")
    print("| A | experts | max rel err (sampled rows) | impl | warps, stages, split K | µs | floor µs | floor / measured |")
    print("|---:|---:|---:|---|---|---:|---:|---:|", flush=True)
    for a in args.assignments:
      sizes_np = routing(rng, args.experts, a)
      sizes = jnp.asarray(sizes_np)
      touched = int(np.count_nonzero(sizes_np))
      x = jnp.asarray(rng.standard_normal((a, k)), jnp.bfloat16)
      err = check_rows(x, codes, scales, sizes_np, jax.jit(
          lambda *o: fp8_grouped_matmul(*o, backend="gpu" if gpu else "interpret"))(x, codes, scales, sizes))
      floor = touched * k * n / bandwidth
      for warps, stages, split in configs:
        kernel = jax.jit(functools.partial(fp8_grouped_matmul, backend="gpu" if gpu else "interpret",
                                           config=Config(num_warps=warps, num_stages=stages, split_k=split)))
        split = f"auto ({split_k_for(a, args.experts, k, n)})" if split is None else split
        try:
          seconds = time_call(kernel, (x, codes, scales, sizes), args.iters)
        except Exception as e:  # noqa: BLE001 (a config that does not compile is a row, not the end of the run)
          print(f"| {a} | {touched} | | fp8_grouped | {warps}, {stages}, {split} | failed: {type(e).__name__} | | |")
          continue
        print(f"| {a} | {touched} | {err:.1e} | fp8_grouped | {warps}, {stages}, {split} | {seconds * 1e6:,.0f} | "
              f"{floor * 1e6:,.0f} | {floor / seconds:.2f} |", flush=True)
      if not gpu:
        continue
      lhs = jnp.pad(x, ((0, -a % 8), (0, 0)))
      seconds = time_call(jax.jit(tokamax_gpu_grouped_matmul), (lhs, dense, sizes), args.iters)
      print(f"| {a} | {touched} | | tokamax bf16 | default | {seconds * 1e6:,.0f} | {2 * floor * 1e6:,.0f} | "
            f"{2 * floor / seconds:.2f} |", flush=True)
    print(flush=True)
    del codes, scales, dense


if __name__ == "__main__":
  main()
