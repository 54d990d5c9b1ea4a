"""The MTP draft step under shard_map gives the TP=1 (unsharded) result at tp = 1, 2, 4, 8."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import jax_mtp
from jax_mtp import ShardedMtp
from jax_mtp.sharding import make_mesh, param_spec, validate_tp
from tests.tolerances import assert_close

B, T, CAPACITY = 2, 12, 16  # capacity > index_topk: the DSA indexer runs
TPS = (1, 2, 4, 8)


@functools.cache
def _setup(vocab_size: int, dtype: str):
  cfg = jax_mtp.tiny(vocab_size=vocab_size, dtype=dtype, param_dtype=dtype)
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, vocab_size, (B, T), dtype=np.int32))
  hidden = jnp.asarray(rng.standard_normal((B, T, cfg.hidden_size), dtype=np.float32)).astype(dtype)
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return cfg, params, ids, positions, hidden


@functools.cache
def _unsharded(vocab_size: int, dtype: str):
  cfg, params, ids, positions, hidden = _setup(vocab_size, dtype)
  model = jax_mtp.MtpPredictor(cfg)
  out = jax.jit(lambda p, *a: model.apply({"params": p}, *a))(params, ids, positions, hidden,
                                                              jax_mtp.init_caches(cfg, B, CAPACITY))
  logits = model.apply({"params": params}, out.hidden_BTD, method=model.compute_logits)
  return out, logits


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("vocab_size", [256, 250], ids=["vocab256", "vocab250-padded"])
def test_sharded_step_matches_unsharded(tp, vocab_size):
  cfg, params, ids, positions, hidden = _setup(vocab_size, "float32")
  ref, ref_logits = _unsharded(vocab_size, "float32")
  sharded = ShardedMtp(cfg, make_mesh(tp))
  placed = sharded.shard(params)
  caches = jax_mtp.init_caches(cfg, B, CAPACITY)
  top = sharded(placed, ids, positions, hidden, caches, path="top_tokens")
  full = sharded(placed, ids, positions, hidden, caches, path="logits")

  assert_close(top.hidden_BTD, ref.hidden_BTD, what=f"hidden at tp={tp}")
  assert_close(full.logits_BTV, ref_logits, what=f"logits at tp={tp}")
  np.testing.assert_array_equal(top.tokens_BT, jnp.argmax(full.logits_BTV, axis=-1))
  np.testing.assert_array_equal(top.tokens_BT, jnp.argmax(ref_logits, axis=-1))
  for ours, theirs in zip(jax.tree.leaves(top.caches), jax.tree.leaves(ref.caches), strict=True):
    assert_close(ours, theirs, what="caches")


@pytest.mark.parametrize("tp", [2, 8])
def test_bf16_sharded_step_tracks_unsharded(tp):
  cfg, params, ids, positions, hidden = _setup(256, "bfloat16")
  ref, _ = _unsharded(256, "bfloat16")
  sharded = ShardedMtp(cfg, make_mesh(tp))
  top = sharded(sharded.shard(params), ids, positions, hidden, jax_mtp.init_caches(cfg, B, CAPACITY))
  assert top.hidden_BTD.dtype == jnp.bfloat16
  assert_close(top.hidden_BTD.astype(jnp.float32), ref.hidden_BTD.astype(jnp.float32), dtype="bfloat16",
               what=f"bf16 hidden at tp={tp}")


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_tail_matches_fused_tail(tp):
  """vLLM's SP tail (reduce-scatter tokens, norm, all-gather) gives the same hidden, T % tp ≠ 0 too."""
  cfg, params, ids, positions, hidden = _setup(256, "float32")
  ref, _ = _unsharded(256, "float32")
  sharded = ShardedMtp(cfg, make_mesh(tp), sequence_parallel=True)
  for t in (T, T - 1):  # 2·11 = 22 tokens is not a multiple of 4
    out = sharded(sharded.shard(params), ids[:, :t], positions[:, :t], hidden[:, :t],
                  jax_mtp.init_caches(cfg, B, CAPACITY))
    assert_close(out.hidden_BTD, ref.hidden_BTD[:, :t], what=f"SP hidden at tp={tp}, T={t}")


