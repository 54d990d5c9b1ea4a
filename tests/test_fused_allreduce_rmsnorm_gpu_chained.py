"""Opt-1 GPU kernel chained through a persistent workspace, without XLA's device barrier.

On CPU: the chain (sync kernel + chained calls, unrolled and in a fori_loop) is lowered for CUDA on
an abstract H200 mesh; bad workspaces and meshes are errors. On the GPU machine (JAX_PLATFORMS=cuda,
≥ 2 GPUs): chains of calls with distinct data per call, back to back, against the XLA path call by
call, bit-identical across devices, repeated programs; and no XLA copy of the workspace in the
compiled program (a copy between the chain's kernels would break the protocol).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.drafter import MtpDrafter, Window
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.kernels.fused_allreduce_rmsnorm import fused_allreduce_rmsnorm, reference
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_common import KERNEL_NAME, SXM_SMS, communicating_grid, resident_ctas
from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_chained import (CHAIN_MAX_ROWS, CHAIN_MIN_CALLS, CHAINED_KERNEL_NAME,
                                                                SYNC_KERNEL_NAME, GpuWorkspace,
                                                                fused_allreduce_rmsnorm_gpu_chained, gpu_workspace,
                                                                workspace_copies)
from jax_mtp.model import TargetModel, init_target_caches, init_target_params
from jax_mtp.sharding import jit_per_shard, make_mesh, param_specs, replicated, tensor_parallel
from tests.lowered_step import H200
from tests.tolerances import assert_close

EPS = 1e-6
ON_GPU = jax.devices()[0].platform == "gpu"


def _fused(impl: str, ws):
  if impl == "xla":
    return functools.partial(reference, axis_name="tp")
  return functools.partial(fused_allreduce_rmsnorm_gpu_chained, axis_name="tp", workspace=ws)


def _chain(mesh, impl: str, looped: bool):
  """jit(shard_map): N calls on x [N, tp, T, D] (device i gets x[:, i]) with residual r + call
  index. Unrolled: independent data per call; looped (fori_loop): call c+1 adds call c's normed to
  its partial, a true data chain. Outputs stacked [tp, N, T, D] (normed, new_residual)."""

  def per_device(x_N1TD, residual_TD, weight_D):
    x_NTD = x_N1TD[:, 0]
    n_calls, t, d = x_NTD.shape
    ws = gpu_workspace("tp", t, d, x_NTD.dtype) if impl == "pallas_gpu" else None
    fused = _fused(impl, ws)
    if not looped:
      outs = [fused(x_NTD[c], residual_TD + c, weight_D, EPS) for c in range(n_calls)]
      return tuple(jnp.stack(o)[None] for o in zip(*outs))

    def step(c, carry):
      normed_NTD, new_res_NTD, prev_TD = carry
      normed, new_res = fused(x_NTD[c] + prev_TD, residual_TD + c, weight_D, EPS)
      return normed_NTD.at[c].set(normed), new_res_NTD.at[c].set(new_res), normed

    zeros = jnp.zeros_like(x_NTD)
    normed_NTD, new_res_NTD, _ = jax.lax.fori_loop(0, n_calls, step, (zeros, zeros, jnp.zeros_like(residual_TD)))
    return normed_NTD[None], new_res_NTD[None]

  return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(None, "tp"), P(), P()),
                               out_specs=(P("tp"), P("tp")), check_vma=False))


def _shapes(n_calls, tp, t, d, dtype):
  return (jax.ShapeDtypeStruct((n_calls, tp, t, d), dtype), jax.ShapeDtypeStruct((t, d), dtype),
          jax.ShapeDtypeStruct((d,), dtype))


@functools.cache
def _cuda_module(tp: int, t: int, d: int, dtype_name: str, looped: bool) -> str:
  mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(_chain(mesh, "pallas_gpu", looped), platforms=["cuda"])
    return exported(*_shapes(3, tp, t, d, jnp.dtype(dtype_name))).mlir_module()


class TestCudaLowering:

  @pytest.mark.parametrize("looped", [False, True])
  @pytest.mark.parametrize("tp, t, d, dtype", [
      (2, 1, 7168, "bfloat16"), (2, 64, 7168, "bfloat16"), (8, 256, 7168, "bfloat16"),
      (8, 300, 7168, "bfloat16"),  # more rows than CTAs
      (2, 3, 200, "float32"),  # D padded
  ])
  def test_chain_lowers(self, tp, t, d, dtype, looped):
    module = _cuda_module(tp, t, d, dtype, looped)
    calls = [line for line in module.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
    assert len(calls) == (2 if looped else 4)  # the sync kernel, then one chained call per call site
    assert sum(SYNC_KERNEL_NAME in line for line in calls) == 1
    assert sum(f"{CHAINED_KERNEL_NAME}_mosaic_gpu" in line for line in calls) == len(calls) - 1
    # Only the sync kernel keeps XLA's device barrier; every kernel talks to peers.
    assert module.count("skip_device_barrier = true") == len(calls) - 1
    assert module.count("uses_xla_collective_metadata = true") == len(calls)
    assert "all_reduce" not in module and "multimem" not in module


# These build a tp = 2 mesh: on one GPU (JAX_PLATFORMS=cuda, one device) there is none to build.
_two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="builds a 2-device mesh; this machine has 1 device")


class TestBadInputs:

  def _run(self, mesh, fn, *args):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))(*args)

  @_two_devices
  def test_workspace_must_match_the_call(self):
    x = jnp.zeros((4, 128), jnp.float32)

    def call(x):
      ws = gpu_workspace("tp", 8, 128, jnp.float32)
      return fused_allreduce_rmsnorm_gpu_chained(x, x, x[0], EPS, axis_name="tp", workspace=ws)[0]

    with pytest.raises(ValueError, match=r"workspace is for \(axis, T, padded D, dtype\) = \('tp', 8, 128"):
      self._run(make_mesh(2), call, x)

  @_two_devices
  def test_workspace_type_and_tp(self):
    x = jnp.zeros((4, 128), jnp.float32)
    with pytest.raises(TypeError, match="workspace must be a GpuWorkspace"):
      self._run(make_mesh(2), lambda x: fused_allreduce_rmsnorm_gpu_chained(
          x, x, x[0], EPS, axis_name="tp", workspace=object())[0], x)
    with pytest.raises(ValueError, match="is for tp ≥ 2"):
      self._run(make_mesh(1), lambda x: gpu_workspace("tp", 4, 128, x.dtype).recv[...][0, 0], x)

  def test_workspace_is_for_the_gpu_kernel_only(self):
    x = jnp.zeros((4, 128), jnp.float32)
    with pytest.raises(ValueError, match="workspace applies to impl='pallas_gpu', not impl='xla'"):
      fused_allreduce_rmsnorm(x, x, x[0], EPS, axis_name=None, impl="xla", workspace=object())

  @_two_devices
  def test_needs_a_one_axis_mesh(self):
    mesh = jax.make_mesh((1, 2), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2)
    with pytest.raises(ValueError, match=r"needs a 1-D mesh over axis 'tp'.*\('dp', 'tp'\)"):
      self._run(mesh, lambda x: gpu_workspace("tp", 4, 128, x.dtype).recv[...][0, 0], jnp.zeros((4,)))

  def test_grid_fits_the_devices_sms(self):
    """Spin-waiting CTAs must all be resident: the grid is bounded by the mesh devices' SM count."""
    for cores, want in ((114, 114), (132, 132), (None, SXM_SMS)):
      device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=cores, platform="cuda")
      with jax.sharding.use_abstract_mesh(AbstractMesh((2,), ("tp",), axis_types=(AxisType.Auto,),
                                                       abstract_device=device)):
        assert resident_ctas() == want

  def test_workspace_copies_finds_copies_of_its_shapes(self):
    hlo = "  %copy.1 = s32[256]{0} copy(s32[256]{0} %p)\n  %copy.2 = f32[4]{0} copy(f32[4]{0} %q)\n"
    assert workspace_copies(hlo, ["s32[256]"]) == ["%copy.1 = s32[256]{0} copy(s32[256]{0} %p)"]
    assert workspace_copies(hlo, ["bf16[2,2,1,7168]"]) == []
    assert GpuWorkspace._fields[:2] == ("recv", "counters")


