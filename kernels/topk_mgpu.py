"""The DSA indexer's k-th largest score per query on Pallas's Mosaic GPU backend: the radix select of
`jax_mtp.topk.topk_selection_radix` in one kernel, where XLA's form is ~90 small kernels a layer (issue 27).

    kth[b, t] = the k-th largest of order_key(scores[b, t, s]) over s ≤ positions[b, t] (invisible slots: −inf's key)

`order_key` maps fp32 scores to uint32 keys whose unsigned order is the scores' order (`topk.order_keys`). A CTA
takes one query's row: its scores are read once from HBM into shared memory as keys, then 16 passes of 2-bit digits
each count, for the three candidates of the next digit, the keys at or above them, and keep the largest digit whose
count still reaches k. Each pass reads the keys from shared memory, not HBM: XLA's form reads the row from L2 / HBM
in each of its 16 passes and launches ~5 kernels a pass. A pass's counts are per-thread partial counts in registers,
summed over the warpgroup at its end; two of the three travel as one int32's 16-bit halves (`Config.counts`), since
the sums, not the compares, held the pass back: two sums a pass instead of three made the kernel 1.36-1.47x faster
at verification's 256 queries (RESULTS, 2026-12-06). The loop over a row steps through it `chunk` keys at a time
(`config_for`). Where the chunk does not divide the row, shared memory holds the row padded to a multiple of it with
`_PAD_KEY`, below every candidate and every k-th key a pass or the search compares with, so no test counts a pad
slot and no step needs a mask. (A masked last step over the row's last chunk, as before 2026-12-07, made Mosaic GPU's
layout inference take ~9 s more per kernel: 11 s to lower at the CLI's 4,864-slot capacity against 2.7 s padded,
and the CLI's round at B = 64 over 4K prompts 225 s to lower on an H100's host.) The compaction (the slots above the
k-th key, ties to the lowest) stays in XLA (`topk.select_from_kth`).

Why: on an H100 at verification's 256 queries over a 32K cache, XLA's radix select took 345 µs a layer, 5 % of the
verification forward at B = 64 (274 kernels a step over 3 layers). How far this got, and why not further (a row runs
on one warpgroup): benchmarks/RESULTS.md and docs/mosaic_gpu_notes.md, 2026-12-06.

A row runs on one warpgroup. A row split over 2 or 4 warpgroups of a CTA, their counts meeting in shared memory each
pass, passed Pallas's GPU interpreter and its race detector but gave wrong keys compiled on an H100 and was no faster
alone (2026-12-06, RESULTS): removed, docs/mosaic_gpu_notes.md.

`kth_key_and_tie_cutoff_mgpu` also gives each row's tie cutoff (the last slot equal to the k-th key that the top-k
keeps), so XLA's compaction (`topk.select_by_tie_cutoff`) needs one scan where `select_from_kth` needs a count and
two: half the top-k's time at a prefill chunk was that compaction (RESULTS, 2026-12-06). Rows whose ties all fit
(nearly every row past the first k positions) cost nothing more; the others run one pass counting the keys above and
the visible tied ones; a row seeing fewer slots than k (its k-th key −inf's, its ties the invisible slots) is done
there, and only real ties (equal finite scores, or more visible −inf scores than it drops) run a binary search over
slots. The model's top-k (`topk.topk_selection_kernel`) takes this form: faster than `kth_key_mgpu` plus the
count and two scans at 64, 256 and 2,048 queries (RESULTS, 2026-12-06; one slower run at 256 ran again faster).

Keys are held as signed int32: the unsigned key with its top bit flipped has the same order, and int32 arrays are
what the kernel was written and checked with (Pallas's GPU interpreter, both jax versions' CUDA lowering, the H100).
The row lives in shared memory, so a row of S slots takes 4·S bytes of it, padded to whole chunks: S ≤ MAX_SLOTS,
and the padding adds less than a chunk (≤ 4,096 slots), ≤ 208 KiB in all (a Hopper CTA holds up to 227 KiB).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mtp.kernels.mosaic_gpu_common import interpret_params, lowered_once_per_launch

KERNEL_NAME = "dsa_topk_kth_mgpu"
MAX_SLOTS = 49152  # 192 KiB of keys in shared memory (a Hopper CTA holds up to 227 KiB)
_FLIP = np.int32(np.uint32(0x80000000).view(np.int32))  # unsigned → signed order: x ^ 0x80000000
_NEG_INF_KEY = np.int32(np.uint32(0xFF800000 ^ 0x7FFFFFFF).view(np.int32))  # −inf's key, signed (order_keys's ^ flip)
# the padding's key: unsigned 0, the least key. Every candidate has a nonzero digit (≥ 1 unsigned), so no pass counts
# it; the search counts keys above the k-th (never this one) and tied keys only at slots < S (never the padding's)
_PAD_KEY = np.int32(np.iinfo(np.int32).min)


# Keys a warpgroup holds in registers at once (32 … 1 a thread), widest first: a pass's loop step. A CTA runs one
# warpgroup (its row's keys fill shared memory), so its latency is hidden only by the independent work within a
# thread: wider steps put more loads and compares in flight.
CHUNKS = (4096, 2048, 1024, 512, 256, 128)


# A pass's three candidate counts: "packed" sums two of them as one int32's 16-bit halves (two warpgroup sums a pass,
# not three: 1.36x faster at verification's 256 queries over 4,608 and 32K slots, RESULTS 2026-12-06); "separate"
# sums each, as timed before; "packed_lazy" (built 2026-12-06 after that run, untimed) also skips the third count's
# sum in a pass whose second count falls short of k (the third cannot then reach it).
COUNT_FORMS = ("packed", "separate", "packed_lazy")


# The 16 passes as a `fori_loop` ("loop") or unrolled in the kernel's body ("unrolled", the form timed 2026-12-06).
# Unrolled, Mosaic GPU's layout inference took ~3.3 s to lower one kernel on this project's CPU (7 s inside the CLI's
# round, once per layer: minutes for a deep model's round); as a loop, 0.15-0.3 s (2026-12-07). A pass is a loop over
# the row's keys ending in warpgroup sums, so the outer loop's branch and shift are a small part of it: the loop is
# the default, untimed against the unrolled form on a GPU until stage `topkpass` runs.
PASS_FORMS = ("loop", "unrolled")


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch parameters. `chunk` = 0: `config_for` picks it."""

  chunk: int = 0  # keys a pass's loop step holds in registers (a multiple of 128, ≤ 4,096 and ≤ the row)
  counts: str = "packed"  # COUNT_FORMS
  passes: str = "loop"  # PASS_FORMS


