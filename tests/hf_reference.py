"""Independent torch / HF-transformers (5.24) reference for the `jax_mtp` parity tests.

Everything here is fp32, CPU, eager attention (``config._attn_implementation = "eager"``, so the V3.2
indexer's top-k is folded into a boolean/additive mask) and eager experts, with no KV cache. Weights
are re-randomised from a ``torch.Generator(seed)`` so that norms != 1 and biases != 0:
norm weights ``1 + 0.1 N``, LayerNorm bias / ``e_score_correction_bias`` / other 1-D ``0.1 N``,
matrices ``N / sqrt(fan_in)``. Same seed => bit-identical weights and outputs.

Conventions (all verified against the installed HF source):
* ``cfg`` is a plain JSON-able HF ``config.json`` dict (see ``tiny_hf_config_dict``); legacy
  ``rope_theta`` + ``rope_scaling`` are mapped by HF onto ``rope_parameters`` (YaRN + mscale applied).
* Linear weights are torch layout ``[out, in]`` (y = x @ W.T). Fused experts:
  ``mlp.experts.gate_up_proj`` [E, 2F, D] -- rows [:F] = gate, rows [F:] = up (``.chunk(2)``);
  ``mlp.experts.down_proj`` [E, D, F]. ``mlp.gate.weight`` [E, D] router (fp32),
  ``mlp.gate.e_score_correction_bias`` [E] (buffer, in the state dict).
* MLA ``q_b_proj`` rows per head are ``[nope | rope]``; ``kv_a_proj_with_mqa`` rows are
  ``[kv_lora | rope]``; ``kv_b_proj`` rows per head are ``[k_nope | v]``. The rope slices use the
  DeepSeek **interleaved** pair layout (pairs (2i, 2i+1)); HF rotates them and returns
  ``[evens' | odds']`` (de-interleaved), identically for q and k, so scores are unchanged.
* Indexer: ``wq_b`` [H_I*d_I, q_lora], per head ``[rope | pass]`` (rope FIRST); ``wk`` [d_I, D]
  -> LayerNorm(eps=1e-6, weight+bias) -> ``[rope | pass]``. V3.2 uses NeoX ``rotate_half`` rope
  (pairs (i, i+r/2)), GLM-MoE-DSA uses the interleaved rope.
* Causal mask: explicit additive fp32 ``[B, 1, T, T]`` (0 / finfo.min) over *sequence index*;
  ``positions`` only drive RoPE. HF's indexer adds this mask before ``topk(min(index_topk, T))``.
* Norm eps: layer/MTP RMSNorms use ``rms_norm_eps``; ``q_a_layernorm``/``kv_a_layernorm`` are hard-coded
  1e-6 in HF (matters for GLM, whose ``rms_norm_eps`` is 1e-5).
* MTP: built at ``layer_idx = num_hidden_layers`` on a config whose per-layer lists
  (``mlp_layer_types``, ``layer_types``, GLM ``indexer_types``) are extended by one sparse/full entry.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from transformers import CONFIG_MAPPING
from transformers.modeling_layers import MtpLayer
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as _v3
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as _v32
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as _glm


class _GlmMtpBlock(_glm.GlmMoeDsaDecoderLayer):
    """GLM's decoder layer returns ``(hidden, topk_indices)``; MtpLayer expects a tensor."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)[0]


class _IndexerTopkSpy(TorchFunctionMode):
    """Records the input of ``topk`` calls made while ``active`` (i.e. inside the indexer forward)."""

    def __init__(self):
        super().__init__()
        self.active, self.seen = False, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.active and func in (torch.Tensor.topk, torch.topk):
            self.seen.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


# model_type -> (decoder layer class, MTP block class, RMSNorm class, rotary class)
_CLASSES = {
    "deepseek_v3": (_v3.DeepseekV3DecoderLayer, _v3.DeepseekV3DecoderLayer, _v3.DeepseekV3RMSNorm,
                    _v3.DeepseekV3RotaryEmbedding),
    "deepseek_v32": (_v32.DeepseekV32DecoderLayer, _v32.DeepseekV32DecoderLayer, _v32.DeepseekV32RMSNorm,
                     _v32.DeepseekV32RotaryEmbedding),
    "glm_moe_dsa": (_glm.GlmMoeDsaDecoderLayer, _GlmMtpBlock, _glm.GlmMoeDsaRMSNorm,
                    _glm.GlmMoeDsaRotaryEmbedding),
}


