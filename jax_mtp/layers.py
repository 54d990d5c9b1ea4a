"""Small building blocks: RMSNorm, LayerNorm, YaRN RoPE (interleaved and NeoX), dense projections.

Numerics follow the official DeepSeek inference code (see shared/reference/deepseek_v32.md):
norms compute in fp32 and cast the product `weight * normed` to the activation dtype; RoPE
angles are fp32; the YaRN temperature mscale² goes into the softmax scale (config.softmax_scale),
not into cos/sin.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jax_mtp import fp8
from jax_mtp.config import MtpConfig, RopeConfig, yarn_mscale
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper, lowering_platform


# Random init: normal(0.02) for every weight matrix and the token embedding, HF's `initializer_range` for
# DeepSeek-V3 / V3.2 and GLM-5 (their `_init_weights`). An embedding of normal(1) would dwarf every sublayer's
# output, so a random model's greedy tokens would follow from the last token alone and no layer would decide them
# (tests/test_speculative.py, test_attention_and_experts_decide_a_random_models_greedy_tokens).
INIT_STD = 0.02


def dtype_of(name: str) -> jnp.dtype:
  return jnp.dtype(name)


class RMSNorm(nn.Module):
  """`weight * x / sqrt(mean(x²) + eps)` with fp32 math; output in `dtype` (activation dtype)."""

  features: int
  eps: float
  dtype: str = "float32"
  param_dtype: str = "float32"

  def setup(self):
    self.weight = self.param("weight", nn.initializers.ones, (self.features,), dtype_of(self.param_dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.weight, self.eps).astype(self.dtype)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm in fp32 (returns fp32); callers cast."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(jnp.float32) * normed


class LayerNorm(nn.Module):
  """LayerNorm with weight and bias, fp32 math (the DSA indexer's `k_norm`)."""

  eps: float
  dtype: str = "float32"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = x.shape[-1]
    weight = self.param("weight", nn.initializers.ones, (features,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + self.eps) * weight + bias).astype(self.dtype)


class Linear(nn.Module):
  """Bias-free projection `x @ kernel`, kernel [in, out] (checkpoints store [out, in]).

  The kernel is declared in `setup` so it can be read without a call (MLA's absorbed decode
  reads kv_b_proj's `weight()`). A `kernel_scale_inv` param beside it makes `kernel` FP8 codes
  (jax_mtp.fp8): on a Hopper GPU with bf16 compute, where the kernel takes the dims (128 × 128 blocks,
  K and N multiples of 128), the product runs straight from the codes in kernels/fp8_grouped_matmul.py
  (one group: every row) and no bf16 copy of the weight is written; elsewhere the codes are
  dequantised inside the program (XLA fuses that into the product at decode sizes, not always above).
  Under the automatic choices a prefill chunk past the kernel's AUTO_MAX_ROWS rows also takes the dequantised
  product: it is compute-bound there (`fp8_grouped_matmul.auto_takes`).
  """

  in_features: int
  out_features: int
  dtype: str = "float32"
  param_dtype: str = "float32"
  fp8_block: tuple[int, int] = (128, 128)  # the checkpoint's FP8 blocks, when the kernel is FP8 codes
  # FP8 codes through the Pallas kernel: True (moe_impl="fp8_grouped_gpu" asks for it everywhere), or
  # None: where the program is for a Hopper GPU (jax_mtp.platform; the kernel is Mosaic GPU's: wgmma, TMA)
  fp8_kernel: bool | None = None
  fp8_impl: str = "auto"  # which kernel (kernels.fp8_grouped_matmul.IMPLS; MtpConfig.fp8_matmul_impl)

  def setup(self):
    self.kernel = self.param("kernel", nn.initializers.normal(INIT_STD), (self.in_features, self.out_features),
                             dtype_of(self.param_dtype))
    # FP8 kept as stored (jax_mtp.fp8): the codes are `kernel`, their block scales beside them
    scales = fp8.scale_name("kernel")
    self.kernel_scale_inv = self.get_variable("params", scales) if self.has_variable("params", scales) else None

  def weight(self) -> jax.Array:
    """The kernel [in, out] in `param_dtype`: as stored, or dequantised from FP8 codes in the program."""
    if self.kernel_scale_inv is None:
      return self.kernel
    return fp8.dequantize(self.kernel, self.kernel_scale_inv, dtype_of(self.param_dtype), self.fp8_block)

  def runs_fp8_kernel(self, shape: tuple[int, ...] | None = None) -> bool:
    """Whether the product of an input of `shape` ([..., T, in]; None: any) runs from the FP8 codes in the Pallas
    kernel (see the class docstring). With both choices automatic (`fp8_kernel` None, `fp8_impl` "auto"), a prefill
    chunk's rows go through XLA's bf16 GEMM over the dequantised weight instead (`fp8_grouped_matmul.auto_takes`)."""
    from jax_mtp.kernels import fp8_grouped_matmul as kernel  # noqa: PLC0415 (Pallas: only where used)
    on_gpu = lowering_platform() == "gpu"
    hopper = on_gpu and lowering_gpu_is_hopper()
    if on_gpu and not hopper and self.kernel_scale_inv is not None and (self.fp8_impl != "auto" or self.fp8_kernel):
      # asked for explicitly (fp8_matmul_impl, or moe_impl="fp8_grouped_gpu"): refused, not silently dequantised
      raise ValueError(f"fp8_matmul_impl={self.fp8_impl!r}: {NOT_HOPPER} (use 'auto': the codes are dequantised "
                       f"in the program there)")
    wanted = hopper if self.fp8_kernel is None else self.fp8_kernel
    if self.fp8_kernel is None and self.fp8_impl == "auto" and shape is not None:
      wanted = wanted and kernel.auto_takes(math.prod(shape[:-1]), shape[-2] if len(shape) > 2 else 1)
    return (wanted and self.kernel_scale_inv is not None and self.dtype == "bfloat16"
            and kernel.takes(*self.kernel.shape, self.fp8_block))  # this device's share of the weight

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    if self.runs_fp8_kernel(x.shape):
      from jax_mtp.kernels.fp8_grouped_matmul import fp8_grouped_matmul  # noqa: PLC0415
      rows = math.prod(x.shape[:-1])
      y = fp8_grouped_matmul(x.reshape(rows, x.shape[-1]), self.kernel[None], self.kernel_scale_inv[None],
                             jnp.full((1,), rows, jnp.int32), backend="auto", impl=self.fp8_impl)
      return y.reshape(*x.shape[:-1], -1).astype(self.dtype)
    return jnp.einsum("...i,io->...o", x, self.weight().astype(self.dtype), precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32).astype(self.dtype)


def linear(in_features: int, out_features: int, cfg: MtpConfig, *, fp32: bool = False) -> Linear:
  """A projection in the config's dtypes, or fully fp32 (router, indexer weights_proj)."""
  if fp32:
    return Linear(in_features, out_features, "float32", "float32")
  return Linear(in_features, out_features, cfg.dtype, cfg.param_dtype, cfg.fp8_block,
                fp8_kernel=True if cfg.moe_impl == "fp8_grouped_gpu" else None, fp8_impl=cfg.fp8_matmul_impl)


# --- RoPE ----------------------------------------------------------------------------------------


def rope_inv_freq(rope: RopeConfig, rotary_dim: int) -> np.ndarray:
  """Inverse frequencies [R/2] (fp32), YaRN-blended when `rope.factor > 1`.

  YaRN keeps the high frequencies (dims below the β_fast correction dim), divides the low ones
  by `factor`, and ramps linearly in between (floor/ceil of the correction range, as DeepSeek).
  """
  exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
  pos_freqs = np.float32(rope.theta) ** exponents
  extrapolation = np.float32(1.0) / pos_freqs
  if not rope.is_yarn:
    return extrapolation
  interpolation = np.float32(1.0) / (np.float32(rope.factor) * pos_freqs)

  def correction_dim(rotations: float) -> float:
    ratio = rope.original_max_position_embeddings / (rotations * 2 * math.pi)
    return rotary_dim * math.log(ratio) / (2 * math.log(rope.theta))

  low = max(math.floor(correction_dim(rope.beta_fast)), 0)
  high = min(math.ceil(correction_dim(rope.beta_slow)), rotary_dim - 1)
  if low == high:
    high += 0.001  # a one-point ramp would divide by zero
  ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  keep = (np.float32(1.0) - ramp).astype(np.float32)  # 1 → keep the original frequency
  return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)


