"""The FP8 kernel (kernels/fp8_grouped_matmul.py, one group) on V3.2's dense FP8 linears at decode
row counts: its launch configs beside XLA's dequantise-then-dot and a bf16 dot of the dequantised
weight, each timed inside one compiled loop (these calls are 10–100 µs: dispatch would dominate).

    python -m benchmarks.fp8_dense --rows 64 8 1

Floor: the codes (and scales) over the copy bandwidth measured in the same run; the bf16 dot's
floor is its bf16 weight. Each config's output is checked against the kernel's jnp formula.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import copy_bandwidth, time_in_loop
from jax_mtp import fp8
from jax_mtp.kernels.fp8_grouped_matmul import Config, fp8_grouped_matmul, reference, split_k_for

# (name, K, N) of the MTP layer's FP8 linears that take whole 128 × 128 blocks
SHAPES = (("o_proj", 16384, 7168), ("q_b_proj", 1536, 24576), ("q_a_proj", 7168, 1536),
          ("shared gate/up", 7168, 2048), ("shared down", 2048, 7168), ("indexer wq_b", 1536, 8192))
WARPS = (4, 8)
SPLITS = (1, 2, 4, 8, 16)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", type=int, nargs="+", default=[64, 8, 1])
  p.add_argument("--iters", type=int, default=50)
  p.add_argument("--stages", type=int, nargs="+", default=[3])
  p.add_argument("--linears", nargs="+", default=[name for name, _, _ in SHAPES], help="which of SHAPES")
  p.add_argument("--layouts", nargs="+", default=["bytes", "words"], choices=["bytes", "words"],
                 help="how a program reads the codes (kernels/fp8_grouped_matmul.layout_for)")
  args = p.parse_args()
  gpu = jax.default_backend() == "gpu"  # elsewhere: interpret mode, a smoke run of the script
  backend = "gpu" if gpu else "interpret"
  bandwidth = copy_bandwidth()
  print(f"fp8_grouped_matmul as a dense linear on {jax.devices()[0].device_kind}, jax {jax.__version__}, copy "
        f"bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| linear | K × N | rows | impl | layout: warps, stages, split K | µs | floor µs | floor / measured | max rel err |")
  print("|---|---|---:|---|---|---:|---:|---:|---:|", flush=True)
  rng = np.random.default_rng(0)
  for name, k, n in [shape for shape in SHAPES if shape[0] in args.linears]:
    key = jax.random.key(k + n)
    codes = (jax.random.normal(key, (1, k, n), jnp.float32) * 64).astype(fp8.FP8)
    scales = jax.random.uniform(jax.random.fold_in(key, 1), (1, k // 128, n // 128), jnp.float32, 1e-3, 1e-2)
    dense = fp8.dequantize(codes[0], scales[0], jnp.bfloat16, (128, 128))
    floor = (codes.nbytes + scales.nbytes) / bandwidth
    for rows in args.rows:
      x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
      sizes = jnp.asarray([rows], jnp.int32)
      want = np.asarray(reference(x, codes, scales, sizes))
      blocks = k // 128
      configs = [(w, s, None) for w in WARPS for s in args.stages]
      configs += [(4, s, split) for s in args.stages for split in SPLITS if blocks % split == 0] if gpu else []
      for (warps, stages, split), layout in itertools.product(configs, args.layouts):
        call = jax.jit(functools.partial(fp8_grouped_matmul, backend=backend, config=Config(
            num_warps=warps, num_stages=stages, split_k=split, layout=layout)))
        label = (f"{layout}: {warps}, {stages}, "
                 + (f"auto ({split_k_for(rows, 1, k, n)})" if split is None else str(split)))
        try:
          err = float(np.max(np.abs(np.asarray(call(x, codes, scales, sizes)) - want)) / np.max(np.abs(want)))
          seconds = time_in_loop(call, (x, codes, scales, sizes), args.iters)
        except Exception as e:  # noqa: BLE001 (a config that does not compile is a row, not the end of the run)
          print(f"| {name} | {k} × {n} | {rows} | kernel | {label} | failed: {type(e).__name__} | | | |")
          continue
        print(f"| {name} | {k} × {n} | {rows} | kernel | {label} | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | "
              f"{floor / seconds:.2f} | {err:.1e} |", flush=True)
      if not gpu:
        continue
      xla = jax.jit(lambda x, c, s: jnp.dot(x, fp8.dequantize(c[0], s[0], jnp.bfloat16, (128, 128)),
                                            preferred_element_type=jnp.float32))
      seconds = time_in_loop(xla, (x, codes, scales), args.iters)
      print(f"| {name} | {k} × {n} | {rows} | XLA dequantise + dot | | {seconds * 1e6:,.1f} | {floor * 1e6:,.1f} | "
            f"{floor / seconds:.2f} | |", flush=True)
      bf16 = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
      seconds = time_in_loop(bf16, (x, dense), args.iters)
      print(f"| {name} | {k} × {n} | {rows} | bf16 dot (dequantised weight) | | {seconds * 1e6:,.1f} | "
            f"{dense.nbytes / bandwidth * 1e6:,.1f} | {dense.nbytes / bandwidth / seconds:.2f} | |", flush=True)


if __name__ == "__main__":
  main()
