"""Top-k and top-p sampling (`jax_mtp.acceptance.Sampling`): the kept tokens equal a float64 reference's, rejection
sampling preserves the filtered distribution (a draft outside it is always rejected), bad values are refused naming
them. End to end (top-k 1 is greedy, the values are traced): tests/test_speculative.py."""

import re
import numpy as np
import pytest

import jax
import jax.numpy as jnp
import jax_mtp
from jax_mtp.acceptance import Sampling, accept_sampled, sample, sampling_logits
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
