"""The DSA indexer's top-k: per query, the index_topk highest-scoring visible slots as a `Selection`, without a
sort. A radix select finds each query's k-th largest score over order-preserving integer keys (XLA's passes, or the
Pallas Mosaic GPU kernel `kernels/topk_mgpu.py`: `resolve_topk_impl`), then the slots above it (and enough of those
equal to it, the lowest) are compacted in slot order (`select_from_kth`, XLA; `select_by_tie_cutoff` where the kernel
also gives the last tied slot kept). `topk_selection` (`lax.top_k`, a sort) is the reference both are tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mtp.cache import causal_mask
from jax_mtp.config import MtpConfig
from jax_mtp.kernels import topk_mgpu
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform


class Selection(NamedTuple):
  """The indexer's choice per query: slot ids int32 [B, T, K] and whether each is visible."""

  slots_BTK: jax.Array
  valid_BTK: jax.Array

  def mask(self, capacity: int) -> jax.Array:
    """bool [B, T, S]: the selected visible slots."""
    b, t, _ = self.slots_BTK.shape
    chosen = jnp.zeros((b, t, capacity), bool)
    bi, ti = jnp.indices((b, t))
    return chosen.at[bi[..., None], ti[..., None], self.slots_BTK].set(self.valid_BTK)  # slots are distinct


def topk_selection(scores_BTS: jax.Array, visible_BTS: jax.Array, topk: int) -> Selection:
  """The `topk` highest-scoring visible slots (all visible ones, and invalid fillers, if fewer), by
  `lax.top_k` (a sort): the reference `topk_selection_radix` is tested against and timed beside
  (benchmarks.dsa_parts, benchmarks.prefill_parts; RESULTS.md)."""
  k = min(topk, scores_BTS.shape[-1])
  masked = jnp.where(visible_BTS, scores_BTS, -jnp.inf)
  _, slots_BTK = jax.lax.top_k(masked, k)
  return Selection(slots_BTK.astype(jnp.int32), jnp.take_along_axis(visible_BTS, slots_BTK, axis=-1))


# Queries (B·T) up to which a radix pass counts its candidates as one reduction (benchmarks/RESULTS.md, issue 27's
# prefill): few queries leave sibling reductions too few rows to fill a GPU; many re-read the keys per candidate.
RADIX_ONE_REDUCTION_QUERIES = 32


def topk_selection_radix(scores_BTS: jax.Array, visible_BTS: jax.Array, topk: int) -> Selection:
  """The slots `topk_selection` picks (ties → the lowest slots), listed in slot order, without a sort:
  a radix select finds each query's k-th largest score over order-preserving integer keys, a digit a pass (the
  largest digit whose prefix still has ≥ k keys at or above it), then the slots above it (and enough of those
  equal to it) are compacted in order.

  How a pass counts its candidates depends on the number of queries, never the result: up to
  RADIX_ONE_REDUCTION_QUERIES, 4-bit digits whose 15 counts are one reduction over a [B, T, 15, S] comparison
  (15 rows per query keep the device busy; each re-reads the keys); beyond, 2-bit digits whose 3 counts are
  separate reductions of the same keys, which XLA fuses into one read of them per pass."""
  k = min(topk, scores_BTS.shape[-1])
  keys_BTS = order_keys(scores_BTS, visible_BTS)
  b, t, _ = keys_BTS.shape
  count = kth_key_one_reduction if b * t <= RADIX_ONE_REDUCTION_QUERIES else kth_key_sibling_reductions
  return select_from_kth(keys_BTS, visible_BTS, count(keys_BTS, k), k)