def config_for(slots: int, config: Config | None = None) -> Config:
  """The widest of CHUNKS whose steps read at most an eighth more keys than the row, unless `config` names one.

  A row the chunk does not divide ends in one more step, over padding beyond the row (until 2026-12-07 over the
  row's last `chunk` slots, the ones already counted masked: the same keys read a pass). Fewer, wider steps pay for
  the extra keys (the CLI's 33,280-slot cache for a 32K prompt: 9 steps of 4,096 keys a pass, 10.8 % more, 1.69x
  faster than 65 steps of 512 at a 2,048-query prefill chunk) until they do not (4,608 slots: 2 steps of 4,096, 78 %
  more, 1.27x slower than 9 of 512). Between the two the eighth is untimed (4,608 slots take 5 steps of 1,024,
  11.1 %): RESULTS.md, 2026-12-06, timed with the masked step. A chunk dividing the row reads nothing more, so the
  rule always ends at one (128 divides every row the kernel takes)."""
  config = config or Config()
  if config.chunk:
    return config
  return dataclasses.replace(config, chunk=next(
      (c for c in CHUNKS if c <= slots and -slots % c <= slots / 8), CHUNKS[-1]))  # (a row `takes` refuses: named)


def takes(slots: int) -> list[str]:
  """Why the kernel cannot take a row of `slots` (empty: it can)."""
  problems = []
  if slots % CHUNKS[-1]:
    problems.append(f"{slots} slots are not a multiple of {CHUNKS[-1]}")
  if slots > MAX_SLOTS:
    problems.append(f"{slots} slots exceed MAX_SLOTS={MAX_SLOTS} (a row's keys stay in shared memory)")
  return problems


