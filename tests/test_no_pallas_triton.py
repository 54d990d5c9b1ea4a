"""Issue 28: no kernel here uses Pallas's Triton backend (deprecated since JAX 0.11.0, to be removed). Importing every
module of `jax_mtp` and `jax_mtp.kernels`, and tracing the FP8 grouped matmul (the last kernel that was on it) for a
GPU, loads no module of that backend, in a fresh process (another test may have loaded it for its own reasons)."""

import os
import subprocess
import sys

_PROBE = """
import importlib, pkgutil, sys
import jax, jax.numpy as jnp
import jax_mtp, jax_mtp.kernels
for package in (jax_mtp, jax_mtp.kernels):
  for module in pkgutil.iter_modules(package.__path__):
    if module.name != "__main__":
      importlib.import_module(f"{package.__name__}.{module.name}")
from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul
args = (jax.ShapeDtypeStruct((8, 256), jnp.bfloat16), jax.ShapeDtypeStruct((2, 256, 128), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct((2, 2, 1), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32))
jax.jit(lambda *a: fp8_grouped_matmul(*a, backend="gpu")).trace(*args).lower(lowering_platforms=("cuda",))
print(sorted(name for name in sys.modules if name.startswith("jax._src.pallas.triton")
             or name.startswith("jax.experimental.pallas.triton")))
"""


def test_no_module_of_pallas_triton_is_loaded():
  out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