def kth_key_one_reduction(keys_BTS: jax.Array, k: int) -> jax.Array:
  """Each query's k-th largest key, 4 bits a pass, the 15 candidates counted by one reduction."""
  kth_BT = jnp.zeros(keys_BTS.shape[:2], jnp.uint32)
  digits = jnp.arange(1, 16, dtype=jnp.uint32)
  for shift in range(28, -1, -4):
    candidates_BTD = kth_BT[..., None] | (digits << shift)
    at_least_BTD = jnp.sum(keys_BTS[:, :, None, :] >= candidates_BTD[..., None], axis=-1, dtype=jnp.int32)
    kth_BT = kth_BT | (jnp.sum(at_least_BTD >= k, axis=-1, dtype=jnp.uint32) << shift)
  return kth_BT


def kth_key_sibling_reductions(keys_BTS: jax.Array, k: int, digit_bits: int = 2) -> jax.Array:
  """Each query's k-th largest key, `digit_bits` a pass (a divisor of 32), the 2^bits − 1 candidates counted by
  separate reductions of the same keys."""
  kth_BT = jnp.zeros(keys_BTS.shape[:2], jnp.uint32)
  for shift in range(32 - digit_bits, -1, -digit_bits):
    digit_BT = jnp.zeros_like(kth_BT)
    for d in range(1, 2**digit_bits):
      at_least_BT = jnp.sum(keys_BTS >= (kth_BT | jnp.uint32(d << shift))[..., None], axis=-1, dtype=jnp.int32)
      digit_BT = digit_BT + (at_least_BT >= k).astype(jnp.uint32)
    kth_BT = kth_BT | (digit_BT << shift)
  return kth_BT


def kth_key_histograms(keys_BTS: jax.Array, k: int, digit_bits: int = 16) -> jax.Array:
  """Each query's k-th largest key, `digit_bits` a pass (a divisor of 32) counted by one histogram a pass (a
  scatter-add of the keys whose higher digits match the k-th key's so far into 2^bits bins a query), instead of
  2^bits − 1 comparisons: 2 passes at 16 bits where the sibling form takes 16. Memory: a [B·T, 2^bits] int32
  histogram a pass. Not the library's form yet (benchmarks.dsa_parts times it beside the others)."""
  b, t, s = keys_BTS.shape
  keys_QS = keys_BTS.reshape(b * t, s)
  rows_Q1 = jnp.arange(b * t)[:, None]
  kth_Q = jnp.zeros((b * t,), jnp.uint32)
  for shift in range(32 - digit_bits, -1, -digit_bits):
    high = shift + digit_bits  # the bits settled before this pass: keys >> high against the k-th key's
    if high == 32:
      in_prefix_QS, above_Q = jnp.ones_like(keys_QS, jnp.int32), jnp.zeros((b * t,), jnp.int32)
    else:
      prefix_QS, settled_Q1 = keys_QS >> high, (kth_Q >> high)[:, None]
      in_prefix_QS = (prefix_QS == settled_Q1).astype(jnp.int32)
      above_Q = jnp.sum(prefix_QS > settled_Q1, axis=-1, dtype=jnp.int32)
    digit_QS = ((keys_QS >> shift) & jnp.uint32(2**digit_bits - 1)).astype(jnp.int32)
    hist_QD = jnp.zeros((b * t, 2**digit_bits), jnp.int32).at[rows_Q1, digit_QS].add(in_prefix_QS)
    at_least_QD = jnp.cumsum(hist_QD[:, ::-1], axis=-1)[:, ::-1]  # keys in the prefix with this digit or more
    digit_Q = jnp.sum(above_Q[:, None] + at_least_QD >= k, axis=-1, dtype=jnp.int32) - 1  # the largest such digit
    kth_Q = kth_Q | (digit_Q.astype(jnp.uint32) << shift)
  return kth_Q.reshape(b, t)


