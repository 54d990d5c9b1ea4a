"""DeepSeek MoE: sigmoid noaux_tc router, routed experts (grouped matmul), shared expert; dense MLP.

Router (official `Gate`, fp32):
    s      = sigmoid(x · W_gateᵀ)                              [T, E]
    s_b    = s + e_score_correction_bias                       bias steers selection only
    groups = top-`topk_group` of (sum of the top-2 s_b in each of G groups)
    idx    = top-K of s_b restricted to the kept groups
    w      = s[idx] / Σ s[idx] (norm_topk_prob) · routed_scaling_factor
Experts: y = Σ_k w_k · down_k(silu(gate_k(x)) · up_k(x)) + shared(x). The routed part runs by the
implementation `cfg.moe_impl` names (`jax_mtp.experts`: a grouped matmul over the token-expert
pairs sorted by expert — tokamax's kernels on GPU and TPU — or gathered weights at decode sizes),
so only the experts that tokens picked are read.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_mtp import fp8
from jax_mtp.config import MtpConfig
from jax_mtp.experts import resolve_expert_impl, routed_experts
from jax_mtp.layers import INIT_STD, dtype_of, linear
from jax_mtp.sharding import TensorParallel
from jax_mtp.platform import lowering_gpu_is_hopper, lowering_platform

_HIGHEST = jax.lax.Precision.HIGHEST
# From this many tokens a bf16 model's router logits are three bf16 dots on the matrix units (`router_logits`), not
# one fp32 dot, which GPUs run on their CUDA cores (cuBLAS's FFMA sgemm). On an H100 (2026-12-05, benchmarks.router)
# 43.0 → 32.4 µs at verification's 256 tokens (B = 64), 428.8 → 132.3 at a 4,096-token prefill chunk; at 1 token
# 13.8 against 16.8 (the parts read the weight once each), even at 8–64
ROUTER_SPLIT_MIN_TOKENS = 64
# A mutable collection only training asks for: each router sows its tokens per expert, from which
# DeepSeek-V3's auxiliary-loss-free balancing moves `e_score_correction_bias` (jax_mtp.training).
EXPERT_LOAD = "expert_load"


class Mlp(nn.Module):
  """SwiGLU MLP: down(silu(gate(x)) · up(x)). Dense layers and the shared expert.

  Under tp the intermediate dim is split (gate/up column-, down row-parallel): the output is this
  device's partial sum, reduced by the caller together with the rest of the block's tail.
  """

  cfg: MtpConfig
  intermediate_size: int
  tp: TensorParallel = TensorParallel()

  def setup(self):
    d, f = self.cfg.hidden_size, self.tp.local(self.intermediate_size, "MLP intermediate size")
    self.gate_proj = linear(d, f, self.cfg)
    self.up_proj = linear(d, f, self.cfg)
    self.down_proj = linear(f, d, self.cfg)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


class Router(nn.Module):
  """noaux_tc top-K routing; returns (expert ids [T, K] int32, weights [T, K] fp32)."""

  cfg: MtpConfig

  def setup(self):
    cfg = self.cfg
    # HF and the official code keep the router in fp32.
    self.weight = self.param("weight", nn.initializers.normal(INIT_STD), (cfg.n_routed_experts, cfg.hidden_size),
                             jnp.float32)
    self.e_score_correction_bias = self.param("e_score_correction_bias", nn.initializers.zeros,
                                              (cfg.n_routed_experts,), jnp.float32)

  def __call__(self, x_TD: jax.Array) -> tuple[jax.Array, jax.Array]:
    cfg = self.cfg
    logits_TE = router_logits(x_TD, self.weight)
    scores_TE = jax.nn.sigmoid(logits_TE)
    biased_TE = scores_TE + self.e_score_correction_bias
    allowed_TE = _kept_groups_mask(biased_TE, cfg.n_group, cfg.topk_group)
    _, ids_TK = jax.lax.top_k(jnp.where(allowed_TE, biased_TE, -jnp.inf), cfg.num_experts_per_tok)
    if self.is_mutable_collection(EXPERT_LOAD):  # training balances the load through the bias (jax_mtp.training)
      self.sow(EXPERT_LOAD, "tokens_E", jnp.zeros(cfg.n_routed_experts, jnp.float32).at[ids_TK].add(1.0))
    weights_TK = jnp.take_along_axis(scores_TE, ids_TK, axis=-1)
    if cfg.norm_topk_prob:
      weights_TK = weights_TK / (jnp.sum(weights_TK, axis=-1, keepdims=True) + 1e-20)
    return ids_TK.astype(jnp.int32), weights_TK * cfg.routed_scaling_factor


def router_logits(x_TD: jax.Array, weight_ED: jax.Array) -> jax.Array:
  """x · W_gateᵀ, fp32 [T, E], to fp32's accuracy (the official router's fp32 dot). A bf16 `x` of at least
  ROUTER_SPLIT_MIN_TOKENS rows multiplies W's three bf16 parts (`split_bf16x3`: their sum is W exactly) in three
  dots with fp32 sums (`split_logits`): each product x_d · part is exact in fp32, so the result is the fp32 dot's up
  to the order of its sums. Otherwise one fp32 dot at HIGHEST precision. Gradients are the fp32 dot's either way."""
  if x_TD.dtype == jnp.bfloat16 and x_TD.shape[0] >= ROUTER_SPLIT_MIN_TOKENS:
    return split_logits(x_TD, weight_ED)
  return fp32_logits(x_TD, weight_ED)