def reference(scores_BTS: jax.Array, positions_BT: jax.Array, k: int) -> jax.Array:
  """uint32 [B, T]: each query's k-th largest key, by a sort (independent of the radix select)."""
  return jnp.sort(_reference_keys(scores_BTS, positions_BT), axis=-1)[..., scores_BTS.shape[-1] - k]


def _reference_keys(scores_BTS: jax.Array, positions_BT: jax.Array) -> jax.Array:
  """uint32 [B, T, S]: the references' order keys (written here, not taken from jax_mtp.topk, which imports this
  module), −inf's key at invisible slots."""
  bits = lax.bitcast_convert_type(scores_BTS.astype(jnp.float32), jnp.uint32)
  keys = jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))
  visible = jnp.arange(scores_BTS.shape[-1]) <= positions_BT[..., None]
  return jnp.where(visible, keys, jnp.uint32(0x007FFFFF))  # −inf's key


def check_operands(scores_BTS: jax.Array, positions_BT: jax.Array, k: int, config: Config) -> None:
  """A ValueError naming the offending value where the kernel cannot take these operands."""
  b, t, s = scores_BTS.shape
  if scores_BTS.dtype != jnp.float32:
    raise ValueError(f"scores {scores_BTS.dtype}: the kernel takes float32 scores")
  if positions_BT.shape != (b, t):
    raise ValueError(f"positions_BT of shape {positions_BT.shape} does not match the scores' queries {(b, t)}")
  if takes(s) or config.chunk % 128 or config.chunk > min(s, CHUNKS[0]):
    why = "; ".join(takes(s)) or f"chunk must be a multiple of 128, ≤ {CHUNKS[0]} and ≤ the row"
    raise ValueError(f"{s} slots with chunk={config.chunk}: {why}")
  if not 1 <= k <= s:
    raise ValueError(f"k={k} must be in [1, {s}]")
  if config.counts not in COUNT_FORMS:
    raise ValueError(f"counts={config.counts!r} is not one of {COUNT_FORMS}")
  if config.passes not in PASS_FORMS:
    raise ValueError(f"passes={config.passes!r} is not one of {PASS_FORMS}")


def kth_key_mgpu(scores_BTS: jax.Array, positions_BT: jax.Array, k: int, *, config: Config | None = None,
                 interpret=False) -> jax.Array:
  """uint32 [B, T]: each query's k-th largest order key over its visible slots (slot ≤ its position), as
  `reference`. `interpret`: Pallas's GPU interpreter (any host: the tests)."""
  out = _row_kernel(scores_BTS, positions_BT, k, config, interpret, tie_cutoff=False)
  return lax.bitcast_convert_type(out[:, 0], jnp.uint32).reshape(positions_BT.shape)


def kth_key_and_tie_cutoff_mgpu(scores_BTS: jax.Array, positions_BT: jax.Array, k: int, *,
                                config: Config | None = None, interpret=False) -> tuple[jax.Array, jax.Array]:
  """(uint32 [B, T], int32 [B, T]): `kth_key_mgpu`'s k-th key, and the last slot whose key equals it that the top-k
  keeps (S where it keeps them all): with the keys above the k-th, the slots ≤ the cutoff among those equal to it
  are exactly the k slots `topk.select_from_kth` chooses (`reference_tie_cutoff`), so the compaction needs no count
  of the keys above and no scan of the tied ones.

  The kernel carries the count of keys at or above the k-th key through its passes; only a row where that count
  exceeds k (tied keys the top-k cannot all keep: rows with fewer visible slots than k, equal scores) runs more: one
  pass counting the keys above and the visible tied ones; where the k-th key is −inf's and the visible ties fall
  short, the rest are the first invisible slots (position + 1 on); otherwise a binary search over slots for the
  (k − above)-th tied one."""
  out = _row_kernel(scores_BTS, positions_BT, k, config, interpret, tie_cutoff=True)
  kth = lax.bitcast_convert_type(out[:, 0], jnp.uint32).reshape(positions_BT.shape)
  return kth, out[:, 1].reshape(positions_BT.shape)


