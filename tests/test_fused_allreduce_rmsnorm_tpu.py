"""Opt-1 TPU kernel (Mosaic, remote DMA) vs the XLA reference, in TPU interpret mode on CPU devices.

Interpret mode runs each device as a thread and simulates remote DMAs, semaphores and the barrier;
`detect_races=True` flags unsynchronised buffer accesses. Detection is nondeterministic, so the
racy cases run in both DMA execution modes and repeat.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic.interpret import interpret_pallas_call  # its race flag (jax 0.11 does not raise)
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.kernels import fused_allreduce_rmsnorm_tpu_two_shot as two_shot
from jax_mtp.kernels.fused_allreduce_rmsnorm import choose_tpu_algorithm, fused_allreduce_rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu import KERNEL_NAME, block_rows, fused_allreduce_rmsnorm_tpu
from jax_mtp import ShardedMtp
from jax_mtp.sharding import make_mesh
from tests.tolerances import assert_close

EPS = 1e-6


def _interpret(mode: str = "on_wait") -> pltpu.InterpretParams:
  # Partial last row-blocks read past T; those rows are never written back.
  return pltpu.InterpretParams(dma_execution_mode=mode, detect_races=True, out_of_bounds_reads="uninitialized")


@functools.cache
def _harness(tp: int, impl: str, mode: str, algorithm: str = "auto"):
  """jit(shard_map(fused_allreduce_rmsnorm)) over a stacked [tp, T, D] partial: device i gets row i.
  Returns every device's outputs, stacked [tp, T, D]."""
  axis = "tp" if tp > 1 else None
  interpret = _interpret(mode) if impl == "pallas_tpu" else None

  def per_device(x_1TD, residual_TD, weight_D):
    outs = fused_allreduce_rmsnorm(x_1TD[0], residual_TD, weight_D, EPS, axis_name=axis, impl=impl,
                                   interpret=interpret, tpu_algorithm=algorithm)
    return tuple(out[None] for out in outs)

  return jax.jit(jax.shard_map(per_device, mesh=make_mesh(tp), in_specs=(P("tp"), P(), P()), out_specs=P("tp"),
                               check_vma=False))


def _inputs(tp: int, t: int, d: int, dtype, seed: int = 0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((tp, t, d)), dtype), jnp.asarray(rng.standard_normal((t, d)), dtype),
          jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype))


def _check(tp, t, d, dtype, mode="on_wait", seed=0, algorithm="one_shot", harness=None):
  """The kernel's outputs are bit-identical on every device and close to the XLA reference."""
  args = _inputs(tp, t, d, dtype, seed)
  ref = _harness(tp, "xla", "")(*args)
  out = (harness or _harness(tp, "pallas_tpu", mode, algorithm))(*args)
  assert not getattr(interpret_pallas_call.races, "races_found", False)  # jax 0.11 flags races, 0.12 raises
  for got, want, what in zip(out, ref, ("normed", "new_residual")):
    got = np.asarray(got.astype(jnp.float32))
    assert got.shape == (tp, t, d)
    assert out[0].dtype == dtype
    for device in range(1, tp):
      np.testing.assert_array_equal(got[device], got[0], err_msg=f"{what}: device {device} != device 0")
    assert_close(got[0], want[0].astype(jnp.float32), jnp.dtype(dtype).name, what=what)


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


@pytest.mark.parametrize("t", [1, 3, 64, 257])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_two_shot_matches_xla_over_tp_and_rows(tp, t):
  """T < tp (devices that own only padding rows) through several chunks per device."""
  _check(tp, t, 128, jnp.float32, algorithm="two_shot")


@pytest.mark.parametrize("tp, t, d, dtype", [
    (8, 64, 7168, jnp.bfloat16),
    (4, 3, 200, jnp.bfloat16),  # D not a multiple of the 128-lane tile
    (2, 257, 200, jnp.float32),
    (8, 257, 200, jnp.bfloat16),
])
def test_two_shot_matches_xla_on_awkward_shapes_and_dtypes(tp, t, d, dtype):
  _check(tp, t, d, dtype, algorithm="two_shot")


@pytest.mark.parametrize("tp, t, dtype", [(4, 257, jnp.float32), (8, 300, jnp.bfloat16)])
def test_two_shot_with_several_row_blocks_and_a_partial_last_block(tp, t, dtype):
  rows = two_shot.two_shot_rows(t, 7168, tp, jnp.dtype(dtype).itemsize)
  assert rows < t and t % rows and rows % (tp * two_shot.sublanes(jnp.dtype(dtype).itemsize)) == 0
  _check(tp, t, 7168, dtype, algorithm="two_shot")


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
@pytest.mark.parametrize("repeat", range(2))
def test_two_shot_has_no_races(mode, repeat, monkeypatch):
  """Three row blocks (a small VMEM budget), so the next block's pushes would race the last one's
  reads if the waits were wrong (dropping the receive waits is detected; checked by hand)."""
  monkeypatch.setattr(two_shot, "VMEM_BUDGET", 32 * 256 * 4 * 11)  # 32 rows of D = 256 fp32
  assert two_shot.two_shot_rows(80, 256, 4, 4) == 32
  harness = _harness.__wrapped__(4, "pallas_tpu", mode, "two_shot")  # uncached: traced under the patch
  _check(4, 80, 256, jnp.float32, mode=mode, seed=repeat, harness=harness)


@pytest.mark.parametrize("t, n, want", [
    (1, 8, "one_shot"), (256, 8, "one_shot"), (257, 8, "two_shot"), (4096, 4, "two_shot"),
    (4096, 3, "one_shot"), (4096, 2, "one_shot"), (4096, 1, "one_shot"),
])
def test_auto_picks_one_shot_for_decode_rows_or_few_devices(t, n, want):
  assert choose_tpu_algorithm(t, n) == want


@pytest.mark.parametrize("tp, t, algorithm, kernel", [
    (4, 257, "auto", two_shot.KERNEL_NAME), (4, 256, "auto", KERNEL_NAME), (2, 257, "auto", KERNEL_NAME),
    (2, 8, "two_shot", two_shot.KERNEL_NAME), (8, 512, "one_shot", KERNEL_NAME),
])
def test_the_wrapper_runs_the_chosen_kernel(tp, t, algorithm, kernel):
  jaxpr = str(jax.make_jaxpr(_harness(tp, "pallas_tpu", "on_wait", algorithm))(*_inputs(tp, t, 128, jnp.float32)))
  assert set(re.findall(rf"\b{KERNEL_NAME}\w*", jaxpr)) == {kernel}


def test_unknown_algorithm_is_an_error():
  x, r, w = _inputs(1, 2, 128, jnp.float32)
  with pytest.raises(ValueError, match="algorithm='ring' is not one of"):
    fused_allreduce_rmsnorm_tpu(x[0], r, w, EPS, axis_name=None, algorithm="ring")
  with pytest.raises(ValueError, match="tpu_algorithm='ring' is not one of"):
    fused_allreduce_rmsnorm(x[0], r, w, EPS, axis_name=None, impl="pallas_tpu", tpu_algorithm="ring")
  with pytest.raises(ValueError, match="tpu_algorithm='two_shot' applies to impl='pallas_tpu', not impl='xla'"):
    fused_allreduce_rmsnorm(x[0], r, w, EPS, axis_name=None, impl="xla", tpu_algorithm="two_shot")


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
