"""Decoder block: pre-norm MLA(+DSA) attention, then a pre-norm MoE (or dense MLP for early layers).

    residual = x + attn(input_layernorm(x))
    y        = mlp(post_attention_layernorm(residual))
    return y, residual          # un-added: the caller fuses `y + residual` with the next norm

Returning the tail un-added is what lets the MTP layer fold the tensor-parallel reduction of `y`,
the residual add and `shared_head.norm` into one kernel (docs/design.md §2, Opt-1).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax

from jax_mtp.cache import LayerCache
from jax_mtp.config import MtpConfig
from jax_mtp.layers import RMSNorm, Rotary
from jax_mtp.mla import MLAttention
from jax_mtp.moe import MoE, Mlp
from jax_mtp.sharding import TensorParallel


class BlockOutput(NamedTuple):
  mlp_out_BTD: jax.Array  # y, before the residual add; under tp this device's partial sum
  residual_BTD: jax.Array
  cache: LayerCache


class DecoderBlock(nn.Module):
  """One transformer layer; `layer_idx` decides MoE (≥ first_k_dense_replace) or dense MLP."""

  cfg: MtpConfig
  layer_idx: int
  tp: TensorParallel = TensorParallel()

  def setup(self):
    cfg = self.cfg
    self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
    self.self_attn = MLAttention(cfg, self.tp)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
    if cfg.is_moe_layer(self.layer_idx):
      self.mlp = MoE(cfg, self.tp)
    else:
      self.mlp = Mlp(cfg, cfg.intermediate_size, self.tp)

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, rotary: Rotary, cache: LayerCache, *,
               absorb: bool, normed_BTD: jax.Array | None = None, selection=None) -> BlockOutput:
    """`normed_BTD`: input_layernorm(x) when the caller has it already (the target computes it
    with the previous block's reduce + add, Opt-1); None: computed here. `selection`: see MLAttention."""
    normed_BTD = self.input_layernorm(x_BTD) if normed_BTD is None else normed_BTD
    attn_BTD, cache = self.self_attn(normed_BTD, positions_BT, rotary, cache, absorb=absorb, selection=selection)
    residual_BTD = x_BTD + attn_BTD
    return BlockOutput(self.mlp(self.post_attention_layernorm(residual_BTD)), residual_BTD, cache)