def reference_tie_cutoff(scores_BTS: jax.Array, positions_BT: jax.Array, k: int) -> jax.Array:
  """int32 [B, T]: the slot of the (k − above)-th key equal to the k-th key (slot order), S where every tied key is
  kept; from `reference`'s k-th key by cumulative counts (independent of the kernel's search)."""
  s = scores_BTS.shape[-1]
  kth = reference(scores_BTS, positions_BT, k)[..., None]
  keys = _reference_keys(scores_BTS, positions_BT)
  wanted = k - jnp.sum(keys > kth, axis=-1, dtype=jnp.int32)
  tied_upto = jnp.cumsum(keys == kth, axis=-1, dtype=jnp.int32)
  cutoff = jnp.argmax(tied_upto >= wanted[..., None], axis=-1).astype(jnp.int32)
  return jnp.where(tied_upto[..., -1] == wanted, s, cutoff)


@lowered_once_per_launch("k", "config", "interpret", "tie_cutoff")
def _row_kernel(scores_BTS, positions_BT, k: int, config: Config | None, interpret, *, tie_cutoff: bool):
  """int32 [B·T, 128]: a row's k-th key (signed-domain bits of the unsigned key) in lane 0, its tie cutoff in lane 1
  (`tie_cutoff`)."""
  from jax.experimental import pallas as pl  # noqa: PLC0415
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415 (a GPU backend's module)

  config = config_for(scores_BTS.shape[-1], config)
  check_operands(scores_BTS, positions_BT, k, config)
  b, t, s = scores_BTS.shape
  ch = config.chunk
  steps = -(-s // ch)  # a pass's loop steps: the row padded to whole chunks (`_PAD_KEY`)
  padded = steps * ch  # ≤ MAX_SLOTS, which every chunk divides
  search_steps = max(1, (s - 1).bit_length())  # halvings of [0, S) to one slot
  scores = scores_BTS.reshape(b * t, s)
  positions = positions_BT.reshape(b * t).astype(jnp.int32)

  def body(scores_gmem, positions_gmem, out_gmem, keys_smem, out_smem):
    row = lax.axis_index("q")
    position = positions_gmem[row]

    def load(start, width):  # the row's scores → signed keys, invisible slots at −inf's
      bits = lax.bitcast_convert_type(scores_gmem[row, pl.ds(start, width)], jnp.int32)
      keys = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
      slots = lax.broadcasted_iota(jnp.int32, (width,), 0) + start
      keys_smem[pl.ds(start, width)] = jnp.where(slots <= position, keys, _NEG_INF_KEY)

    def pad(start, width):
      keys_smem[pl.ds(start, width)] = jnp.full((width,), _PAD_KEY, jnp.int32)

    def in_steps(start, end, step):  # step(start, width) over [start, end), in the widest of CHUNKS dividing it
      width = next(c for c in CHUNKS if (end - start) % c == 0)
      pl.loop(0, (end - start) // width)(lambda c: step(start + c * width, width))

    whole = s // ch * ch  # the row's slots in whole chunks; then the rest (a multiple of 128); then the padding
    for start, end, step in ((0, whole, load), (whole, s, load), (s, padded, pad)):
      if end > start:
        in_steps(start, end, step)

    def row_partials(tests, with_slots=False):
      """Each thread's partial counts ([chunk] int32) of the row's keys passing each test (keys[, slots] → a bool a
      key, counted as 1, or an int32 a key, summed)."""
      def window(start, counts):
        keys = keys_smem[pl.ds(start, ch)]
        args = (keys, lax.broadcasted_iota(jnp.int32, (ch,), 0) + start) if with_slots else (keys,)
        values = (test(*args) for test in tests)
        return tuple(n + (jnp.where(v, 1, 0) if v.dtype == jnp.bool_ else v) for n, v in zip(counts, values, strict=True))

      return lax.fori_loop(0, steps, lambda c, n: window(c * ch, n), (jnp.zeros((ch,), jnp.int32),) * len(tests))

    def row_counts(tests, with_slots=False):  # the row's totals: each test's partial counts summed
      return [jnp.sum(n) for n in row_partials(tests, with_slots)]

    def candidate_totals(candidates):  # the row's count of keys at or above each of the 3 candidates
      if config.counts == "separate":
        return row_counts([lambda keys, cand=cand: keys >= cand for cand in candidates])
      # the first two counts in one int32's halves (each ≤ S ≤ MAX_SLOTS < 2**16; the high half may wrap the sign,
      # so it is read back by a logical shift): one warpgroup sum fewer a pass
      pair, third = row_partials(
          [lambda keys: jnp.where(keys >= candidates[0], 1, 0) + jnp.where(keys >= candidates[1], 1 << 16, 0),
           lambda keys: keys >= candidates[2]])
      pair = jnp.sum(pair)
      first, second = pair & 0xFFFF, lax.shift_right_logical(pair, 16)
      if config.counts == "packed":
        return [first, second, jnp.sum(third)]
      # "packed_lazy": the third count decides the digit only where the second reaches k (n3 ≤ n2): its sum is
      # skipped elsewhere (~half the passes on spread scores), and 0 there leaves the digit as the first two make it
      return [first, second, lax.cond(second >= k, lambda: jnp.sum(third), lambda: jnp.int32(0))]

    def one_pass(index, carry):  # the k-th key's next 2-bit digit, `index` 0 … 15 from the top
      kth, at_or_above = carry  # the k-th key so far (unsigned domain, as int32 bits); keys at or above it
      shift = 30 - 2 * index
      candidates = [(kth | (jnp.int32(d) << shift)) ^ _FLIP for d in (1, 2, 3)]
      totals = candidate_totals(candidates)
      digit = sum(jnp.where(n >= k, 1, 0) for n in totals)
      kth = kth | (jnp.int32(digit) << shift)
      if tie_cutoff:  # the count at the chosen candidate (unchanged where the digit is 0)
        for d, n in enumerate(totals, start=1):
          at_or_above = jnp.where(digit == d, n, at_or_above)
      return kth, at_or_above

    plgpu.commit_smem()
    carry = (jnp.int32(0), jnp.int32(s))
    if config.passes == "loop":
      kth, at_or_above = lax.fori_loop(0, 16, one_pass, carry)
    else:  # "unrolled", as timed before 2026-12-07
      for index in range(16):
        carry = one_pass(index, carry)
      kth, at_or_above = carry

    def search():  # the (k − above)-th tied slot
      kth_signed = kth ^ _FLIP
      above, visible_tied = row_counts([lambda keys, _: keys > kth_signed,
                                        lambda keys, slots: (keys == kth_signed) & (slots <= position)],
                                       with_slots=True)
      wanted = k - above

      def halve(step, bounds):  # the smallest slot with ≥ `wanted` tied keys at or below it
        low, high = bounds
        middle = (low + high) >> 1
        tied = row_counts([lambda keys, slots: (keys == kth_signed) & (slots <= middle)], with_slots=True)[0]
        return jnp.where(tied >= wanted, low, middle + 1), jnp.where(tied >= wanted, middle, high)

      def binary_search():
        return lax.fori_loop(0, search_steps, halve, (jnp.int32(0), jnp.int32(s - 1)))[0]
      # −inf's key: every invisible slot is tied, after the visible ties in slot order
      past_the_visible = (kth_signed == _NEG_INF_KEY) & (visible_tied < wanted)
      return lax.cond(past_the_visible, lambda: position + wanted - visible_tied, binary_search)

    if tie_cutoff:
      cutoff = lax.cond(at_or_above > k, search, lambda: jnp.int32(s))
      out_smem[...] = jnp.where(lax.broadcasted_iota(jnp.int32, out_smem.shape, 0) == 1, cutoff, kth)
    else:
      out_smem[...] = jnp.broadcast_to(kth, out_smem.shape)  # a scalar is not stored to GMEM: a 512-byte row
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[row])
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((b * t, 128), jnp.int32),
      scratch_types=[plgpu.SMEM((padded,), jnp.int32), plgpu.SMEM((128,), jnp.int32)],
      grid=(b * t,),
      grid_names=("q",),
      kernel_name=KERNEL_NAME,
      interpret=interpret_params(plgpu, interpret),
  )
  return kernel(scores, positions)
