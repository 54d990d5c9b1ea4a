"""DeepSeek-V3.2's dense linears (tp = 1) at the row counts decode and verification give them (M = B · T), on XLA's
GEMM (its Triton fusion or cuBLAS, as XLA's autotuner picks) beside two Mosaic GPU kernels, each beside its roofline:

    python -m benchmarks.dense_gemms --rows 64 256 1024

Why: at verification's 256 rows (B = 64, k = 3) q_b_proj took 80 µs a call on XLA's Triton fusion and 44 on
cuBLAS against a ~24 µs roofline (benchmarks/RESULTS.md, "The verification forward's GEMMs"), and issue 27's
B = 64 row is 0.34 ms short of 0.80 of its floor. A decode-size GEMM is the weight streamed once: M rows are one or
a few row tiles, so whether a weight tile's row tiles run together (the weight read from HBM once, the other tiles
hitting L2) decides its time. The kernels:

  hopper   jax's own Hopper matmul (`jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu`: persistent,
           warp-specialised, TMA and wgmma), rasterised over M first (`grid_minor_dim=M`), its row tile the whole
           M up to 256 rows (two compute warpgroups along M), 64 at M = 64 (two along N); `--tiles` sets tile_n
  tokamax  tokamax's grouped matmul (the routed experts' GPU kernel, `jax_mtp.experts.tokamax_gpu_grouped_matmul`)
           over one group of all M rows

Each row: µs a call (inside one compiled loop), the roofline (max of the weight, input and output bytes over the
copy bandwidth and 2·M·K·N over the bf16 GEMM rate, both measured in this run), roofline / time, and the output's
largest difference from XLA's relative to its largest value. A kernel that refuses a shape or fails to compile gets a
"failed" row. On a CPU only XLA's rows run (`--small`: narrower shapes, to check the script).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import measured_ceilings, time_in_loop

# (name, K, N) of V3.2's dense linears at tp = 1: MLA's, the indexer's, the dense layers' MLP, the shared expert, the head
SHAPES = [("q_a_proj", 7168, 1536), ("q_b_proj", 1536, 24576), ("kv_a_proj_with_mqa", 7168, 576),
          ("o_proj", 16384, 7168), ("indexer wq_b", 1536, 8192), ("dense MLP gate / up", 7168, 18432),
          ("dense MLP down", 18432, 7168), ("shared expert gate / up", 7168, 2048), ("shared expert down", 2048, 7168),
          ("head", 7168, 129280)]
SMALL = [("q_b_proj (small)", 256, 512), ("kv_a (small)", 512, 192)]


def xla_gemm(x_MK, w_KN):
  return jnp.dot(x_MK, w_KN, preferred_element_type=jnp.float32).astype(x_MK.dtype)


def hopper_config(m: int, n: int, tile_n: int):
  """jax's Hopper matmul's config for M rows: the whole M in one CTA up to 256 (two warpgroups along M), a 64-row tile
  with two warpgroups along N at M = 64; rasterised over M first; None where N is not a multiple of the CTA's N."""
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm  # noqa: PLC0415 (a GPU-only module)
  along_m = m >= 128
  tile_m = min(m, 256) // 2 if along_m else 64
  cta_n = tile_n * (1 if along_m else 2)
  if m % (tile_m * (2 if along_m else 1)) or n % cta_n:
    return None
  return hm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=64, max_concurrent_steps=4, epi_tile_m=64,
                         epi_tile_n=min(64, tile_n), grid_minor_dim=hm.MatmulDimension.M, grid_tile_width=1,
                         wg_dimension=hm.MatmulDimension.M if along_m else hm.MatmulDimension.N)


def hopper_gemm(config):
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm  # noqa: PLC0415
  return lambda x_MK, w_KN: hm.matmul(x_MK, w_KN, None, config)


def tokamax_gemm(x_MK, w_KN):
  from jax_mtp.experts import tokamax_gpu_grouped_matmul  # noqa: PLC0415
  groups = jnp.full((1,), x_MK.shape[0], jnp.int32)
  return tokamax_gpu_grouped_matmul(x_MK, w_KN[None], groups).astype(x_MK.dtype)


def roofline_seconds(m: int, k: int, n: int, itemsize: int, bandwidth: float, peak: float) -> float:
  """max(bytes moved once / bandwidth, FLOPs / peak): the weight, the input rows and the output rows."""
  return max(itemsize * (k * n + m * k + m * n) / bandwidth, 2 * m * k * n / peak)


def forms(m: int, n: int, tiles: list[int], on_gpu: bool) -> list[tuple[str, object]]:
  """(label, fn or None where the kernel cannot take the shape) for this row count and width."""
  found = [("XLA", xla_gemm)]
  if not on_gpu:
    return found
  for tile_n in tiles:
    config = hopper_config(m, n, tile_n)
    found.append((f"hopper (tile_n {tile_n})", hopper_gemm(config) if config else None))
  found.append(("tokamax (one group)", tokamax_gemm))
  return found


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, nargs="+", default=[256], help="M = B · T")
  parser.add_argument("--tiles", type=int, nargs="+", default=[128, 64], help="the Hopper matmul's tile_n")
  parser.add_argument("--only", nargs="+", default=None, help="linears whose name starts with one of these")
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--small", action="store_true", help="narrow shapes, to check the script on a CPU")
  args = parser.parse_args(argv)
  on_gpu = jax.devices()[0].platform == "gpu"
  shapes = SMALL if args.small else SHAPES
  if args.only:
    shapes = [s for s in shapes if any(s[0].startswith(p) for p in args.only)]
  bandwidth, peak = measured_ceilings(f"V3.2's dense linears (bf16), M = {args.rows}")
  print("| linear | K | N | M | form | µs | roofline µs | roofline / time | max diff / max vs XLA |")
  print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
  keys = iter(jax.random.split(jax.random.key(0), 2 * len(shapes) * len(args.rows)))
  for name, k, n in shapes:
    w = (jax.random.normal(next(keys), (k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    for m in args.rows:
      x = jax.random.normal(next(keys), (m, k), jnp.float32).astype(jnp.bfloat16)
      roof = roofline_seconds(m, k, n, 2, bandwidth, peak)
      reference = None
      for label, fn in forms(m, n, args.tiles, on_gpu):
        cells = f"| {name} | {k:,} | {n:,} | {m:,} | {label} |"
        if fn is None:
          print(f"{cells} does not take N = {n:,} | {roof * 1e6:,.1f} | | |", flush=True)
          continue
        try:
          out = np.asarray(jax.jit(fn)(x, w), np.float32)
          seconds = time_in_loop(fn, (x, w), args.iters)
        except Exception as e:  # a refused shape or a failed compile: a row, and the sweep goes on
          print(f"{cells} failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | {roof * 1e6:,.1f} | | |",
                flush=True)
          continue
        reference = out if reference is None else reference
        diff = float(np.max(np.abs(out - reference)) / max(float(np.max(np.abs(reference))), 1e-30))
        print(f"{cells} {seconds * 1e6:,.1f} | {roof * 1e6:,.1f} | {roof / seconds:.2f} | {diff:.1e} |", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
