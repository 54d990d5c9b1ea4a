"""`index_share_for_mtp_iteration`: draft steps after the first reuse step 0's DSA top-k. Where the
selection cannot change (every query sees ≤ index_topk slots, the indexer keeps them all) sharing
drafts exactly what recomputing does; where it can, the output still equals plain greedy decoding
(verification decides); the reused slots add the drafts written since step 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.config import ConfigError
from jax_mtp.drafter import _reused_selection
from jax_mtp.indexer import Selection


def _run(cfg, prompts, max_new, capacity, k=3):
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), k)
  return spec.generate(spec.shard(target_params, mtp_params), prompts, max_new, capacity=capacity), target_params


def _prompts(lengths, vocab=8):
  rng = np.random.default_rng(7)
  return [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]


def test_sharing_drafts_as_recomputing_where_the_selection_keeps_every_slot():
  """index_topk 32 > every position (≤ 26) in a cache of 40 (> 32: the indexer runs): the top-k is
  every visible slot, shared or not, so the drafts — hence the acceptance counts — are identical."""
  cfg = jax_mtp.tiny(vocab_size=8, index_topk=32)
  prompts = _prompts((10, 6))
  plain, _ = _run(cfg, prompts, 16, capacity=40)
  shared, _ = _run(cfg.replace(index_share_for_mtp_iteration=True), prompts, 16, capacity=40)
  assert shared.tokens == plain.tokens
  assert shared.metrics.accepted_per_position == plain.metrics.accepted_per_position
  assert sum(plain.metrics.accepted_per_position) > 0, "no draft accepted: the comparison would be vacuous"


def test_sharing_past_index_topk_still_equals_plain_greedy(monkeypatch):
  """index_topk 4 with positions up to ~45: the reused top-k differs from a fresh one, the drafts may
  differ, the output may not. The draft steps after the first did take the reused selection (its builder
  was traced for them: with the flag off it is not)."""
  from jax_mtp import drafter  # noqa: PLC0415
  reused = []
  monkeypatch.setattr(drafter, "_reused_selection", lambda *a, **kw: reused.append(1) or _reused_selection(*a, **kw))
  cfg = jax_mtp.tiny(vocab_size=8, index_share_for_mtp_iteration=True)
  prompts = _prompts((25, 17))
  result, target_params = _run(cfg, prompts, 20, capacity=56, k=4)
  assert reused, "the draft steps never took the shared selection"
  decoder = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  assert result.tokens == decoder.generate(decoder.shard(target_params), prompts, 20, capacity=56)


def test_reused_selection_adds_the_drafts_written_since_step_0():
  shared = Selection(jnp.asarray([[[3, 0, 7]], [[1, 2, 0]]], jnp.int32), jnp.asarray([[[True] * 3], [[True, True, False]]]))
  length = jnp.asarray([8, 3], jnp.int32)  # step 0's query sat at 7 and 2
  got = _reused_selection(shared, length, jnp.int32(2), num_drafts=4)  # step 2: at 9 and 4
  np.testing.assert_array_equal(got.slots_BTK, [[[3, 0, 7, 8, 9, 10]], [[1, 2, 0, 3, 4, 5]]])
  np.testing.assert_array_equal(got.valid_BTK, [[[True] * 5 + [False]], [[True, True, False, True, True, False]]])


def test_sharing_config():
  with pytest.raises(ConfigError, match="num_nextn_predict_layers=1"):
    jax_mtp.tiny(index_share_for_mtp_iteration=True, num_nextn_predict_layers=2)
  with pytest.raises(ConfigError, match="true or false"):
    jax_mtp.tiny(index_share_for_mtp_iteration=1)
  from tests.hf_reference import tiny_hf_config_dict  # noqa: PLC0415
  hf = tiny_hf_config_dict("glm_moe_dsa", index_share_for_mtp_iteration=True)
  assert jax_mtp.from_hf_config(hf).index_share_for_mtp_iteration is True
  assert jax_mtp.from_hf_config(tiny_hf_config_dict("glm_moe_dsa")).index_share_for_mtp_iteration is False
