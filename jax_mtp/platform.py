"""Which platform the program being traced is for, so `auto` kernel choices follow the program, not the host.

Inside `shard_map` or `jax.sharding.use_abstract_mesh` JAX knows the mesh's devices: a program traced for an
abstract H200 mesh (an export from a CPU host, tests/lowered_step.py) is a CUDA program and gets the CUDA
kernels, as it would on the GPU itself. Outside any mesh it is JAX's default backend.
"""

from __future__ import annotations

import jax

_PLATFORMS = {"cuda": "gpu", "rocm": "gpu"}  # device platforms under JAX's backend names


def lowering_platform() -> str:
  """"gpu", "tpu" or "cpu": the current mesh's device platform, else `jax.default_backend()`."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = device.platform if device is not None and device.platform else jax.default_backend()
  return _PLATFORMS.get(platform, platform)
