"""The FP8 grouped matmul op's checks that every way of running it takes (tests/test_fp8_weights.py: the op as the
model calls it; tests/test_fp8_grouped_matmul_mgpu.py: the Mosaic GPU kernel's launches): random e4m3 codes and block scales, groups of given
sizes with spare rows past them (another device's assignments), and the output's group rows against the op's jnp
formula and against x times the exactly dequantised weights (fp32: summation order only)."""

import jax.numpy as jnp
import numpy as np

from jax_mtp import fp8
from jax_mtp.kernels.fp8_grouped_matmul import reference
from tests.tolerances import assert_close


def problem(e, k, n, sizes, spare=3, seed=0):
  """x (bf16, the kernels' activations) [Σ sizes + spare, K], codes [E, K, N], scales [E, K/128, N/128], sizes."""
  rng = np.random.default_rng(seed + e + k)
  codes = jnp.asarray(rng.standard_normal((e, k, n)) * 20, jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (e, k // 128, n // 128)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((sum(sizes) + spare, k)), jnp.bfloat16)
  return x, codes, scale, jnp.asarray(sizes, jnp.int32)


def assert_equals_the_formula_and_the_dequantised_product(got, x, codes, scale, sizes_E, what: str) -> None:
  """`got`'s group rows (the rows past them are the kernel's to leave) vs the formula and the exact product."""
  sizes = np.asarray(sizes_E)
  rows = int(sizes.sum())
  got = np.asarray(got)[:rows]
  assert_close(got, np.asarray(reference(x, codes, scale, sizes_E))[:rows], "float32", f"{what} vs formula")
  weights = np.asarray(fp8.dequantize(codes, scale, jnp.float32, (128, 128)))  # fp32: exact
  ids = np.repeat(np.arange(len(sizes)), sizes)
  exact = np.einsum("ak,akn->an", np.asarray(x[:rows], np.float32), weights[ids])
  assert_close(got, exact, "float32", f"{what} vs dequantised product")
