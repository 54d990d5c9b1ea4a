"""GPUs other than Hopper (Ampere, Ada, Blackwell, AMD): the Mosaic GPU kernels here and tokamax's grouped matmul
use wgmma and TMA, which only compute capability 9.x has. `auto` must not pick them there (XLA runs instead), and an explicit one is a clear error, not a failed compile. Checked on programs exported for
abstract devices from this host and on the resolvers' tables."""

import re

import jax
import pytest
from jax.sharding import AbstractMesh, AxisType

from jax_mtp.experts import resolve_expert_impl
from jax_mtp.indexer import resolve_index_scores_impl
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME as MOSAIC_SPARSE_MLA
from jax_mtp.mla import resolve_sparse_attention_impl
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform
from tests.lowered_step import mtp_step_module
from tests.sparse_mla_cases import dsa_kernel_cfg as _dsa_cfg


def _device(kind: str, platform: str = "cuda"):
  return jax.sharding.AbstractDevice(device_kind=kind, num_cores=132, platform=platform)


A100, B200, H100 = _device("NVIDIA A100-SXM4-80GB"), _device("NVIDIA B200"), _device("NVIDIA H100 80GB HBM3")
MI300X = _device("AMD Instinct MI300X", "rocm")


@pytest.mark.parametrize("device,hopper", [(H100, True), (_device("NVIDIA H200"), True), (_device("NVIDIA GH200"), True),
                                           (A100, False), (B200, False), (MI300X, False)],
                         ids=["H100", "H200", "GH200", "A100", "B200", "MI300X"])
def test_the_traced_programs_gpu_is_told_apart(device, hopper):
  with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=device)):
    assert lowering_platform() == "gpu" and lowering_gpu_is_hopper() is hopper


def test_a_cpu_is_not_a_hopper():
  assert lowering_platform() == "cpu" and not lowering_gpu_is_hopper()


def test_auto_keeps_off_the_mosaic_kernels_on_other_gpus():
  """The same model and call on a Hopper (the control) and on another GPU."""
  cfg = _dsa_cfg()
  for cache in (cfg, cfg.replace(kv_cache_dtype="fp8")):
    assert resolve_sparse_attention_impl(cache, "gpu", hopper=True) == "mosaic_gpu"
    assert resolve_sparse_attention_impl(cache, "gpu", hopper=False) == "xla"
  assert resolve_index_scores_impl(cfg, "gpu", 256, hopper=True) == "mosaic_gpu"
  assert resolve_index_scores_impl(cfg, "gpu", 256, hopper=False) == "xla"
  weights = jax.ShapeDtypeStruct((8, 256, 128), "bfloat16")
  for tokens, on_hopper in [(64, "mosaic_gpu"), (4096, "tokamax_gpu")]:  # a round's 128 assignments; a prefill chunk
    assert resolve_expert_impl("auto", "gpu", tokens, 2, weights, hopper=True) == on_hopper
    assert resolve_expert_impl("auto", "gpu", tokens, 2, weights, hopper=False) in ("gather", "ragged_dot")


def test_an_explicit_mosaic_kernel_on_another_gpu_is_one_clear_error():
  """Refused by name on a GPU that is not a Hopper; on a CPU the kernels still run in Pallas's interpreter."""
  with pytest.raises(ValueError, match="sparse_attention_impl='mosaic_gpu' cannot run here: .*need a Hopper GPU"):
    resolve_sparse_attention_impl(_dsa_cfg(sparse_attention_impl="mosaic_gpu"), "gpu", hopper=False)
  with pytest.raises(ValueError, match="index_scores_impl='mosaic_gpu' cannot run here: .*need a Hopper GPU"):
    resolve_index_scores_impl(_dsa_cfg(index_scores_impl="mosaic_gpu"), "gpu", 256, hopper=False)
  with pytest.raises(ValueError, match=re.escape(f"moe_impl='tokamax_gpu': {NOT_HOPPER}")):
    resolve_expert_impl("tokamax_gpu", "gpu", 64, 2, jax.ShapeDtypeStruct((8, 256, 128), "bfloat16"), hopper=False)
  with pytest.raises(ValueError, match=re.escape(f"moe_impl='mosaic_gpu': {NOT_HOPPER}")):
    resolve_expert_impl("mosaic_gpu", "gpu", 64, 2, jax.ShapeDtypeStruct((8, 256, 128), "bfloat16"), hopper=False)
  assert resolve_sparse_attention_impl(_dsa_cfg(sparse_attention_impl="mosaic_gpu"), "cpu", hopper=False) == "mosaic_gpu"
  assert resolve_index_scores_impl(_dsa_cfg(index_scores_impl="mosaic_gpu"), "cpu", 256, hopper=False) == "mosaic_gpu"


@pytest.mark.parametrize("device", [A100, B200], ids=["A100", "B200"])
def test_the_step_exported_for_another_gpu_holds_no_mosaic_kernel(device):
  """`auto` in the MTP draft step at B = 64: on an H100 the Mosaic sparse-MLA kernel and index scores (the control);
  on an A100 or a B200 no Mosaic GPU kernel at all, and no Pallas Triton one either (XLA's sparse form)."""
  cfg = _dsa_cfg()
  hopper = mtp_step_module(cfg, "cuda", 64, 512, device=H100)
  assert MOSAIC_SPARSE_MLA in hopper and "mosaic_gpu" in hopper
  other = mtp_step_module(cfg, "cuda", 64, 512, device=device)
  assert "mosaic_gpu" not in other and "xla.gpu.triton" not in other


def test_an_explicit_fp8_kernel_on_another_gpu_is_refused_and_auto_dequantises():
  """FP8 codes kept on the device, a dense linear traced for an A100: `auto` dequantises in the program (no
  kernel); an explicit fp8_matmul_impl, or the experts' fp8_grouped_gpu (fp8_kernel=True), is one error naming
  why, not a silent dequantisation (on an H100, the control, the kernel runs)."""
  import jax.numpy as jnp  # noqa: PLC0415
  from jax_mtp import fp8  # noqa: PLC0415
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME  # noqa: PLC0415
  from jax_mtp.layers import Linear  # noqa: PLC0415
  params = {"kernel": jax.ShapeDtypeStruct((256, 384), jnp.float8_e4m3fn),
            fp8.scale_name("kernel"): jax.ShapeDtypeStruct((2, 3), jnp.float32)}
  x = jax.ShapeDtypeStruct((4, 256), jnp.bfloat16)

  def lowered(device, **kwargs):
    module = Linear(256, 384, "bfloat16", "bfloat16", (128, 128), **kwargs)
    mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
      return jax.export.export(jax.jit(lambda p, x: module.apply({"params": p}, x)), platforms=["cuda"])(
          params, x).mlir_module()

  assert KERNEL_NAME in lowered(H100, fp8_impl="mosaic_gpu")
  assert KERNEL_NAME not in lowered(A100) and "mosaic_gpu" not in lowered(A100)
  for kwargs in ({"fp8_impl": "mosaic_gpu"}, {"fp8_kernel": True}):
    with pytest.raises(ValueError, match=re.escape(NOT_HOPPER)):
      lowered(A100, **kwargs)

