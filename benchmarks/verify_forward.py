"""Time the target's verification forward (T = B·(k + 1) tokens + greedy head) of a reduced-depth,
full-width DeepSeek-V3.2 target on one device, per routed-experts impl, against its weight floor.

    python -m benchmarks.verify_forward --layers 4 --batch 1 8 64 256 -k 3 --moe-impls ragged_dot tokamax_gpu

The target has `--layers` layers, the first dense and the rest MoE (V3.2 widths: 256 experts,
D 7168), random bf16 weights, caches of `--capacity` with every row at position capacity/2.
"floor" = bytes of every weight the forward reads (embedding and head rows aside: the head is
read whole; the routed experts only those the routing picked, counted per layer from the router's
output) / copy bandwidth measured in the same run; cache bytes are not in it. "roofline" = each part at the larger
of its bytes over that bandwidth and its FLOPs over a bf16 GEMM's rate measured in the same run, summed, with the
attended cache entries and the indexer's keys counted (`roofline_seconds`): where the weights floor says whether
the weights stream at the bandwidth, it says whether any part could be faster. `absorb` is MLA's
form: "naive" re-expands kv_b_proj over the cache (what the speculator runs today), "absorbed" is
the decode form. Tokens are checked equal across experts impls of one form. `--profile` adds each row's kernels
per model part from a device trace.
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from benchmarks import step_profile
from benchmarks.timing import experts_touched, measured_ceilings, time_carrying
from jax_mtp.model import TargetModel, init_target_caches, init_target_params


ROUTED_EXPERTS = ("w_gate_EDF", "w_up_EDF", "w_down_EFD")  # a MoE layer's routed experts' weights


def target_config(layers: int, small: bool) -> jax_mtp.MtpConfig:
  base = jax_mtp.tiny() if small else jax_mtp.deepseek_v32()
  return base.replace(num_hidden_layers=layers, first_k_dense_replace=1)


def floor_bytes(params, cfg, touched_per_layer: list[int]) -> int:
  """Every weight but the embedding, with each MoE layer's experts scaled by the share touched."""
  total = sum(x.nbytes for x in jax.tree.leaves(params)) - params["embed_tokens"].nbytes
  moe_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
  for i, touched in zip(moe_layers, touched_per_layer, strict=True):
    mlp = params[f"layers_{i}"]["mlp"]
    experts = sum(mlp[k].nbytes for k in ROUTED_EXPERTS)
    total -= experts * (1 - touched / cfg.n_routed_experts)
  return int(total)


