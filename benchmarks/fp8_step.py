"""FP8 weights kept on the device vs the same weights dequantised to bf16: the MTP layer's memory and
its draft step (tp = 1), in one run.

    python -m benchmarks.fp8_step --preset deepseek_v32 --batch 64 1 8

Random V3.2-width weights are quantised on the device with DeepSeek's block quantiser (128 × 128
blocks, scale = amax / 448) on the tensors a V3.2 checkpoint stores in FP8 (every linear but eh_proj,
the router and the indexer's weights_proj; the routed experts); the bf16 tree is their exact
dequantisation, so both paths run the same weights. Printed: each tree's bytes and the device memory
in use with only it alive; per batch the step time of each path beside its floor (the bytes it must
read — weights as stored, the experts the routing picked, the cache DSA reads — over the copy
bandwidth measured in the same run), whether the draft tokens agree, and the compiled program's
temporary buffer size (a dequantised copy of a weight would show there).
"""

from __future__ import annotations

import argparse
import functools
import gc
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from benchmarks.mtp_step import PRESETS, cache_bytes_read
from benchmarks.timing import copy_bandwidth, experts_touched
from jax_mtp import fp8



def tree_bytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def in_use() -> int:
  """Device bytes in use (0 where the backend keeps no statistics, as XLA's CPU client)."""
  gc.collect()
  return (jax.devices()[0].memory_stats() or {}).get("bytes_in_use", 0)


def step_bytes(params, cfg, touched: int) -> int:
  """Bytes a step reads: every weight as stored, the routed experts scaled to the ones picked."""
  total = tree_bytes(params) - params["embed_tokens"].nbytes
  mlp = params["layers_0"]["mtp_block"]["mlp"]
  experts = sum(x.nbytes for name, x in mlp.items() if name.startswith("w_"))
  return int(total - experts + experts * touched / cfg.n_routed_experts)


def fp8_tree(cfg):
  """Random params with the tensors a V3.2 checkpoint stores in FP8 as codes + block scales."""
  return fp8.as_checkpoint_fp8(jax_mtp.init_params(cfg, jax.random.key(0)), cfg.fp8_block, fp8.quantize)


def build_params(cfg):
  """(FP8 tree, its exact dequantisation): the same weights in both forms."""
  fp8_params = fp8_tree(cfg)
  return fp8_params, fp8.dequantize_params(fp8_params, cfg.param_dtype, cfg.fp8_block)


def draft_step(params, ids, positions, hidden, caches, model):
  """One draft step: the MTP layer, then its head's greedy tokens; returns (tokens, new caches)."""
  out = model.apply({"params": params}, ids, positions, hidden, caches)
  return model.apply({"params": params}, out.hidden_BTD, method=model.get_top_tokens), out.caches


