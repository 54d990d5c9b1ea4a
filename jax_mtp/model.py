"""The target model: DeepSeek-V3.2 (dense first layers, MoE after, MLA + DSA), built from the same
blocks as the MTP layer, with a per-layer latent KV cache.

    x, h   = embed_tokens(input_ids), None
    for i:   y_i, residual_i = layers_i(x, h)                      decoder block (h = its input norm),
                                                                   tail un-added
             h, x = fused(y_i, residual_i, layers_{i+1}.input_layernorm)     ◄ Opt-1 at every boundary
    hidden = fused(y_L, residual_L, norm)                          ◄ and at the final norm
    logits = lm_head(hidden)

where fused(y, r, norm) = (norm(reduce(y) + r), reduce(y) + r), `fused_allreduce_rmsnorm` with
impl=`norm_impl` (reduce = psum over tp; identity at tp = 1), as vLLM fuses its layer boundaries.
With norm_impl="pallas_gpu" at tp ≥ 2 the L calls of a decode-sized forward share one workspace
and skip XLA's per-kernel barrier (`workspace_for_chain`).

`hidden` is the **post-final-norm** hidden state the MTP layer consumes as `prev_hidden` (docs/design.md §1).
By default a call with T > 1 tokens uses MLA's naive form (prefill), T = 1 the absorbed form
(decode); the speculator's verification passes `absorb=True` (jax_mtp.mla: every decode-time call
is absorbed). Both forms write every token's latent at its position (jax_mtp.cache), so the same call serves
prefill, decode and speculative verification. Param names mirror HF (`model.embed_tokens`,
`model.layers.{i}`, `model.norm`, `lm_head`) so the checkpoint loader (issue #6) maps them by name.
Under tp (inside `shard_map`, see jax_mtp.speculative) the embedding and head are vocab-parallel.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_mtp.block import DecoderBlock
from jax_mtp.cache import LayerCache, init_layer_cache
from jax_mtp.config import MtpConfig
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm, workspace_for_chain
from jax_mtp.layers import INIT_STD, RMSNorm, dtype_of, rotary_for_positions
from jax_mtp.sharding import TensorParallel, padded_vocab
from jax_mtp.vocab import embed_lookup, head_logits, head_top_tokens


class TargetOutput(NamedTuple):
  hidden_BTD: jax.Array  # post final norm, activation dtype; the MTP layer's prev_hidden
  caches: tuple[LayerCache, ...]  # one per target layer


class TargetModel(nn.Module):
  """`num_hidden_layers` decoder blocks between a vocab-parallel embedding and head.

  `norm_impl` picks the implementation of every reduce + add + norm (`fused_allreduce_rmsnorm`);
  greedy tokens come from `get_top_tokens` (local argmax under tp), sampling from `compute_logits`.
  """

  cfg: MtpConfig
  tp: TensorParallel = TensorParallel()
  norm_impl: str = "xla"

  supports_local_argmax = True  # the same capability protocol as the drafter (jax_mtp.draft_path)

  def setup(self):
    cfg = self.cfg
    vocab = self.tp.local(padded_vocab(cfg, self.tp.size), "padded vocab")
    shape, pdt = (vocab, cfg.hidden_size), dtype_of(cfg.param_dtype)
    self.embed_tokens = self.param("embed_tokens", nn.initializers.normal(INIT_STD), shape, pdt)
    self.layers = [DecoderBlock(cfg, i, self.tp) for i in range(cfg.num_hidden_layers)]
    self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
    self.lm_head = self.param("lm_head", nn.initializers.normal(cfg.hidden_size**-0.5), shape, pdt)

  def __call__(self, input_ids_BT: jax.Array, positions_BT: jax.Array, caches: tuple[LayerCache, ...],
               absorb: bool | None = None) -> TargetOutput:
    """Runs the tokens at their positions, writing each layer's cache there.

    input_ids, positions: int [B, T]; caches: `init_target_caches` layout, capacity > every position.
    `absorb` picks MLA's absorbed (decode) form; default: absorbed iff T == 1.
    """
    if len(caches) != self.cfg.num_hidden_layers:
      raise ValueError(f"got {len(caches)} caches for num_hidden_layers={self.cfg.num_hidden_layers}")
    absorb = input_ids_BT.shape[1] == 1 if absorb is None else absorb
    rotary = rotary_for_positions(self.cfg.rope, self.cfg.qk_rope_head_dim, positions_BT)
    x_BTD = embed_lookup(self.embed_tokens, input_ids_BT, self.tp, self.cfg.dtype)
    cfg, tp, (b, t) = self.cfg, self.tp, input_ids_BT.shape
    workspace = workspace_for_chain(self.norm_impl, tp.axis, tp.size, len(self.layers), b * t, cfg.hidden_size,
                                    cfg.dtype)
    normed_BTD, new_caches = None, []
    for i, layer in enumerate(self.layers):
      y_BTD, residual_BTD, cache = layer(x_BTD, positions_BT, rotary, caches[i], absorb=absorb, normed_BTD=normed_BTD)
      new_caches.append(cache)
      # the tail's MLP output is a partial sum under tp: reduce, add, and the next norm in one call
      norm = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
      normed_BTD, x_BTD = self._reduce_add_norm(y_BTD, residual_BTD, norm.weight, workspace)
    return TargetOutput(normed_BTD, tuple(new_caches))

  def _reduce_add_norm(self, y_BTD: jax.Array, residual_BTD: jax.Array, weight_D: jax.Array, workspace):
    """(norm(reduce(y) + residual), reduce(y) + residual) through Opt-1's fused call, on tokens
    flattened to [T, D]."""
    shape, d = y_BTD.shape, self.cfg.hidden_size
    normed_TD, new_residual_TD = fused_allreduce_rmsnorm(
        y_BTD.reshape(-1, d), residual_BTD.reshape(-1, d), weight_D, self.cfg.rms_norm_eps, axis_name=self.tp.axis,
        impl=self.norm_impl, workspace=workspace)
    return normed_TD.reshape(shape), new_residual_TD.reshape(shape)

  def compute_logits(self, hidden_BTD: jax.Array) -> jax.Array:
    """Full-vocab logits fp32 [B, T, V] (all-gathered over the vocab under tp)."""
    return head_logits(hidden_BTD, self.lm_head, self.tp, self.cfg.vocab_size)

  def get_top_tokens(self, hidden_BTD: jax.Array) -> jax.Array:
    """Greedy tokens int32 [B, T] = argmax(compute_logits), ties → lowest id."""
    return head_top_tokens(hidden_BTD, self.lm_head, self.tp, self.cfg.vocab_size)

  def init_all(self):
    """Touches every layer (with its DSA indexer) and the head so `init` creates all parameters."""
    capacity = self.cfg.index_topk + 1  # a cache larger than top-k runs the indexer
    ids, positions = jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32)
    return self.compute_logits(self(ids, positions, init_target_caches(self.cfg, 1, capacity)).hidden_BTD)


def init_target_caches(cfg: MtpConfig, batch: int, capacity: int) -> tuple[LayerCache, ...]:
  """One zeroed cache per target layer, for `batch` sequences of up to `capacity` positions."""
  return tuple(init_layer_cache(cfg, batch, capacity) for _ in range(cfg.num_hidden_layers))


def init_target_params(cfg: MtpConfig, rng: jax.Array) -> dict:
  """Random parameters of the target model: `embed_tokens`, `layers_{i}`, `norm`, `lm_head`."""
  return _initializer(cfg)(rng)


@functools.cache
def _initializer(cfg: MtpConfig):
  """The jit-compiled init, one per config (compiling it costs more than running it); traced with
  XLA's experts, index scores and sparse attention, as `jax_mtp.init_params` is."""
  model = TargetModel(cfg.replace(moe_impl="ragged_dot", index_scores_impl="xla", sparse_attention_impl="xla",
                                  topk_impl="xla"))
  return jax.jit(lambda key: model.init(key, method=TargetModel.init_all)["params"])