def roofline_seconds(params, cfg, batch: int, width: int, visible: int, touched_per_layer: list[int],
                     bandwidth: float, peak: float) -> float:
  """A floor that also counts the FLOPs and the caches' bytes: each part the forward cannot skip at its own roofline,
  max(bytes / bandwidth, FLOPs / peak), summed over the parts (one kernel each, none overlapping):
    - every weight matrix but the embedding (the head included): its bytes (a MoE layer's experts scaled by the
      share touched), 2 · tokens · its size FLOPs (tokens = batch · width; a routed expert's matrices
      2 · tokens · top-k · D · F: one expert each assignment); norms and biases their bytes;
    - each layer's sparse attention: the entries a row attends (top-k of the `visible` positions) read once a row,
      2 · tokens · heads · k · (C + R + C) FLOPs (scores over latent and rope, the output over the latent);
    - each layer's index scores: a row's `visible` keys read once, 2 · tokens · index heads · visible · index dim
      FLOPs (none where the cache holds no more than top-k positions: everything is attended).
  `weights_floor / time` asks whether the weights stream at the bandwidth; this one whether any part could be faster."""
  from jax_mtp.cache import init_layer_cache  # noqa: PLC0415
  tokens = batch * width
  seconds = 0.0
  experts = dict(zip([i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)], touched_per_layer, strict=True))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names = [getattr(k, "key", "") for k in path]
    if names[0] == "embed_tokens":
      continue
    size = math.prod(leaf.shape)  # (arrays or their shapes: jax.eval_shape's, for a model this host cannot hold)
    nbytes = size * jnp.dtype(leaf.dtype).itemsize
    if names[-1] in ROUTED_EXPERTS:
      nbytes *= experts[int(names[0].removeprefix("layers_"))] / cfg.n_routed_experts
      flops = 2 * tokens * cfg.num_experts_per_tok * leaf.shape[1] * leaf.shape[2]
    else:
      flops = 2 * tokens * size if len(leaf.shape) == 2 else 0
    seconds += max(nbytes / bandwidth, flops / peak)
  cache = jax.eval_shape(lambda: init_layer_cache(cfg, 1, 1))  # one position's bytes per cache part
  per_slot = {name: sum(x.dtype.itemsize * math.prod(x.shape) for x in jax.tree.leaves(getattr(cache, name)))
              for name in cache._fields}  # an absent part (None) has no leaves: 0 bytes
  entry = sum(per_slot[k] for k in per_slot if not k.startswith("index_"))
  key = sum(per_slot[k] for k in per_slot if k.startswith("index_"))
  k = min(cfg.index_topk, visible)
  c, r, n = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.num_attention_heads
  attention = max(batch * k * entry / bandwidth, 2 * tokens * n * k * (2 * c + r) / peak)
  scores = 0.0 if visible <= cfg.index_topk else max(
      batch * visible * key / bandwidth, 2 * tokens * cfg.index_n_heads * visible * cfg.index_head_dim / peak)
  return seconds + cfg.num_hidden_layers * (attention + scores)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
  parser.add_argument("-k", type=int, default=3, help="draft tokens per row: T = B·(k + 1)")
  parser.add_argument("--capacity", type=int, nargs="+", default=[1024], help="cache capacities (rows at S/2)")
  parser.add_argument("--moe-impls", nargs="+", default=["auto"], choices=jax_mtp.config.MOE_IMPLS)
  parser.add_argument("--topk-impls", nargs="+", default=["auto"], choices=jax_mtp.config.TOPK_IMPLS,
                      help="the indexer's top-k (each a row, after each --moe-impls)")
  parser.add_argument("--forms", nargs="+", default=["naive", "absorbed"], choices=["naive", "absorbed"])
  parser.add_argument("--iters", type=int, default=10, help="calls a timed run")
  parser.add_argument("--repeats", type=int, default=3, help="timed runs a row (one compile): its median and spread")
  parser.add_argument("--all-experts-touched", action="store_true",
                      help="floor with every routed expert read, without the routing count's own forward (which ran "
                           "out of memory at B = 256 × 32K on the H200; B = 256 × 4 queries touched all 256 at 4K)")
  parser.add_argument("--small", action="store_true", help="the tiny preset's widths, to check the script")
  parser.add_argument("--profile", action="store_true", help="also print each row's kernels per model part, from a "
                      "device trace (benchmarks.step_profile)")
  args = parser.parse_args(argv)
  cfg = target_config(args.layers, args.small)
  params = init_target_params(cfg, jax.random.key(0))
  bandwidth, peak = measured_ceilings(f"verification forward, {args.layers}-layer "
                                      f"{'tiny' if args.small else 'V3.2'}-width target, k = {args.k}, caches "
                                      f"{args.capacity},")
  print(f"| S | B | T | MLA form | experts impl | experts touched / layer | ms (median of {args.repeats} runs) | "
        "min–max ms | floor ms | floor / time | roofline ms | roofline / time | tokens match |")
  print("|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|")
  w = args.k + 1
  for capacity, batch in [(c, b) for c in args.capacity for b in args.batch]:
    rng = np.random.default_rng(batch)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, w)), jnp.int32)
    positions = jnp.asarray(capacity // 2 + np.arange(w)[None].repeat(batch, 0), jnp.int32)
    # fresh caches for each call that donates them: one set lives at a time (B = 256 × 32K fills the device)
    if args.all_experts_touched:  # assumed, not counted: the table's column says so
      touched = [cfg.n_routed_experts] * sum(map(cfg.is_moe_layer, range(cfg.num_hidden_layers)))
    else:
      touched = experts_touched(TargetModel(cfg), params, ids, positions, init_target_caches(cfg, batch, capacity),
                                donate_state=True, absorb=True)  # as timed
    floor = floor_bytes(params, cfg, touched) / bandwidth
    roofline = roofline_seconds(params, cfg, batch, w, capacity // 2 + w, touched, bandwidth, peak)
    for form in args.forms:
      reference = None
      for moe_impl, topk_impl in [(m, t) for m in args.moe_impls for t in args.topk_impls]:
        model = TargetModel(cfg.replace(moe_impl=moe_impl, topk_impl=topk_impl))
        impls = moe_impl + (f", top-k {topk_impl}" if topk_impl != "auto" else "")

        def verify(p, i, pos, c, model=model, absorb=form == "absorbed"):
          out = model.apply({"params": p}, i, pos, c, absorb=absorb)
          return model.apply({"params": p}, out.hidden_BTD, method=model.get_top_tokens), out.caches

        try:
          seconds, tokens, runs = time_carrying(verify, (params, ids, positions,
                                                         init_target_caches(cfg, batch, capacity)),
                                                args.iters, args.repeats, copy_state=False)
        except Exception as e:  # e.g. out of memory for the naive form at large B: a row, not the end
          print(f"| {capacity} | {batch} | {batch * w} | {form} | {impls} | {touched} | failed: {type(e).__name__} | "
                "| | | | | |")
          continue
        tokens = np.asarray(tokens)
        reference = tokens if reference is None else reference
        print(f"| {capacity} | {batch} | {batch * w} | {form} | {impls} | {touched}{" (assumed)" * args.all_experts_touched} | {seconds * 1e3:,.2f} | {spread_ms(runs)} | "
              f"{floor * 1e3:,.2f} | {floor / seconds:.2f} | {roofline * 1e3:,.2f} | {roofline / seconds:.2f} | "
              f"{bool(np.all(tokens == reference))} |")
        if args.profile:
          profile_row(verify, (params, ids, positions, init_target_caches(cfg, batch, capacity)),
                      f"S = {capacity}, B = {batch}, {form}, {impls}")
  return 0


def spread_ms(runs: list[float]) -> str:
  """The runs' range in ms ("min–max"), the spread a row's median comes with."""
  return f"{min(runs) * 1e3:,.2f}–{max(runs) * 1e3:,.2f}"


def profile_row(verify, call_args, label: str, calls: int = 3) -> None:
  """The row's kernels summed per model part from a trace of `calls` calls (caches donated call to call: the
  caller's are consumed)."""
  lowered = jax.jit(verify, donate_argnums=len(call_args) - 1).lower(*call_args)
  step_us, events, names = step_profile.profile(lowered, call_args, calls)
  step_profile.summarize(events, names, calls, step_us, label)


if __name__ == "__main__":
  raise SystemExit(main())