def fp32_logits(x_TD, weight_ED):
  """The router's logits as the official code computes them: one fp32 dot at HIGHEST precision."""
  return jnp.einsum("td,ed->te", x_TD.astype(jnp.float32), weight_ED, precision=_HIGHEST)


@jax.custom_vjp
def split_logits(x_TD, weight_ED):
  """The router's logits for a bf16 `x`: three bf16 dots over W's exact parts (`split_bf16x3`), fp32 sums."""
  hi, mid, lo = (jnp.einsum("td,ed->te", x_TD, part, preferred_element_type=jnp.float32)
                 for part in split_bf16x3(weight_ED))
  return (hi + mid) + lo


def _split_logits_fwd(x_TD, weight_ED):
  return split_logits(x_TD, weight_ED), (x_TD, weight_ED)


def _split_logits_bwd(saved, g_TE):
  # the fp32 dot's gradients: through the bit-mask split the weight's would reach only its last part, in bf16
  return jax.vjp(fp32_logits, *saved)[1](g_TE)


split_logits.defvjp(_split_logits_fwd, _split_logits_bwd)


def split_bf16x3(w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """fp32 `w` as three bfloat16 arrays hi, mid, lo with hi + mid + lo == w exactly for |w| ≥ 2^-110: each part the
  top 16 bits of what is left (bf16's sign, exponent and 7 stored significand bits), so each residual is exact in
  fp32 and the last has at most 8 significant bits. Bit masks, not float roundings: XLA on GPUs may keep a
  float → bf16 → float round trip in fp32 (excess precision), which made the residuals 0 (2026-12-05, H100)."""
  def top_bits(v):
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(v, jnp.uint32) & jnp.uint32(0xFFFF0000),
                                        jnp.float32)
  hi = top_bits(w)
  mid = top_bits(w - hi)
  return hi.astype(jnp.bfloat16), mid.astype(jnp.bfloat16), (w - hi - mid).astype(jnp.bfloat16)


