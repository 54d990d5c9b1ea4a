"""Top-k and top-p sampling (`jax_mtp.acceptance.Sampling`): the kept tokens equal a float64 reference's, rejection
sampling preserves the filtered distribution (a draft outside it is always rejected), bad values are refused naming
them. End to end (top-k 1 is greedy, the values are traced): tests/test_speculative.py."""

import re
import numpy as np
import pytest

import jax
import jax.numpy as jnp
import jax_mtp
from jax_mtp.acceptance import Sampling, accept_sampled, sample, sampling_logits, sampling_logits_reference
from jax_mtp.threshold_search import smallest_key_under
from jax_mtp.topk import key_value, kth_key_one_reduction, order_keys
from tests.sampling_checks import assert_follows
from tests.tolerances import assert_close

VOCAB = 50


def _kept_reference(logits_V: np.ndarray, temperature: float, top_k: int | None, top_p: float | None) -> set[int]:
  """The tokens vLLM's sampler keeps, in float64: the top_k most likely, then of those the fewest, most likely first,
  whose probabilities (renormalised over the top-k) reach top_p."""
  order = np.argsort(-logits_V, kind="stable")
  kept = order[:top_k] if top_k is not None else order
  if top_p is not None:
    z = logits_V[kept] / temperature
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    kept = kept[np.cumsum(probs) - probs < top_p]
  return {int(t) for t in kept}


@pytest.mark.parametrize("top_k, top_p", [(1, None), (7, None), (None, 0.5), (None, 0.9), (10, 0.6), (3, 0.999),
                                          (None, 1e-6), (VOCAB - 1, 0.95)])
def test_the_kept_tokens_are_the_top_k_then_the_top_p_nucleus(top_k, top_p):
  """Distinct logits (no ties), 2 × 3 positions: each position keeps exactly the reference's tokens, at their own
  scaled logits; the rest are −inf."""
  temperature = 0.7
  logits_BTV = np.random.default_rng(top_k or 0).normal(0.0, 2.0, (2, 3, VOCAB)).astype(np.float32)
  sampling = Sampling(np.float32(temperature), None if top_k is None else np.int32(top_k),
                      None if top_p is None else np.float32(top_p))
  out_BTV = np.asarray(jax.jit(sampling_logits)(jnp.asarray(logits_BTV), sampling))
  for b, t in np.ndindex(2, 3):
    kept = {int(v) for v in np.flatnonzero(np.isfinite(out_BTV[b, t]))}
    assert kept == _kept_reference(logits_BTV[b, t].astype(np.float64), temperature, top_k, top_p), (b, t)
    assert_close(out_BTV[b, t, sorted(kept)], logits_BTV[b, t, sorted(kept)] / temperature, "float32",
                 "kept logits / temperature")  # XLA may divide as a product with 1/τ: an ulp apart


@pytest.mark.parametrize("top_k, top_p", [(1, None), (40, None), (None, 0.95), (None, 0.3), (50, 0.95), (5, 0.999),
                                          (VOCAB * 3, None), (VOCAB * 3, 0.9)])
def test_the_radix_search_keeps_what_the_sort_keeps_with_ties_and_at_v32s_vocabulary(top_k, top_p):
  """The threshold search (no sort) against the sort's form (`sampling_logits_reference`): 4 rows of V3.2's 129,280
  logits, two of them rounded to a grid of 1/4 (thousands of ties, at every threshold), one with −inf entries, and
  one row of 150 with every logit tied in threes: the kept tokens equal exactly; top-k above the vocabulary keeps it
  all."""
  rng = np.random.default_rng(top_k or 1)
  rows = rng.normal(0.0, 2.5, (4, 129_280)).astype(np.float32)
  rows[1:3] = np.round(rows[1:3] * 4) / 4
  rows[3, rng.choice(129_280, 5_000, replace=False)] = -np.inf
  sampling = Sampling(np.float32(0.6), None if top_k is None else np.int32(top_k),
                      None if top_p is None else np.float32(top_p))
  for logits in (rows.reshape(2, 2, -1), np.repeat(rng.normal(0, 1, (1, 1, 50)).astype(np.float32), 3, axis=-1)):
    got = np.asarray(jax.jit(sampling_logits)(jnp.asarray(logits), sampling))
    want = np.asarray(jax.jit(sampling_logits_reference)(jnp.asarray(logits), sampling))
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_array_equal(got[np.isfinite(got)], want[np.isfinite(want)])
  if top_k and top_k > VOCAB and top_p is None:
    assert np.isfinite(got).all()


@pytest.mark.parametrize("top_k, top_p", [(50, None), (None, 0.95), (50, 0.95)])
def test_no_filter_sorts_the_vocabulary_in_the_compiled_program(top_k, top_p):
  """The filter's compiled CPU program holds no sort instruction; the sort's form holds one (the check finds it)."""
  sampling = Sampling(np.float32(0.6), None if top_k is None else np.int32(top_k),
                      None if top_p is None else np.float32(top_p))
  logits = jax.ShapeDtypeStruct((2, 4, 1000), jnp.float32)
  sorts = {f.__name__: len(re.findall(r"\ssort\(", jax.jit(f).lower(logits, sampling).compile().as_text()))
           for f in (sampling_logits, sampling_logits_reference)}
  assert sorts == {"sampling_logits": 0, "sampling_logits_reference": 1}


def test_the_keys_order_floats_as_the_floats_and_map_back():
  values = np.array([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1e-38, 1.0, 3e38, np.inf], np.float32)
  keys = np.asarray(order_keys(jnp.asarray(values), True))
  assert (np.diff(keys.astype(np.int64)) > 0).all()  # strictly increasing, −0 just below +0
  np.testing.assert_array_equal(np.asarray(key_value(jnp.asarray(keys))).view(np.uint32), values.view(np.uint32))


