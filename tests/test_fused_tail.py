"""Opt-1's contract with `impl="xla"`: under `shard_map`, with a different partial sum on every device,
`fused_allreduce_rmsnorm` returns (rmsnorm(Σ x_partial + residual) · weight, Σ x_partial + residual)
in the activation dtype, within the tolerance table of a float64 numpy computation, and identical on
every device; with `axis_name=None` it is the plain formula; the sequence-parallel tail gives the
same normalised rows for any T (padded to a multiple of tp); bad inputs raise naming the values.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jax_mtp.kernels import fused_allreduce_rmsnorm as far
from jax_mtp.sharding import TP_AXIS, make_mesh
from tests.tolerances import assert_close

EPS = 1e-6
TPS = [1, 2, 4, 8]
DTYPES = ["float32", "bfloat16"]
# (T, D): T = 1 (decode), 3 (< tp), 64, 257 (odd, > 256); D = 128, 200 (not a multiple of 128) and
# the real 7168 for two T only, to keep the run short.
SHAPES_TD = [(1, 128), (3, 200), (64, 128), (257, 200), (1, 7168), (64, 7168)]


def inputs(tp: int, t: int, d: int, dtype: str, seed: int = 0):
  """x_partial [tp, T, D] (one partial sum per device), residual [T, D], weight [D]."""
  rng = np.random.default_rng(seed)
  x_partial_PTD = rng.standard_normal((tp, t, d), np.float32).astype(dtype)
  residual_TD = (3.0 * rng.standard_normal((t, d), np.float32)).astype(dtype)
  weight_D = (1.0 + 0.1 * rng.standard_normal(d, np.float32)).astype(dtype)
  return x_partial_PTD, residual_TD, weight_D


def numpy_tail(x_partial_PTD, residual_TD, weight_D, eps: float = EPS):
  """The formula in float64: (rmsnorm(Σ_p x_partial[p] + residual) · weight, Σ_p x_partial[p] + residual)."""
  new_residual = np.asarray(x_partial_PTD, np.float64).sum(axis=0) + np.asarray(residual_TD, np.float64)
  rms = np.sqrt(np.mean(new_residual**2, axis=-1, keepdims=True) + eps)
  return new_residual / rms * np.asarray(weight_D, np.float64), new_residual


@functools.cache
def _tail_fn(tp: int, which: str):
  """jit(shard_map) of one tail; every output gets a leading per-device axis so replication is checked."""

  def per_shard(x_partial_1TD, residual_TD, weight_D):
    x_partial_TD = x_partial_1TD[0]
    if which == "fused":
      outs = far.fused_allreduce_rmsnorm(x_partial_TD, residual_TD, weight_D, EPS, axis_name=TP_AXIS, impl="xla")
    elif which == "reference":
      outs = far.reference(x_partial_TD, residual_TD, weight_D, EPS, axis_name=TP_AXIS)
    else:
      outs = (far.sequence_parallel_rmsnorm(x_partial_TD, residual_TD, weight_D, EPS, axis_name=TP_AXIS, tp=tp),)
    return tuple(o[None] for o in outs)

  return jax.jit(jax.shard_map(per_shard, mesh=make_mesh(tp), in_specs=(P(TP_AXIS), P(), P()),
                               out_specs=P(TP_AXIS), check_vma=False))


def run_tail(which: str, x_partial_PTD, residual_TD, weight_D):
  """Runs the tail on tp = len(x_partial_PTD) devices; asserts every device's outputs are identical."""
  outs = _tail_fn(x_partial_PTD.shape[0], which)(x_partial_PTD, residual_TD, weight_D)
  agreed = []
  for out_PTD in outs:
    out_PTD = np.asarray(out_PTD)
    assert (out_PTD.view(np.uint8) == out_PTD[:1].view(np.uint8)).all(), f"{which}: devices disagree"
    agreed.append(out_PTD[0])
  return agreed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, d", SHAPES_TD)
@pytest.mark.parametrize("tp", TPS)
def test_fused_xla_equals_float64_psum_add_rmsnorm(tp, t, d, dtype):
  """normed and new_residual match the float64 formula within the table, in the activation dtype."""
  x_partial_PTD, residual_TD, weight_D = inputs(tp, t, d, dtype, seed=t * d + tp)
  normed_TD, new_residual_TD = run_tail("fused", x_partial_PTD, residual_TD, weight_D)
  expected_normed, expected_residual = numpy_tail(x_partial_PTD, residual_TD, weight_D)
  assert normed_TD.dtype == new_residual_TD.dtype == np.dtype(dtype)
  assert_close(new_residual_TD, expected_residual, dtype, what=f"new_residual tp={tp} T={t} D={d}")
  assert_close(normed_TD, expected_normed, dtype, what=f"normed tp={tp} T={t} D={d}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, d", [(1, 128), (257, 200), (64, 7168)])
