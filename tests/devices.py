"""A test's device needs: a tp = n mesh needs n devices. The CPU suite has 8 virtual ones (conftest.py); a one-GPU
machine (the lent H200's runs) has one, where such a case skips, naming what it needs, instead of failing in
`make_mesh`."""

import jax
import pytest


def needs_devices(n: int) -> None:
  """Skip the calling test unless this machine has ≥ n devices."""
  if jax.device_count() < n:
    pytest.skip(f"a tp = {n} mesh needs {n} devices; this machine has {jax.device_count()}")