@pytest.mark.skipif(not ON_GPU or jax.device_count() < 2, reason="needs ≥ 2 Hopper GPUs (JAX_PLATFORMS=cuda)")
class TestOnGpu:
  """Chains of 6 calls (the parity buffers turn over three times), each program run 3 times back to
  back with fresh inputs, against the XLA path call by call."""

  @pytest.mark.parametrize("looped", [False, True])
  @pytest.mark.parametrize("t, d, dtype", [
      (1, 7168, jnp.bfloat16), (8, 7168, jnp.bfloat16), (64, 7168, jnp.bfloat16), (256, 7168, jnp.bfloat16),
      (300, 7168, jnp.float32), (3, 200, jnp.float32),
  ])
  @pytest.mark.parametrize("tp", [2, 4, 8])
  def test_chain_matches_xla(self, tp, t, d, dtype, looped):
    if tp > jax.device_count():
      pytest.skip(f"tp={tp} needs {tp} GPUs, {jax.device_count()} present")
    mesh, n_calls = make_mesh(tp), 6
    kernel, xla = _chain(mesh, "pallas_gpu", looped), _chain(mesh, "xla", looped)
    inputs = [_inputs(n_calls, tp, t, d, dtype, seed) for seed in range(3)]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # the grid follows the GPUs' SM count
      shapes = _workspace_shapes(tp, t, d, dtype)
    assert workspace_copies(kernel.lower(*inputs[0]).compile().as_text(), shapes) == []
    outs = [kernel(*args) for args in inputs]  # back to back: a fast device runs ahead into the next program
    for args, got in zip(inputs, outs):
      want = xla(*args)
      for g, w, what in zip(got, want, ("normed", "new_residual")):
        assert_close(np.asarray(g[0], np.float32), np.asarray(w[0], np.float32), jnp.dtype(dtype).name, what=what)
        for i in range(1, tp):
          np.testing.assert_array_equal(np.asarray(g[i]), np.asarray(g[0]), err_msg=f"{what}: device {i} != 0")


  def test_speculator_with_chained_target_and_drafts_matches_xla(self):
    """A 4-layer target at tp = 2: verification (T = B·(k+1) ≤ CHAIN_MAX_ROWS) chains its 4 fused
    calls, the drafter its k − 1 = 3 steps; tokens and acceptance equal the XLA speculator's."""
    from tests.test_speculative import CAPACITY, MAX_NEW, SMALL_VOCAB, _prompts

    cfg = jax_mtp.tiny(vocab_size=SMALL_VOCAB, num_hidden_layers=4)
    target_params, mtp_params = jax_mtp.init_target_params(cfg, jax.random.key(0)), jax_mtp.init_params(
        cfg, jax.random.key(1))
    results = {}
    for impl in ("pallas_gpu", "xla"):
      spec = jax_mtp.Speculator(cfg, make_mesh(2), CHAIN_MIN_CALLS + 1, norm_impl=impl)
      results[impl] = spec.generate(spec.shard(target_params, mtp_params), _prompts(SMALL_VOCAB), MAX_NEW,
                                    capacity=CAPACITY)
    kernel, xla = results["pallas_gpu"], results["xla"]
    assert kernel.tokens == xla.tokens
    assert (kernel.metrics.rounds, kernel.metrics.accepted_per_position) == (
        xla.metrics.rounds, xla.metrics.accepted_per_position)

  def test_speculator_with_chained_draft_steps_equals_plain_greedy(self):
    """End to end at tp = 2: k = CHAIN_MIN_CALLS + 1 (its draft steps chain) with the kernel gives
    plain greedy decoding's tokens and the XLA speculator's acceptance."""
    from tests.test_speculative import CAPACITY, MAX_NEW, SMALL_VOCAB, _plain, _prompts, _weights

    cfg, target_params, mtp_params = _weights(SMALL_VOCAB)
    results = {}
    for impl in ("pallas_gpu", "xla"):
      spec = jax_mtp.Speculator(cfg, make_mesh(2), CHAIN_MIN_CALLS + 1, norm_impl=impl)
      results[impl] = spec.generate(spec.shard(target_params, mtp_params), _prompts(SMALL_VOCAB), MAX_NEW,
                                    capacity=CAPACITY)
    assert results["pallas_gpu"].tokens == _plain(SMALL_VOCAB)
    kernel, xla = results["pallas_gpu"].metrics, results["xla"].metrics
    assert (kernel.rounds, kernel.accepted_per_position) == (xla.rounds, xla.accepted_per_position)
    assert kernel.draft_tokens_accepted > 0


