"""Properties of our MTP predictor on its own: cache equivalences, layer selection, recycling, dtypes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from tests.tolerances import assert_close

B, T = 2, 12
CAPACITY = 12  # > tiny index_topk (4): the DSA indexer runs in every call


@pytest.fixture(scope="module")
def setup():
  cfg = jax_mtp.tiny()
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int32))
  hidden = jnp.asarray(rng.standard_normal((B, T, cfg.hidden_size), dtype=np.float32))
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return cfg, params, ids, hidden, positions


@functools.cache
def _jitted_step(cfg, spec_step_idx: int, absorb: bool | None):
  model = jax_mtp.MtpPredictor(cfg)
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a, spec_step_idx=spec_step_idx, absorb=absorb))


def _step(cfg, params, ids, positions, hidden, caches, spec_step_idx=0, absorb=None):
  return _jitted_step(cfg, spec_step_idx, absorb)(params, ids, positions, hidden, caches)


def _full(cfg, params, ids, hidden, positions, **kw):
  return _step(cfg, params, ids, positions, hidden, jax_mtp.init_caches(cfg, B, CAPACITY), **kw)


def _prefill_then_decode(cfg, params, ids, hidden, positions, prefill: int):
  """Prefill `prefill` tokens (naive MLA), then one token per call (absorbed MLA)."""
  out = _step(cfg, params, ids[:, :prefill], positions[:, :prefill], hidden[:, :prefill],
              jax_mtp.init_caches(cfg, B, CAPACITY))
  hiddens, caches = [out.hidden_BTD], out.caches
  for t in range(prefill, T):
    out = _step(cfg, params, ids[:, t:t + 1], positions[:, t:t + 1], hidden[:, t:t + 1], caches)
    hiddens.append(out.hidden_BTD)
    caches = out.caches
  return jnp.concatenate(hiddens, axis=1), caches


@pytest.mark.parametrize("prefill", [1, 5, 11])
def test_prefill_then_decode_equals_one_full_forward(setup, prefill):
  cfg, params, ids, hidden, positions = setup
  full = _full(cfg, params, ids, hidden, positions)
  incremental, caches = _prefill_then_decode(cfg, params, ids, hidden, positions, prefill)
  assert_close(incremental, full.hidden_BTD, what=f"prefill {prefill} + decode vs full")
  for ours, theirs in zip(jax.tree.leaves(caches), jax.tree.leaves(full.caches), strict=True):
    assert_close(ours, theirs, what="caches")


def test_naive_and_absorbed_mla_agree(setup):
  cfg, params, ids, hidden, positions = setup
  naive = _full(cfg, params, ids, hidden, positions, absorb=False)
  absorbed = _full(cfg, params, ids, hidden, positions, absorb=True)
  assert_close(absorbed.hidden_BTD, naive.hidden_BTD, what="absorbed vs naive")


def test_rollback_by_overwriting_stale_slots(setup):
  """Decoding past length L and then rewriting from L gives what a fresh run gives: stale cache
  slots beyond a query's position are never read."""
  cfg, params, ids, hidden, positions = setup
  _, caches = _prefill_then_decode(cfg, params, ids, hidden, positions, prefill=4)  # slots 0..11 filled
  keep = 8
  other_ids = (ids[:, keep:] + 7) % cfg.vocab_size
  rewritten = _step(cfg, params, other_ids, positions[:, keep:], hidden[:, keep:], caches)
  fresh_ids = jnp.concatenate([ids[:, :keep], other_ids], axis=1)
  fresh = _full(cfg, params, fresh_ids, hidden, positions)
  assert_close(rewritten.hidden_BTD, fresh.hidden_BTD[:, keep:], what="after rollback")


def test_position_zero_ignores_its_token(setup):
  cfg, params, ids, hidden, positions = setup
  changed = ids.at[:, 0].set((ids[:, 0] + 1) % cfg.vocab_size)
  a = _full(cfg, params, ids, hidden, positions).hidden_BTD
  b = _full(cfg, params, changed, hidden, positions).hidden_BTD
  np.testing.assert_array_equal(a, b)  # the embedding at position 0 is zeroed before enorm
  changed = ids.at[:, 1].set((ids[:, 1] + 1) % cfg.vocab_size)
  assert not np.allclose(_full(cfg, params, changed, hidden, positions).hidden_BTD[:, 1], a[:, 1])


def test_spec_step_selects_layer_modulo_num_layers():
  cfg = jax_mtp.tiny(num_nextn_predict_layers=2)
  params = jax_mtp.init_params(cfg, jax.random.key(1))
  assert set(params) == {"embed_tokens", "lm_head", "layers_0", "layers_1"}
  ids = jnp.ones((1, 3), jnp.int32)
  positions = jnp.arange(1, 4, dtype=jnp.int32)[None]
  hidden = jax.random.normal(jax.random.key(2), (1, 3, cfg.hidden_size))
  caches = jax_mtp.init_caches(cfg, 1, 8)
  outs = [_step(cfg, params, ids, positions, hidden, caches, spec_step_idx=i) for i in range(4)]
  np.testing.assert_array_equal(outs[0].hidden_BTD, outs[2].hidden_BTD)
  np.testing.assert_array_equal(outs[1].hidden_BTD, outs[3].hidden_BTD)
  assert not np.allclose(outs[0].hidden_BTD, outs[1].hidden_BTD)
  # Only the selected layer's cache is written.
  np.testing.assert_array_equal(outs[1].caches[0].latent_BSC, caches[0].latent_BSC)
  assert np.any(outs[1].caches[1].latent_BSC != 0)


def test_greedy_tokens_are_argmax_of_logits_and_jit_matches_eager(setup):
  cfg, params, ids, hidden, positions = setup
  model = jax_mtp.MtpPredictor(cfg)
  caches = jax_mtp.init_caches(cfg, B, CAPACITY)
  eager = model.apply({"params": params}, ids, positions, hidden, caches)
  jitted = jax.jit(lambda p, *a: model.apply({"params": p}, *a))(params, ids, positions, hidden, caches)
  assert_close(jitted.hidden_BTD, eager.hidden_BTD, what="jit vs eager")
  logits = model.apply({"params": params}, eager.hidden_BTD, method=model.compute_logits)
  tokens = model.apply({"params": params}, eager.hidden_BTD, method=model.get_top_tokens)
  assert logits.dtype == jnp.float32 and logits.shape == (B, T, cfg.vocab_size)
  assert tokens.dtype == jnp.int32
  np.testing.assert_array_equal(tokens, jnp.argmax(logits, axis=-1))


def test_bf16_model_tracks_fp32(setup):
  cfg, params, ids, hidden, positions = setup
  cfg16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  params16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16) if p.dtype == jnp.float32 else p, params)
  # The router and the indexer's weights_proj / k_norm stay fp32, as in HF and the official code.
  params16["layers_0"]["mtp_block"]["mlp"]["gate"] = params["layers_0"]["mtp_block"]["mlp"]["gate"]
  out16 = _full(cfg16, params16, ids, hidden, positions)
  out32 = _full(cfg, params, ids, hidden, positions)
  assert out16.hidden_BTD.dtype == jnp.bfloat16
  assert_close(out16.hidden_BTD.astype(jnp.float32), out32.hidden_BTD, dtype="bfloat16", what="bf16 vs fp32")