def test_sequence_parallel_refuses_a_fused_norm_it_would_not_run():
  """The SP tail is XLA's reduce-scatter form: asking for a Pallas norm beside it is one error, not ignored."""
  cfg = _setup(256, "float32")[0]
  with pytest.raises(ValueError, match="sequence_parallel=True runs the tail's reduce \\+ norm as XLA's .* "
                                       "norm_impl='pallas_tpu' would not run"):
    ShardedMtp(cfg, make_mesh(2), norm_impl="pallas_tpu", sequence_parallel=True)


def test_draft_tokens_over_several_steps_agree_across_tp():
  """Three greedy draft steps with post-norm recycling give the same drafts at every tp."""
  cfg, params, ids, positions, hidden = _setup(256, "float32")
  drafts = {}
  for tp in TPS:
    sharded = ShardedMtp(cfg, make_mesh(tp))
    placed = sharded.shard(params)
    out = sharded(placed, ids, positions, hidden, jax_mtp.init_caches(cfg, B, CAPACITY))
    tokens, h, caches = out.tokens_BT[:, -1:], out.hidden_BTD[:, -1:], out.caches
    steps = [tokens]
    for i in range(1, 3):
      out = sharded(placed, tokens, jnp.full((B, 1), T - 1 + i, jnp.int32), h, caches, spec_step_idx=i)
      tokens, h, caches = out.tokens_BT, out.hidden_BTD, out.caches
      steps.append(tokens)
    drafts[tp] = np.concatenate(steps, axis=1)
  for tp in TPS[1:]:
    np.testing.assert_array_equal(drafts[tp], drafts[1])


def test_partition_spec_table():
  assert param_spec(("layers_0", "mtp_block", "self_attn", "o_proj", "kernel")) == P("tp", None)
  assert param_spec(("layers_0", "mtp_block", "self_attn", "q_b_proj", "kernel")) == P(None, "tp")
  assert param_spec(("layers_0", "mtp_block", "mlp", "w_down_EFD")) == P("tp", None, None)
  assert param_spec(("lm_head",)) == P("tp", None)
  assert param_spec(("layers_0", "eh_proj", "kernel")) == P()
  assert param_spec(("layers_0", "mtp_block", "self_attn", "indexer", "wk", "kernel")) == P()


@pytest.mark.parametrize("overrides, tp, match", [
    (dict(num_attention_heads=6), 4, "tp=4 does not divide num_attention_heads=6"),
    (dict(n_routed_experts=12, n_group=4), 8, "tp=8 does not divide n_routed_experts=12"),
    (dict(moe_intermediate_size=20), 8, "tp=8 does not divide shared expert intermediate size=20"),
    (dict(intermediate_size=100), 8, "tp=8 does not divide intermediate_size=100"),
])
def test_tp_that_does_not_divide_is_an_error(overrides, tp, match):
  with pytest.raises(ValueError, match=match):
    validate_tp(jax_mtp.tiny(**overrides), tp)


def test_mesh_larger_than_devices_is_an_error():
  with pytest.raises(ValueError, match="tp=9 needs an integer 1 ≤ tp ≤ 8"):
    make_mesh(9)


class _ClaimsWithoutMethod(jax_mtp.MtpPredictor):
  get_top_tokens = None  # claims supports_local_argmax (inherited) but cannot deliver


class _NoLocalArgmax(jax_mtp.MtpPredictor):
  supports_local_argmax = False


def test_draft_path_follows_the_declared_capability():
  cfg, mesh = jax_mtp.tiny(), make_mesh(2)
  assert ShardedMtp(cfg, mesh).greedy_path == "top_tokens"
  assert ShardedMtp(cfg, mesh, drafter_cls=_NoLocalArgmax).greedy_path == "logits"
  with pytest.raises(TypeError, match="_ClaimsWithoutMethod sets supports_local_argmax=True but has no callable"):
    ShardedMtp(cfg, mesh, drafter_cls=_ClaimsWithoutMethod)