def _inputs(n_calls, tp, t, d, dtype, seed):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((n_calls, tp, t, d)), dtype), jnp.asarray(rng.standard_normal((t, d)), dtype),
          jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype))


def _workspace_shapes(tp, t, d, dtype) -> list[str]:
  """The workspace's HLO shapes: recv and counters (kernels/fused_allreduce_rmsnorm_gpu_chained.py)."""
  from jax_mtp.kernels.fused_allreduce_rmsnorm_gpu_chained import _counters_size
  hlo_dtype = {"bfloat16": "bf16", "float32": "f32"}[jnp.dtype(dtype).name]
  return [f"{hlo_dtype}[2,{tp},{t},{d + (-d % 128)}]", f"s32[{_counters_size(communicating_grid(t), tp)}]"]


@pytest.mark.parametrize("k, chained", [(CHAIN_MIN_CALLS, False), (CHAIN_MIN_CALLS + 1, True)])
def test_draft_steps_chain_from_chain_min_steps(k, chained):
  """The drafter's k − 1 steps after the first chain their kernels once there are CHAIN_MIN_CALLS of
  them: the proposal's CUDA module then holds the sync kernel and the chained kernel (once, in the
  scan); the catch-up keeps the standalone kernel (its T differs)."""
  cfg, tp, batch, capacity = jax_mtp.tiny(), 2, 2, 16
  mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  drafter = MtpDrafter(cfg, tensor_parallel(tp), "pallas_gpu")

  def per_shard(own, target_shared, window, caches):
    return drafter.propose(drafter.variables(own, target_shared), window, caches, k)

  w = 3
  window = Window(jax.ShapeDtypeStruct((batch, w), jnp.int32),
                  jax.ShapeDtypeStruct((batch, w, cfg.hidden_size), jnp.dtype(cfg.dtype)),
                  jax.ShapeDtypeStruct((batch,), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32))
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  own = {name: value for name, value in params.items() if name not in SHARED_WITH_TARGET}
  target_shared = {name: params[name] for name in SHARED_WITH_TARGET}  # the target's arrays, by the same names
  caches = jax.eval_shape(lambda: drafter.init_caches(batch, capacity))
  with jax.sharding.use_abstract_mesh(mesh):
    fn = jit_per_shard(per_shard, mesh, (drafter.param_specs(), param_specs(target_shared), replicated(), replicated()))
    module = jax.export.export(fn, platforms=["cuda"])(own, target_shared, window, caches).mlir_module()
  # the catch-up (T = B·W) always runs the standalone kernel; the scanned step the chained or standalone one
  want = [KERNEL_NAME, SYNC_KERNEL_NAME, CHAINED_KERNEL_NAME] if chained else [KERNEL_NAME, KERNEL_NAME]
  assert _mosaic_kinds(module) == sorted(want)