def tiny_hf_config_dict(model_type: str = "deepseek_v32", **overrides) -> dict:
    """Tiny HF config.json-style dict (qk_head_dim 24 -> YaRN mscale^2 = (0.1 ln 40 + 1)^2 on 24^-0.5)."""
    d = dict(
        model_type=model_type, architectures=None, vocab_size=256, hidden_size=64,
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
        moe_layer_freq=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu", rms_norm_eps=1e-6,
        max_position_embeddings=640, rope_theta=10000.0,
        rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=16, beta_fast=32,
                          beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
        index_n_heads=4, index_head_dim=16, index_topk=4, num_nextn_predict_layers=1,
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
        initializer_range=0.02, bos_token_id=0, eos_token_id=1,
    )
    if model_type == "deepseek_v3":
        for k in ("index_n_heads", "index_head_dim", "index_topk"):
            d.pop(k)
    elif model_type == "glm_moe_dsa":  # GLM-5 style: default RoPE, interleaved indexer rope, 1 group
        d.update(qk_nope_head_dim=24, v_head_dim=32, n_group=1, topk_group=1, rms_norm_eps=1e-5,
                 rope_theta=1e6, rope_scaling=None, rope_interleave=True, indexer_rope_interleave=True)
    elif model_type != "deepseek_v32":
        raise ValueError(f"unsupported model_type {model_type!r}")
    d["architectures"] = [{"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM",
                           "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[model_type]]
    d.update(overrides)
    return d


def _hf_config(cfg: dict, mtp: bool = False):
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    c = CONFIG_MAPPING[cfg["model_type"]](**kw)
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"
    if mtp:  # the MTP block sits at layer_idx = num_hidden_layers: extend the per-layer lists by one
        for name, val in (("mlp_layer_types", "sparse"), ("layer_types", "indexed_attention"),
                          ("indexer_types", "full")):
            if getattr(c, name, None) is not None:
                setattr(c, name, list(getattr(c, name)) + [val])
    return c


def _randomize_(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    norm_types = (nn.LayerNorm,) + tuple(v[2] for v in _CLASSES.values())
    norms = {n for n, m in module.named_modules() if isinstance(m, norm_types)}
    tensors = list(module.named_parameters()) + [
        (n, b) for n, b in module.named_buffers() if n.endswith("e_score_correction_bias")]
    with torch.no_grad():
        for name, t in tensors:
            owner, leaf = name.rpartition(".")[0], name.rpartition(".")[2]
            noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
            if owner in norms and leaf == "weight":
                t.copy_(1.0 + 0.1 * noise)
            elif t.ndim == 1:  # LayerNorm bias, e_score_correction_bias, any other bias
                t.copy_(0.1 * noise)
            else:  # [out, in] or fused experts [E, out, in]: fan_in is the last dim
                t.copy_(noise / math.sqrt(t.shape[-1]))
    return module.float().eval()


def build_hf_decoder_layer(cfg: dict, layer_idx: int, seed: int) -> nn.Module:
    """HF decoder layer (MoE iff layer_idx >= first_k_dense_replace), fp32, eval, randomised."""
    layer_cls = _CLASSES[cfg["model_type"]][0]
    return _randomize_(layer_cls(_hf_config(cfg), layer_idx), seed)


def build_hf_mtp_layer(cfg: dict, seed: int) -> MtpLayer:
    """``MtpLayer(config, DecoderLayer, RMSNorm, layer_idx=num_hidden_layers)``, fp32, eval, randomised.

    Params: ``enorm.weight``, ``hnorm.weight`` [D]; ``eh_proj.weight`` [D, 2D] (input = [enorm(e) | hnorm(h)]);
    ``mtp_block.*`` (an MoE decoder layer, same names as ``build_hf_decoder_layer``); ``post_norm.weight`` [D]
    (= checkpoint ``shared_head.norm``). For GLM the block is a thin subclass dropping the top-k output.
    """
    _, block_cls, norm_cls, _ = _CLASSES[cfg["model_type"]]
    c = _hf_config(cfg, mtp=True)
    return _randomize_(MtpLayer(c, block_cls, norm_cls, layer_idx=c.num_hidden_layers), seed)


def hf_state_dict_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """``{name: float32 ndarray}`` of params + persistent buffers, module-relative torch names/layouts.

    Linear ``*.weight`` are ``[out, in]``; ``mlp.experts.gate_up_proj`` ``[E, 2F, D]`` (gate rows first),
    ``mlp.experts.down_proj`` ``[E, D, F]``; ``mlp.gate.weight`` ``[E, D]``; norms ``[dim]``;
    ``self_attn.indexer.k_norm.{weight,bias}`` ``[d_I]`` (LayerNorm, eps 1e-6).
    """
    return {k: v.detach().to(torch.float32).numpy().copy() for k, v in module.state_dict().items()}


def _inputs(cfg: dict, x: np.ndarray, positions: np.ndarray):
    x = torch.as_tensor(np.asarray(x, np.float32))
    pos = torch.as_tensor(np.asarray(positions, np.int64))
    B, T = pos.shape
    rotary = _CLASSES[cfg["model_type"]][3](_hf_config(cfg))
    cos_sin = rotary(x, pos)  # each [B, T, qk_rope_head_dim], (cat(f, f)) layout, * attention_scaling
    neg = torch.finfo(torch.float32).min
    mask = torch.full((T, T), neg).triu(1)[None, None].expand(B, 1, T, T).contiguous()
    return x, pos, cos_sin, mask


def run_hf_decoder_layer(module: nn.Module, cfg: dict, hidden_TD: np.ndarray, positions: np.ndarray) -> dict:
    """Full causal no-cache forward of one decoder layer on ``hidden_TD`` [B, T, D].

    Returns float32 ``out`` [B, T, D] and ``attn_out`` [B, T, D] (o_proj output, before the residual add);
    for MoE layers ``router_topk_indices`` int [B, T, K] (sorted ascending) and matching
    ``router_topk_weights`` [B, T, K] (normalised, times routed_scaling_factor); for DSA layers the raw
    indexer output ``topk_indices`` int32 [B, T, min(index_topk, T)] (rows with < k visible keys also
    contain masked future keys, in arbitrary order), ``index_mask`` bool [B, T, T] = selected AND causal,
    i.e. the keys the MLA softmax really attends, and ``index_scores`` float32 [B, T, T], the exact tensor
    HF top-k's (future keys set to -inf). ReLU makes exact ties (score 0) possible: check the k-th vs
    (k+1)-th margin before demanding identical selections.
    """
    x, pos, cos_sin, mask = _inputs(cfg, hidden_TD, positions)
    B, T, _ = x.shape
    cap, hooks = {}, []
    attn = module.self_attn
    hooks.append(attn.register_forward_hook(lambda m, a, o: cap.__setitem__("attn_out", o[0])))
    spy = _IndexerTopkSpy()
    if getattr(attn, "indexer", None) is not None:
        def _indexer_done(m, a, o):  # (a hook returning non-None would replace the output)
            spy.active = False
            cap["topk"] = o

        hooks.append(attn.indexer.register_forward_pre_hook(lambda m, a: setattr(spy, "active", True)))
        hooks.append(attn.indexer.register_forward_hook(_indexer_done))
    if hasattr(module.mlp, "gate"):
        hooks.append(module.mlp.gate.register_forward_hook(lambda m, a, o: cap.__setitem__("router", o)))
    try:
        with torch.no_grad(), spy:
            out = module(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin, cache=None)
    finally:
        for h in hooks:
            h.remove()
    out = out[0] if isinstance(out, tuple) else out
    res = {"out": out.numpy().copy(), "attn_out": cap["attn_out"].numpy().copy()}
    if "router" in cap:
        _, w, idx = cap["router"]
        idx, order = idx.sort(dim=-1)
        res["router_topk_indices"] = idx.reshape(B, T, -1).numpy().copy()
        res["router_topk_weights"] = w.gather(-1, order).reshape(B, T, -1).numpy().copy()
    if "topk" in cap:
        topk = cap["topk"].long()
        sel = torch.zeros(B, T, T, dtype=torch.bool).scatter(-1, topk, True)
        res["topk_indices"] = topk.to(torch.int32).numpy().copy()
        res["index_mask"] = (sel & (mask[:, 0] == 0)).numpy().copy()
        (scores,) = spy.seen
        res["index_scores"] = scores.masked_fill(mask[:, 0] != 0, float("-inf")).numpy().copy()
    return res


def run_hf_mtp_layer(module: MtpLayer, cfg: dict, inputs_embeds: np.ndarray, prev_hidden: np.ndarray,
                     positions: np.ndarray, *, with_index_scores: bool = False):
    """``post_norm(block(eh_proj([enorm(inputs_embeds) | hnorm(prev_hidden)])))`` -> float32 [B, T, D].

    The caller does the embedding lookup (of the *next* tokens) and any position-0 zeroing. With
    ``with_index_scores`` returns ``(hidden, index_scores [B, T, T])`` (future keys -inf), the scores
    the block's indexer ran top-k on, so callers can check the top-k boundary margin.
    """
    e, pos, cos_sin, mask = _inputs(cfg, inputs_embeds, positions)
    h = torch.as_tensor(np.asarray(prev_hidden, np.float32))
    spy, hooks = _IndexerTopkSpy(), []
    indexer = getattr(module.mtp_block.self_attn, "indexer", None)
    if with_index_scores:
        hooks.append(indexer.register_forward_pre_hook(lambda m, a: setattr(spy, "active", True)))
        hooks.append(indexer.register_forward_hook(lambda m, a, o: setattr(spy, "active", False)))
    try:
        with torch.no_grad(), spy:
            out = module(inputs_embeds=e, previous_hidden_state=h, position_embeddings=cos_sin,
                         attention_mask=mask, position_ids=pos, cache=None)
    finally:
        for hook in hooks:
            hook.remove()
    if not with_index_scores:
        return out.numpy().copy()
    (scores,) = spy.seen
    return out.numpy().copy(), scores.masked_fill(mask[:, 0] != 0, float("-inf")).numpy().copy()


def hf_config_object(cfg: dict, mtp: bool = False):
    """The HF config object the builders use (e.g. to read ``.rope_parameters``); a fresh deep copy."""
    return copy.deepcopy(_hf_config(cfg, mtp))
