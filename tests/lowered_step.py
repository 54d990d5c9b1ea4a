"""The MTP draft step of a config exported for a platform (an abstract H200 mesh for CUDA), as MLIR text:
for the tests that prove a kernel is in the lowered program when its impl asks for it."""

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

import jax_mtp

H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")


def mtp_step_module(cfg: jax_mtp.MtpConfig, platform: str, batch: int, capacity: int) -> str:
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, batch, capacity))
  ids = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  step = jax.jit(lambda p, i, pos, h, c: jax_mtp.MtpPredictor(cfg).apply({"params": p}, i, pos, h, c).hidden_BTD)
  checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(step, platforms=[platform], disabled_checks=checks)
    return exported(params, ids, ids, hidden, caches).mlir_module()
