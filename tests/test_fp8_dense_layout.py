"""The FP8 kernel's one-group "bytes" layout (kernels/fp8_grouped_matmul.py, the dense FP8 linears): whole
128 × 128 code tiles per product. Equal to the kernel's formula, to the "words" layout and to x times the
exactly dequantised weight; chosen only where it can run; refused elsewhere by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp import fp8
from jax_mtp.kernels.fp8_grouped_matmul import Config, fp8_grouped_matmul, layout_for, reference
from tests.tolerances import assert_close

BACKEND = "gpu" if jax.default_backend() == "gpu" else "interpret"


@pytest.mark.parametrize("rows,group,k,n,split_k", [(5, 5, 256, 384, 1), (70, 67, 384, 256, 3), (1, 1, 128, 128, None),
                                                   (64, 64, 512, 128, 2)])
def test_bytes_layout_equals_the_formula_the_words_layout_and_the_dequantised_product(rows, group, k, n, split_k):
  """Rows past the group (another device's) unwritten; > 64 rows (two row tiles); K split or not."""
  rng = np.random.default_rng(rows + k)
  codes = jnp.asarray(rng.standard_normal((1, k, n)) * 20, jnp.float8_e4m3fn)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (1, k // 128, n // 128)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
  sizes = jnp.asarray([group], jnp.int32)
  got = np.asarray(fp8_grouped_matmul(x, codes, scale, sizes, backend=BACKEND,
                                      config=Config(split_k=split_k, layout="bytes")))
  words = np.asarray(fp8_grouped_matmul(x, codes, scale, sizes, backend=BACKEND,
                                        config=Config(split_k=split_k, layout="words")))
  assert_close(got[:group], np.asarray(reference(x, codes, scale, sizes))[:group], "float32", "bytes vs formula")
  assert_close(got[:group], words[:group], "float32", "bytes vs words layout")
  exact = np.asarray(x[:group], np.float32) @ np.asarray(fp8.dequantize(codes[0], scale[0], jnp.float32, (128, 128)))
  assert_close(got[:group], exact, "float32", "bytes vs dequantised product")


def test_the_layout_is_bytes_for_one_group_of_many_rows_within_int32_offsets_only():
  assert layout_for(1, 16384, 7168, 64) == "bytes"  # V3.2's o_proj at B = 64
  assert layout_for(1, 16384, 7168, 8) == "words"  # ... at B = 8 (measured faster there)
  assert layout_for(256, 7168, 2048, 512) == "words"  # the experts
  assert layout_for(1, 65536, 65536, 64) == "words"  # 2^32 codes: past int32 byte offsets
  assert layout_for(1, 16384, 7168, 1024) == "bytes"  # 16 tiles of 64: verification at B = 256
  assert layout_for(1, 16384, 7168, 1025) == "words"  # 17: past BYTES_MAX_TILES (a prefill chunk's rows)
  x, codes = jnp.zeros((2, 128), jnp.bfloat16), jnp.zeros((3, 128, 128), jnp.float8_e4m3fn)
  with pytest.raises(ValueError, match="layout='bytes' does not take codes \\(3, 128, 128\\)"):
    fp8_grouped_matmul(x, codes, jnp.zeros((3, 1, 1)), jnp.zeros((3,), jnp.int32), backend="interpret",
                       config=Config(layout="bytes"))
  with pytest.raises(ValueError, match="layout='tiles'"):
    fp8_grouped_matmul(x, codes[:1], jnp.zeros((1, 1, 1)), jnp.zeros((1,), jnp.int32), backend="interpret",
                       config=Config(layout="tiles"))


def _kernel_equations(rows: int, layout: str = "auto") -> int:
  """Equations in the body of the one-group kernel traced for `rows` rows."""
  x, codes = jax.ShapeDtypeStruct((rows, 256), jnp.bfloat16), jax.ShapeDtypeStruct((1, 256, 128), jnp.float8_e4m3fn)
  scale, sizes = jax.ShapeDtypeStruct((1, 2, 1), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda *a: fp8_grouped_matmul(*a, backend="interpret", config=Config(layout=layout)))(
      x, codes, scale, sizes)
  calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
  assert len(calls) == 1
  return len(calls[0].params["jaxpr"].eqns)


def test_the_kernel_does_not_grow_with_the_rows():
  """The "bytes" program unrolls its row tiles (its size grows with the rows: Triton's compile time with it), so
  past BYTES_MAX_TILES tiles the launch takes the "words" layout, whose size does not depend on the rows: a prefill
  chunk's rows give the kernel a few thousand rows do."""
  assert _kernel_equations(4096, "bytes") > 3 * _kernel_equations(1024, "bytes")  # 64 tiles against 16
  assert _kernel_equations(8192) == _kernel_equations(65536)
