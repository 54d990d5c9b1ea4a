"""Why FP8 draft tokens can differ from the bf16 path's: per row, the bf16 path's top-1 / top-2 logit gap
beside the largest logit difference between the two paths, V3.2's MTP layer on the same weights.

    python -m benchmarks.fp8_agreement --batch 8

The FP8 tree and its exact bf16 dequantisation as in `benchmarks.fp8_step`; `moe_impl=auto` on each
(on a GPU: tokamax over bf16, fp8_grouped_gpu over the codes, which scales the codes in fp32 and never
rounds a weight to bf16). A token may differ only where the gap is below the difference.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from benchmarks.mtp_step import PRESETS
from jax_mtp import fp8


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", default="deepseek_v32", choices=sorted(PRESETS))
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--capacity", type=int, default=4096)
  args = p.parse_args()
  cfg = PRESETS[args.preset]()
  fp8_params = fp8.as_checkpoint_fp8(jax_mtp.init_params(cfg, jax.random.key(0)), cfg.fp8_block, fp8.quantize)
  bf16_params = fp8.dequantize_params(fp8_params, cfg.param_dtype, cfg.fp8_block)
  model = jax_mtp.MtpPredictor(cfg)
  rng = np.random.default_rng(args.batch)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, 1), dtype=np.int32))
  positions = jnp.full((args.batch, 1), args.capacity // 2, jnp.int32)
  hidden = jnp.asarray(rng.standard_normal((args.batch, 1, cfg.hidden_size)), cfg.dtype)
  caches = jax_mtp.init_caches(cfg, args.batch, args.capacity)

  @jax.jit
  def logits(params, ids, positions, hidden, caches):
    out = model.apply({"params": params}, ids, positions, hidden, caches)
    return model.apply({"params": params}, out.hidden_BTD, method=model.compute_logits)[:, 0]

  dense = np.asarray(logits(bf16_params, ids, positions, hidden, caches), np.float64)
  quant = np.asarray(logits(fp8_params, ids, positions, hidden, caches), np.float64)
  top2 = np.sort(dense, axis=-1)[:, -2:]
  print(f"{args.preset} MTP layer on {jax.devices()[0].device_kind}, B = {args.batch}\n")
  print("| row | bf16 top-1 | fp8 top-1 | bf16 top-1 − top-2 gap | max abs logit difference | logit scale (std) |")
  print("|---:|---:|---:|---:|---:|---:|")
  for b in range(args.batch):
    print(f"| {b} | {dense[b].argmax()} | {quant[b].argmax()} | {top2[b, 1] - top2[b, 0]:.2e} | "
          f"{np.abs(dense[b] - quant[b]).max():.2e} | {dense[b].std():.2e} |", flush=True)


if __name__ == "__main__":
  main()
