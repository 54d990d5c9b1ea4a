"""Per-device memory of the full DeepSeek-V3.2 target + MTP layer under this repo's tp layout, FP8 weights
kept (`--weights fp8`) vs bf16, for slices of 8–64 chips: which fit.

    python tools/fp8_memory_report.py --batch 8 --context 32768

Counted from the params' shapes and `jax_mtp.sharding`'s specs (a sharded param costs its bytes / tp on
each device, a replicated one all of them), nothing allocated: weights as stored (FP8 codes + fp32
block scales, or bf16), the target's and MTP layer's caches (replicated over tp, as the decode state
is) for `--batch` rows of `--context` positions. "fits" leaves `--headroom` of each device's HBM for
activations and XLA's temporaries. An FP8 param whose per-device share is not whole 128-blocks cannot
be kept at that tp (`load_hf_checkpoint` refuses it): such slices are marked.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jax_mtp  # noqa: E402
from jax_mtp import fp8  # noqa: E402
from jax_mtp.request import cache_bytes  # noqa: E402
from jax_mtp.sharding import SHARED_WITH_TARGET, param_specs  # noqa: E402

HBM_GIB = {"v5p": 95, "v6e": 32, "H200": 141 * 10**9 / 2**30}


def per_device_bytes(params, tp: int) -> tuple[int, list[str]]:
  """(bytes each device holds, FP8 params whose share is not whole blocks at this tp)."""
  total, unsplit = 0, []
  specs = param_specs(params)
  flat = jax.tree_util.tree_leaves_with_path(params)
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
  for (path, leaf), spec in zip(flat, jax.tree.leaves(specs, is_leaf=is_spec)):
    split = [i for i, axis in enumerate(spec) if axis is not None]
    nbytes = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
    total += nbytes // tp if split else nbytes
    block_dims = [i for i in split if i >= leaf.ndim - 2]  # a split over experts cuts no block
    if leaf.dtype == fp8.FP8 and any((leaf.shape[i] // tp) % 128 for i in block_dims):  # V3.2's 128 × 128 blocks
      unsplit.append(jax.tree_util.keystr(path))
  return total, unsplit


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--context", type=int, default=32768)
  p.add_argument("--tp", type=int, nargs="+", default=[8, 16, 32, 64])
  p.add_argument("--headroom", type=float, default=0.1, help="share of HBM left for activations and temporaries")
  args = p.parse_args()
  cfg = jax_mtp.deepseek_v32()
  target = jax.eval_shape(lambda key: jax_mtp.init_target_params(cfg, key), jax.random.key(0))
  mtp = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  mtp = {k: v for k, v in mtp.items() if k not in SHARED_WITH_TARGET}  # the target's are shared
  trees = {"bf16": {"target": target, "mtp": mtp},
           "fp8": {"target": fp8.as_checkpoint_fp8(target, cfg.fp8_block, fp8.abstract_fp8),
                   "mtp": fp8.as_checkpoint_fp8(mtp, cfg.fp8_block, fp8.abstract_fp8)}}
  cache = cache_bytes(cfg, args.batch, args.context)  # every layer's caches, as the decode check counts them
  print(f"DeepSeek-V3.2 target ({cfg.num_hidden_layers} layers) + MTP layer; caches for B = {args.batch} × "
        f"{args.context:,} positions: {cache / 2**30:.1f} GiB per device (replicated); headroom "
        f"{args.headroom:.0%}\n")
  print("| tp | weights | weights GiB / device | + caches GiB | fits v5p (95 GiB) | fits v6e (32 GiB) "
        "| fits H200 (131 GiB) | FP8 shares not in whole blocks |")
  print("|---:|---|---:|---:|---|---|---|---|")
  for tp in args.tp:
    for name, tree in trees.items():
      weights, unsplit = per_device_bytes(tree, tp)
      need = (weights + cache) / 2**30
      fits = ["yes" if need <= (1 - args.headroom) * hbm else "no" for hbm in HBM_GIB.values()]
      note = "—" if not unsplit else f"{len(unsplit)} (e.g. {unsplit[0]}): cannot keep FP8 at this tp"
      print(f"| {tp} | {name} | {weights / 2**30:.1f} | {need:.1f} | {' | '.join(fits)} | {note} |")


if __name__ == "__main__":
  main()