def _mosaic_kinds(module: str) -> list[str]:
  """Which of our GPU kernels each Mosaic custom call of an exported module is, sorted."""
  return sorted(kind for line in module.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line
                for kind in (KERNEL_NAME, SYNC_KERNEL_NAME, CHAINED_KERNEL_NAME) if f"{kind}_mosaic_gpu" in line)


@pytest.mark.parametrize("layers, batch, tokens, chained", [
    (2, 2, 1, False),  # 2 calls: fewer than CHAIN_MIN_CALLS
    (3, 2, 4, True),  # decode / verification size: every boundary and the final norm chain
    (3, 1, CHAIN_MAX_ROWS + 1, False),  # prefill size: standalone calls
])
def test_target_fuses_every_layer_boundary(layers, batch, tokens, chained):
  """The target's L reduce + add + norm calls (L − 1 boundaries, the final norm) are Opt-1 kernels,
  chained through one workspace at decode sizes; no all-reduce of the MLP outputs is left."""
  cfg, tp = jax_mtp.tiny(num_hidden_layers=layers), 2
  mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  modules = {}
  for impl in ("xla", "pallas_gpu"):
    model = TargetModel(cfg, tensor_parallel(tp), impl)

    def per_shard(params, ids, positions, caches):
      return model.apply({"params": params}, ids, positions, caches).hidden_BTD

    params = jax.eval_shape(lambda key: init_target_params(cfg, key), jax.random.key(0))
    caches = jax.eval_shape(lambda: init_target_caches(cfg, batch, tokens + 1))
    ids = jax.ShapeDtypeStruct((batch, tokens), jnp.int32)
    with jax.sharding.use_abstract_mesh(mesh):
      fn = jit_per_shard(per_shard, mesh, (param_specs(params), replicated(), replicated(), replicated()))
      modules[impl] = jax.export.export(fn, platforms=["cuda"])(params, ids, ids, caches).mlir_module()
  want = [SYNC_KERNEL_NAME] + [CHAINED_KERNEL_NAME] * layers if chained else [KERNEL_NAME] * layers
  assert _mosaic_kinds(modules["pallas_gpu"]) == sorted(want)
  # the kernels take over exactly the L all-reduces of the fused calls (embedding, o_proj ones stay)
  all_reduces = {impl: module.count("stablehlo.all_reduce") for impl, module in modules.items()}
  assert all_reduces["xla"] - all_reduces["pallas_gpu"] == layers
