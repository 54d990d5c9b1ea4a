"""Opt-2 vocab-parallel argmax: under `shard_map` on 1–8 CPU devices, the token it picks is EXACTLY
`jnp.argmax` of the full, unpadded row — on ties within and across shards, ±inf, all −inf rows, NaN
(the first NaN wins), ±0 ties, a vocab not divisible by tp (padded shards, even pure-padding ones),
T < tp — and every device picks the same token.

Two harnesses: `argmax_over_shards` on logits padded with −inf (its contract: padding is −inf), and
the whole `vocab_parallel_argmax(h, head_shard, ...)` path, whose padded head rows hold junk (huge,
+inf, NaN) that `shard_logits` must mask. On the second path h and head hold small integers, so the
fp32 logits are exact in any summation order and the oracle is computed independently in numpy; a
constant-1 feature of h carries a per-vocab "bias" column with the ±inf/NaN entries (a one-hot h
cannot plant per-row non-finite values: 0·inf = NaN).

Hypothesis draws values only; shapes come from a short bucket list so each bucket compiles once.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import PartitionSpec as P

from jax_mtp.kernels import vocab_argmax as va
from jax_mtp.sharding import TP_AXIS, make_mesh

# (T, V, tp). Vs = ceil(V / tp); Vp = Vs · tp.
BUCKETS = (
    (2, 8, 1),  # tp = 1: one shard, no collective partner
    (4, 6, 2),  # Vs = 3
    (3, 7, 4),  # V % tp ≠ 0: the last shard is half padding; T < tp
    (2, 5, 4),  # Vs = 2, Vp = 8: shard 3 is pure padding
    (1, 250, 8),  # V = 250, Vs = 32, last shard 26/32 real; T = 1
    (3, 9, 8),  # Vs = 2: shards 5, 6, 7 are pure padding; T = 3 < tp
    (5, 64, 8),  # V divisible by tp
)
MULTI_SHARD = tuple(b for b in BUCKETS if b[2] > 1)
V32_VOCAB = 129280  # DeepSeek-V3.2

NAN_NEG = np.copysign(np.float32(np.nan), np.float32(-1.0))  # sign bit set
NAN_SIGNALLING = np.array(0x7F800001, np.uint32).view(np.float32)  # quiet bit clear, payload 1
# Drawn values: small integers (frequent exact ties), ±0, ±inf and NaNs of several bit patterns.
POOL = np.array([-3.0, -2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 3.0, np.inf, -np.inf, np.nan, NAN_NEG, NAN_SIGNALLING],
                np.float32)
FINITE_CODES = tuple(range(8))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shard_width(v: int, tp: int) -> int:
  return -(-v // tp)


def jnp_argmax(logits_TV: np.ndarray) -> np.ndarray:
  """The spec: `jnp.argmax` over the full, unpadded row."""
  return np.asarray(jnp.argmax(jnp.asarray(logits_TV), axis=-1))


@functools.cache
def _over_shards_fn(tp: int):
  def per_shard(local_TV):
    return va.argmax_over_shards(local_TV, axis_name=TP_AXIS)[None]  # [1, T]: this device's answer

  return jax.jit(jax.shard_map(per_shard, mesh=make_mesh(tp), in_specs=P(None, TP_AXIS), out_specs=P(TP_AXIS),
                               check_vma=False))


def _agreed(per_device_PT: jax.Array) -> np.ndarray:
  """The replicated answer [T], after asserting that every device holds the same one."""
  per_device_PT = np.asarray(per_device_PT)
  assert (per_device_PT == per_device_PT[:1]).all(), f"devices disagree: {per_device_PT}"
  assert per_device_PT.dtype == np.int32
  return per_device_PT[0]


def argmax_over_shards(logits_TV: np.ndarray, tp: int) -> np.ndarray:
  """`argmax_over_shards` on `logits_TV` padded with −inf to a multiple of tp, vocab-sharded over tp."""
  t, v = logits_TV.shape
  padded_TV = np.full((t, shard_width(v, tp) * tp), -np.inf, logits_TV.dtype)
  padded_TV[:, :v] = logits_TV
  return _agreed(_over_shards_fn(tp)(padded_TV))


@functools.cache
def _from_head_fn(tp: int, vocab_size: int, reference: bool):
  fn = va.reference if reference else va.vocab_parallel_argmax

  def per_shard(h_TD, head_shard_VD):
    return fn(h_TD, head_shard_VD, vocab_size=vocab_size, axis_name=TP_AXIS)[None]

  return jax.jit(jax.shard_map(per_shard, mesh=make_mesh(tp), in_specs=(P(), P(TP_AXIS, None)),
                               out_specs=P(TP_AXIS), check_vma=False))


def argmax_from_head(h_TD, head_VD: np.ndarray, tp: int, junk: float, *, reference: bool = False) -> np.ndarray:
  """The full path: head rows padded with `junk` to a multiple of tp, vocab-sharded; h replicated."""
  v, d = head_VD.shape
  padded_VD = np.full((shard_width(v, tp) * tp, d), junk, head_VD.dtype)
  padded_VD[:v] = head_VD
  return _agreed(_from_head_fn(tp, v, reference)(h_TD, padded_VD))


def check(logits_TV: np.ndarray, tp: int) -> None:
  """argmax_over_shards == jnp.argmax of the full row, exactly."""
  np.testing.assert_array_equal(argmax_over_shards(logits_TV, tp), jnp_argmax(logits_TV),
                                err_msg=f"tp={tp}, logits=\n{logits_TV}")


# ---------------------------------------------------------------- argmax_over_shards, drawn values


@st.composite
def drawn_logits(draw, buckets=BUCKETS, codes=tuple(range(len(POOL)))):
  """(logits [T, V] fp32 from POOL[codes], tp)."""
  t, v, tp = draw(st.sampled_from(buckets))
  idx = draw(hnp.arrays(np.int64, (t, v), elements=st.sampled_from(codes)))
  return POOL[idx], tp


@SETTINGS
@given(drawn_logits())
def test_any_mix_of_special_values_matches_jnp_argmax(case):
  """Any mix of small integers, ±0, ±inf and NaNs: the sharded pick is jnp.argmax's, exactly."""
  check(*case)


