"""A test's device needs: a tp = n mesh needs n devices. The CPU suite has 8 virtual ones (conftest.py); a one-GPU
machine (the lent H200's runs) has one, where such a case skips, naming what it needs, instead of failing in
`make_mesh`."""

import jax
import pytest


def needs_a_cpu_device(why: str) -> None:
  """Skip the calling test (or fixture) unless a CPU device runs beside the accelerator: a host callback
  (`jax.pure_callback`) needs one, and the device scripts' JAX_PLATFORMS=cuda has none (JAX_PLATFORMS=cuda,cpu does)."""
  try:
    jax.devices("cpu")
  except RuntimeError:  # JAX_PLATFORMS names no cpu
    pytest.skip(f"{why}, which needs a CPU device: JAX_PLATFORMS=cuda,cpu")


def needs_devices(n: int) -> None:
  """Skip the calling test unless this machine has ≥ n devices."""
  if jax.device_count() < n:
    pytest.skip(f"a tp = {n} mesh needs {n} devices; this machine has {jax.device_count()}")
