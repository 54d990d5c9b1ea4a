"""The FP8 grouped matmul's kernel (kernels/fp8_grouped_matmul_mgpu.py, Pallas Mosaic GPU) at DeepSeek-V3.2's shapes
on one device, its default launch beside its variants, in one run:

    python -m benchmarks.fp8_mgpu --assignments 8 64 512 2048 --rows 1 8 64

Experts: gate/up (K = 7168, N = 2048) and down (K = 2048, N = 7168) over 256 experts (3.8e9 codes a weight), B × 8
top-8 assignments (uniform random experts); floor = the distinct picked experts' codes over the copy bandwidth
measured in the same run. Dense linears (one group): o_proj, q_b_proj, q_a_proj at decode row counts; floor = the
codes and scales. Each call is timed inside one compiled loop (`time_in_loop`); each output is checked against x
times the exactly dequantised weights on sampled rows (relative to the row's largest magnitude). The kernels it was
measured against (the removed Pallas Triton kernel; an [E, N, K] form widened in wgmma's register operand): their
tables are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp import fp8
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config, config_for, fp8_grouped_matmul_mgpu

DENSE = (("o_proj", 16384, 7168), ("q_b_proj", 1536, 24576), ("q_a_proj", 7168, 1536))
# the default and the variants measured closest to it (2026-12-04 on an H200, 2026-12-05 on an H100: two subtiles and
# 16-row tiles were slower; 3 stages helped the [E, N, K] form's dense linears at 64 rows), and the grid over all E
# experts that the default's min(A, E) group slots replaced (2026-12-05)
# None: what a call without a Config launches (`default_config`; a Config() here would bypass it: before 2026-12-05's
# fix the dense 64-row rows timed Config(), not the default)
MOSAIC_VARIANTS = (None, Config(share_output_smem=True), Config(stages=3), Config(compact_groups=False))
TOP_K = 8


def _describe(config: Config) -> str:
  return (f"tile {config.row_tile} stages {config.stages} split {config.split_k} rows {config.row_programs}"
          + (" shared output staging" if config.share_output_smem else "")
          + (f" {config.subtiles} subtiles" if config.subtiles > 1 else "")
          + ("" if config.compact_groups else " grid over all experts"))


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


def _rows(label, a, touched, config, seconds, floor, err):
  print(f"| {label} | {a} | {touched} | {config} | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | "
        f"{floor / seconds:.2f} | {err:.1e} |", flush=True)


def _time_variants(label, a, touched, x, codes, scales, sizes, floor, iters, gpu):
  e, k, n = codes.shape
  for variant in MOSAIC_VARIANTS if gpu else MOSAIC_VARIANTS[:1]:
    if e == 1 and variant is not None and not variant.compact_groups:  # one group: the same grid either way
      continue
    config = config_for(a, e, k, n, variant)
    call = jax.jit(functools.partial(fp8_grouped_matmul_mgpu, config=config, interpret=not gpu))
    try:
      err = check_rows(x, codes, scales, np.asarray(sizes), call(x, codes, scales, sizes))
      seconds = time_in_loop(call, (x, codes, scales, sizes), iters)
    except Exception as e:  # noqa: BLE001 (a launch that fails is a row, not the end of the run)
      print(f"| {label} | {a} | {touched} | {_describe(config)} | failed: {type(e).__name__}: {str(e)[:200]} | | | |")
      continue
    _rows(label, a, touched, _describe(config), seconds, floor, err)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--assignments", type=int, nargs="+", default=[8, 64, 512, 2048])
  p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--experts", type=int, default=256)
  args = p.parse_args()
  gpu = jax.default_backend() == "gpu"  # elsewhere: interpret mode at a few experts, a smoke run of the script
  bandwidth = copy_bandwidth()
  print(f"FP8 grouped matmul on Mosaic GPU, on {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| shape | A | experts touched | config | µs | floor µs | floor / time | max rel err |")
  print("|---|---:|---:|---|---:|---:|---:|---:|", flush=True)
  rng = np.random.default_rng(0)
  for name, (k, n) in (("gate/up", (7168, 2048)), ("down", (2048, 7168))):
    codes, scales = random_codes(jax.random.key(k), args.experts, k, n)
    for a in args.assignments:
      sizes = routing(rng, args.experts, a)
      touched = int(np.count_nonzero(sizes))
      x = jnp.asarray(rng.standard_normal((a, k)), jnp.bfloat16)
      _time_variants(f"experts {name}", a, touched, x, codes, scales, jnp.asarray(sizes),
                     touched * k * n / bandwidth, args.iters, gpu)
    del codes, scales
  for name, k, n in DENSE:
    codes, scales = random_codes(jax.random.key(k + n), 16, k, n)
    codes, scales = codes[:1], scales[:1]
    for rows in args.rows:
      x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
      _time_variants(name, rows, 1, x, codes, scales, jnp.asarray([rows], jnp.int32),
                     (codes.nbytes + scales.nbytes) / bandwidth, args.iters, gpu)


if __name__ == "__main__":
  main()
