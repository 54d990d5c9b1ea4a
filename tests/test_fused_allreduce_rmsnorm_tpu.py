"""Opt-1 TPU kernel (Mosaic, remote DMA) vs the XLA reference, in TPU interpret mode on CPU devices.

Interpret mode runs each device as a thread and simulates remote DMAs, semaphores and the barrier;
`detect_races=True` flags unsynchronised buffer accesses. Detection is nondeterministic, so the
racy cases run in both DMA execution modes and repeat.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu import KERNEL_NAME, block_rows
from jax_mtp.parallel import ShardedMtp
from jax_mtp.sharding import make_mesh
from tests.tolerances import assert_close

EPS = 1e-6


def _interpret(mode: str = "on_wait") -> pltpu.InterpretParams:
  # Partial last row-blocks read past T; those rows are never written back.
  return pltpu.InterpretParams(dma_execution_mode=mode, detect_races=True, out_of_bounds_reads="uninitialized")


@functools.cache
def _harness(tp: int, impl: str, mode: str):
  """jit(shard_map(fused_allreduce_rmsnorm)) over a stacked [tp, T, D] partial: device i gets row i."""
  axis = "tp" if tp > 1 else None
  interpret = _interpret(mode) if impl == "pallas_tpu" else None

  def per_device(x_1TD, residual_TD, weight_D):
    return fused_allreduce_rmsnorm(x_1TD[0], residual_TD, weight_D, EPS, axis_name=axis, impl=impl,
                                   interpret=interpret)

  return jax.jit(jax.shard_map(per_device, mesh=make_mesh(tp), in_specs=(P("tp"), P(), P()), out_specs=P(),
                               check_vma=False))


def _inputs(tp: int, t: int, d: int, dtype, seed: int = 0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((tp, t, d)), dtype), jnp.asarray(rng.standard_normal((t, d)), dtype),
          jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype))


def _check(tp, t, d, dtype, mode="on_wait", seed=0):
  args = _inputs(tp, t, d, dtype, seed)
  ref = _harness(tp, "xla", "")(*args)
  out = _harness(tp, "pallas_tpu", mode)(*args)
  for got, want, what in zip(out, ref, ("normed", "new_residual")):
    assert got.dtype == dtype and got.shape == (t, d)
    assert_close(got.astype(jnp.float32), want.astype(jnp.float32), jnp.dtype(dtype).name, what=what)


@pytest.mark.parametrize("t", [1, 3, 64, 257])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_kernel_matches_xla_over_tp_and_rows(tp, t):
  _check(tp, t, 128, jnp.float32)


@pytest.mark.parametrize("tp, t, d, dtype", [
    (8, 64, 7168, jnp.bfloat16),  # V3.2 hidden size, decode batch
    (4, 3, 7168, jnp.float32),
    (2, 257, 200, jnp.bfloat16),  # D not a multiple of the 128-lane tile
    (8, 1, 200, jnp.float32),
])
def test_kernel_matches_xla_on_awkward_shapes_and_dtypes(tp, t, d, dtype):
  _check(tp, t, d, dtype)


def test_kernel_with_several_row_blocks_and_a_partial_last_block():
  assert block_rows(257, 7168, 8, 4) < 257  # the VMEM budget splits these rows into blocks
  _check(8, 257, 7168, jnp.float32)


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
@pytest.mark.parametrize("repeat", range(3))
def test_kernel_has_no_races(mode, repeat):
  """Each device's results are bit-identical to the reference ordering and no race is detected
  (InterpretParams(detect_races=True) raises on a race)."""
  _check(4, 16, 256, jnp.float32, mode=mode, seed=repeat)


def test_mtp_layer_with_the_tpu_kernel_equals_xla_tail():
  cfg = jax_mtp.tiny()
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 5), dtype=np.int32))
  positions = jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (2, 5))
  hidden = jnp.asarray(rng.standard_normal((2, 5, cfg.hidden_size), dtype=np.float32))
  caches = jax_mtp.init_caches(cfg, 2, 8)
  mesh = make_mesh(4)
  outs = {}
  for impl in ("xla", "pallas_tpu"):
    sharded = ShardedMtp(cfg, mesh, norm_impl=impl)
    with pltpu.force_tpu_interpret_mode(_interpret()):
      outs[impl] = sharded(sharded.shard(params), ids, positions, hidden, caches)
  assert_close(outs["pallas_tpu"].hidden_BTD, outs["xla"].hidden_BTD, what="MTP hidden")
  np.testing.assert_array_equal(outs["pallas_tpu"].tokens_BT, outs["xla"].tokens_BT)


def test_unknown_impl_and_misplaced_interpret_are_errors():
  x, r, w = _inputs(1, 2, 128, jnp.float32)
  with pytest.raises(ValueError, match="impl='pallas_gpu_typo' is not one of"):
    fused_allreduce_rmsnorm(x[0], r, w, EPS, axis_name=None, impl="pallas_gpu_typo")
  with pytest.raises(ValueError, match="applies to a Pallas impl, not impl='xla'"):
    fused_allreduce_rmsnorm(x[0], r, w, EPS, axis_name=None, impl="xla", interpret=_interpret())
  assert KERNEL_NAME == "fused_allreduce_rmsnorm_tpu"