def test_no_axis_is_the_plain_formula(t, d, dtype):
  """axis_name=None (no mesh): the psum is the identity; add + RMSNorm as the formula, eager and jitted."""
  x_partial_PTD, residual_TD, weight_D = inputs(1, t, d, dtype, seed=d)
  expected_normed, expected_residual = numpy_tail(x_partial_PTD, residual_TD, weight_D)
  fn = functools.partial(far.fused_allreduce_rmsnorm, eps=EPS, axis_name=None, impl="xla")
  for normed_TD, new_residual_TD in (fn(x_partial_PTD[0], residual_TD, weight_D),
                                     jax.jit(fn)(x_partial_PTD[0], residual_TD, weight_D)):
    assert normed_TD.dtype == new_residual_TD.dtype == jnp.dtype(dtype)
    assert_close(new_residual_TD, expected_residual, dtype, what="new_residual")
    assert_close(normed_TD, expected_normed, dtype, what="normed")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 257])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_sequence_parallel_equals_fused_reference_for_t_not_divisible_by_tp(tp, t, dtype):
  """SP tail (reduce-scatter tokens, norm, all-gather) == the fused reference's `normed`, with T
  padded up to a multiple of tp; shape [T, D] and dtype kept."""
  assert t % tp
  d = 200
  x_partial_PTD, residual_TD, weight_D = inputs(tp, t, d, dtype, seed=t + tp)
  (sp_normed_TD,) = run_tail("sp", x_partial_PTD, residual_TD, weight_D)
  ref_normed_TD, _ = run_tail("reference", x_partial_PTD, residual_TD, weight_D)
  assert sp_normed_TD.shape == (t, d) and sp_normed_TD.dtype == np.dtype(dtype)
  assert_close(sp_normed_TD, ref_normed_TD, dtype, what=f"SP vs fused reference tp={tp} T={t}")
  assert_close(sp_normed_TD, numpy_tail(x_partial_PTD, residual_TD, weight_D)[0], dtype, what="SP vs float64")


# ---------------------------------------------------------------- bad inputs

X_TD = np.zeros((3, 8), np.float32)
W_D = np.ones(8, np.float32)


@pytest.mark.parametrize("x, residual, weight, match", [
    (X_TD, np.zeros((4, 8), np.float32), W_D, r"x_partial shape \(3, 8\) != residual shape \(4, 8\)"),
    (X_TD, np.zeros((3, 9), np.float32), np.ones(9, np.float32),
     r"x_partial shape \(3, 8\) != residual shape \(3, 9\)"),
    (X_TD, X_TD, np.ones(7, np.float32), r"weight shape \(7,\) does not match D=8"),
    (X_TD, X_TD, np.ones((1, 8), np.float32), r"weight shape \(1, 8\) does not match D=8"),
    (X_TD, X_TD.astype(jnp.bfloat16), W_D, r"x_partial dtype float32 != residual dtype bfloat16"),
], ids=["T-mismatch", "D-mismatch", "weight-D", "weight-rank", "dtype-mismatch"])
def test_bad_inputs_raise_naming_the_values(x, residual, weight, match):
  """Both tails validate before any collective; the message names the offending shapes / dtypes."""
  with pytest.raises(ValueError, match=match):
    far.fused_allreduce_rmsnorm(x, residual, weight, EPS, axis_name=None, impl="xla")
  with pytest.raises(ValueError, match=match):
    far.sequence_parallel_rmsnorm(x, residual, weight, EPS, axis_name=TP_AXIS, tp=2)


@pytest.mark.parametrize("impl", ["no_such_impl", "XLA", ""])
def test_unknown_impl_raises_naming_it(impl):
  """No silent fallback: an impl that is not implemented is an error naming it and the choices."""
  with pytest.raises(ValueError, match=rf"impl={impl!r} is not one of {re.escape(str(far.IMPLS))}"):
    far.fused_allreduce_rmsnorm(X_TD, X_TD, W_D, EPS, axis_name=None, impl=impl)
