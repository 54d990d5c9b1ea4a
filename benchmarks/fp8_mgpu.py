"""The FP8 grouped matmul on Mosaic GPU (kernels/fp8_grouped_matmul_mgpu.py, codes [E, K, N]; and
kernels/fp8_grouped_matmul_mgpu_nk.py, codes [E, N, K] widened in wgmma's register operand) beside the Triton kernel
(kernels/fp8_grouped_matmul.py) in one run, at DeepSeek-V3.2's shapes on one device:

    python -m benchmarks.fp8_mgpu --assignments 8 64 512 2048 --rows 1 8 64 [--kernels triton kn nk]

Experts: gate/up (K = 7168, N = 2048) and down (K = 2048, N = 7168) over 256 experts, B × 8 top-8 assignments
(uniform random experts); floor = the distinct picked experts' codes over the copy bandwidth measured in the same
run. Dense linears (one group): o_proj, q_b_proj, q_a_proj at decode row counts; floor = the codes and scales.
Each call is timed inside one compiled loop (`time_in_loop`); each output is checked against the op's formula on
sampled rows (relative to the row's largest magnitude), Mosaic and Triton alike.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.fp8_grouped import check_rows, random_codes, routing
from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import Config, config_for, fp8_grouped_matmul_mgpu
from jax_mtp.kernels.fp8_grouped_matmul_mgpu_nk import as_nk, fp8_grouped_matmul_mgpu_nk

DENSE = (("o_proj", 16384, 7168), ("q_b_proj", 1536, 24576), ("q_a_proj", 7168, 1536))
# the [E, K, N] kernel's default and its best variant timed on the H200 (2026-12-04 07:17; two subtiles, 3 stages and
# 16-row tiles were slower there: benchmarks/RESULTS.md)
MOSAIC_VARIANTS = (Config(), Config(share_output_smem=True))
# the [E, N, K] kernel keeps no widened block in shared memory: room for more stages
NK_VARIANTS = (Config(), Config(stages=3), Config(stages=4), Config(subtiles=2))
KERNELS = ("triton", "kn", "nk")


def _describe(config: Config) -> str:
  return (f"tile {config.row_tile} stages {config.stages} split {config.split_k} rows {config.row_programs}"
          + (" shared output staging" if config.share_output_smem else "")
          + (f" {config.subtiles} subtiles" if config.subtiles > 1 else ""))


def _rows(label, a, touched, impl, config, seconds, floor, err):
  print(f"| {label} | {a} | {touched} | {impl} | {config} | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | "
        f"{floor / seconds:.2f} | {err:.1e} |", flush=True)


def _time_both(label, a, touched, x, codes, scales, sizes, floor, iters, gpu, kernels=KERNELS):
  """One row per kernel and launch variant; the [E, N, K] kernel gets the codes transposed once, outside its timing
  (what a param tree stored in that order would hold)."""
  e, k, n = codes.shape
  runs = []
  if "triton" in kernels:
    runs.append(("Triton", "auto", jax.jit(functools.partial(fp8_grouped_matmul, backend="gpu" if gpu else
                                                             "interpret")), (codes, scales)))
  for kernel, variants, call, operands in (("kn", MOSAIC_VARIANTS, fp8_grouped_matmul_mgpu, (codes, scales)),
                                           ("nk", NK_VARIANTS, fp8_grouped_matmul_mgpu_nk, None)):
    if kernel not in kernels:
      continue
    operands = operands or as_nk(codes, scales)
    for variant in variants if gpu else variants[:1]:
      config = config_for(a, e, k, n, variant)
      runs.append((f"Mosaic GPU [{kernel}]", _describe(config),
                   jax.jit(functools.partial(call, config=config, interpret=not gpu)), operands))
  for impl, config, call, (weight, weight_scales) in runs:
    try:
      err = check_rows(x, codes, scales, np.asarray(sizes), call(x, weight, weight_scales, sizes))
      seconds = time_in_loop(call, (x, weight, weight_scales, sizes), iters)
    except Exception as e:  # noqa: BLE001 (a launch that fails is a row, not the end of the run)
      print(f"| {label} | {a} | {touched} | {impl} | {config} | failed: {type(e).__name__}: {str(e)[:200]} | | | |")
      continue
    _rows(label, a, touched, impl, config, seconds, floor, err)
  del runs


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--assignments", type=int, nargs="+", default=[8, 64, 512, 2048])
  p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--experts", type=int, default=256)
  p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
  args = p.parse_args()
  gpu = jax.default_backend() == "gpu"  # elsewhere: interpret mode at a few experts, a smoke run of the script
  bandwidth = copy_bandwidth()
  print(f"FP8 grouped matmul, Mosaic GPU vs Triton, on {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| shape | A | experts touched | impl | config | µs | floor µs | floor / time | max rel err |")
  print("|---|---:|---:|---|---|---:|---:|---:|---:|", flush=True)
  rng = np.random.default_rng(0)
  for name, (k, n) in (("gate/up", (7168, 2048)), ("down", (2048, 7168))):
    codes, scales = random_codes(jax.random.key(k), args.experts, k, n)
    for a in args.assignments:
      sizes = routing(rng, args.experts, a)
      touched = int(np.count_nonzero(sizes))
      x = jnp.asarray(rng.standard_normal((a, k)), jnp.bfloat16)
      _time_both(f"experts {name}", a, touched, x, codes, scales, jnp.asarray(sizes), touched * k * n / bandwidth,
                 args.iters, gpu, args.kernels)
    del codes, scales
  for name, k, n in DENSE:
    codes, scales = random_codes(jax.random.key(k + n), 16, k, n)
    codes, scales = codes[:1], scales[:1]
    for rows in args.rows:
      x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
      _time_both(name, rows, 1, x, codes, scales, jnp.asarray([rows], jnp.int32),
                 (codes.nbytes + scales.nbytes) / bandwidth, args.iters, gpu, args.kernels)


if __name__ == "__main__":
  main()