def order_keys(scores_BTS: jax.Array, visible_BTS: jax.Array) -> jax.Array:
  """uint32 keys whose unsigned order is the scores' float order; invisible slots get −inf's key."""
  bits = jax.lax.bitcast_convert_type(jnp.where(visible_BTS, scores_BTS, -jnp.inf).astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def key_value(keys: jax.Array) -> jax.Array:
  """The float32 values of `order_keys`'s keys (its inverse; an invisible slot's key gives −inf)."""
  bits = jnp.where(keys >> 31 == 1, keys & jnp.uint32(0x7FFFFFFF), ~keys)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def select_from_kth(keys_BTS: jax.Array, visible_BTS: jax.Array, kth_BT: jax.Array, k: int) -> Selection:
  """The k slots whose keys are above each query's k-th largest key `kth_BT`, and enough of those equal to it
  (the lowest), compacted in slot order."""
  above_BTS, tied_BTS = keys_BTS > kth_BT[..., None], keys_BTS == kth_BT[..., None]
  ties_wanted_BT = k - jnp.sum(above_BTS, axis=-1, dtype=jnp.int32)
  chosen_BTS = above_BTS | (tied_BTS & (jnp.cumsum(tied_BTS, axis=-1, dtype=jnp.int32) <= ties_wanted_BT[..., None]))
  return _listed_by_rank(chosen_BTS, visible_BTS, k)


# Queries a call (B · T) for which `auto` runs the Mosaic GPU k-th key kernel on Hopper GPUs: 64 and up (an H100,
# 2026-12-06, benchmarks/RESULTS.md). Measured faster, kernel + XLA's compaction against XLA's radix select, µs a
# call: 64 queries 55 / 83 (4,608 slots) and 120 / 157 (32K); 128: 67 / 118 (4,608); 256: 60-71 / 88-101 (4,608)
# and 275-331 / 328-358 (32K), the verification forward at B = 64 1.0-1.5 % faster; a 32K prompt's prefill chunks
# of 2,048 and 4,096 queries (33,280 slots) 2,551-2,641 / 2,732-2,738 and 5,018 / 5,229. Between and above those
# counts by inference: both forms' time grows with the rows once they fill the GPU. No faster at 4 and 32 queries
# (one warpgroup a row: a row's 16 passes take ~50 µs at 32K, where XLA's passes spread over the GPU).
TOPK_KERNEL_MIN_QUERIES = 64


def resolve_topk_impl(cfg: MtpConfig, platform: str, capacity: int, *, queries: int | None = None,
                      hopper: bool = True) -> str:
  """"xla" or "mosaic_gpu" (the k-th key in kernels/topk_mgpu.py) for `cfg.topk_impl` over a `capacity`-slot cache
  and a call of `queries` (B · T; None: no call yet, as the CLI's flag check asks).

  "auto": mosaic_gpu on a Hopper GPU where the kernel takes the capacity (≤ topk_mgpu.MAX_SLOTS, a multiple of
  128) and the call has at least TOPK_KERNEL_MIN_QUERIES queries (where it measured faster); else xla. An explicit
  mosaic_gpu runs as asked (on a CPU in Pallas's GPU interpreter; on another platform than this process's, as an
  AOT compile does) unless it cannot take the capacity or the GPU is not a Hopper: then a ValueError names why."""
  impl = cfg.topk_impl
  if impl == "xla":
    return "xla"
  problems = topk_mgpu.takes(capacity)
  if impl == "auto":
    timed = queries is not None and queries >= TOPK_KERNEL_MIN_QUERIES
    return "mosaic_gpu" if timed and platform == "gpu" and hopper and not problems else "xla"
  if platform == "gpu" and not hopper:
    problems.append(NOT_HOPPER)
  if problems:
    raise ValueError(f"topk_impl={impl!r} cannot run here: {'; '.join(problems)} (use 'xla' or 'auto')")
  return impl


def select_topk(cfg: MtpConfig, scores_BTS: jax.Array, positions_BT: jax.Array) -> Selection:
  """The model's top-k over a cache's scores (slot s visible to the query at position p iff s ≤ p), by
  `cfg.topk_impl`: the same slots whichever runs."""
  capacity = scores_BTS.shape[-1]
  queries = scores_BTS.shape[0] * scores_BTS.shape[1]
  if resolve_topk_impl(cfg, lowering_platform(), capacity, queries=queries, hopper=lowering_gpu_is_hopper()) == "xla":
    return topk_selection_radix(scores_BTS, causal_mask(positions_BT, capacity), cfg.index_topk)
  return topk_selection_kernel(scores_BTS, positions_BT, cfg.index_topk, interpret=lowering_platform() == "cpu")


def topk_selection_kernel(scores_BTS: jax.Array, positions_BT: jax.Array, topk: int, *, interpret=False,
                          config: topk_mgpu.Config | None = None, tie_cutoff: bool = True) -> Selection:
  """`topk_selection_radix`'s slots over a causal mask (slot s visible to the query at position p iff s ≤ p), the
  k-th key from the Mosaic GPU kernel (kernels/topk_mgpu.py, launched by `config`, default `config_for`'s;
  `interpret`: in Pallas's GPU interpreter), then XLA's compaction: with `tie_cutoff` (the model's form) the kernel
  also gives each query's tie cutoff and `select_by_tie_cutoff` takes one scan; without it, `select_from_kth`'s count
  and two scans. The tie cutoff measured faster at 64, 256 and 2,048 queries (H100, 2026-12-06, RESULTS: 36 against
  46 µs at 64 queries and 51 against 59 at 256 over 4,608 slots; 2,207 against 2,573 at a 32K prompt's first
  2,048-query chunk)."""
  k = min(topk, scores_BTS.shape[-1])
  visible_BTS = causal_mask(positions_BT, scores_BTS.shape[-1])
  keys_BTS = order_keys(scores_BTS, visible_BTS)
  if tie_cutoff:
    kth_BT, cutoff_BT = topk_mgpu.kth_key_and_tie_cutoff_mgpu(scores_BTS, positions_BT, k, config=config,
                                                              interpret=interpret)
    return select_by_tie_cutoff(keys_BTS, visible_BTS, kth_BT, cutoff_BT, k)
  kth_BT = topk_mgpu.kth_key_mgpu(scores_BTS, positions_BT, k, config=config, interpret=interpret)
  return select_from_kth(keys_BTS, visible_BTS, kth_BT, k)


def select_by_tie_cutoff(keys_BTS: jax.Array, visible_BTS: jax.Array, kth_BT: jax.Array, cutoff_BT: jax.Array,
                         k: int) -> Selection:
  """`select_from_kth`'s slots given each query's tie cutoff (`topk_mgpu.kth_key_and_tie_cutoff_mgpu`: the last
  tied slot kept, S for all): the slots above the k-th key and the tied ones at or below the cutoff, ranked by one
  scan — no count of the keys above and no scan of the tied ones."""
  slot_S = jnp.arange(keys_BTS.shape[-1], dtype=jnp.int32)
  chosen_BTS = (keys_BTS > kth_BT[..., None]) | ((keys_BTS == kth_BT[..., None]) & (slot_S <= cutoff_BT[..., None]))
  return _listed_by_rank(chosen_BTS, visible_BTS, k)


def _listed_by_rank(chosen_BTS: jax.Array, visible_BTS: jax.Array, k: int) -> Selection:
  """The k chosen slots of each query in slot order: each one's rank is the chosen slots up to it (a scan), and
  each is scattered to its rank."""
  b, t, s = chosen_BTS.shape
  rank_BTS = jnp.where(chosen_BTS, jnp.cumsum(chosen_BTS, axis=-1, dtype=jnp.int32) - 1, k)  # k: dropped
  bi, ti = jnp.indices((b, t))
  slots_BTK = jnp.zeros((b, t, k), jnp.int32).at[bi[..., None], ti[..., None], rank_BTS].set(
      jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, t, s)), mode="drop")
  return Selection(slots_BTK, jnp.take_along_axis(visible_BTS, slots_BTK, axis=-1))