def rope_cos_sin_scale(rope: RopeConfig) -> float:
  """Factor on cos/sin. DeepSeek: mscale/mscale_all_dim = 1; the temperature is in softmax_scale."""
  if not rope.is_yarn:
    return 1.0
  if rope.mscale and rope.mscale_all_dim:
    return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
  return yarn_mscale(rope.factor, 1.0)


class Rotary(NamedTuple):
  """cos and sin of the rotation angles, fp32 [B, T, R/2]."""

  cos: jax.Array
  sin: jax.Array


def rotary_for_positions(rope: RopeConfig, rotary_dim: int, positions_BT: jax.Array) -> Rotary:
  inv_freq = jnp.asarray(rope_inv_freq(rope, rotary_dim))
  angles = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  scale = rope_cos_sin_scale(rope)
  return Rotary(jnp.cos(angles) * scale, jnp.sin(angles) * scale)


def apply_rope(x: jax.Array, rotary: Rotary, *, interleaved: bool) -> jax.Array:
  """Rotates the last dim R of `x` [B, T, ..., R] at the angles of `rotary` [B, T, R/2].

  interleaved=True pairs dims (2i, 2i+1) and keeps that layout (MLA; the official complex-number
  form). interleaved=False pairs (i, i + R/2), i.e. NeoX `rotate_half` (the V3.2 DSA indexer).
  """
  extra = x.ndim - rotary.cos.ndim
  cos = rotary.cos.reshape(rotary.cos.shape[:2] + (1,) * extra + rotary.cos.shape[2:])
  sin = rotary.sin.reshape(cos.shape)
  x32 = x.astype(jnp.float32)
  if interleaved:
    x1, x2 = x32[..., 0::2], x32[..., 1::2]
    rotated = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
  else:
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)
