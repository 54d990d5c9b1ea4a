"""Routed experts and the dense linears of a V3.2 layer on one device, per implementation, against
the weight-read floor measured in the same run.

    python -m benchmarks.moe_experts --batch 1 8 64 256 --impls gather ragged_dot tokamax_gpu [--sweep]

Shapes: DeepSeek-V3.2 (E = 256, D = 7168, F = 2048, K = 8, dense MLP 18432), bf16 weights, each
token routed to K distinct uniformly random experts. "floor" = bytes of the experts actually
touched (3 matrices each) / copy bandwidth. Rows:
  <impl>             the whole routed-experts call (sort, permute, 3 grouped matmuls, un-sort, combine)
  <impl> matmuls     the 3 grouped matmuls alone on pre-sorted rows: full − this = the permute's cost
  tokamax_gpu <cfg>  (--sweep) tokamax's Mosaic-GPU kernel with an explicit block config
  mosaic_gpu <cfg>   (--mosaic-sweep) our 16-bit Mosaic GPU kernel at 2, 3 and 4 stages
and, per B, the shared expert, eh_proj and a dense first-layer MLP (plain XLA dots) vs their floor.
Outputs are checked against "gather" (the reference when it is in --impls): max |diff| / max |ref|.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import copy_bandwidth, time_call
from jax_mtp.experts import (grouped_experts, grouped_matmul_for, mosaic_gpu_grouped_matmul, routed_experts,
                             tokamax_gpu_grouped_matmul)
from jax_mtp.kernels.grouped_matmul_mgpu import Config as MosaicConfig

E, D, F, K, DENSE_F = 256, 7168, 2048, 8, 18432  # --small: 16, 256, 128, 4, 512 (a CPU smoke run)

# (block_m, block_n, block_k, num_stages, persistent) for the --sweep rows.
# block_m 16 and 32 failed Pallas's verification on jax 0.11.2 (2026-12-01), so none are swept.
# block_m 128 at 2 stages fits shared memory where 4 did not: for verification's ~32 rows an expert (B = 256 × 4
# queries), where a 64-row tile splits the fuller groups and reads their weights twice.
SWEEP = [(64, 64, 128, 2, False), (64, 128, 128, 4, False), (64, 128, 128, 2, False), (64, 128, 256, 2, False),
         (128, 128, 128, 4, False), (128, 128, 128, 2, False), (128, 128, 64, 3, False), (64, 256, 128, 2, False),
         (64, 128, 128, 4, True)]
MOSAIC_SWEEP = [MosaicConfig(stages=2), MosaicConfig(stages=3), MosaicConfig(stages=4)]  # other values: config_for's


def routing(batch: int, seed: int):
  rng = np.random.default_rng(seed)
  ids = np.stack([rng.choice(E, K, replace=False) for _ in range(batch)]).astype(np.int32)
  weights = rng.uniform(0.1, 1.0, (batch, K)).astype(np.float32)
  return jnp.asarray(ids), jnp.asarray(weights), len(np.unique(ids))


def sorted_inputs(x, ids):
  order = jnp.argsort(ids.reshape(-1), stable=True)
  return x[order // K], jnp.bincount(ids.reshape(-1), length=E).astype(jnp.int32)


def matmuls_only(matmul, x_AD, group_sizes, w_gate, w_up, w_down):
  hidden = jax.nn.silu(matmul(x_AD, w_gate, group_sizes)) * matmul(x_AD, w_up, group_sizes)
  return matmul(hidden.astype(x_AD.dtype), w_down, group_sizes)


def dense_rows(batch, bandwidth, iters, rng):
  """The shared expert (D→F→D), eh_proj (2D→D) and a dense MLP (D→18432→D) as XLA dots."""
  rows = []
  for name, shapes in (("shared expert", [(D, F), (D, F), (F, D)]), ("eh_proj", [(2 * D, D)]),
                       ("dense MLP", [(D, DENSE_F), (D, DENSE_F), (DENSE_F, D)])):
    ws = [jax.random.normal(jax.random.key(i), s, jnp.bfloat16) * 0.02 for i, s in enumerate(shapes)]
    x = jnp.asarray(rng.standard_normal((batch, shapes[0][0])), jnp.bfloat16)
    if len(ws) == 3:
      fn = jax.jit(lambda x, a, b, c: (jax.nn.silu(x @ a) * (x @ b)) @ c)
    else:
      fn = jax.jit(lambda x, a: x @ a)
    seconds = time_call(fn, (x, *ws), iters)
    floor = sum(w.nbytes for w in ws) / bandwidth
    rows.append((name, seconds, floor))
    del ws
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
  parser.add_argument("--impls", nargs="+", default=["gather", "ragged_dot", "tokamax_gpu"])
  parser.add_argument("--sweep", action="store_true", help="tokamax_gpu block configs (GPU only)")
  parser.add_argument("--mosaic-sweep", action="store_true", help="mosaic_gpu's stages (GPU only)")
  parser.add_argument("--experts-only", action="store_true", help="no dense-linear rows")
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--small", action="store_true", help="small dims, to check the script on a CPU")
  args = parser.parse_args(argv)
  if args.small:
    global E, D, F, K, DENSE_F
    E, D, F, K, DENSE_F = 16, 256, 128, 4, 512
  bandwidth = copy_bandwidth()
  keys = jax.random.split(jax.random.key(0), 3)
  w_gate = jax.random.normal(keys[0], (E, D, F), jnp.bfloat16) * 0.02
  w_up = jax.random.normal(keys[1], (E, D, F), jnp.bfloat16) * 0.02
  w_down = jax.random.normal(keys[2], (E, F, D), jnp.bfloat16) * 0.02
  weights = (w_gate, w_up, w_down)
  expert_bytes = 3 * D * F * 2
  print(f"routed experts (E {E}, D {D}, F {F}, K {K}, bf16) on {jax.devices()[0].device_kind}, "
        f"jax {jax.__version__}, copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| B | path | experts touched | µs | floor µs | floor / time | max diff / max ref |")
  print("|---:|---|---:|---:|---:|---:|---:|")
  rng = np.random.default_rng(0)
  dense = []
  for batch in args.batch:
    ids, gates, touched = routing(batch, batch)
    x = jnp.asarray(rng.standard_normal((batch, D)), jnp.bfloat16)
    floor = touched * expert_bytes / bandwidth
    reference = None

    def row(path, fn, fn_args, compare=True):
      nonlocal reference
      try:
        seconds = time_call(fn, fn_args, args.iters)
        out = np.asarray(fn(*fn_args), np.float32)
      except Exception as e:  # a config the kernel rejects is a row, not the end of the run
        print(f"| {batch} | {path} | {touched} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | |")
        return
      diff = ""
      if compare:
        reference = out if reference is None else reference
        diff = f"{np.max(np.abs(out - reference)) / np.max(np.abs(reference)):.1e}"
      print(f"| {batch} | {path} | {touched} | {seconds * 1e6:,.0f} | {floor * 1e6:,.0f} | "
            f"{floor / seconds:.2f} | {diff} |")

    for impl in args.impls:
      if impl == "gather" and batch * K > E:
        continue  # gathers T·K copies of experts: past E assignments it reads more than all of them
      row(impl, jax.jit(functools.partial(routed_experts, impl)), (x, ids, gates, *weights))
    sorted_x, group_sizes = jax.jit(sorted_inputs)(x, ids)
    for impl in args.impls:
      if impl != "gather":
        row(f"{impl} matmuls", jax.jit(functools.partial(matmuls_only, grouped_matmul_for(impl))),
            (sorted_x, group_sizes, *weights), compare=False)
    if args.sweep:
      for config in SWEEP:
        matmul = functools.partial(tokamax_gpu_grouped_matmul, blocks=config[:4], persistent=config[4])
        row(f"tokamax_gpu {config}", jax.jit(functools.partial(grouped_experts, matmul)), (x, ids, gates, *weights))
    if args.mosaic_sweep:
      for config in MOSAIC_SWEEP:
        matmul = functools.partial(mosaic_gpu_grouped_matmul, config=config)
        row(f"mosaic_gpu stages={config.stages}", jax.jit(functools.partial(grouped_experts, matmul)),
            (x, ids, gates, *weights))
    if not args.experts_only:
      dense += [(batch, *r) for r in dense_rows(batch, bandwidth, args.iters, rng)]
  if not dense:
    return 0
  print("\n| B | dense linear (XLA) | µs | floor µs | floor / time |")
  print("|---:|---|---:|---:|---:|")
  for batch, name, seconds, floor in dense:
    print(f"| {batch} | {name} | {seconds * 1e6:,.0f} | {floor * 1e6:,.0f} | {floor / seconds:.2f} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
