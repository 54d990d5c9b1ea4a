"""Parity with an independent reference: Hugging Face transformers' DeepSeek-V3 / V3.2 / GLM-5
decoder layers and `MtpLayer`, tiny random weights, fp32 on CPU (tests/hf_reference.py).

Convention differences from HF, each handled explicitly (reference/deepseek_v32.md §6):
  * HF rotates MLA q_pe/k_pe and returns them de-interleaved; we keep the interleaved layout. Both
    apply the same rotation to q and k, so we compare attention outputs, never rotated q/k.
  * HF's MtpLayer does not zero the embedding at position 0 (vLLM does, and so do we): the test
    zeroes it in the embeddings it hands to HF, and checks that without it the outputs differ.
  * HF's MTP generator feeds the embedded token's position (ours + 1): RoPE is relative, so the same
    layer at shifted positions must give the same hidden — checked.
  * ReLU in the indexer can make exact score ties at the top-k boundary, where any tie-break is
    right: the tests assert the seeds give a clear margin, then demand identical top-k sets.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.block import DecoderBlock
from jax_mtp.cache import init_layer_cache
from jax_mtp.indexer import Selection
from jax_mtp.layers import rotary_for_positions
from tests import hf_params, hf_reference
from tests.tolerances import assert_close

B, T = 2, 12
MODEL_TYPES = ("deepseek_v32", "deepseek_v3", "glm_moe_dsa")
TIE_MARGIN = 1e-4  # top-k boundary gap that float rounding (≤ 1e-6 here) cannot flip


def _configs(model_type: str) -> tuple[dict, jax_mtp.MtpConfig]:
  hf = hf_reference.tiny_hf_config_dict(model_type)
  return hf, jax_mtp.from_hf_config(hf, dtype="float32", param_dtype="float32")


def _inputs(seed: int, d: int):
  rng = np.random.default_rng(seed)
  positions = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy()
  return rng.standard_normal((B, T, d), dtype=np.float32), positions


def _run_block(cfg, layer_idx, params, x, positions, absorb):
  """Our decoder block on a fresh cache of exactly T slots; returns outputs and intermediates."""
  block = DecoderBlock(cfg, layer_idx)
  rotary = rotary_for_positions(cfg.rope, cfg.qk_rope_head_dim, jnp.asarray(positions))
  apply = jax.jit(functools.partial(block.apply, absorb=absorb, capture_intermediates=True))
  out, state = apply({"params": params}, jnp.asarray(x), jnp.asarray(positions), rotary,
                     init_layer_cache(cfg, B, T))
  return out, state["intermediates"]


def _assert_clear_topk_margin(scores_BTS: np.ndarray, k: int) -> None:
  """The k-th and (k+1)-th visible scores of every row with more than k visible keys differ."""
  for b, t in np.ndindex(scores_BTS.shape[:2]):
    row = np.sort(scores_BTS[b, t][np.isfinite(scores_BTS[b, t])])[::-1]
    if row.size > k:
      assert row[k - 1] - row[k] > TIE_MARGIN, f"seed gives a top-k tie at row ({b}, {t}): pick another"


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("layer_idx", [0, 1], ids=["dense", "moe"])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_decoder_block_matches_hf(model_type, layer_idx, absorb):
  hf_cfg, cfg = _configs(model_type)
  module = hf_reference.build_hf_decoder_layer(hf_cfg, layer_idx, seed=2)
  params = hf_params.block_params(hf_reference.hf_state_dict_numpy(module))
  x, positions = _inputs(seed=1, d=cfg.hidden_size)
  ref = hf_reference.run_hf_decoder_layer(module, hf_cfg, x, positions)
  if cfg.has_indexer:
    _assert_clear_topk_margin(ref["index_scores"], cfg.index_topk)

  (y, residual, _), inter = _run_block(cfg, layer_idx, params, x, positions, absorb)
  assert_close(inter["self_attn"]["__call__"][0][0], ref["attn_out"], what="attention output")
  assert_close(y + residual, ref["out"], what="block output")
  if cfg.is_moe_layer(layer_idx):
    ids, weights = inter["mlp"]["gate"]["__call__"][0]
    order = np.argsort(np.asarray(ids), axis=-1)
    np.testing.assert_array_equal(np.sort(ids, axis=-1).reshape(B, T, -1), ref["router_topk_indices"])
    assert_close(np.take_along_axis(np.asarray(weights), order, -1).reshape(B, T, -1),
                 ref["router_topk_weights"], what="router weights")
  if cfg.has_indexer:
    selection = Selection(*inter["self_attn"]["indexer"]["__call__"][0][0])
    keep = np.asarray(selection.mask(T))
    np.testing.assert_array_equal(keep, ref["index_mask"])
    assert keep[:, -1].sum(-1).max() == cfg.index_topk < T  # the sparse path really ran


def _mtp_setup(model_type: str, seed: int = 2):
  hf_cfg, cfg = _configs(model_type)
  module = hf_reference.build_hf_mtp_layer(hf_cfg, seed=seed)
  rng = np.random.default_rng(seed)
  embed_VD = rng.standard_normal((cfg.vocab_size, cfg.hidden_size), dtype=np.float32)
  head_VD = rng.standard_normal((cfg.vocab_size, cfg.hidden_size), dtype=np.float32) / 8
  params = {"embed_tokens": embed_VD, "lm_head": head_VD,
            "layers_0": hf_params.mtp_layer_params(hf_reference.hf_state_dict_numpy(module))}
  ids = rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int32)
  prev_hidden, positions = _inputs(seed + 1, cfg.hidden_size)
  return hf_cfg, cfg, module, params, ids, positions, prev_hidden


def _run_mtp(cfg, params, ids, positions, prev_hidden):
  model = jax_mtp.MtpPredictor(cfg)
  out = model.apply({"params": params}, ids, positions, prev_hidden, jax_mtp.init_caches(cfg, B, T))
  logits = model.apply({"params": params}, out.hidden_BTD, method=model.compute_logits)
  tokens = model.apply({"params": params}, out.hidden_BTD, method=model.get_top_tokens)
  return out, np.asarray(logits), np.asarray(tokens)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_mtp_layer_hidden_logits_and_drafts_match_hf(model_type):
  hf_cfg, cfg, module, params, ids, positions, prev_hidden = _mtp_setup(model_type)
  embeds = np.where(positions[..., None] == 0, 0, params["embed_tokens"][ids])  # vLLM's position-0 zeroing
  if cfg.has_indexer:
    ref_hidden, index_scores = hf_reference.run_hf_mtp_layer(module, hf_cfg, embeds, prev_hidden, positions,
                                                             with_index_scores=True)
    _assert_clear_topk_margin(index_scores, cfg.index_topk)
  else:
    ref_hidden = hf_reference.run_hf_mtp_layer(module, hf_cfg, embeds, prev_hidden, positions)
  ref_logits = ref_hidden.astype(np.float64) @ params["lm_head"].T.astype(np.float64)

  out, logits, tokens = _run_mtp(cfg, params, ids, positions, prev_hidden)
  assert_close(out.hidden_BTD, ref_hidden, what="MTP hidden")
  assert out.next_prev_hidden_BTD is out.hidden_BTD  # post-norm recycling
  assert_close(logits, ref_logits, what="MTP logits")
  top2 = np.sort(ref_logits, axis=-1)[..., -2:]
  assert np.all(top2[..., 1] - top2[..., 0] > TIE_MARGIN), "seed gives an argmax near-tie: pick another"
  np.testing.assert_array_equal(tokens, np.argmax(ref_logits, axis=-1))


def test_mtp_layer_matches_hf_generator_positions_and_zeroing_matters():
  """HF's generator runs the MTP layer at position + 1 and does not zero position 0."""
  hf_cfg, cfg, module, params, ids, positions, prev_hidden = _mtp_setup("deepseek_v32")
  embeds = params["embed_tokens"][ids]
  zeroed = np.where(positions[..., None] == 0, 0, embeds)
  out, _, _ = _run_mtp(cfg, params, ids, positions, prev_hidden)

  shifted, index_scores = hf_reference.run_hf_mtp_layer(module, hf_cfg, zeroed, prev_hidden, positions + 1,
                                                        with_index_scores=True)
  _assert_clear_topk_margin(index_scores, cfg.index_topk)
  assert_close(out.hidden_BTD, shifted, what="MTP hidden vs HF at positions + 1")
  unzeroed = hf_reference.run_hf_mtp_layer(module, hf_cfg, embeds, prev_hidden, positions)
  assert np.max(np.abs(np.asarray(out.hidden_BTD)[:, 0] - unzeroed[:, 0])) > 1e-2
