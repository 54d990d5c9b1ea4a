"""Opt-1 GPU kernel (Mosaic GPU, peer-to-peer NVLink stores + semaphores) vs the XLA reference.

On CPU: the kernel is lowered for CUDA on an abstract H200 mesh (`jax.export`, which runs the whole
Mosaic GPU lowering: layouts, SMEM, peer refs — not ptxas), and its communication-free path (tp = 1)
runs in GPU interpret mode. Interpret mode has no semaphores, so the tp > 1 path runs only in
`TestOnGpu`, on a GPU machine (JAX_PLATFORMS=cuda; conftest defaults to cpu).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu import PUSH_MODES, with_protocol, fused_allreduce_rmsnorm_gpu
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_common import KERNEL_NAME, MAX_D
from jax_mtp import ShardedMtp
from jax_mtp.sharding import make_mesh
from tests.test_kernel_lowering import _abstract_args
from tests.lowered_step import H200
from tests.tolerances import assert_close

EPS = 1e-6
ON_GPU = jax.devices()[0].platform == "gpu"
# (push, entry_barrier): the kernel's protocols for tp > 1; the first is the default.
PROTOCOLS = [("tma", False), ("st", True), ("tma", True), ("st", False)]


def _harness(mesh, impl: str, interpret=None, **gpu_options):
  """jit(shard_map) over a stacked [tp, T, D] partial: device i gets row i; every device's outputs
  come back stacked [tp, T, D], so bit-identity across devices can be checked. gpu_options
  (push, entry_barrier) call the GPU kernel's protocol hook: the public wrapper runs the production one."""
  tp = mesh.shape["tp"]

  def per_device(x_1TD, residual_TD, weight_D):
    axis = "tp" if tp > 1 else None
    if gpu_options:
      outs = with_protocol(x_1TD[0], residual_TD, weight_D, EPS, axis_name=axis, interpret=interpret, **gpu_options)
    else:
      outs = fused_allreduce_rmsnorm(x_1TD[0], residual_TD, weight_D, EPS, axis_name=axis, impl=impl,
                                     interpret=interpret)
    return tuple(o[None] for o in outs)

  return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("tp"), P(), P()),
                               out_specs=(P("tp"), P("tp")), check_vma=False))


def _inputs(tp: int, t: int, d: int, dtype, seed: int = 0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((tp, t, d)), dtype), jnp.asarray(rng.standard_normal((t, d)), dtype),
          jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype))


def _check(got, want, dtype, t, d):
  for g, w, what in zip(got, want, ("normed", "new_residual")):
    assert g.dtype == dtype and g.shape[1:] == (t, d)
    assert_close(g[0].astype(jnp.float32), w[0].astype(jnp.float32), jnp.dtype(dtype).name, what=what)
    for i in range(1, g.shape[0]):  # the fixed summation order makes every device bit-identical
      np.testing.assert_array_equal(np.asarray(g[i]), np.asarray(g[0]), err_msg=f"{what}: device {i} != 0")