@SETTINGS
@given(st.data())
def test_ties_across_shard_boundaries_pick_the_lowest_index(data):
  """The row maximum planted in several shards (often at a boundary): the lowest index wins."""
  t, v, tp = data.draw(st.sampled_from(MULTI_SHARD))
  vs = shard_width(v, tp)
  real_shards = -(-v // vs)
  logits_TV = data.draw(hnp.arrays(np.int64, (t, v), elements=st.integers(-8, 8))).astype(np.float32)
  expected = []
  for row in range(t):
    shards = data.draw(st.lists(st.integers(0, real_shards - 1), min_size=2, max_size=real_shards, unique=True))
    # Offsets biased to the shard edges, where an off-by-one in the index arithmetic would show.
    cols = [min(s * vs + data.draw(st.sampled_from([0, vs - 1, 1 % vs])), v - 1) for s in shards]
    logits_TV[row, cols] = 9.0
    expected.append(min(cols))
  np.testing.assert_array_equal(jnp_argmax(logits_TV), expected)  # the oracle means what we think
  check(logits_TV, tp)


@SETTINGS
@given(st.data())
def test_duplicate_maxima_within_one_shard_pick_the_first(data):
  """Several copies of the maximum inside one shard (and maybe one in a later shard)."""
  t, v, tp = data.draw(st.sampled_from([b for b in BUCKETS if shard_width(b[1], b[2]) >= 2]))
  vs = shard_width(v, tp)
  logits_TV = data.draw(hnp.arrays(np.int64, (t, v), elements=st.integers(-8, 8))).astype(np.float32)
  expected = []
  for row in range(t):
    shard = data.draw(st.integers(0, (v - 1) // vs))
    width = min(vs, v - shard * vs)
    if width < 2:
      shard, width = 0, vs
    cols = [shard * vs + c for c in data.draw(st.lists(st.integers(0, width - 1), min_size=2, unique=True))]
    if data.draw(st.booleans()) and (shard + 1) * vs < v:
      cols.append(data.draw(st.integers((shard + 1) * vs, v - 1)))
    logits_TV[row, cols] = 9.0
    expected.append(min(cols))
  np.testing.assert_array_equal(jnp_argmax(logits_TV), expected)
  check(logits_TV, tp)


@SETTINGS
@given(drawn_logits(codes=FINITE_CODES + (8, 9)))
def test_infinities(case):
  """+inf beats everything and ties with other +inf (first wins); −inf never beats a finite value."""
  check(*case)


@SETTINGS
@given(st.data())
def test_all_neg_inf_rows_pick_index_zero(data):
  """A row of only −inf (the padding too) picks index 0, like jnp.argmax; other rows are unaffected."""
  t, v, tp = data.draw(st.sampled_from(BUCKETS))
  logits_TV = POOL[data.draw(hnp.arrays(np.int64, (t, v), elements=st.sampled_from(FINITE_CODES + (8, 9))))]
  dead = data.draw(st.lists(st.booleans(), min_size=t, max_size=t))
  logits_TV[np.asarray(dead)] = -np.inf
  got = argmax_over_shards(logits_TV, tp)
  assert (got[np.asarray(dead)] == 0).all()
  np.testing.assert_array_equal(got, jnp_argmax(logits_TV))


@SETTINGS
@given(st.data())
def test_first_nan_wins_across_shards(data):
  """One or several NaNs (any sign or payload), in different shards, next to +inf: the first NaN wins."""
  t, v, tp = data.draw(st.sampled_from(BUCKETS))
  logits_TV = POOL[data.draw(hnp.arrays(np.int64, (t, v), elements=st.sampled_from(FINITE_CODES + (8, 9))))]
  expected = []
  for row in range(t):
    cols = data.draw(st.lists(st.integers(0, v - 1), min_size=1, max_size=min(v, 4), unique=True))
    nans = data.draw(st.lists(st.sampled_from([np.nan, NAN_NEG, NAN_SIGNALLING]), min_size=len(cols),
                              max_size=len(cols)))
    logits_TV[row, cols] = np.asarray(nans, np.float32)
    expected.append(min(cols))
  np.testing.assert_array_equal(jnp_argmax(logits_TV), expected)
  check(logits_TV, tp)


@SETTINGS
@given(drawn_logits(codes=(0, 1, 2, 3, 4, 9)))  # {-3, -2, -1, -0.0, +0.0, -inf}
def test_signed_zero_ties(case):
  """+0.0 and −0.0 compare equal: whichever zero comes first wins, whatever its sign."""
  logits_TV, tp = case
  has_zero = (logits_TV == 0).any(axis=-1)
  got = argmax_over_shards(logits_TV, tp)
  first_zero = np.argmax(logits_TV == 0, axis=-1)
  np.testing.assert_array_equal(got[has_zero], first_zero[has_zero])
  np.testing.assert_array_equal(got, jnp_argmax(logits_TV))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_bfloat16_local_logits(tp):
  """bf16 local logits (values are compared after an exact widening to fp32)."""
  rng = np.random.default_rng(tp)
  logits_TV = rng.integers(-4, 5, (3, 37)).astype(jnp.bfloat16)
  logits_TV[0, [5, 30]] = 99
  logits_TV[1, [2, 36]] = np.nan
  logits_TV[2] = -np.inf
  check(logits_TV, tp)


# ---------------------------------------------------------------- the full path: h, head shard


def integer_problem(rng_or_draw, t: int, v: int, bias_V: np.ndarray, d: int = 4):
  """h [T, d+1] and head [V, d+1] of small integers plus a bias feature (h = 1, head = bias_V), and
  the exact logits h @ headᵀ computed in numpy."""
  h_int = rng_or_draw(t, d)
  head_int = rng_or_draw(v, d)
  h_TD = np.concatenate([h_int, np.ones((t, 1))], axis=1).astype(np.float32)
  with np.errstate(invalid="ignore"):  # casting a signalling NaN sets the invalid flag
    head_VD = np.concatenate([head_int, bias_V[:, None]], axis=1).astype(np.float32)
    logits_TV = (h_int @ head_int.T + bias_V[None, :]).astype(np.float32)
  return h_TD, head_VD, logits_TV


JUNK = (1e30, np.inf, np.nan, 1e4)  # padded head rows: they'd win if not masked


@SETTINGS
@given(st.data())
def test_full_path_from_h_and_head_matches_jnp_argmax(data):
  """vocab_parallel_argmax(h, head_shard) == jnp.argmax(h @ headᵀ) exactly, fp32 and bf16 h, with
  ±inf/NaN logits and junk in the padded head rows."""
  t, v, tp = data.draw(st.sampled_from(BUCKETS))
  dtype = data.draw(st.sampled_from([np.float32, jnp.bfloat16]))
  junk = data.draw(st.sampled_from(JUNK))
  bias_V = POOL[data.draw(hnp.arrays(np.int64, (v,), elements=st.sampled_from(range(len(POOL)))))]
  ints = lambda *shape: data.draw(hnp.arrays(np.int64, shape, elements=st.integers(-3, 3)))
  h_TD, head_VD, logits_TV = integer_problem(ints, t, v, bias_V)
  got = argmax_from_head(h_TD.astype(dtype), head_VD, tp, junk)
  np.testing.assert_array_equal(got, jnp_argmax(logits_TV), err_msg=f"tp={tp}, junk={junk}, logits=\n{logits_TV}")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_equals_kernel_on_random_h_and_head(tp, dtype):
  """vocab_parallel_argmax == reference (gather + jnp.argmax) on random
  normal h/head, with a vocab that is not a multiple of tp, exactly."""
  rng = np.random.default_rng(tp)
  t, v, d = 5, 203, 32
  h_TD = rng.standard_normal((t, d), np.float32).astype(dtype)
  head_VD = rng.standard_normal((v, d), np.float32)
  got = argmax_from_head(h_TD, head_VD, tp, junk=np.inf)
  expected = argmax_from_head(h_TD, head_VD, tp, junk=np.inf, reference=True)
  np.testing.assert_array_equal(got, expected)
  assert ((0 <= got) & (got < v)).all()


# ---------------------------------------------------------------- the real V3.2 vocab


def _v32_planted_logits(vs: int) -> tuple[np.ndarray, list[int]]:
  rng = np.random.default_rng(32)
  logits_TV = rng.standard_normal((4, V32_VOCAB), np.float32)
  # row 0: ties across the shard 0 | 1 boundary and in shards 2 and 7
  logits_TV[0, [vs - 1, vs, 2 * vs + 5, 7 * vs + 3]] = 10.0
  # row 1: +inf first, then NaNs of different bit patterns in shards 5, 3 and 6
  logits_TV[1, 0] = np.inf
  logits_TV[1, [5 * vs + 7, 3 * vs + 2, 6 * vs]] = [np.nan, NAN_NEG, NAN_SIGNALLING]
  # row 2: everything negative except ±0: −0.0 in shard 2 comes before +0.0 in shards 2 and 6
  logits_TV[2] = -np.abs(logits_TV[2]) - 1.0
  logits_TV[2, [2 * vs + 4, 2 * vs + 9, 6 * vs + 9]] = [-0.0, 0.0, 0.0]
  # row 3: all −inf
  logits_TV[3] = -np.inf
  return logits_TV, [vs - 1, 3 * vs + 2, 2 * vs + 4, 0]


def test_real_vocab_129280_with_planted_ties_nan_and_signed_zeros():
  """At V = 129280, tp = 8 (Vs = 16160): planted boundary ties, NaNs, ±0 and an all −inf row."""
  tp = 8
  vs = V32_VOCAB // tp
  logits_TV, expected = _v32_planted_logits(vs)
  np.testing.assert_array_equal(jnp_argmax(logits_TV), expected)
  np.testing.assert_array_equal(argmax_over_shards(logits_TV, tp), expected)


def test_real_vocab_129280_full_path_from_h_and_head():
  """The h/head path at V = 129280, tp = 8, with planted bias ties, ±inf and NaN columns."""
  tp, t = 8, 4
  vs = V32_VOCAB // tp
  rng = np.random.default_rng(129280)
  bias_V = rng.integers(-2, 3, V32_VOCAB).astype(np.float32)
  bias_V[[vs - 1, vs, 5 * vs]] = 100.0  # ties across shards: the winner unless a NaN/inf column exists
  bias_V[[3 * vs + 11, 4 * vs]] = [np.nan, NAN_NEG]
  bias_V[[2 * vs + 1]] = np.inf
  ints = lambda *shape: rng.integers(-3, 4, shape)
  h_TD, head_VD, logits_TV = integer_problem(ints, t, V32_VOCAB, bias_V)
  assert (jnp_argmax(logits_TV) == 3 * vs + 11).all()
  for dtype in (np.float32, jnp.bfloat16):
    np.testing.assert_array_equal(argmax_from_head(h_TD.astype(dtype), head_VD, tp, junk=np.nan),
                                  jnp_argmax(logits_TV))
  bias_V[[3 * vs + 11, 4 * vs, 2 * vs + 1]] = 0.0  # no non-finite column: the boundary tie decides
  h_TD, head_VD, logits_TV = integer_problem(lambda *shape: np.zeros(shape, np.int64), t, V32_VOCAB, bias_V)
  assert (jnp_argmax(logits_TV) == vs - 1).all()
  np.testing.assert_array_equal(argmax_from_head(h_TD, head_VD, tp, junk=1e30), jnp_argmax(logits_TV))


# ---------------------------------------------------------------- bad inputs


H_TD = np.zeros((3, 4), np.float32)
HEAD_VD = np.zeros((8, 4), np.float32)


@pytest.mark.parametrize("h, head, match", [
    (np.zeros(4, np.float32), HEAD_VD, r"\(4,\) and \(8, 4\)"),
    (np.zeros((1, 3, 4), np.float32), HEAD_VD, r"\(1, 3, 4\) and \(8, 4\)"),
    (H_TD, np.zeros((2, 8, 4), np.float32), r"\(3, 4\) and \(2, 8, 4\)"),
    (H_TD, np.zeros((8, 5), np.float32), r"h has D=4 but head_shard has D=5"),
], ids=["h-rank-1", "h-rank-3", "head-rank-3", "D-mismatch"])
def test_bad_shapes_raise_naming_them(h, head, match):
  """Wrong ranks or mismatched D raise ValueError naming the shapes, before any collective."""
  with pytest.raises(ValueError, match=match):
    va.vocab_parallel_argmax(h, head, vocab_size=8, axis_name=TP_AXIS)
  with pytest.raises(ValueError, match=match):
    va.check_operands(h, head, 8)


@pytest.mark.parametrize("vocab_size", [0, -5])
def test_vocab_size_below_one_raises(vocab_size):
  with pytest.raises(ValueError, match=rf"vocab_size={vocab_size} must be ≥ 1"):
    va.vocab_parallel_argmax(H_TD, HEAD_VD, vocab_size=vocab_size, axis_name=TP_AXIS)


def test_unknown_impl_raises_naming_it():
  with pytest.raises(ValueError, match=rf"impl='no_such_impl' is not one of {re.escape(str(va.IMPLS))}"):
    va.vocab_parallel_argmax(H_TD, HEAD_VD, vocab_size=8, axis_name=TP_AXIS, impl="no_such_impl")
