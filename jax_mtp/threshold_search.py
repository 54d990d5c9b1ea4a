"""The top-p threshold of a row of logits without sorting it: a radix search over the floats' bits.

A sampling filter keeps every logit at or above a threshold (`acceptance.sampling_logits`), and each threshold is the
smallest value u for which what lies strictly above u is under a limit (top-k's, the k-th largest, is the indexer's
radix select, `topk.kth_key_one_reduction`; top-p's is this module's, the same passes summing masses):

    top-k   the k-th largest value:       the smallest u with  #{x > u}          < k
    top-p   the nucleus's last value:     the smallest u with  Σ_{x > u} e^(x−m) < p · Z

(Z the filtered row's Σ e^(x−m); a value's mass strictly above is what a sorted cumulative sum gives its first rank,
so both agree with the sort's definition, ties at the threshold kept.) The mass above u only falls as u grows and
changes only at the row's own values, so the smallest u is one of them, found digit by digit over the 32 bits of
an order-preserving integer key (`topk.order_keys`): each pass tries, for each of the next 4-bit digit's values
0 … 14, the largest key with that digit (the bits below it all set), and keeps the first digit whose mass above is
under the limit (15 when none is). Eight passes, each one read of the row (15 comparisons and sums an element, fused
into one reduction), against a sort of the whole vocabulary (B × (k + 1) sorts of 129,280 logits a round under a
top-p setting). Where the sums' order differs from a sorted cumulative sum's, a logit whose mass above lies within
fp32 rounding of the limit may fall on the other side; the float64 reference's tests hold it to the definition (tests/test_sampling.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

DIGIT_BITS = 4  # 15 candidates a pass, 8 passes over 32 bits


def smallest_key_under(keys_RV: jax.Array, limit_R: jax.Array, weights_RV: jax.Array) -> jax.Array:
  """uint32 [R]: per row, the smallest key u of the row's own keys (`topk.order_keys`) with Σ_{keys > u} weight <
  limit. The largest key always qualifies (nothing lies above it) when limit > 0."""
  candidates = 2**DIGIT_BITS - 1
  digits_D = jnp.arange(candidates, dtype=jnp.uint32)
  prefix_R = jnp.zeros(keys_RV.shape[:1], jnp.uint32)
  for shift in range(32 - DIGIT_BITS, -1, -DIGIT_BITS):
    # the largest key of each candidate digit (lower bits all set): under the limit from the answer's digit on
    tried_RD = prefix_R[:, None] | (digits_D << shift) | jnp.uint32((1 << shift) - 1)
    above_RDV = keys_RV[:, None, :] > tried_RD[:, :, None]
    mass_RD = jnp.sum(jnp.where(above_RDV, weights_RV[:, None, :], 0.0), axis=-1)
    under_R = jnp.sum(mass_RD < limit_R[:, None], axis=-1, dtype=jnp.uint32)  # digits ≥ the answer's, of 0..14
    prefix_R = prefix_R | ((jnp.uint32(candidates) - under_R) << shift)
  return prefix_R
