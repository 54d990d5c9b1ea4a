"""The fused DSA index-scores kernel for TPUs (kernels/index_scores.py): equal to the XLA formulation
(`jax_mtp.indexer.index_scores`) and to a float64 formula on awkward shapes, fp32 / bf16 / fp8 keys,
in Pallas interpret mode; in the lowered TPU program of the MTP step when asked for and in no `auto` program;
compiled for v5e and v6e through libtpu; refused with the offending values where it cannot run (its GPU form on
Pallas's Triton backend is gone: the Mosaic GPU kernel's tests are tests/test_index_scores_mgpu.py); `auto`'s
resolution table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.indexer import resolve_index_scores_impl
from jax_mtp.kernels.index_scores import KERNEL_NAME, Config, index_scores_pallas
from jax_mtp.kernels.index_scores_mgpu import KERNEL_NAME as MGPU_KERNEL
from tests.index_scores_cases import (assert_equals_xla_and_the_formula, assert_positions_bound_the_scored_slots,
                                       inputs, keys_as)
from tests.lowered_step import mtp_step_module
from tests.tpu_toolchain import requires_libtpu


@pytest.mark.parametrize("b,t,i,j,s,block", [(1, 1, 16, 16, 128, 128), (3, 3, 4, 48, 384, 128),
                                              (2, 5, 8, 32, 512, 256), (1, 4, 64, 128, 256, 256)])
@pytest.mark.parametrize("keys", ["float32", "bfloat16", "float8_e4m3fn"])
def test_kernel_equals_xla_and_the_formula(b, t, i, j, s, block, keys):
  q, k, w = inputs(b, t, i, j, s)
  k, k_scale, dot = keys_as(k, keys)
  got = index_scores_pallas(q.astype(dot), k, w, 0.25, k_scale_BS=k_scale, config=Config(block_slots=block),
                            backend="interpret")
  assert_equals_xla_and_the_formula(got, q, k, w, 0.25, k_scale=k_scale, dot=dot, what=f"kernel, {keys} keys")


@pytest.mark.parametrize("t,tokens", [(5, 4), (9, 4), (3, 1), (3, 4)])
def test_positions_bound_the_scored_slots(t, tokens):
  config = Config(block_slots=128, block_tokens=tokens)
  assert_positions_bound_the_scored_slots(
      lambda q, k, w, scale, positions: index_scores_pallas(q, k, w, scale, positions_BT=positions, config=config,
                                                            backend="interpret"), t, tokens, 128)


def test_kernel_refuses_what_it_cannot_run():
  q, k, w = inputs(1, 1, 16, 16, 200)
  with pytest.raises(ValueError, match="200 is not a multiple of block_slots=128"):
    index_scores_pallas(q, k, w, 1.0, config=Config(block_slots=128), backend="interpret")
  for gpu in ("cuda", "gpu"):  # the Triton form was removed (issue 28)
    with pytest.raises(ValueError, match=f"backend='{gpu}' is not one of \\('tpu', 'interpret'\\)"):
      index_scores_pallas(q, k[:, :128], w, 1.0, config=Config(block_slots=128), backend=gpu)
  with pytest.raises(ValueError, match="do not agree"):
    index_scores_pallas(q, k[:, :128, :8], w, 1.0, config=Config(block_slots=128), backend="interpret")
  with pytest.raises(ValueError, match="cannot bound the slots on backend='tpu'"):
    index_scores_pallas(q, k[:, :128], w, 1.0, positions_BT=jnp.zeros((1, 1), jnp.int32), config=Config(block_slots=128),
                        backend="tpu")


def _kernel_cfg(**overrides):
  return jax_mtp.tiny(**{"dtype": "bfloat16", "param_dtype": "bfloat16", "index_n_heads": 16, **overrides})


def test_resolution_table():
  # auto on GPUs: the Mosaic GPU kernel where it takes the model (measured ahead of Triton's on an H200) ...
  assert resolve_index_scores_impl(_kernel_cfg(), "gpu", 512) == "mosaic_gpu"
  assert resolve_index_scores_impl(_kernel_cfg(index_cache_dtype="fp8", index_head_dim=32), "gpu",
                                   512) == "mosaic_gpu"
  # ... else XLA: models only the removed Triton kernel took ...
  for triton_only in (_kernel_cfg(index_cache_dtype="fp8"),  # fp8 keys of head dim 16
                      _kernel_cfg(index_cache_dtype="float32"),  # keys neither the model's dtype nor float8
                      _kernel_cfg(index_n_heads=272)):  # more heads than a wgmma's N
    assert resolve_index_scores_impl(triton_only, "gpu", 512) == "xla"
  # ... and where no kernel takes the cache
  assert resolve_index_scores_impl(_kernel_cfg(), "gpu", 500) == "xla"  # auto: a capacity the kernels cannot take
  assert resolve_index_scores_impl(_kernel_cfg(), "tpu", 512) == "xla"  # auto: not timed on a TPU
  assert resolve_index_scores_impl(_kernel_cfg(), "cpu", 512) == "xla"
  assert resolve_index_scores_impl(_kernel_cfg(index_scores_impl="pallas_tpu"), "cpu", 512) == "pallas_tpu"  # AOT
  with pytest.raises(ValueError, match="float32.*capacity 500 is not a multiple of 256.*index_n_heads=4"):
    resolve_index_scores_impl(jax_mtp.tiny(index_scores_impl="pallas_tpu"), "tpu", 500)
  with pytest.raises(ValueError, match="keys in the model's dtype \\(bfloat16\\) or float8, not float32.*at most 256 "
                     "indexer heads"):
    resolve_index_scores_impl(_kernel_cfg(index_cache_dtype="float32", index_n_heads=272,
                                          index_scores_impl="mosaic_gpu"), "gpu", 512)
  for gone in ("triton", "pallas_gpu"):  # the Triton kernel was removed (issue 28)
    with pytest.raises(jax_mtp.ConfigError, match=f"index_scores_impl='{gone}'"):
      jax_mtp.tiny(index_scores_impl=gone)


def _step_module(impl: str, platform: str) -> str:
  """The MTP step of a bf16 model (16 indexer heads, a 512-slot cache) lowered for `platform`."""
  return mtp_step_module(_kernel_cfg(index_scores_impl=impl), platform, 2, 512)


def test_the_kernel_is_in_the_lowered_tpu_step_when_asked_for_and_not_under_auto():
  """auto follows the program's platform (jax_mtp.platform): XLA's scores on TPUs (in a CUDA program the Mosaic GPU
  kernel where it takes the model, not this one: tests/test_index_scores_mgpu.py)."""
  assert KERNEL_NAME in _step_module("pallas_tpu", "tpu")
  assert KERNEL_NAME not in _step_module("auto", "tpu")


def test_auto_gives_a_cuda_step_the_mosaic_kernel_does_not_take_xlas_scores():
  """float8 keys of head dim 16: the Mosaic GPU kernel widens float8 keys of head dims in multiples of 32 only; no
  Pallas kernel in the step."""
  module = mtp_step_module(_kernel_cfg(index_cache_dtype="fp8"), "cuda", 2, 512)
  assert KERNEL_NAME not in module and MGPU_KERNEL not in module


@pytest.mark.slow
@requires_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2"])
def test_kernel_compiles_for_tpu(topology):
  """V3.2 widths (64 heads × 128, T = 4, S = 4096), bf16 keys and fp8 keys + scales, through libtpu."""
  mesh = Mesh(np.array(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[:1]), ("x",))
  arg = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))  # noqa: E731
  b, t, i, j, s = 8, 4, 64, 128, 4096
  fn = jax.jit(lambda q, k, w, ks: index_scores_pallas(q, k, w, 0.1, k_scale_BS=ks, backend="tpu"))
  for keys, scales in [(jnp.bfloat16, None), (jnp.float8_e4m3fn, arg((b, s), jnp.float32))]:
    hlo = fn.lower(arg((b, t, i, j), jnp.bfloat16), arg((b, s, j), keys), arg((b, t, i), jnp.float32),
                   scales).compile().as_text()
    assert hlo.count("tpu_custom_call") == 1 and KERNEL_NAME in hlo, keys
