"""The Pallas kernels are really in the program: lower the sharded draft step for TPU on this CPU
machine (`jax.export`, abstract mesh) and find the named Mosaic kernel where the XLA all-reduce of
the block tail was. (Mosaic's own compile needs libtpu: tools/tpu_aot_compile.py.)"""

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mtp
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu import KERNEL_NAME
from jax_mtp import ShardedMtp
from jax_mtp.sharding import param_specs


def _abstract_args(cfg, mesh, batch=2, capacity=8):
  def placed(tree, specs=None):
    specs = jax.tree.map(lambda _: P(), tree) if specs is None else specs
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)),
                        tree, specs)

  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, batch, capacity))
  ids = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  return placed(params, param_specs(params)), placed(ids), placed(ids), placed(hidden), placed(caches)


@functools.cache
def _tpu_module(impl: str, tp: int) -> str:
  cfg = jax_mtp.tiny()
  mesh = AbstractMesh((tp,), ("tp",), axis_types=(AxisType.Auto,))
  step = ShardedMtp(cfg, mesh, norm_impl=impl).compiled_step(0, None, "top_tokens")
  return jax.export.export(step, platforms=["tpu"])(*_abstract_args(cfg, mesh)).mlir_module()


@pytest.mark.parametrize("tp", [2, 8])
def test_tpu_kernel_replaces_the_tail_all_reduce(tp):
  xla, pallas = _tpu_module("xla", tp), _tpu_module("pallas_tpu", tp)
  assert KERNEL_NAME not in xla and "tpu_custom_call" not in xla
  assert KERNEL_NAME in pallas and pallas.count("tpu_custom_call") == 1
  # xla: embedding psum, o_proj psum, tail psum; the kernel takes over the tail's.
  assert len(re.findall(r"stablehlo\.all_reduce", xla)) == 3
  assert len(re.findall(r"stablehlo\.all_reduce", pallas)) == 2