@pytest.mark.parametrize("weighted", [False, True])
def test_the_search_finds_the_smallest_key_whose_mass_above_is_under_the_limit(weighted):
  """Against a brute force over each row's own keys: 6 rows of 300 keys (ties among them), limits from 1 to the
  whole row's mass. Weighted: top-p's search (`smallest_key_under`); counted: top-k's, the indexer's radix select
  (`topk.kth_key_one_reduction`, the k-th largest key), with each row's own k."""
  rng = np.random.default_rng(int(weighted))
  keys = np.asarray(order_keys(jnp.asarray(np.round(rng.normal(0, 3, (6, 300)), 1).astype(np.float32)), True))
  weights = rng.uniform(0.1, 1.0, keys.shape).astype(np.float32) if weighted else np.ones(keys.shape, np.float32)
  limits = np.array([1, 2, 17, 150, 299, 300], np.float32) * (weights.mean(1) if weighted else 1)
  if weighted:
    got = np.asarray(smallest_key_under(jnp.asarray(keys), jnp.asarray(limits), jnp.asarray(weights)))
  else:
    k_R11 = jnp.asarray(limits.astype(np.int32))[:, None, None]  # each row's own k
    got = np.asarray(kth_key_one_reduction(jnp.asarray(keys)[:, None], k_R11))[:, 0]
  for r in range(6):
    above = [weights[r][keys[r] > u].astype(np.float64).sum() for u in np.unique(keys[r])]
    want = min(u for u, mass in zip(np.unique(keys[r]), above) if mass < limits[r])
    assert got[r] == want, r


def test_no_filter_is_the_scaled_logits_and_ties_at_the_threshold_are_kept():
  logits_V = jnp.asarray([3.0, 1.0, 1.0, 1.0, 0.5], jnp.float32)
  np.testing.assert_array_equal(sampling_logits(logits_V, Sampling(2.0)), logits_V / 2)
  kept = np.isfinite(np.asarray(sampling_logits(logits_V, Sampling(1.0, top_k=np.int32(2)))))
  np.testing.assert_array_equal(kept, [True, True, True, True, False])  # the three tied at the 2nd logit


def test_rejection_sampling_preserves_the_filtered_distribution():
  """As test_rejection_sampling_preserves_the_target_distribution, with top-k 4 and top-p 0.8 over 6 tokens: the
  emitted tokens follow the filtered p, and a draft outside it (p = 0) is always rejected."""
  n = 60_000
  sampling = Sampling(np.float32(0.7), np.int32(4), np.float32(0.8))
  logits_WV = jnp.asarray(np.random.default_rng(0).normal(0.0, 0.8, (3, 6)), jnp.float32)
  probs_WV = np.asarray(jax.nn.softmax(sampling_logits(logits_WV, sampling), axis=-1), np.float64)
  assert 2 <= (probs_WV > 0).sum(-1).min() and (probs_WV > 0).sum(-1).max() < 6  # the filters cut something
  outside = int(np.flatnonzero(probs_WV[0] == 0)[0])
  drafts_M = jnp.array([outside, np.argmax(probs_WV[1])])
  a_B, emitted_BW = jax.jit(accept_sampled)(jnp.broadcast_to(drafts_M, (n, 2)), jnp.broadcast_to(logits_WV, (n, 3, 6)),
                                            sampling, jax.random.key(0))
  a_B, emitted_BW = np.asarray(a_B), np.asarray(emitted_BW)
  assert (a_B == 0).all()  # the draft outside the filtered set is never accepted
  assert_follows(emitted_BW[:, 0], probs_WV[0], "first token, filtered p")
  drafts_M = jnp.array([np.argsort(probs_WV[0])[-2], np.argmax(probs_WV[1])])  # a likely and the top token
  a_B, emitted_BW = jax.jit(accept_sampled)(jnp.broadcast_to(drafts_M, (n, 2)), jnp.broadcast_to(logits_WV, (n, 3, 6)),
                                            sampling, jax.random.key(1))
  a_B, emitted_BW = np.asarray(a_B), np.asarray(emitted_BW)
  assert_follows(emitted_BW[:, 0], probs_WV[0], "first token")
  assert_follows(emitted_BW[a_B >= 1, 1], probs_WV[1], "second token | d1 accepted")
  assert_follows(emitted_BW[a_B >= 2, 2], probs_WV[2], "bonus token | d1, d2 accepted")
  samples = np.asarray(jax.jit(sample)(jnp.broadcast_to(logits_WV[:1], (n, 1, 6)), sampling, jax.random.key(2)))
  assert_follows(samples[:, 0], probs_WV[0], "a first token sampled from the filtered p")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", np.float32(2)])
def test_a_bad_top_k_is_refused_naming_it(bad):
  from jax_mtp.request import validate_top_k  # noqa: PLC0415
  with pytest.raises(ValueError, match=re.escape(f"top_k={bad!r} must be an integer ≥ 0 (0: off)")):
    validate_top_k(bad)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.5"])
def test_a_bad_top_p_is_refused_naming_it(bad):
  from jax_mtp.request import validate_top_p  # noqa: PLC0415
  with pytest.raises(ValueError, match=re.escape(f"top_p={bad!r} must be a number in (0, 1] (1: off)")):
    validate_top_p(bad)
  spec = jax_mtp.Speculator(jax_mtp.tiny(), jax_mtp.make_mesh(1), 1)
  with pytest.raises(ValueError, match=re.escape(f"top_p={bad!r}")):  # before any params are read
    spec.generate(None, [[1, 2]], 2, temperature=1.0, top_p=bad)
