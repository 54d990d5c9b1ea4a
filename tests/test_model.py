"""The target model: HF-shaped param tree, post-norm hidden, prefill-then-decode == one full forward,
tensor parallelism."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.sharding import jit_per_shard, make_mesh, param_specs, replicated, shard_params, tensor_parallel
from tests.tolerances import assert_close

B, T, CAPACITY = 2, 12, 16  # capacity > tiny index_topk (4): the DSA indexer runs in every layer


@functools.cache
def _setup():
  cfg = jax_mtp.tiny()
  params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int32))
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return cfg, params, ids, positions


@functools.cache
def _forward(cfg):
  model = jax_mtp.TargetModel(cfg)
  return jax.jit(lambda p, ids, positions, caches: model.apply({"params": p}, ids, positions, caches))


def _full(cfg, params, ids, positions):
  return _forward(cfg)(params, ids, positions, jax_mtp.init_target_caches(cfg, B, CAPACITY))


def test_param_tree_mirrors_hf_names():
  """`embed_tokens`, `layers_{i}` (dense MLP below first_k_dense_replace, MoE + DSA after), `norm`,
  `lm_head` — HF's `model.embed_tokens`, `model.layers.{i}`, `model.norm`, `lm_head`."""
  cfg, params, _, _ = _setup()
  assert set(params) == {"embed_tokens", "layers_0", "layers_1", "norm", "lm_head"}
  assert set(params["layers_0"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}  # first_k_dense_replace=1
  assert {"gate", "w_gate_EDF", "w_up_EDF", "w_down_EFD", "shared_experts"} == set(params["layers_1"]["mlp"])
  assert "indexer" in params["layers_1"]["self_attn"]
  assert params["embed_tokens"].shape == params["lm_head"].shape == (cfg.vocab_size, cfg.hidden_size)


def test_hidden_is_post_final_norm():
  """The returned hidden is norm's output: divided by the norm weight, every token has unit RMS (with an eps far
  below the residual's mean square, ~1e-3 at this init, where tiny's 1e-6 would take 5e-4 off it)."""
  cfg, params, ids, positions = _setup()
  cfg = cfg.replace(rms_norm_eps=1e-12)
  weight = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, cfg.hidden_size), jnp.float32)
  params = {**params, "norm": {"weight": weight}}
  hidden = _full(cfg, params, ids, positions).hidden_BTD
  assert hidden.shape == (B, T, cfg.hidden_size) and hidden.dtype == jnp.float32
  rms = jnp.sqrt(jnp.mean((hidden / weight) ** 2, axis=-1))
  assert_close(rms, jnp.ones_like(rms), what="RMS of hidden / norm weight")


@pytest.mark.parametrize("prefill", [1, 5, 11])
def test_prefill_then_decode_equals_one_full_forward(prefill):
  """Prefill `prefill` tokens (naive MLA), then one token per call (absorbed MLA): the same hidden
  states, caches and greedy tokens as one forward over all T tokens."""
  cfg, params, ids, positions = _setup()
  full = _full(cfg, params, ids, positions)
  out = _forward(cfg)(params, ids[:, :prefill], positions[:, :prefill], jax_mtp.init_target_caches(cfg, B, CAPACITY))
  hiddens, caches = [out.hidden_BTD], out.caches
  for t in range(prefill, T):
    out = _forward(cfg)(params, ids[:, t:t + 1], positions[:, t:t + 1], caches)
    hiddens.append(out.hidden_BTD)
    caches = out.caches
  incremental = jnp.concatenate(hiddens, axis=1)
  assert_close(incremental, full.hidden_BTD, what=f"prefill {prefill} + decode vs full")
  for ours, theirs in zip(jax.tree.leaves(caches), jax.tree.leaves(full.caches), strict=True):
    assert_close(ours, theirs, what="caches")
  model = jax_mtp.TargetModel(cfg)
  top = functools.partial(model.apply, {"params": params}, method=model.get_top_tokens)
  np.testing.assert_array_equal(top(incremental), top(full.hidden_BTD))


def test_logits_and_greedy_tokens():
  cfg, params, ids, positions = _setup()
  model = jax_mtp.TargetModel(cfg)
  hidden = _full(cfg, params, ids, positions).hidden_BTD
  logits = model.apply({"params": params}, hidden, method=model.compute_logits)
  tokens = model.apply({"params": params}, hidden, method=model.get_top_tokens)
  assert logits.shape == (B, T, cfg.vocab_size) and logits.dtype == jnp.float32
  assert tokens.dtype == jnp.int32
  np.testing.assert_array_equal(tokens, jnp.argmax(logits, axis=-1))


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_target_matches_unsharded(tp):
  """Under shard_map at tp = 2, 4 (vocab-parallel embed/head, head-split MLA, expert-split MoE, psum
  between layers, the fused final norm) the hidden, logits, caches and greedy tokens equal tp = 1."""
  cfg, params, ids, positions = _setup()
  ref = _full(cfg, params, ids, positions)
  ref_logits = jax_mtp.TargetModel(cfg).apply({"params": params}, ref.hidden_BTD,
                                              method=jax_mtp.TargetModel.compute_logits)
  model, mesh = jax_mtp.TargetModel(cfg, tensor_parallel(tp)), make_mesh(tp)
  placed = shard_params(params, cfg, mesh)

  def per_shard(p, ids, positions):
    variables = {"params": p}
    out = model.apply(variables, ids, positions, jax_mtp.init_target_caches(cfg, B, CAPACITY))
    return (out, model.apply(variables, out.hidden_BTD, method=model.compute_logits),
            model.apply(variables, out.hidden_BTD, method=model.get_top_tokens))

  rep = replicated()
  out, logits, tokens = jit_per_shard(per_shard, mesh, (param_specs(placed), rep, rep))(placed, ids, positions)
  assert_close(out.hidden_BTD, ref.hidden_BTD, what=f"hidden at tp={tp}")
  assert_close(logits, ref_logits, what=f"logits at tp={tp}")
  for ours, theirs in zip(jax.tree.leaves(out.caches), jax.tree.leaves(ref.caches), strict=True):
    assert_close(ours, theirs, what=f"caches at tp={tp}")
  np.testing.assert_array_equal(tokens, jnp.argmax(ref_logits, axis=-1))


def test_wrong_number_of_caches_is_an_error():
  cfg, params, ids, positions = _setup()
  with pytest.raises(ValueError, match="got 1 caches for num_hidden_layers=2"):
    jax_mtp.TargetModel(cfg).apply({"params": params}, ids, positions, jax_mtp.init_target_caches(cfg, B, 16)[:1])