def _kernel_calls(module: str) -> list[str]:
  """The Mosaic GPU custom calls in an exported module whose embedded kernel is ours (the name also
  appears in source locations, e.g. this file's path, so only the custom-call lines count)."""
  calls = [line for line in module.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
  return [line for line in calls if f"{KERNEL_NAME}_mosaic_gpu" in line]


@functools.cache
def _cuda_module(tp: int, t: int, d: int, dtype_name: str, push: str | None = None, entry_barrier=False) -> str:
  """push None: through the public wrapper (the production protocol); else the kernel with these options."""
  mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  dtype = jnp.dtype(dtype_name)
  shapes = (jax.ShapeDtypeStruct((tp, t, d), dtype), jax.ShapeDtypeStruct((t, d), dtype),
            jax.ShapeDtypeStruct((d,), dtype))
  options = {} if push is None else dict(push=push, entry_barrier=entry_barrier)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.export.export(_harness(mesh, "pallas_gpu", **options), platforms=["cuda"])(*shapes).mlir_module()


class TestCudaLowering:
  """The Mosaic GPU lowering accepts every supported shape (SMEM, layouts, alignment, peer refs)."""

  @pytest.mark.parametrize("t", [1, 3, 8, 64, 256, 257])
  @pytest.mark.parametrize("tp", [1, 2, 8])
  def test_lowers_for_decode_rows(self, tp, t):
    self._check_module(tp, t, 7168, "bfloat16")

  @pytest.mark.parametrize("tp, t, d, dtype", [
      (1, 64, 7168, "float32"), (8, 257, 7168, "float32"), (2, 3, 128, "float32"), (8, 1, 128, "bfloat16"),
      (2, 257, 200, "bfloat16"), (8, 8, 200, "float32"),  # D not a multiple of 128: padded
  ])
  def test_lowers_for_awkward_shapes_and_dtypes(self, tp, t, d, dtype):
    self._check_module(tp, t, d, dtype)

  @pytest.mark.parametrize("push, entry_barrier", PROTOCOLS)
  @pytest.mark.parametrize("tp, t, d, dtype", [
      (2, 1, 7168, "bfloat16"), (2, 257, 7168, "bfloat16"), (8, 64, 7168, "bfloat16"), (8, 3000, 7168, "bfloat16"),
      (2, 257, 16384, "float32"), (8, 8, 200, "bfloat16"),  # 64 KiB rows: 2 SMEM slots; D padded
  ])
  def test_lowers_every_protocol(self, tp, t, d, dtype, push, entry_barrier):
    """Both pushes, with and without the entry barrier; "tma" is bulk copies (no multicast either)."""
    module = self._check_module(tp, t, d, dtype, push, entry_barrier)
    assert ("cp.async.bulk.global.shared::cta.bulk_group" in module) == (push == "tma")

  @pytest.mark.parametrize("tp", [2, 8])
  def test_draft_step_tail_is_the_kernel(self, tp):
    """The whole sharded draft step (tiny config) for CUDA: the kernel takes over the tail's psum."""
    cfg = jax_mtp.tiny()
    mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
    modules = {}
    for impl in ("xla", "pallas_gpu"):
      step = ShardedMtp(cfg, mesh, norm_impl=impl).compiled_step(0, None, "top_tokens")
      with jax.sharding.use_abstract_mesh(mesh):
        modules[impl] = jax.export.export(step, platforms=["cuda"])(*_abstract_args(cfg, mesh)).mlir_module()
    assert "custom_call @mosaic_gpu" not in modules["xla"]
    assert len(_kernel_calls(modules["pallas_gpu"])) == modules["pallas_gpu"].count("custom_call @mosaic_gpu") == 1
    # xla: embedding psum, o_proj psum, tail psum; the kernel takes over the tail's.
    assert len(re.findall(r"stablehlo\.all_reduce", modules["xla"])) == 3
    assert len(re.findall(r"stablehlo\.all_reduce", modules["pallas_gpu"])) == 2

  @staticmethod
  def _check_module(tp, t, d, dtype, push=None, entry_barrier=False):
    module = _cuda_module(tp, t, d, dtype, push, entry_barrier)
    assert len(_kernel_calls(module)) == module.count("custom_call @mosaic_gpu") == 1
    assert "all_reduce" not in module  # the kernel is the reduction
    assert "multimem" not in module  # never NVLink multicast (the PTX strings are in the module)
    communicates = "uses_xla_collective_metadata = true" in module
    assert communicates == (tp > 1)
    assert ("red.release.sys" in module) == (tp > 1)  # the semaphore signal after the peer stores
    return module


@pytest.mark.skipif(ON_GPU, reason="interpret mode is the CPU stand-in; TestOnGpu runs the kernel")
class TestInterpret:
  """tp = 1 (no communication): the real kernel body in GPU interpret mode on CPU."""

  @pytest.mark.parametrize("t, d, dtype", [
      (1, 128, jnp.float32), (3, 7168, jnp.bfloat16), (8, 200, jnp.bfloat16), (64, 7168, jnp.float32),
      (257, 200, jnp.float32), (257, 7168, jnp.bfloat16),
  ])
  def test_matches_xla(self, t, d, dtype):
    args = _inputs(1, t, d, dtype)
    mesh = make_mesh(1)
    _check(_harness(mesh, "pallas_gpu", plgpu.InterpretGPUParams())(*args), _harness(mesh, "xla")(*args), dtype, t, d)

  def test_without_an_axis_and_with_interpret_true(self):
    x, r, w = _inputs(1, 5, 256, jnp.float32)
    got = jax.jit(functools.partial(fused_allreduce_rmsnorm_gpu, eps=EPS, axis_name=None, interpret=True))(x[0], r, w)
    want = fused_allreduce_rmsnorm(x[0], r, w, EPS, axis_name=None)
    for g, w_, what in zip(got, want, ("normed", "new_residual")):
      assert_close(g, w_, what=what)


class TestBadInputs:

  @pytest.mark.parametrize("x_shape, w_shape, dtype, w_dtype, match", [
      ((4, 256), (256,), jnp.float16, jnp.float16, "dtype float16 is not supported by " + KERNEL_NAME),
      ((4, 256), (256,), jnp.bfloat16, jnp.float32, "weight dtype float32 != activation dtype bfloat16"),
      ((0, 256), (256,), jnp.float32, jnp.float32, r"shape \(T=0, D=256\) is not supported"),
      ((2, MAX_D + 128), (MAX_D + 128,), jnp.float32, jnp.float32, rf"shape \(T=2, D={MAX_D + 128}\)"),
  ])
  def test_unsupported_inputs_are_errors(self, x_shape, w_shape, dtype, w_dtype, match):
    x, w = jnp.zeros(x_shape, dtype), jnp.ones(w_shape, w_dtype)
    with pytest.raises(ValueError, match=match):
      fused_allreduce_rmsnorm_gpu(x, x, w, EPS, axis_name=None)

  @pytest.mark.parametrize("options, match", [
      (dict(push="multimem", entry_barrier=False), f"push='multimem' is not one of {re.escape(str(PUSH_MODES))}"),
      (dict(push="tma", entry_barrier=1), "entry_barrier=1 must be a bool"),
  ])
  def test_unknown_protocol_is_an_error(self, options, match):
    x = jnp.zeros((2, 128), jnp.float32)
    with pytest.raises(ValueError, match=match):
      with_protocol(x, x, x[0], EPS, axis_name=None, interpret=None, **options)

  def test_public_wrapper_offers_no_protocol_choice(self):
    """The experiments' protocol knobs stay out of the production signature (benchmarks reach them
    through `with_protocol`)."""
    x = jnp.zeros((2, 128), jnp.float32)
    with pytest.raises(TypeError, match="push"):
      fused_allreduce_rmsnorm_gpu(x, x, x[0], EPS, axis_name=None, push="st")

  @pytest.mark.skipif(jax.device_count() < 2, reason="needs a 2-device mesh")
  def test_interpret_with_communication_is_an_error(self):
    args = _inputs(2, 2, 128, jnp.float32)
    with pytest.raises(ValueError, match="GPU interpret mode has no semaphores"):
      _harness(make_mesh(2), "pallas_gpu", plgpu.InterpretGPUParams())(*args)


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (Hopper); run with JAX_PLATFORMS=cuda")
class TestOnGpu:
  """The compiled kernel on the GPU machine vs the XLA path; every case repeats to flush races."""

  @pytest.mark.parametrize("t, d, dtype", [
      (1, 7168, jnp.bfloat16), (8, 7168, jnp.bfloat16), (64, 7168, jnp.bfloat16), (256, 7168, jnp.bfloat16),
      (257, 7168, jnp.float32), (3, 128, jnp.float32), (257, 200, jnp.bfloat16),
  ])
  # tp = 1 does not communicate: only the first protocol applies there
  @pytest.mark.parametrize("tp, push, entry_barrier", [(1, *PROTOCOLS[0])] +
                           [(tp, *protocol) for tp in (2, 4, 8) for protocol in PROTOCOLS])
  def test_matches_xla(self, tp, t, d, dtype, push, entry_barrier):
    if tp > jax.device_count():
      pytest.skip(f"tp={tp} needs {tp} GPUs, {jax.device_count()} present")
    mesh = make_mesh(tp)
    kernel = _harness(mesh, "pallas_gpu", push=push, entry_barrier=entry_barrier)
    xla = _harness(mesh, "xla")
    inputs = [_inputs(tp, t, d, dtype, seed) for seed in range(5)]
    outs = [kernel(*args) for args in inputs]  # back to back: a fast device reaches the next call early
    for args, got in zip(inputs, outs):
      _check(got, xla(*args), dtype, t, d)


@pytest.mark.skipif(ON_GPU, reason="needs CPU devices; the GPU machine's mesh has GPUs (JAX_PLATFORMS=cuda)")
def test_building_a_gpu_kernel_model_on_cpu_devices_is_an_error():
  """The runtime is checked when the model is built, naming what is missing (here: GPUs)."""
  with pytest.raises(RuntimeError, match="impl='pallas_gpu' needs NVIDIA GPUs, but the mesh has cpu devices"):
    ShardedMtp(jax_mtp.tiny(), jax_mtp.make_mesh(2), norm_impl="pallas_gpu")
  with pytest.raises(RuntimeError, match="impl='pallas_gpu' needs NVIDIA GPUs"):
    jax_mtp.Speculator(jax_mtp.tiny(), jax_mtp.make_mesh(1), 2, norm_impl="pallas_gpu")
