"""Verifying k draft tokens against the target: greedy acceptance and rejection sampling.

The target ran once over the window [t1, d1..dk] (W = k + 1 tokens) and gives, at window index j,
its prediction for the token after window token j. Draft d_{j+1} is checked against index j.

Greedy (temperature 0): a = length of the longest prefix with d_{j+1} == argmax_j; the row emits
target_0 .. target_a — the accepted drafts (equal to the target's tokens) plus one bonus token.

Sampling (temperature τ > 0), speculative sampling (Leviathan et al. 2023; Chen et al. 2023) with
greedy drafts, as vLLM runs MTP: the draft distribution q_j is one-hot at d_{j+1}, so

    accept d_{j+1} with probability min(1, p_j(d)/q_j(d)) = p_j(d_{j+1})     p_j = softmax(logits_j / τ)
    on the first rejection at index a: sample from norm(max(0, p_a − q_a)) = p_a with d_{a+1} removed
    if all k are accepted:            sample the bonus from p_k

Each emitted token is then distributed exactly as p (the target's own sampling distribution):
P(d) = p(d)·1 and P(x ≠ d) = (1 − p(d)) · p(x)/(1 − p(d)) = p(x).

Top-k and top-p (`Sampling`) restrict p before all of this, as vLLM's sampler does (top-k, then the top-p nucleus
of what top-k kept; softmax over the rest): p is then the filtered distribution, every step above holds for it
unchanged, and a draft outside it has p(d) = 0 (always rejected).

Both return (a_B int32 accepted drafts in 0..k, emitted_BW int32) where emitted[:, :a+1] are the
row's new tokens and later entries are meaningless. Shapes: B rows, M = k drafts, W = k + 1, V vocab.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_mtp.threshold_search import smallest_key_under
from jax_mtp.topk import key_value, kth_key_one_reduction, order_keys


class Sampling(NamedTuple):
  """What a sampled token is drawn from: softmax(logits / temperature) over the `top_k` most likely tokens, then over
  the smallest set of those, most likely first, whose probability reaches `top_p` (vLLM's order). A filter that is
  None is off; which are on is static (each combination compiles its own program, and none sorts the vocabulary when
  both are off), their values traced. Ties at a filter's threshold are all kept."""

  temperature: jax.Array | float
  top_k: jax.Array | int | None = None  # ≥ 1
  top_p: jax.Array | float | None = None  # in (0, 1)

  @classmethod
  def of(cls, temperature: float, top_k: int, top_p: float, vocab_size: int) -> Sampling:
    """A request's settings (top_k 0 or top_p 1: off) as a program's argument: a filter that keeps every token is
    off — no program of its own, no sort of the vocabulary."""
    return cls(np.float32(temperature), np.int32(top_k) if 0 < top_k < vocab_size else None,
               np.float32(top_p) if top_p < 1 else None)


def sampling_logits(logits_BTV: jax.Array, sampling: Sampling) -> jax.Array:
  """fp32 logits / temperature with the tokens top-k and top-p filter out at −inf (`Sampling`): each filter's
  threshold found by a radix search over the logits' bits (`topk`'s for top-k, `threshold_search`'s for top-p), no
  sort of the vocabulary; the same kept tokens as `sampling_logits_reference`'s sort, which the tests hold both to."""
  scaled_BTV = logits_BTV.astype(jnp.float32) / sampling.temperature
  if sampling.top_k is None and sampling.top_p is None:
    return scaled_BTV
  v = scaled_BTV.shape[-1]
  scaled_RV = scaled_BTV.reshape(-1, v)
  keys_RV = order_keys(scaled_RV, True)  # every logit a candidate
  threshold_R = jnp.zeros(keys_RV.shape[:1], jnp.uint32)  # every key is above 0 (key 0 is no float's)
  if sampling.top_k is not None:  # the k-th largest logit: the indexer's radix select
    top_k = jnp.minimum(jnp.asarray(sampling.top_k, jnp.int32), v)
    threshold_R = kth_key_one_reduction(keys_RV[:, None], top_k)[:, 0]
  if sampling.top_p is not None:  # of what top-k kept, the nucleus's last logit: its mass above under top_p
    max_R1 = jnp.max(scaled_RV, axis=-1, keepdims=True)
    weights_RV = jnp.exp(scaled_RV - max_R1)
    mass_R = jnp.sum(weights_RV, axis=-1)
    if sampling.top_k is not None:  # top-k's k ranks: those above the k-th logit, then copies of it to make k
      above_RV = keys_RV > threshold_R[:, None]
      at_k_R = jnp.exp(key_value(threshold_R) - max_R1[:, 0])
      mass_R = (jnp.sum(jnp.where(above_RV, weights_RV, 0.0), axis=-1)
                + (top_k - jnp.sum(above_RV, axis=-1)).astype(jnp.float32) * at_k_R)
    nucleus_R = smallest_key_under(keys_RV, sampling.top_p * mass_R, weights_RV)
    threshold_R = jnp.maximum(threshold_R, nucleus_R)
  threshold_BT1 = key_value(threshold_R).reshape(*scaled_BTV.shape[:-1], 1)
  return jnp.where(scaled_BTV >= threshold_BT1, scaled_BTV, -jnp.inf)


def sampling_logits_reference(logits_BTV: jax.Array, sampling: Sampling) -> jax.Array:
  """`sampling_logits` by its definition: the vocabulary sorted, most likely first; top-k's first k ranks, then of
  those the ranks whose mass above (a cumulative sum of the renormalised probabilities) is under top_p; every
  logit at or above the last kept rank's kept (ties at the threshold)."""
  scaled_BTV = logits_BTV.astype(jnp.float32) / sampling.temperature
  if sampling.top_k is None and sampling.top_p is None:
    return scaled_BTV
  v = scaled_BTV.shape[-1]
  sorted_BTV = -jnp.sort(-scaled_BTV, axis=-1)  # most likely first
  top_k = v if sampling.top_k is None else sampling.top_k
  kept_BTV = jnp.broadcast_to(jnp.arange(v) < top_k, sorted_BTV.shape)
  if sampling.top_p is not None:  # of what top-k kept: the mass ranked strictly above each token is under top_p
    probs_BTV = jax.nn.softmax(jnp.where(kept_BTV, sorted_BTV, -jnp.inf), axis=-1)
    kept_BTV &= jnp.cumsum(probs_BTV, axis=-1) - probs_BTV < sampling.top_p
  # the last kept rank's logit (rank 0 is always kept: nothing ranks above it, top_k ≥ 1)
  last_BT1 = jnp.sum(kept_BTV, axis=-1, keepdims=True) - 1
  threshold_BT1 = jnp.take_along_axis(sorted_BTV, last_BT1, axis=-1)
  return jnp.where(scaled_BTV >= threshold_BT1, scaled_BTV, -jnp.inf)


def accepted_prefix(accepted_BM: jax.Array) -> jax.Array:
  """int32 [B]: the number of leading True entries of each row."""
  return jnp.sum(jnp.cumprod(accepted_BM.astype(jnp.int32), axis=1), axis=1)


def accept_greedy(drafts_BM: jax.Array, target_BW: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Longest matching prefix + bonus. target_BW: the target's greedy token at each window index."""
  a_B = accepted_prefix(drafts_BM == target_BW[:, :-1])
  return a_B, target_BW.astype(jnp.int32)


def sample(logits_BTV: jax.Array, sampling: Sampling, key: jax.Array) -> jax.Array:
  """Tokens int32 [B, T] from p = softmax(`sampling_logits`); temperature > 0."""
  return jax.random.categorical(key, sampling_logits(logits_BTV, sampling), axis=-1).astype(jnp.int32)


def accept_sampled(drafts_BM: jax.Array, logits_BWV: jax.Array, sampling: Sampling,
                   key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Rejection sampling of greedy (one-hot) drafts against p = softmax(`sampling_logits`).

  drafts_BM int [B, k]; logits_BWV fp32 [B, k + 1, V]; temperature > 0; key: one PRNG key.
  """
  b, m = drafts_BM.shape
  probs_BWV = jax.nn.softmax(sampling_logits(logits_BWV, sampling), axis=-1)
  key_accept, key_resample = jax.random.split(key)
  p_draft_BM = jnp.take_along_axis(probs_BWV[:, :m], drafts_BM[..., None], axis=-1)[..., 0]
  a_B = accepted_prefix(jax.random.uniform(key_accept, (b, m)) < p_draft_BM)

  p_at_a_BV = jnp.take_along_axis(probs_BWV, a_B[:, None, None], axis=1)[:, 0]
  rejected_BV = (a_B[:, None] < m) & (jnp.arange(p_at_a_BV.shape[-1]) == _draft_at(drafts_BM, a_B)[:, None])
  residual_BV = jnp.where(rejected_BV, 0.0, p_at_a_BV)
  # A rejection is only possible when p(d) < 1, so the residual has mass; this guards rounding.
  residual_BV = jnp.where(jnp.sum(residual_BV, -1, keepdims=True) > 0, residual_BV, p_at_a_BV)
  last_B = jax.random.categorical(key_resample, jnp.log(residual_BV), axis=-1).astype(jnp.int32)

  j_W = jnp.arange(m + 1)
  drafts_BW = jnp.concatenate([drafts_BM, jnp.zeros((b, 1), drafts_BM.dtype)], axis=1).astype(jnp.int32)
  emitted_BW = jnp.where(j_W < a_B[:, None], drafts_BW, last_B[:, None])
  return a_B, emitted_BW


def _draft_at(drafts_BM: jax.Array, a_B: jax.Array) -> jax.Array:
  """d_{a+1} (the first rejected draft) per row; clipped when all were accepted (then unused)."""
  index_B = jnp.minimum(a_B, drafts_BM.shape[1] - 1)
  return jnp.take_along_axis(drafts_BM, index_B[:, None], axis=1)[:, 0]
