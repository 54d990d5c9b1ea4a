"""Time one MTP draft step (tp = 1) on the local accelerator, per Opt-1 impl, against a weight-read roofline.

    python -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 64 --impls xla pallas_gpu \
        --moe-impls ragged_dot tokamax_gpu

A decode step of the MTP layer is memory-bound: it reads the attention and indexer weights, the
routed experts the batch picked, the shared expert, eh_proj and the head. The table prints the
measured time beside two rooflines at the measured copy bandwidth: "touched" (the experts this
batch's routing picked, counted from the router's output, plus the cache bytes DSA must read: every
visible indexer key and the index_topk selected entries; rows sit at position S/2) and "all" (every
weight of the layer + head). Tables recorded before 2026-12-01 17:00 UTC counted weights only; those
before 19:40 UTC timed the step without donating its caches, so each call also copied every cache.
Rows are (Opt-1 impl, routed-experts impl) pairs; the draft tokens must equal the first row's.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from benchmarks.timing import copy_bandwidth, experts_touched, time_carrying

PRESETS = {"tiny": jax_mtp.tiny, "deepseek_v32": jax_mtp.deepseek_v32, "glm5": jax_mtp.glm5}


def weight_bytes(params, cfg: jax_mtp.MtpConfig, touched_experts: int) -> tuple[int, int]:
  """(touched, all) bytes a step reads: experts scaled by the number the routing picked."""
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)) - params["embed_tokens"].nbytes
  mlp = params["layers_0"]["mtp_block"]["mlp"]
  experts = sum(mlp[k].nbytes for k in ("w_gate_EDF", "w_up_EDF", "w_down_EFD"))
  touched = touched_experts / cfg.n_routed_experts
  return int(total - experts + experts * touched), total


def cache_bytes_read(cfg: jax_mtp.MtpConfig, visible: int) -> int:
  """Cache bytes one row's step must read: DSA reads every visible indexer key and the
  min(index_topk, visible) selected latent + rope entries; without an indexer, every visible entry."""
  entry = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * jnp.dtype(cfg.dtype).itemsize
  if not cfg.has_indexer:
    return visible * entry
  key = cfg.index_head_dim * jnp.dtype(cfg.index_key_dtype).itemsize
  key += 4 if cfg.index_key_dtype == "float8_e4m3fn" else 0  # the per-token fp32 scale
  return visible * key + min(cfg.index_topk, visible) * entry


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
  parser.add_argument("--capacity", type=int, nargs="+", default=[4096], help="cache capacities (each row at S/2)")
  parser.add_argument("--impls", nargs="+", default=["xla"])
  parser.add_argument("--moe-impls", nargs="+", default=["auto"], choices=jax_mtp.config.MOE_IMPLS)
  parser.add_argument("--index-cache-dtype", default="auto", choices=jax_mtp.config.INDEX_CACHE_DTYPES)
  parser.add_argument("--index-scores-impl", default="auto", choices=jax_mtp.config.INDEX_SCORES_IMPLS)
  parser.add_argument("--iters", type=int, default=50)
  args = parser.parse_args(argv)
  cfg = PRESETS[args.preset](index_cache_dtype=args.index_cache_dtype, index_scores_impl=args.index_scores_impl)
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  bandwidth = copy_bandwidth()
  print(f"{args.preset} MTP draft step (index keys {cfg.index_key_dtype}, index scores {cfg.index_scores_impl}) on "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
  print("| S | B | Opt-1 impl | experts impl | experts touched | cache MB read | µs / step | roofline touched µs "
        "| roofline all µs | touched / measured | tokens match row 1 |")
  print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
  for capacity, batch in [(c, b) for c in args.capacity for b in args.batch]:
    rng = np.random.default_rng(batch)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 1), dtype=np.int32))
    positions = jnp.full((batch, 1), capacity // 2, jnp.int32)
    hidden = jnp.asarray(rng.standard_normal((batch, 1, cfg.hidden_size)), cfg.dtype)
    caches = jax_mtp.init_caches(cfg, batch, capacity)
    (touched,) = experts_touched(jax_mtp.MtpPredictor(cfg), params, ids, positions, hidden, caches)
    active, total = weight_bytes(params, cfg, touched)
    cache = batch * cache_bytes_read(cfg, visible=capacity // 2 + 1)
    active += cache
    reference = None
    for impl in args.impls:
      for moe_impl in args.moe_impls:
        if moe_impl == "gather" and batch * cfg.num_experts_per_tok > cfg.n_routed_experts:
          continue  # T·K gathered expert copies: past E assignments more bytes than every expert
        model = jax_mtp.MtpPredictor(cfg.replace(moe_impl=moe_impl), norm_impl=impl)

        def step(p, i, pos, h, c, model=model):
          out = model.apply({"params": p}, i, pos, h, c)
          return model.apply({"params": p}, out.hidden_BTD, method=model.get_top_tokens), out.caches

        seconds, tokens, _ = time_carrying(step, (params, ids, positions, hidden, caches), args.iters)
        reference = tokens if reference is None else reference
        same = bool(jnp.all(tokens == reference))
        print(f"| {capacity} | {batch} | {impl} | {moe_impl} | {touched} | {cache / 1e6:,.1f} | {seconds * 1e6:,.0f} | "
              f"{active / bandwidth * 1e6:,.0f} | "
              f"{total / bandwidth * 1e6:,.0f} | {active / bandwidth / seconds:.2f} | {same} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
