"""benchmarks/mgpu_handoff.py's kernels do what their rows say, in Pallas's GPU interpreter: the ping-pong completes its
round trips (a hang or a lost arrival would never return) and the repeated products sum to `reps` × a · b; and they
lower for CUDA (the timed form)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import mgpu_handoff
from tests.tolerances import assert_close


@pytest.mark.parametrize("commit", [False, True])
def test_ping_pong_completes(commit):
  assert float(mgpu_handoff.ping_pong(3, commit, interpret=True)(jnp.zeros((1,), jnp.float32))[0]) == 1.0


@pytest.mark.parametrize("form", ["qk", "pv"])
def test_products_sum_to_reps_times_the_product(form):
  kernel, a_shape, b_shape = mgpu_handoff.product(2, form, 32, interpret=True)
  a = (jax.random.normal(jax.random.key(0), a_shape) * 0.1).astype(jnp.bfloat16)
  b = (jax.random.normal(jax.random.key(1), b_shape) * 0.1).astype(jnp.bfloat16)
  b_mat = (b.T if form == "qk" else b).astype(jnp.float32)
  assert_close(kernel(a, b), 2 * jnp.dot(a.astype(jnp.float32), b_mat).sum(axis=1), "float32", form)


def test_the_kernels_lower_for_cuda():
  x = jax.ShapeDtypeStruct((1,), jnp.float32)
  assert "mosaic_gpu" in jax.jit(mgpu_handoff.ping_pong(8, True)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  for form, entries in [("qk", 64), ("pv", 32), ("pv", 64)]:  # pv at 32 entries: P's rows are 64 B
    kernel, a_shape, b_shape = mgpu_handoff.product(8, form, entries)
    args = (jax.ShapeDtypeStruct(a_shape, jnp.bfloat16), jax.ShapeDtypeStruct(b_shape, jnp.bfloat16))
    assert "mosaic_gpu" in jax.jit(kernel).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