def _kept_groups_mask(biased_TE: jax.Array, n_group: int, topk_group: int) -> jax.Array:
  """bool [T, E]: experts in the `topk_group` groups with the highest top-2 sums."""
  t, e = biased_TE.shape
  grouped_TGX = biased_TE.reshape(t, n_group, e // n_group)
  group_scores_TG = jnp.sum(jax.lax.top_k(grouped_TGX, 2)[0], axis=-1)
  _, kept_TK = jax.lax.top_k(group_scores_TG, topk_group)
  kept_TG = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], kept_TK].set(True)
  return jnp.repeat(kept_TG, e // n_group, axis=-1)


class MoE(nn.Module):
  """Routed experts + shared expert. Expert weights are stacked: gate/up [E, D, F], down [E, F, D].

  Under tp each device holds E/tp consecutive experts and the shared expert's F/tp slice; every
  device routes every token, and the output is this device's partial sum (un-reduced).
  """

  cfg: MtpConfig
  tp: TensorParallel = TensorParallel()

  def setup(self):
    cfg = self.cfg
    e = self.tp.local(cfg.n_routed_experts, "n_routed_experts")
    d, f = cfg.hidden_size, cfg.moe_intermediate_size
    init, pdt = nn.initializers.normal(INIT_STD), dtype_of(cfg.param_dtype)
    self.gate = Router(cfg)
    self.w_gate_EDF = self.param("w_gate_EDF", init, (e, d, f), pdt)
    self.w_up_EDF = self.param("w_up_EDF", init, (e, d, f), pdt)
    self.w_down_EFD = self.param("w_down_EFD", init, (e, f, d), pdt)
    # FP8 kept as stored (jax_mtp.fp8): each weight's block scales beside it
    names = [fp8.scale_name(n) for n in ("w_gate_EDF", "w_up_EDF", "w_down_EFD")]
    self.fp8_scales = (tuple(self.get_variable("params", n) for n in names)
                       if self.has_variable("params", names[0]) else None)
    if cfg.n_shared_experts:
      self.shared_experts = Mlp(cfg, cfg.moe_intermediate_size * cfg.n_shared_experts, self.tp)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    cfg = self.cfg
    x_TD = x_BTD.reshape(-1, cfg.hidden_size)
    ids_TK, weights_TK = self.gate(x_TD)
    self.sow("intermediates", "expert_ids_TK", ids_TK)  # kept only when asked (benchmarks count experts)
    if self.tp.axis is not None:  # this device's experts are [first, first + E/tp)
      first = jax.lax.axis_index(self.tp.axis) * self.w_gate_EDF.shape[0]
      ids_TK, weights_TK = local_assignments(ids_TK - first, weights_TK, self.w_gate_EDF.shape[0])
    # FP8 codes run as the weights they dequantise to: the same impl as a dequantised checkpoint's
    dtype = self.w_gate_EDF.dtype if self.fp8_scales is None else dtype_of(cfg.param_dtype)
    weights = jax.ShapeDtypeStruct(self.w_gate_EDF.shape, dtype)
    impl = resolve_expert_impl(cfg.moe_impl, lowering_platform(), *ids_TK.shape, weights,
                               fp8_codes=self.fp8_scales is not None, hopper=lowering_gpu_is_hopper())
    with jax.named_scope(f"routed_experts_{impl}"):  # the impl traced, in the compiled program (jax_mtp.ran_kernels)
      y_TD = routed_experts(impl, x_TD, ids_TK, weights_TK, self.w_gate_EDF, self.w_up_EDF, self.w_down_EFD,
                            fp8_scales=self.fp8_scales, fp8_block=cfg.fp8_block, dtype=dtype,
                            fp8_matmul_impl=cfg.fp8_matmul_impl)
    y_BTD = y_TD.reshape(x_BTD.shape).astype(x_BTD.dtype)
    if cfg.n_shared_experts:
      y_BTD = y_BTD + self.shared_experts(x_BTD)
    return y_BTD


def local_assignments(local_ids_TK, weights_TK, num_local: int) -> tuple[jax.Array, jax.Array]:
  """Assignments to other devices' experts get id `num_local` (past every group) and weight 0."""
  mine = (local_ids_TK >= 0) & (local_ids_TK < num_local)
  return jnp.where(mine, local_ids_TK, num_local), jnp.where(mine, weights_TK, 0.0)
