"""Whether the official Triton bindings run here (issue 28's other supported route off Pallas's Triton backend): the
installed `triton`, `jax_triton` (carried: the GPU image has none), and one `tl.dot` kernel through
`jax_triton.triton_call` checked against XLA.

    python tools/jax_triton_probe.py        # on a GPU; prints one line a fact, exit 1 on the first failure

Only a probe: no kernel of the package uses jax_triton yet."""

import sys


def main() -> int:
  try:
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
  except ImportError as e:
    print(f"triton: not importable ({e})")
    return 1
  print(f"triton {triton.__version__}")
  try:
    import jax_triton as jt  # noqa: PLC0415
  except Exception as e:  # noqa: BLE001 (any import failure is the fact to report)
    print(f"jax_triton: import failed: {type(e).__name__}: {e}")
    return 1
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  print(f"jax_triton {jt.__version__}, jax {jax.__version__}, {jax.devices()[0].device_kind}")

  @triton.jit
  def matmul_kernel(x_ptr, y_ptr, o_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rows, cols, ks = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    x = tl.load(x_ptr + rows[:, None] * K + ks[None, :])
    y = tl.load(y_ptr + ks[:, None] * N + cols[None, :])
    tl.store(o_ptr + rows[:, None] * N + cols[None, :], tl.dot(x, y))

  m, n, k = 64, 64, 64
  x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
  y = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
  try:
    out = jt.triton_call(x, y, kernel=matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(1,),
                         num_warps=4, M=m, N=n, K=k)
    err = float(jnp.max(jnp.abs(out - jnp.dot(x, y, preferred_element_type=jnp.float32))))
  except Exception as e:  # noqa: BLE001
    print(f"triton_call: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return 1
  print(f"triton_call: a 64x64x64 bf16 tl.dot, max |error| vs XLA {err:.2e}")
  return 0 if err < 1e-2 else 1


if __name__ == "__main__":
  sys.exit(main())
