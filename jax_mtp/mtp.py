"""The DeepSeek-V3.2 MTP (NextN) draft layer and the predictor that holds the MTP layers.

One MTP step, per token (vLLM `DeepseekV32MultiTokenPredictorLayer.forward`):

    e = embed(input_ids);  e = 0 where position == 0          (nothing precedes position 0)
    x = eh_proj([enorm(e); hnorm(prev_hidden)])               [e; h] order, as the checkpoint expects
    y, residual = decoder_block(x)
    h = shared_head.norm(y + residual)                        post-norm hidden
    → h for the head (logits / greedy draft token) and h again as the next step's prev_hidden

`input_ids[t]` is the token *after* the one whose hidden is `prev_hidden[t]`, and `positions[t]`
is the position of the hidden's token (vLLM's convention; HF's MTP generator uses position + 1).
The embedding and the head are the target model's, shared by all MTP layers; step `i` uses MTP
layer `i % num_nextn_predict_layers`.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jax_mtp.block import DecoderBlock
from jax_mtp.cache import LayerCache, init_layer_cache
from jax_mtp.config import MtpConfig
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm, sequence_parallel_rmsnorm
from jax_mtp.layers import INIT_STD, RMSNorm, dtype_of, linear, rotary_for_positions
from jax_mtp.sharding import TensorParallel, padded_vocab
from jax_mtp.vocab import embed_lookup, head_logits, head_top_tokens


class MtpOutput(NamedTuple):
  hidden_BTD: jax.Array  # post shared_head.norm; feeds the head
  next_prev_hidden_BTD: jax.Array  # the same tensor, recycled as the next draft step's prev_hidden
  caches: tuple[LayerCache, ...]


class MtpLayer(nn.Module):
  """One MTP layer (checkpoint `model.layers.{layer_idx}.*`).

  Under tp the block's tail is un-reduced; `fused_allreduce_rmsnorm(impl=norm_impl)` reduces it,
  adds the residual and applies shared_head.norm in one step (Opt-1). With `sequence_parallel`
  the tail is reduce-scattered over tokens, normalised, and all-gathered instead (vLLM's SP path).
  """

  cfg: MtpConfig
  layer_idx: int
  tp: TensorParallel = TensorParallel()
  norm_impl: str = "xla"
  sequence_parallel: bool = False

  def setup(self):
    cfg = self.cfg
    d = cfg.hidden_size
    self.enorm = RMSNorm(d, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
    self.hnorm = RMSNorm(d, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
    self.eh_proj = linear(2 * d, d, cfg)
    self.mtp_block = DecoderBlock(cfg, self.layer_idx, self.tp)
    self.shared_head_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)

  def __call__(self, embeds_BTD: jax.Array, positions_BT: jax.Array, prev_hidden_BTD: jax.Array,
               cache: LayerCache, *, absorb: bool, workspace=None, selection=None) -> tuple[jax.Array, LayerCache]:
    """Returns (post-norm hidden [B, T, D], updated cache). `workspace`, `selection`: see `MtpPredictor`."""
    embeds_BTD = jnp.where(positions_BT[..., None] == 0, 0, embeds_BTD)
    x_BTD = self.eh_proj(jnp.concatenate([self.enorm(embeds_BTD), self.hnorm(prev_hidden_BTD)], axis=-1))
    rotary = rotary_for_positions(self.cfg.rope, self.cfg.qk_rope_head_dim, positions_BT)
    y_BTD, residual_BTD, cache = self.mtp_block(x_BTD, positions_BT, rotary, cache, absorb=absorb, selection=selection)
    return self._tail(y_BTD, residual_BTD, workspace), cache

  def _tail(self, y_BTD: jax.Array, residual_BTD: jax.Array, workspace) -> jax.Array:
    """shared_head.norm(reduce(y) + residual), flattening tokens for the [T, D] kernels."""
    shape, d = y_BTD.shape, self.cfg.hidden_size
    y_TD, residual_TD = y_BTD.reshape(-1, d), residual_BTD.reshape(-1, d)
    weight, eps = self.shared_head_norm.weight, self.cfg.rms_norm_eps
    if workspace is not None and self.sequence_parallel:
      raise ValueError("a GPU workspace chains the fused all-reduce + norm; the sequence-parallel tail has none")
    if self.sequence_parallel and self.tp.axis is not None:
      normed_TD = sequence_parallel_rmsnorm(y_TD, residual_TD, weight, eps, axis_name=self.tp.axis,
                                            tp=self.tp.size)
    else:
      normed_TD, _ = fused_allreduce_rmsnorm(y_TD, residual_TD, weight, eps, axis_name=self.tp.axis,
                                             impl=self.norm_impl, workspace=workspace)
    return normed_TD.reshape(shape)


class MtpPredictor(nn.Module):
  """The MTP layers with the shared embedding and head.

  Call it for one draft step; `compute_logits` (full vocab, fp32) and `get_top_tokens` (greedy
  draft ids) read the step's hidden. Both take `spec_step_idx` like vLLM's, for a per-layer head.
  Under tp (inside `shard_map`, see jax_mtp.sharding.jit_per_shard) the embedding and head rows are split over
  the vocab: `get_top_tokens` reduces (value, index) pairs and never gathers the logits.
  """

  cfg: MtpConfig
  tp: TensorParallel = TensorParallel()
  norm_impl: str = "xla"
  sequence_parallel: bool = False

  # Draft-path capability (docs/design.md §2): greedy drafts come from `get_top_tokens`, a local argmax.
  supports_local_argmax = True

  def setup(self):
    cfg = self.cfg
    vocab = self.tp.local(padded_vocab(cfg, self.tp.size), "padded vocab")
    shape, pdt = (vocab, cfg.hidden_size), dtype_of(cfg.param_dtype)
    self.embed_tokens = self.param("embed_tokens", nn.initializers.normal(INIT_STD), shape, pdt)
    self.layers = [MtpLayer(cfg, cfg.num_hidden_layers + i, self.tp, self.norm_impl, self.sequence_parallel)
                   for i in range(cfg.num_nextn_predict_layers)]
    self.lm_head = self.param("lm_head", nn.initializers.normal(cfg.hidden_size**-0.5), shape, pdt)

  def __call__(self, input_ids_BT: jax.Array, positions_BT: jax.Array, prev_hidden_BTD: jax.Array,
               caches: tuple[LayerCache, ...], spec_step_idx: int = 0, absorb: bool | None = None,
               workspace=None, selection=None) -> MtpOutput:
    """One draft step. `absorb` picks MLA's absorbed (decode) form; default: absorbed iff T == 1.
    `selection` (a `jax_mtp.indexer.Selection`): the DSA slots to attend, instead of the indexer's.
    `workspace` (norm_impl="pallas_gpu", tp ≥ 2): a `gpu_workspace` for [B·T, D] that chains this
    step's Opt-1 kernel with the other steps of the program, without XLA's device barrier."""
    validate_inputs(self.cfg, input_ids_BT, positions_BT, prev_hidden_BTD, caches)
    layer_no = spec_step_idx % self.cfg.num_nextn_predict_layers
    absorb = input_ids_BT.shape[1] == 1 if absorb is None else absorb
    hidden_BTD, cache = self.layers[layer_no](self._embed(input_ids_BT), positions_BT,
                                              prev_hidden_BTD.astype(self.cfg.dtype), caches[layer_no],
                                              absorb=absorb, workspace=workspace, selection=selection)
    caches = caches[:layer_no] + (cache,) + caches[layer_no + 1:]
    return MtpOutput(hidden_BTD, hidden_BTD, caches)

  def _embed(self, ids_BT: jax.Array) -> jax.Array:
    """Embedding lookup; under tp each device looks up its vocab rows and a psum assembles them."""
    return embed_lookup(self.embed_tokens, ids_BT, self.tp, self.cfg.dtype)

  def compute_logits(self, hidden_BTD: jax.Array, spec_step_idx: int = 0) -> jax.Array:
    """Full-vocab logits, fp32 [B, T, V] (all-gathered over the vocab under tp). All MTP layers
    share the head, so spec_step_idx selects among identical heads; kept for the protocol."""
    del spec_step_idx
    return head_logits(hidden_BTD, self.lm_head, self.tp, self.cfg.vocab_size)

  def get_top_tokens(self, hidden_BTD: jax.Array, spec_step_idx: int = 0) -> jax.Array:
    """Greedy draft tokens int32 [B, T]; equal to argmax(compute_logits) (ties → lowest id)."""
    del spec_step_idx
    return head_top_tokens(hidden_BTD, self.lm_head, self.tp, self.cfg.vocab_size)

  def init_all(self):
    """Touches every MTP layer, its indexer and the head so `init` creates all parameters."""
    batch, capacity = 1, self.cfg.index_topk + 1  # a cache larger than top-k runs the indexer
    ids, positions = jnp.zeros((batch, 1), jnp.int32), jnp.zeros((batch, 1), jnp.int32)
    hidden = jnp.zeros((batch, 1, self.cfg.hidden_size), self.cfg.dtype)
    caches = init_caches(self.cfg, batch, capacity)
    for step in range(self.cfg.num_nextn_predict_layers):
      hidden = self(ids, positions, hidden, caches, spec_step_idx=step).hidden_BTD
    return self.compute_logits(hidden)


def init_caches(cfg: MtpConfig, batch: int, capacity: int) -> tuple[LayerCache, ...]:
  """One zeroed cache per MTP layer, for `batch` sequences of up to `capacity` positions."""
  return tuple(init_layer_cache(cfg, batch, capacity) for _ in range(cfg.num_nextn_predict_layers))


def init_params(cfg: MtpConfig, rng: jax.Array) -> dict:
  """Random parameters for every MTP layer, the embedding and the head (jit-compiled init).

  The init traces the model with XLA's experts, index scores and sparse attention: params depend on no
  impl, and a kernel for another platform (an AOT target) cannot be traced on this host."""
  model = MtpPredictor(cfg.replace(moe_impl="ragged_dot", index_scores_impl="xla", sparse_attention_impl="xla",
                                   topk_impl="xla"))
  return jax.jit(lambda key: model.init(key, method=MtpPredictor.init_all)["params"])(rng)


def validate_inputs(cfg: MtpConfig, input_ids_BT, positions_BT, prev_hidden_BTD, caches) -> None:
  """Checks shapes and dtypes always, and token / position values when they are concrete
  (under `jit` they are tracers: validate before jitting, as the CLI and speculator do)."""
  ids_shape = tuple(input_ids_BT.shape)
  if len(ids_shape) != 2:
    raise ValueError(f"input_ids must be [B, T], got shape {ids_shape}")
  if tuple(positions_BT.shape) != ids_shape:
    raise ValueError(f"positions shape {tuple(positions_BT.shape)} != input_ids shape {ids_shape}")
  for name, x in (("input_ids", input_ids_BT), ("positions", positions_BT)):
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
  if tuple(prev_hidden_BTD.shape) != ids_shape + (cfg.hidden_size,):
    raise ValueError(f"prev_hidden shape {tuple(prev_hidden_BTD.shape)} != {ids_shape + (cfg.hidden_size,)}")
  if len(caches) != cfg.num_nextn_predict_layers:
    raise ValueError(f"got {len(caches)} caches for num_nextn_predict_layers={cfg.num_nextn_predict_layers}")
  for i, cache in enumerate(caches):
    if cache.latent_BSC.shape[0] != ids_shape[0]:
      raise ValueError(f"cache batch {cache.latent_BSC.shape[0]} != input batch {ids_shape[0]} (caches[{i}])")
  capacity = min(cache.capacity for cache in caches)
  _validate_values("input_ids", input_ids_BT, cfg.vocab_size, "vocab_size")
  limit, what = min((cfg.max_position_embeddings, "max_position_embeddings"), (capacity, "cache capacity"))
  _validate_values("positions", positions_BT, limit, what)


def _validate_values(name: str, x, limit: int, limit_name: str) -> None:
  if isinstance(x, jax.core.Tracer):
    return
  values = np.asarray(x)
  bad = values[(values < 0) | (values >= limit)]
  if bad.size:
    raise ValueError(f"{name} value {int(bad.flat[0])} is outside [0, {limit}) ({limit_name}={limit})")