def step_inputs(cfg, batch: int, capacity: int):
  """(ids, positions, hidden, caches) of a draft step of `batch` random rows at position capacity / 2."""
  rng = np.random.default_rng(batch)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 1), dtype=np.int32))
  positions = jnp.full((batch, 1), capacity // 2, jnp.int32)
  hidden = jnp.asarray(rng.standard_normal((batch, 1, cfg.hidden_size)), cfg.dtype)
  return ids, positions, hidden, jax_mtp.init_caches(cfg, batch, capacity)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", default="deepseek_v32", choices=sorted(PRESETS))
  p.add_argument("--batch", type=int, nargs="+", default=[64, 1, 8])
  p.add_argument("--capacity", type=int, default=4096)
  p.add_argument("--iters", type=int, default=30)
  p.add_argument("--attention", nargs="+", default=["auto"], choices=jax_mtp.config.SPARSE_ATTENTION_IMPLS,
                 help="sparse_attention_impl values to time (each with both weight trees)")
  args = p.parse_args()
  cfg = PRESETS[args.preset]()
  base = in_use()
  fp8_params = fp8_tree(cfg)
  fp8_in_use = in_use() - base
  bf16_params = fp8.dequantize_params(fp8_params, cfg.param_dtype, cfg.fp8_block)
  both_in_use = in_use() - base
  bandwidth = copy_bandwidth()
  print(f"{args.preset} MTP layer + head on {jax.devices()[0].device_kind}, jax {jax.__version__}, copy bandwidth "
        f"{bandwidth / 1e12:.2f} TB/s\n")
  print(f"| weights | tree GB | device GB in use (only it alive) |\n|---|---:|---:|\n"
        f"| FP8 (codes + scales) | {tree_bytes(fp8_params) / 1e9:.2f} | {fp8_in_use / 1e9:.2f} |\n"
        f"| {cfg.param_dtype} | {tree_bytes(bf16_params) / 1e9:.2f} | {(both_in_use - fp8_in_use) / 1e9:.2f} |\n",
        flush=True)
  print("| S | B | weights | experts impl | attention | µs / step | floor µs | floor / measured | fp8 / dense "
        "| tokens equal | compile s | temp MB |")
  print("|---:|---:|---|---|---|---:|---:|---:|---:|---|---:|---:|", flush=True)
  model = jax_mtp.MtpPredictor(cfg)

  for batch in args.batch:
    ids, positions, hidden, caches = step_inputs(cfg, batch, args.capacity)
    (touched,) = experts_touched(model, bf16_params, ids, positions, hidden, caches)
    cache = batch * cache_bytes_read(cfg, visible=args.capacity // 2 + 1)
    results = {}
    dense = str(jnp.dtype(cfg.param_dtype))
    runs = [(dense, bf16_params, "auto", attn) for attn in args.attention]
    runs += [("fp8", fp8_params, "auto", attn) for attn in args.attention]
    if batch * cfg.num_experts_per_tok <= cfg.n_routed_experts:  # the kernel's rows: against XLA's gather
      runs.append(("fp8", fp8_params, "gather", args.attention[-1]))
    for name, params, moe_impl, attn in runs:
      run_model = jax_mtp.MtpPredictor(cfg.replace(moe_impl=moe_impl, sparse_attention_impl=attn))
      start = time.perf_counter()
      compiled = jax.jit(functools.partial(draft_step, model=run_model), donate_argnums=4).lower(
          params, ids, positions, hidden, caches).compile()
      compile_s = time.perf_counter() - start
      temp = compiled.memory_analysis().temp_size_in_bytes
      state = jax.tree.map(jnp.copy, caches)
      tokens, state = compiled(params, ids, positions, hidden, state)
      jax.block_until_ready(tokens)
      start = time.perf_counter()
      for _ in range(args.iters):
        tokens, state = compiled(params, ids, positions, hidden, state)
      jax.block_until_ready((tokens, state))
      seconds = (time.perf_counter() - start) / args.iters
      floor = (step_bytes(params, cfg, touched) + cache) / bandwidth
      moe = jax_mtp.experts.resolve_expert_impl(moe_impl, jax.default_backend(), batch, cfg.num_experts_per_tok,
                                                jax.ShapeDtypeStruct((cfg.n_routed_experts, cfg.hidden_size,
                                                                      cfg.moe_intermediate_size), cfg.param_dtype),
                                                fp8_codes=name == "fp8")
      attention = jax_mtp.mla.resolve_sparse_attention_impl(run_model.cfg, jax.default_backend())
      results.setdefault((name, attn), (seconds, np.asarray(tokens)))
      ratio = f"{seconds / results[dense, attn][0]:.2f}" if name == "fp8" else ""
      same = str(bool(np.array_equal(np.asarray(tokens), results[dense, args.attention[0]][1])))
      print(f"| {args.capacity} | {batch} | {name} | {moe} | {attention} | {seconds * 1e6:,.0f} | {floor * 1e6:,.0f} | "
            f"{floor / seconds:.2f} | {ratio} | {same} | {compile_s:.0f} | {temp / 1e6:,.0f} |", flush=True)
      del state


if __name__ == "__main__":
  main()
