"""Routed experts at decode sizes straight from FP8 codes: one Pallas kernel per projection that reads
each picked expert's e4m3 codes once, scales them per 128 × 128 block in registers, and never writes
a dequantised copy of a weight to HBM.

    y[a, n] = Σ_kb  scale[e_a, kb, n // 128] · Σ_{k in block kb} x[a, k] · code[e_a, k, n]      e_a = ids[a]

for each token-expert assignment a (row a of `x` goes through expert ids[a]); fp32 out. XLA's
gather-then-dequantise path writes the picked experts in bf16 first (on an H200 the V3.2 MTP layer's
step spent 705 MB of temporaries at B = 1 and ran 1.15× the bf16 step, 2.1× at B = 8:
benchmarks/RESULTS.md "FP8 weights"). Grid (A, N / 128): a program streams the K / 128 code blocks of
its expert's 128 output columns through a loop, a matrix-vector product on the CUDA cores, which is
what a memory-bound decode step needs. The math differs from the dequantising path only in rounding
(the codes are scaled in fp32, never rounded to bf16): `reference` is the formula in jnp.

`backend`: "gpu" (Pallas' Triton backend, as kernels/index_scores.py) or "interpret" (any host, for
tests). Blocks must be 128 × 128 and K, N multiples of 128 (DeepSeek-V3.2's experts: 7168 × 2048).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KERNEL_NAME = "fp8_expert_matvec"
BACKENDS = ("gpu", "interpret")
BLOCK = 128
# Triton computes a ref's element offsets in int32: past 2^31 codes an expert's offset wraps and the
# kernel reads another buffer (seen on an H200 with V3.2's 256 experts on one device: 7 of 8 rows'
# logits off by ~1). DeepSeek-V3.2's experts fit from tp = 2 (128 local experts, 1.9e9 codes).
MAX_CODES = 2**31


def reference(x_AK: jax.Array, codes_EKN: jax.Array, scale_EkN: jax.Array, ids_A: jax.Array) -> jax.Array:
  """The kernel's formula in jnp (fp32): per-block partial sums of x · code, times the block scale."""
  a, k = x_AK.shape
  n = codes_EKN.shape[2]
  codes = codes_EKN[ids_A].astype(jnp.float32).reshape(a, k // BLOCK, BLOCK, n)
  partial = jnp.einsum("abk,abkn->abn", x_AK.astype(jnp.float32).reshape(a, k // BLOCK, BLOCK), codes,
                       precision=jax.lax.Precision.HIGHEST)
  scales = jnp.repeat(scale_EkN[ids_A].astype(jnp.float32), BLOCK, axis=-1)[..., :n]  # [A, K/128, N]
  return jnp.sum(partial * scales, axis=1)


def fp8_expert_matvec(x_AK: jax.Array, codes_EKN: jax.Array, scale_EkN: jax.Array, ids_A: jax.Array, *,
                      backend: str = "gpu") -> jax.Array:
  """fp32 [A, N]: row a of `x_AK` times expert ids[a]'s FP8 weight (codes [E, K, N], block scales
  [E, K/128, N/128]). ids must lie in [0, E)."""
  a, k = x_AK.shape
  e, k2, n = codes_EKN.shape
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  if k2 != k or k % BLOCK or n % BLOCK:
    raise ValueError(f"x {x_AK.shape} and codes {codes_EKN.shape}: need the same K, K and N multiples of {BLOCK}")
  if scale_EkN.shape != (e, k // BLOCK, n // BLOCK):
    raise ValueError(f"scales {scale_EkN.shape} are not the {BLOCK} × {BLOCK} blocks of codes {codes_EKN.shape}")
  if ids_A.shape != (a,):
    raise ValueError(f"ids {ids_A.shape} must give one expert per row of x {x_AK.shape}")
  if e * k * n >= MAX_CODES:
    raise ValueError(f"codes {codes_EKN.shape} hold {e * k * n:,} elements: the kernel's element offsets are int32 "
                     f"(< {MAX_CODES:,}); split the experts over more devices (tp) or use the gather impl")
  kernel = functools.partial(_kernel, blocks=k // BLOCK)
  return pl.pallas_call(
      kernel,
      grid=(a, n // BLOCK),
      in_specs=[pl.BlockSpec()] * 4,  # whole arrays, indexed in the kernel (the expert is data)
      out_specs=pl.BlockSpec((None, BLOCK), lambda ai, ni: (ai, ni)),
      out_shape=jax.ShapeDtypeStruct((a, n), jnp.float32),
      compiler_params=_compiler_params(backend),
      interpret=backend == "interpret",
      name=KERNEL_NAME,
  )(ids_A.astype(jnp.int32), x_AK, codes_EKN, scale_EkN.astype(jnp.float32))


def _kernel(ids_ref, x_ref, codes_ref, scale_ref, o_ref, *, blocks: int):
  row = pl.program_id(0)
  expert = ids_ref[row]
  column = pl.program_id(1)

  def body(kb, acc):
    x = x_ref[row, pl.ds(kb * BLOCK, BLOCK)].astype(jnp.float32)  # [128]
    codes = codes_ref[expert, pl.ds(kb * BLOCK, BLOCK), pl.ds(column * BLOCK, BLOCK)]
    w = codes.astype(jnp.float32)  # e4m3 → f32: every ptxas converts it (not always e4m3 → bf16)
    return acc + jnp.sum(x[:, None] * w, axis=0) * scale_ref[expert, kb, column]

  o_ref[...] = jax.lax.fori_loop(0, blocks, body, jnp.zeros((BLOCK,), jnp.float32))


def _compiler_params(backend: str):
  if backend == "gpu":
    from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (GPU-only module)
    return pl_triton.CompilerParams(num_warps=4, num_stages=3)
  return None
