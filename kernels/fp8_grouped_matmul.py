"""A grouped matmul straight from FP8 codes: the routed experts' projections (and every dense FP8 linear, one group)
with each expert's e4m3 codes read once per group of its rows, block scales applied in registers, and never a
dequantised copy of a weight in HBM.

    y[a, n] = Σ_kb  scale[e_a, kb, n // 128] · Σ_{k in block kb} x[a, k] · code[e_a, k, n]

where the rows a of `x` are sorted by expert and group e holds `group_sizes[e]` consecutive rows (the contract of
`jax_mtp.experts.grouped_experts`, as tokamax's and lax's ragged_dot have it); rows past Σ group_sizes are left
unwritten. fp32 out.

Why a kernel of ours: without it XLA dequantises every local expert to a bf16 copy in HBM before tokamax's bf16
grouped matmul, which makes the FP8 step slower than the bf16 one, and tokamax's own quantized ragged_dot (0.0.17)
takes only fp16 activations and runs far below the FP8 bytes floor (benchmarks/RESULTS.md, "FP8 weights kept on the
device vs the same weights in bf16").

The kernel is `kernels/fp8_grouped_matmul_mgpu.py` (Pallas Mosaic GPU: TMA, wgmma; Hopper). This module holds the
op: its formula (`reference`), its operand checks, which weights it takes, when `auto` runs a dense linear in it,
and `fp8_grouped_matmul`, which launches it compiled or in Pallas's GPU interpreter. Its first kernel, on Pallas's
Triton backend, was removed on 2026-12-05 (issue 28: that backend is deprecated since JAX 0.11.0): on an H100 the
Mosaic kernel was 1.01–1.17× it on V3.2's experts from 64 assignments up and slower at 8 assignments and on dense
linears at 64 rows (benchmarks/RESULTS.md, "The FP8 grouped matmul's Triton kernel removed").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BACKENDS = ("auto", "gpu", "interpret")
# The kernels of this op: "mosaic_gpu" (kernels/fp8_grouped_matmul_mgpu.py); "auto" runs it.
IMPLS = ("auto", "mosaic_gpu")
BLOCK = 128  # DeepSeek's FP8 block: 128 × 128 codes share one scale


def reference(x_AK, codes_EKN, scale_EkN, group_sizes_E) -> jax.Array:
  """The kernel's formula in jnp (fp32); rows past Σ group_sizes are zero here."""
  a, k = x_AK.shape
  e, _, n = codes_EKN.shape
  ids_A = jnp.repeat(jnp.arange(e), group_sizes_E, total_repeat_length=a)
  valid_A = jnp.arange(a) < jnp.sum(group_sizes_E)
  codes = codes_EKN[ids_A].astype(jnp.float32).reshape(a, k // BLOCK, BLOCK, n)
  partial = jnp.einsum("abk,abkn->abn", x_AK.astype(jnp.float32).reshape(a, k // BLOCK, BLOCK), codes,
                       precision=jax.lax.Precision.HIGHEST)
  scales = jnp.repeat(scale_EkN[ids_A].astype(jnp.float32), BLOCK, axis=-1)  # [A, K/128, N]
  return jnp.where(valid_A[:, None], jnp.sum(partial * scales, axis=1), 0.0)


def takes(k: int, n: int, block, experts: int = 1) -> bool:
  """Whether the kernel takes `experts` [K, N] weights in FP8 blocks `block` (128 × 128; K and N multiples)."""
  del experts  # any count: TMA addresses in 64 bits (V3.2's 256 experts on one device are 3.8e9 codes)
  return tuple(block) == (BLOCK, BLOCK) and k % BLOCK == 0 and n % BLOCK == 0


def check_shapes(x_AK, codes_EKN, scale_EkN, group_sizes_E) -> None:
  """One clear error for operands the op does not take (its kernel checks its launch beside them)."""
  a, k = x_AK.shape
  e, k2, n = codes_EKN.shape
  if codes_EKN.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"codes must be float8_e4m3fn, got {codes_EKN.dtype}")
  if k2 != k or k % BLOCK or n % BLOCK:
    raise ValueError(f"x {x_AK.shape} and codes {codes_EKN.shape}: need the same K, K and N multiples of {BLOCK}")
  if scale_EkN.shape != (e, k // BLOCK, n // BLOCK):
    raise ValueError(f"scales {scale_EkN.shape} are not the {BLOCK} × {BLOCK} blocks of codes {codes_EKN.shape}")
  if group_sizes_E.shape != (e,):
    raise ValueError(f"group_sizes {group_sizes_E.shape} must give one size per expert of codes {codes_EKN.shape}")


# impl="auto" runs a dense FP8 linear (one group) in a kernel here up to AUTO_MAX_ROWS rows, and above them while
# its rows are decode's (fewer than PREFILL_MIN_TOKENS tokens a sequence: a step, a verification of k + 1): there
# reading the codes (1 byte a weight) bounds the product. A prefill chunk of more rows is compute-bound: XLA's bf16
# GEMM over the weight dequantised in the program runs the tensor cores at full rate, where the kernel's products
# of ≤ 56 rows do not. Decode calls keep the kernel at every batch, so a speculative round and a plain step multiply
# alike (greedy speculative == plain).
AUTO_MAX_ROWS = 1024
PREFILL_MIN_TOKENS = 64


def auto_takes(rows: int, tokens: int) -> bool:
  """Whether impl="auto" runs a dense FP8 linear of `rows` rows, `tokens` a sequence, in a kernel here."""
  return rows <= AUTO_MAX_ROWS or tokens < PREFILL_MIN_TOKENS


def fp8_grouped_matmul(x_AK: jax.Array, codes_EKN: jax.Array, scale_EkN: jax.Array, group_sizes_E: jax.Array, *,
                       backend: str = "gpu", config=None, impl: str = "auto") -> jax.Array:
  """fp32 [A, N]: the rows of group e (sorted, consecutive) times expert e's FP8 weight (codes [E, K, N], block
  scales [E, K/128, N/128]), by `impl` (IMPLS) with the kernel's `Config` (None: its `config_for`). `backend`:
  "gpu" compiled, "interpret" Pallas's GPU interpreter (any host, for tests), "auto" by the platform the program is
  traced for (a CUDA program traced on a CPU host holds the compiled kernel)."""
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import fp8_grouped_matmul_mgpu  # noqa: PLC0415 (no cycle)
  from jax_mtp.platform import lowering_platform  # noqa: PLC0415

  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  # by the platform at trace time (the interpreter's ordered callbacks cannot sit in a platform_dependent branch)
  interpret = backend == "interpret" or (backend == "auto" and lowering_platform() == "cpu")
  return fp8_grouped_matmul_mgpu(x_AK, codes_EKN, scale_EkN, group_sizes_E, config=config, interpret=interpret)
