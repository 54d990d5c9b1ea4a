"""Routed experts: y[t] = Σ_k w[t, k] · down_e(silu(gate_e(x[t])) · up_e(x[t])), e = ids[t, k].

Which implementation runs is explicit (`MtpConfig.moe_impl`), never a silent fallback:

  impl           what runs                                                        reads
  "gather"       each assignment's expert weights gathered, then batched einsums   the T·K picked experts, twice
  "ragged_dot"   `jax.lax.ragged_dot` over the assignments sorted by expert        TPU: the picked experts;
                                                                                   CUDA and CPU: all E (one
                                                                                   masked dense dot)
  "tokamax_gpu"  `tokamax.ragged_dot`, its Mosaic-GPU (Hopper) grouped GEMM;       the picked experts once
                 empty groups get no work
  "tokamax_tpu"  `tokamax.ragged_dot`, its Mosaic-TPU grouped matmul               the picked experts once
  "fp8_grouped_gpu" FP8 weights only: kernels/fp8_grouped_matmul.py, a Pallas       the picked experts' codes
                 Mosaic GPU (Hopper) grouped matmul straight from the e4m3 codes   once (1 byte a weight)
                 and block scales, bf16 activations on the tensor cores (no
                 dequantised copy; on CPU in Pallas's interpreter, for tests)
  "mosaic_gpu"   16-bit weights: kernels/grouped_matmul_mgpu.py, a Pallas Mosaic  the picked experts once
                 GPU (Hopper) grouped matmul in the FP8 kernel's transposed rows
                 (a few rows an expert cost an N of 8, not a 64-row tile); `auto`'s
                 on Hopper GPUs at decode and verification sizes (on CPU in Pallas's
                 interpreter, for tests)
  "auto"         `resolve_expert_impl`'s table, per platform, weight dtype and dims, and token count

The grouped paths sort the T·K assignments by expert (A = T·K rows, padded to whole row tiles of
tokamax's kernels: 8 on GPU, 128 on TPU), run gate, up and down as three
grouped matmuls (bf16 in, fp32 accumulation), and un-sort with a gather (deterministic; no
scatter-add atomics) before the weighted sum over k. Under tp an assignment to another device's
expert carries id E_local and weight 0: it sorts past the last group, where no grouped kernel is
obliged to write, so its rows are zeroed explicitly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mtp import fp8
from jax_mtp.config import MOE_IMPLS as EXPERT_IMPLS
from jax_mtp.kernels.mosaic_gpu_common import lowered_once_per_launch
from jax_mtp.platform import NOT_HOPPER, backend_name

_HIGHEST = jax.lax.Precision.HIGHEST


# Gathered expert weights (T·K copies) up to which gathering also pays above E/4 assignments: with small
# experts (the embedded default: E = 8, K = 2, D = 256, F = 128, fp32; 0.4 MB an expert) a CPU target
# forward gathers faster than ragged_dot at decode and verification sizes (T ≤ 6 for k ≤ 5), and
# ragged_dot wins by T = 32 (benchmarks/RESULTS.md, "The embedded default: training on one H200,
# speculative vs plain decoding on the H200 and on CPU").
GATHER_BYTES = 2**23


def uses_gathered_experts(tokens: int, experts_per_token: int, num_experts: int, expert_bytes: int = 0) -> bool:
  """Decode sizes: T·K ≤ E/4 assignments read at most a quarter of the experts; or, for small
  experts, T·K ≤ 2E assignments whose gathered copies stay within GATHER_BYTES."""
  assignments = tokens * experts_per_token
  return assignments * 4 <= num_experts or (assignments <= 2 * num_experts
                                            and assignments * expert_bytes <= GATHER_BYTES)


# Where `auto` runs our 16-bit grouped matmul (kernels/grouped_matmul_mgpu.py) instead of tokamax's on a Hopper GPU,
# from the user's path timed on an H100 (2026-12-07, benchmarks/RESULTS.md, "The 16-bit Mosaic GPU experts kernel
# on the user's path"): from 64 assignments (the draft step at B = 8 × top-8: 2,755 against 2,829 µs; at B = 1's 8
# the step was 1,411 against 1,358, though the experts alone were 308 against 345) up to 32 rows an expert on
# average (the verification forward at B = 256: 1,024 tokens × top-8 over 256 experts, 7,872 against 9,793 µs for
# the experts; B = 64 over 4K and 32K caches 18.83 / 19.94 against 19.91 / 20.96 ms). A prefill chunk's 128 rows an
# expert and more are untimed with it: tokamax's 64-row tiles read each expert fewer times there.
MOSAIC_GPU_MIN_ASSIGNMENTS = 64
MOSAIC_GPU_MAX_ROWS_PER_EXPERT = 32


def uses_mosaic_gpu_experts(tokens: int, experts_per_token: int, num_local_experts: int) -> bool:
  """Whether `auto` takes the 16-bit Mosaic GPU kernel over tokamax's at T = `tokens` (where both take the weights):
  MOSAIC_GPU_MIN_ASSIGNMENTS ≤ T·K ≤ MOSAIC_GPU_MAX_ROWS_PER_EXPERT × the local experts. Under tp the T·K
  assignments count every device's (the local share is about 1/tp of them), so tp > 1 leaves the kernel sooner than
  it needs to: tp > 1 is untimed with it."""
  assignments = tokens * experts_per_token
  return MOSAIC_GPU_MIN_ASSIGNMENTS <= assignments <= MOSAIC_GPU_MAX_ROWS_PER_EXPERT * num_local_experts


def tokamax_gpu_takes(w_gate_EDF) -> bool:
  """Whether tokamax's Mosaic-GPU kernel takes these expert weights: 16-bit (it rejects fp32
  precision), and output dims D and F each < 64 or a multiple of 64 (its output tiling: tokamax 0.0.17
  fails to lower F = 96)."""
  _, d, f = w_gate_EDF.shape
  return jnp.dtype(w_gate_EDF.dtype).itemsize == 2 and all(n < 64 or n % 64 == 0 for n in (d, f))


def tokamax_tpu_takes(w_gate_EDF) -> bool:
  """Whether tokamax's Mosaic-TPU grouped matmul takes these weights: D and F ≥ 128 (it refuses
  any operand dim < 128, tokamax 0.0.17; `grouped_experts` pads the rows to multiples of 128)."""
  _, d, f = w_gate_EDF.shape
  return d >= 128 and f >= 128


def resolve_expert_impl(impl: str, platform: str, tokens: int, experts_per_token: int, w_gate_EDF, *,
                        fp8_codes: bool = False, hopper: bool = True) -> str:
  """The implementation that runs for `impl` on `platform` ('cpu', 'gpu', 'tpu') at T = `tokens`. `hopper`: the GPU
  is a Hopper (`platform.lowering_gpu_is_hopper`; the model passes it): tokamax's Mosaic-GPU kernel is sm_90's, so
  on other GPUs `auto` takes the cpu column's impls and an explicit tokamax_gpu is refused.

  `w_gate_EDF`: the local gate weights, or anything with their .shape and .dtype. An explicit impl
  runs as asked (it may target another platform than this process's default, as an AOT compile
  for TPU from a CPU host does). "auto" (why: benchmarks/RESULTS.md, "Routed experts through tokamax's
  grouped matmul on one H200"):
    gpu  mosaic_gpu (ours) where it takes the weights (`mosaic_gpu_takes`: 16-bit, D and F multiples of 128) at
         decode and verification sizes (`uses_mosaic_gpu_experts`: 64 ≤ T·K ≤ 32 rows an expert), else
         tokamax_gpu at every T where it takes the weights (`tokamax_gpu_takes`): both read the picked experts
         once, where gather reads them twice and CUDA's ragged_dot all E; other weights as on cpu
    tpu  tokamax_tpu at every T where it takes the weights (`tokamax_tpu_takes`), else as on cpu
         (AOT-compiled for v5e and v5p, tools/tpu_aot_compile.py; not timed on a TPU)
    cpu  gather at decode sizes (`uses_gathered_experts`: T·K ≤ E/4, or ≤ 2E small experts within
         GATHER_BYTES), ragged_dot above (on a CPU one masked dense dot over all E experts —
         the compiled program on jax 0.11.2 and 0.12, 2026-12-05 — but no gathered copy of T·K experts)
  `fp8_codes` (FP8 weights kept as stored; `w_gate_EDF` then describes the dequantised weights): on
  a Hopper GPU fp8_grouped_gpu at every T where it takes the dims (reads the picked experts' codes once,
  writes no dequantised copy; other GPUs as below); on tpu gather while T·K ≤ E (dequantises only the picked experts, where a
  grouped impl dequantises every local expert first: no TPU kernel takes the codes yet), above as the
  table. On cpu the table, so FP8 and dequantised weights run the same impl there.
  """
  if impl not in EXPERT_IMPLS:
    raise ValueError(f"moe_impl={impl!r} is not one of {EXPERT_IMPLS}")
  if impl in ("tokamax_gpu", "fp8_grouped_gpu", "mosaic_gpu") and platform == "gpu" and not hopper:
    raise ValueError(f"moe_impl={impl!r}: {NOT_HOPPER} (use 'auto', 'gather' or 'ragged_dot')")
  if impl != "auto":
    return impl
  if fp8_codes and platform == "gpu" and hopper and fp8_grouped_takes(w_gate_EDF):
    return "fp8_grouped_gpu"
  if fp8_codes and platform in ("gpu", "tpu") and tokens * experts_per_token <= w_gate_EDF.shape[0]:
    return "gather"
  if (platform == "gpu" and hopper and uses_mosaic_gpu_experts(tokens, experts_per_token, w_gate_EDF.shape[0])
      and mosaic_gpu_takes(w_gate_EDF)):
    return "mosaic_gpu"
  if platform == "gpu" and hopper and tokamax_gpu_takes(w_gate_EDF):
    return "tokamax_gpu"
  if platform == "tpu" and tokamax_tpu_takes(w_gate_EDF):
    return "tokamax_tpu"
  if platform in ("cpu", "gpu", "tpu"):
    e, d, f = w_gate_EDF.shape
    expert_bytes = 3 * d * f * jnp.dtype(w_gate_EDF.dtype).itemsize  # gate, up, down
    return "gather" if uses_gathered_experts(tokens, experts_per_token, e, expert_bytes) else "ragged_dot"
  raise ValueError(f"moe_impl='auto' has no entry for platform {platform!r}; choose one of {EXPERT_IMPLS[1:]}")


def routed_experts(impl: str, x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD, *,
                   fp8_scales=None, fp8_block=(128, 128), dtype=None, fp8_matmul_impl: str = "auto") -> jax.Array:
  """Σ_k weights[t, k] · expert_{ids[t, k]}(x[t]) by the resolved `impl`; fp32 [T, D].

  ids ∈ [0, E] where E = w_gate_EDF.shape[0]; id E (another device's expert) has weight 0.
  `fp8_scales` (gate, up, down block scales, by `fp8_block`): the weights are FP8 codes (jax_mtp.fp8):
  "fp8_grouped_gpu" multiplies the codes themselves (bf16 activations); the others dequantise to
  `dtype` in the program — "gather" only the T·K picked experts, the grouped impls every local
  expert (a `dtype` copy of the weights per call). `fp8_matmul_impl`: which kernel multiplies the codes
  (kernels.fp8_grouped_matmul.IMPLS).
  """
  if impl == "fp8_grouped_gpu":
    matmul = fp8_grouped_matmul_for(fp8_scales, w_gate_EDF, fp8_block, fp8_matmul_impl)
    pairs = tuple(zip((w_gate_EDF, w_up_EDF, w_down_EFD), fp8_scales))
    return grouped_experts(matmul, x_TD, ids_TK, weights_TK, *pairs, row_tile=8,
                           num_experts=w_gate_EDF.shape[0], dtype=jnp.bfloat16)
  if fp8_scales is not None:
    if impl == "gather":
      return gathered_experts(x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD, fp8_scales=fp8_scales,
                              fp8_block=fp8_block, dtype=dtype)
    w_gate_EDF, w_up_EDF, w_down_EFD = (fp8.dequantize(w, s, dtype, fp8_block) for w, s in
                                        zip((w_gate_EDF, w_up_EDF, w_down_EFD), fp8_scales))
  if impl == "gather":
    return gathered_experts(x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD)
  if impl not in ("ragged_dot", "tokamax_gpu", "tokamax_tpu", "mosaic_gpu"):
    raise ValueError(f"routed_experts needs a resolved impl, got {impl!r}")
  check_gpu_kernel_takes(impl, w_gate_EDF)
  return grouped_experts(grouped_matmul_for(impl), x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD,
                         row_tile=128 if impl == "tokamax_tpu" else 8)


def check_gpu_kernel_takes(impl: str, w_gate_EDF) -> None:
  """A ValueError naming the dtype and dims where a GPU grouped kernel (tokamax_gpu, mosaic_gpu) cannot take the
  16-bit expert weights [E, D, F] (anything with their .shape and .dtype: the CLI checks a config's before reading
  weights); other impls pass."""
  _, d, f = w_gate_EDF.shape
  if impl == "mosaic_gpu" and not mosaic_gpu_takes(w_gate_EDF):
    raise ValueError(f"moe_impl='mosaic_gpu' takes bf16/fp16 expert weights whose hidden size and expert intermediate "
                     f"size are multiples of 128, got {jnp.dtype(w_gate_EDF.dtype)} with D={d}, F={f} (use 'auto')")
  if impl == "tokamax_gpu" and not tokamax_gpu_takes(w_gate_EDF):
    raise ValueError(f"moe_impl='tokamax_gpu' takes bf16/fp16 expert weights whose hidden size and expert "
                     f"intermediate size are each < 64 or a multiple of 64, got {jnp.dtype(w_gate_EDF.dtype)} with "
                     f"D={d}, F={f} (use 'ragged_dot' or 'gather', or 'auto')")


def check_runs_on(impl: str, mesh) -> None:
  """An explicit tokamax impl on a mesh of another platform's devices: a ValueError naming it where a model is
  built (tokamax fails inside its compiler, naming no impl). AbstractMeshes (exports, AOT compiles) are not
  checked: their program is for the platform they name."""
  runs_on = {"tokamax_gpu": "gpu", "tokamax_tpu": "tpu"}.get(impl)
  if runs_on is None or not isinstance(mesh, jax.sharding.Mesh):
    return
  platform = mesh.devices.flat[0].platform
  if backend_name(platform) != runs_on:
    raise ValueError(f"moe_impl={impl!r} runs on {runs_on.upper()}s; this mesh's devices are {platform} (use 'auto', "
                     f"which picks per platform)")


def _precision(dtype) -> jax.lax.Precision:
  # HIGHEST only for fp32 weights: bf16 products are exact in one pass, and Mosaic TPU rejects a
  # grouped matmul with fp32 contract precision on bf16 operands ("Bad lhs type").
  return _HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def gathered_experts(x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD, *, fp8_scales=None,
                     fp8_block=(128, 128), dtype=None) -> jax.Array:
  """The "gather" impl: each assignment's weights gathered; fp32 out. Ids ≥ E are clipped (weight 0).
  With `fp8_scales` the gathered FP8 codes are dequantised to `dtype` (else the weights' dtype)."""
  dtype = w_gate_EDF.dtype if fp8_scales is None else dtype
  ids_TK = jnp.minimum(ids_TK, w_gate_EDF.shape[0] - 1)
  x_TD = x_TD.astype(dtype)

  def picked(i, w):
    return w[ids_TK] if fp8_scales is None else fp8.dequantize(w[ids_TK], fp8_scales[i][ids_TK], dtype, fp8_block)

  def project(eq, lhs, weights):
    return jnp.einsum(eq, lhs.astype(dtype), weights, precision=_precision(dtype),
                      preferred_element_type=jnp.float32)

  hidden_TKF = (jax.nn.silu(project("td,tkdf->tkf", x_TD, picked(0, w_gate_EDF)))
                * project("td,tkdf->tkf", x_TD, picked(1, w_up_EDF)))
  y_TKD = project("tkf,tkfd->tkd", hidden_TKF, picked(2, w_down_EFD))
  return jnp.einsum("tkd,tk->td", y_TKD, weights_TK.astype(jnp.float32))


def fp8_grouped_takes(w_gate_EDF) -> bool:
  """Whether kernels/fp8_grouped_matmul.py takes these (local) experts (`takes`: D and F multiples of
  its 128 blocks, < 2^31 uint32 words of codes a weight; V3.2's 256 experts on one device are 9.4e8)."""
  from jax_mtp.kernels import fp8_grouped_matmul as kernel  # noqa: PLC0415 (Pallas: only where used)
  e, d, f = w_gate_EDF.shape
  return kernel.takes(d, f, (128, 128), experts=e)


def fp8_grouped_matmul_for(fp8_scales, w_gate_EDF, fp8_block, impl: str = "auto"):
  """The grouped matmul over FP8 weights given as (codes, block scales) pairs (`grouped_experts`'
  `matmul`); one clear error where the kernel does not take the weights."""
  from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul  # noqa: PLC0415 (Pallas: only where used)
  if fp8_scales is None or tuple(fp8_block) != (128, 128) or not fp8_grouped_takes(w_gate_EDF):
    raise ValueError(f"moe_impl='fp8_grouped_gpu' takes FP8 expert weights (--weights fp8) in 128 × 128 blocks with "
                     f"dims multiples of 128, got {'no FP8 scales' if fp8_scales is None else 'blocks ' + str(fp8_block)}"
                     f" and weights {w_gate_EDF.shape} {w_gate_EDF.dtype} (use 'gather' or 'auto')")

  def matmul(lhs_AX, fp8_weight, group_sizes_E):
    codes_EXY, scale_EXY = fp8_weight
    return fp8_grouped_matmul(lhs_AX, codes_EXY, scale_EXY, group_sizes_E, backend="auto", impl=impl)

  return matmul


def grouped_experts(matmul, x_TD, ids_TK, weights_TK, w_gate_EDF, w_up_EDF, w_down_EFD, *,
                    row_tile: int = 8, num_experts: int | None = None, dtype=None) -> jax.Array:
  """Sort assignments by expert, three grouped matmuls, un-sort, weighted sum over k; fp32 [T, D].

  The T·K assignment rows are padded with foreign ones (id E, in no group) to a multiple of
  `row_tile`: 8 for tokamax's Mosaic-GPU kernel, 128 for its Mosaic-TPU one (its row tile).

  `matmul(lhs_AX, w_EXY, group_sizes_E) -> fp32 [A, Y]` is one grouped matmul (rows of group e
  contiguous, in expert order); rows past Σ group_sizes are zeroed here, whatever it leaves there.
  The weights are whatever `matmul` takes (arrays, or (codes, scales) pairs for FP8): `num_experts`
  and `dtype` (of the rows handed to it) default to the gate weights' leading dim and dtype.
  """
  t, k = ids_TK.shape
  num_experts = w_gate_EDF.shape[0] if num_experts is None else num_experts
  dtype = w_gate_EDF.dtype if dtype is None else dtype
  a = t * k  # token-expert assignments
  flat_ids_A = jnp.pad(ids_TK.reshape(-1), (0, -a % row_tile), constant_values=num_experts)
  order_A = jnp.argsort(flat_ids_A, stable=True)
  group_sizes_E = jnp.bincount(flat_ids_A, length=num_experts).astype(jnp.int32)  # id E: not counted
  x_AD = x_TD.astype(dtype)[jnp.minimum(order_A // k, t - 1)]
  hidden_AF = jax.nn.silu(matmul(x_AD, w_gate_EDF, group_sizes_E)) * matmul(x_AD, w_up_EDF, group_sizes_E)
  y_AD = matmul(hidden_AF.astype(dtype), w_down_EFD, group_sizes_E)
  local_A = jnp.arange(order_A.shape[0]) < jnp.sum(group_sizes_E)  # rows of this device's experts
  y_AD = jnp.where(local_A[:, None], y_AD, 0.0)
  unsort_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(order_A.shape[0], dtype=order_A.dtype))
  y_TKD = y_AD[unsort_A[:a]].reshape(t, k, -1)
  return jnp.einsum("tkd,tk->td", y_TKD, weights_TK.astype(jnp.float32), precision=_HIGHEST)


def grouped_matmul_for(impl: str):
  """The grouped matmul `grouped_experts` takes, for a grouped impl."""
  return {"ragged_dot": _lax_grouped_matmul, "tokamax_gpu": tokamax_gpu_grouped_matmul,
          "tokamax_tpu": _tokamax_tpu_grouped_matmul, "mosaic_gpu": mosaic_gpu_grouped_matmul}[impl]


def mosaic_gpu_takes(w_gate_EDF) -> bool:
  """Whether kernels/grouped_matmul_mgpu.py takes these (local) experts: 16-bit, D and F multiples of 128."""
  from jax_mtp.kernels.grouped_matmul_mgpu import takes  # noqa: PLC0415 (Pallas: only where used)
  return takes(w_gate_EDF)  # [E, D, F]: D and F multiples of 128, so the down weights' [E, F, D] too


def mosaic_gpu_grouped_matmul(lhs_AX, w_EXY, group_sizes_E, *, config=None):
  """kernels/grouped_matmul_mgpu.py compiled, or in Pallas's GPU interpreter where the program is traced for a CPU
  (tests); fp32 out."""
  from jax_mtp.kernels.grouped_matmul_mgpu import grouped_matmul_mgpu  # noqa: PLC0415
  from jax_mtp.platform import lowering_platform  # noqa: PLC0415
  return grouped_matmul_mgpu(lhs_AX.astype(w_EXY.dtype), w_EXY, group_sizes_E, config=config,
                             interpret=lowering_platform() == "cpu")


def _lax_grouped_matmul(lhs_AX, w_EXY, group_sizes_E):
  return jax.lax.ragged_dot(lhs_AX, w_EXY, group_sizes_E, precision=_precision(w_EXY.dtype),
                            preferred_element_type=jnp.float32)


# tokamax's Mosaic-GPU block config, (block_m, block_n, block_k, num_stages): its sm90 default has
# block_n = 64; 128 output columns per CTA halve the tiles a decode-size group is split into and
# read each expert in longer runs (the block-config sweep: benchmarks/RESULTS.md, "Routed experts
# through tokamax's grouped matmul on one H200").
TOKAMAX_GPU_BLOCKS = (64, 128, 128, 4)


@lowered_once_per_launch("blocks", "persistent")
def tokamax_gpu_grouped_matmul(lhs_AX, w_EXY, group_sizes_E, *, blocks=TOKAMAX_GPU_BLOCKS, persistent=False):
  """tokamax's Mosaic-GPU grouped matmul with an explicit block config (block_m, block_n, block_k,
  num_stages); fp32 out. The defaults are the production choice; benchmarks sweep others. Jitted, as our kernels'
  entries are (`lowered_once_per_launch`): every layer's identical call lowers tokamax's kernel once."""
  import tokamax  # imported here: `import jax_mtp` stays light where no tokamax kernel runs
  # tokamax.ops.gpu re-exports these but also imports its Triton kernels (jax_triton); the module
  # that defines them does not.
  from tokamax._src.ops.ragged_dot.pallas_mosaic_gpu import Config as PallasMosaicRaggedDotConfig
  from tokamax._src.ops.ragged_dot.pallas_mosaic_gpu import PallasMosaicGpuRaggedDot as PallasMosaicRaggedDot

  block_m, block_n, block_k, stages = blocks
  kernel = PallasMosaicRaggedDot(config=PallasMosaicRaggedDotConfig(
      block_m=block_m, block_n=block_n, block_k=block_k, num_stages=stages, split_k=1, persistent=persistent))
  return tokamax.ragged_dot(lhs_AX, w_EXY, group_sizes_E, precision=_precision(w_EXY.dtype),
                            preferred_element_type=jnp.float32, implementation=[kernel])


@lowered_once_per_launch()
def _tokamax_tpu_grouped_matmul(lhs_AX, w_EXY, group_sizes_E):
  """tokamax's Mosaic-TPU grouped matmul; fp32 out; jitted to lower once per shape (as the GPU form)."""
  import tokamax

  return tokamax.ragged_dot(lhs_AX, w_EXY, group_sizes_E, precision=_precision(w_EXY.dtype),
                            preferred_element_type=jnp.float32, implementation="mosaic_tpu")
