"""Which platform the program being traced is for, so `auto` kernel choices follow the program, not the host.

Inside `shard_map` or `jax.sharding.use_abstract_mesh` JAX knows the mesh's devices: a program traced for an
abstract H200 mesh (an export from a CPU host, tests/lowered_step.py) is a CUDA program and gets the CUDA
kernels, as it would on the GPU itself. Outside any mesh it is JAX's default backend.
"""

from __future__ import annotations

import jax

_PLATFORMS = {"cuda": "gpu", "rocm": "gpu"}  # device platforms under JAX's backend names


# Device kinds of sm_90 GPUs (GH200's kind names its H100 or H200), for devices that state no compute capability: an
# abstract device (an export from a CPU host) has only a kind.
HOPPER_KINDS = ("H100", "H200", "H800", "H20")
# Why an explicit Mosaic GPU kernel cannot run on this GPU (a resolver's problem line)
NOT_HOPPER = "the Mosaic GPU kernels need a Hopper GPU (compute capability 9.x: wgmma, TMA); this one is not"


def lowering_platform() -> str:
  """"gpu", "tpu" or "cpu": the current mesh's device platform, else `jax.default_backend()`."""
  device = _lowering_device()
  return backend_name(device.platform if device is not None and device.platform else jax.default_backend())


def backend_name(platform: str) -> str:
  """A device's platform under JAX's backend names ("cuda" and "rocm" are "gpu")."""
  return _PLATFORMS.get(platform, platform)


def lowering_gpu_is_hopper() -> bool:
  """Whether the traced program's GPU is a Hopper (compute capability 9.x: wgmma, TMA), the only GPU the Mosaic GPU
  kernels here are written for (ours and tokamax's use wgmma, which Ampere, Ada, Blackwell and AMD GPUs lack):
  the device's compute capability where it states one, else its kind (`HOPPER_KINDS`). False off GPUs."""
  device = _lowering_device()
  if device is None:
    device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  if capability:
    return str(capability).split(".")[0] == "9"
  kind = getattr(device, "device_kind", "") or ""
  return backend_name(device.platform) == "gpu" and any(k in kind for k in HOPPER_KINDS)


def _lowering_device():
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else getattr(mesh, "abstract_device", None)
