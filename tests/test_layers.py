"""Building blocks in `jax_mtp.layers`: RoPE frequencies against HF's own YaRN code and the
reference numbers (reference/deepseek_v32.md §4.2), the two RoPE layouts against their textbook
forms, and the norms against float64 numpy formulas.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf_v32

import jax_mtp
from jax_mtp import RopeConfig, from_hf_config
from jax_mtp.layers import (LayerNorm, RMSNorm, apply_rope, rms_norm, rope_cos_sin_scale, rope_inv_freq,
                            rotary_for_positions)
from tests.hf_reference import hf_config_object, tiny_hf_config_dict
from tests.tolerances import assert_close

# The full-size V3.2 RoPE block (reference §1.1) on the tiny dict: HF's YaRN reads only these keys
# (head_dim = qk_rope_head_dim for the DeepSeek configs).
FULL_V32_ROPE = dict(
    qk_rope_head_dim=64, index_head_dim=128, max_position_embeddings=163840, rope_theta=10000,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
)


def _hf_yarn(hf_dict: dict) -> tuple[np.ndarray, float]:
  """HF 5.24's `_compute_yarn_parameters(config)` → (inv_freq [R/2] fp32, attention_factor)."""
  config = hf_config_object(hf_dict)
  assert config.head_dim == hf_dict["qk_rope_head_dim"]  # HF rotates exactly the rope part
  inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
  return inv_freq.numpy(), attention_factor


# --- RoPE frequencies ------------------------------------------------------------------------------


@pytest.mark.parametrize("rope_scaling", [
    {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
     "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek: the temperature is all in softmax_scale
    {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16},  # no mscale keys: cos/sin scaled
    {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 0.707,
     "mscale_all_dim": 1.0},  # mscale ≠ mscale_all_dim: the ratio scales cos/sin
], ids=["deepseek", "no-mscale", "mscale-ratio"])
def test_yarn_inv_freq_and_cos_sin_scale_match_hf_tiny(rope_scaling):
  """Tiny config: our YaRN inv_freq equals HF's within 1e-7 relative, and our cos/sin factor is
  HF's attention_factor."""
  hf = tiny_hf_config_dict("deepseek_v32", rope_scaling=rope_scaling)
  hf_inv_freq, hf_attention_factor = _hf_yarn(hf)
  rope = from_hf_config(hf).rope
  ours = rope_inv_freq(rope, hf["qk_rope_head_dim"])
  assert ours.dtype == np.float32 and ours.shape == hf_inv_freq.shape == (4,)
  np.testing.assert_allclose(ours, hf_inv_freq, rtol=1e-7, atol=0)
  assert rope_cos_sin_scale(rope) == pytest.approx(hf_attention_factor, rel=1e-7)


def _yarn_inv_freq_f64(rope: RopeConfig, rotary_dim: int) -> np.ndarray:
  """HF's / DeepSeek's YaRN formula (floor/ceil correction range, linear ramp) in float64."""
  pos_freqs = rope.theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)

  def correction_dim(rotations):
    return rotary_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
        2 * math.log(rope.theta))

  low = max(math.floor(correction_dim(rope.beta_fast)), 0)
  high = min(math.ceil(correction_dim(rope.beta_slow)), rotary_dim - 1)
  keep = 1 - np.clip((np.arange(rotary_dim // 2) - low) / (high - low), 0, 1)
  return (1 - keep) / (rope.factor * pos_freqs) + keep / pos_freqs


def test_yarn_inv_freq_matches_hf_full_size_v32():
  """qk_rope_head_dim 64, original length 4096, factor 40: ours (from the deepseek_v32() preset)
  equals HF's to 2 float32 ulps and the float64 formula to 2e-7 relative; the cos/sin factor is
  HF's attention_factor, 1.

  Not 1e-7 against HF: numpy's and torch's fp32 `pow` differ by an ulp (1.2e-7 relative) at some
  i (e.g. i = 5, where ours is the correctly rounded one), and the blend adds one more rounding;
  HF itself is 1.3e-7 from the float64 formula.
  """
  hf = tiny_hf_config_dict("deepseek_v32", **FULL_V32_ROPE)
  hf_inv_freq, hf_attention_factor = _hf_yarn(hf)
  rope = jax_mtp.deepseek_v32().rope
  assert from_hf_config(hf).rope == rope
  ours = rope_inv_freq(rope, 64)
  assert ours.dtype == np.float32 and ours.shape == hf_inv_freq.shape == (32,)
  np.testing.assert_array_max_ulp(ours, hf_inv_freq, maxulp=2)
  np.testing.assert_allclose(ours, _yarn_inv_freq_f64(rope, 64), rtol=2e-7, atol=0)
  assert rope_cos_sin_scale(rope) == hf_attention_factor == 1.0


def test_yarn_correction_range_is_10_to_23_for_full_size_v32():
  """Reference §4.2: low = 10, high = 23. Frequencies i ≤ 10 are the base 10000^(-2i/64) exactly,
  i ≥ 23 are exactly base/40, and in between the blend weight ramps linearly: 1 − (i − 10)/13."""
  rope = jax_mtp.deepseek_v32().rope
  ours = rope_inv_freq(rope, 64).astype(np.float64)
  base = rope_inv_freq(RopeConfig(theta=rope.theta), 64).astype(np.float64)  # plain RoPE, same fp32 math
  i = np.arange(32)
  np.testing.assert_array_equal(ours[i <= 10], base[i <= 10])
  np.testing.assert_allclose(ours[i >= 23], base[i >= 23] / 40, rtol=2e-7, atol=0)
  keep = (ours / base - 1 / 40) / (1 - 1 / 40)  # ours = base · (keep + (1 − keep)/40)
  np.testing.assert_allclose(keep, 1 - np.clip((i - 10) / 13, 0, 1), rtol=0, atol=1e-5)
  assert np.all((keep[11:23] > 0) & (keep[11:23] < 1))  # 11..22 are strictly blended


@pytest.mark.parametrize("rope, rotary_dim", [(from_hf_config(tiny_hf_config_dict("glm_moe_dsa")).rope, 8),
                                              (jax_mtp.glm5().rope, 64)], ids=["tiny-glm", "glm5"])
def test_plain_rope_is_theta_to_the_minus_2i_over_r(rope, rotary_dim):
  """GLM (no YaRN): inv_freq_i = theta^(-2i/R) (fp32 rounding only) and cos/sin are unscaled."""
  assert not rope.is_yarn and rope.theta == 1e6
  expected = rope.theta ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
  np.testing.assert_allclose(rope_inv_freq(rope, rotary_dim), expected, rtol=1e-6, atol=0)
  assert rope_cos_sin_scale(rope) == 1.0


# --- apply_rope ------------------------------------------------------------------------------------

B, T, N, R = 2, 5, 3, 8


def _rotary(rope: RopeConfig, positions_BT: np.ndarray):
  return rotary_for_positions(rope, R, jnp.asarray(positions_BT, jnp.int32))


def _random(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


ROPES = {"yarn": jax_mtp.tiny().rope, "plain": RopeConfig(theta=10000.0)}


@pytest.mark.parametrize("rope_name", list(ROPES))
def test_interleaved_rope_is_complex_multiplication(rope_name):
  """Pairs (2i, 2i+1) as complex numbers z_i, rotated to z_i · exp(i·p·inv_freq_i) (float64 angles),
  in place: the official DeepSeek `apply_rotary_emb`."""
  rope = ROPES[rope_name]
  positions = np.random.default_rng(0).integers(0, 64, (B, T))
  x = _random((B, T, N, R), seed=1)
  out = apply_rope(jnp.asarray(x), _rotary(rope, positions), interleaved=True)

  angles = positions[..., None, None] * rope_inv_freq(rope, R).astype(np.float64)  # [B, T, 1, R/2]
  z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles) * rope_cos_sin_scale(rope)
  expected = np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
  assert out.dtype == jnp.float32 and out.shape == x.shape
  assert_close(out, expected, what="interleaved RoPE")


@pytest.mark.parametrize("rope_name", list(ROPES))
def test_neox_rope_is_hf_rotate_half(rope_name):
  """Pairs (i, i + R/2): equals HF's `apply_rotary_pos_emb` (x·cos + rotate_half(x)·sin, cos/sin
  duplicated as cat(f, f)) on the same angles."""
  rope = ROPES[rope_name]
  positions = np.random.default_rng(2).integers(0, 600, (B, T))
  x = _random((B, T, N, R), seed=3)
  rotary = _rotary(rope, positions)
  out = apply_rope(jnp.asarray(x), rotary, interleaved=False)

  cos = torch.from_numpy(np.concatenate([np.asarray(rotary.cos)] * 2, axis=-1))
  sin = torch.from_numpy(np.concatenate([np.asarray(rotary.sin)] * 2, axis=-1))
  expected, _ = hf_v32.apply_rotary_pos_emb(torch.from_numpy(x), torch.from_numpy(x), cos, sin, unsqueeze_dim=2)
  assert_close(out, expected.numpy(), what="NeoX RoPE")


def test_the_two_layouts_differ_by_a_permutation():
  """NeoX on the de-interleaved vector [evens | odds] is interleaved RoPE, de-interleaved (HF's
  `apply_rotary_pos_emb_interleave` convention)."""
  positions = np.random.default_rng(4).integers(0, 64, (B, T))
  rotary = _rotary(ROPES["yarn"], positions)
  x = _random((B, T, N, R), seed=5)
  perm = np.concatenate([np.arange(0, R, 2), np.arange(1, R, 2)])
  interleaved = apply_rope(jnp.asarray(x), rotary, interleaved=True)
  neox = apply_rope(jnp.asarray(x[..., perm]), rotary, interleaved=False)
  assert_close(neox, np.asarray(interleaved)[..., perm], what="permuted layouts")


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
def test_rope_preserves_norms(interleaved):
  """Each rotated pair keeps its length (cos/sin factor 1), so every vector keeps its norm."""
  positions = np.random.default_rng(6).integers(0, 600, (B, T))
  x = _random((B, T, N, R), seed=7)
  out = np.asarray(apply_rope(jnp.asarray(x), _rotary(ROPES["yarn"], positions), interleaved=interleaved))
  pairs = (lambda v: (v[..., 0::2], v[..., 1::2])) if interleaved else (lambda v: np.split(v, 2, axis=-1))
  (a, b), (c, d) = pairs(x.astype(np.float64)), pairs(out.astype(np.float64))
  assert_close(np.hypot(c, d), np.hypot(a, b), what="pair lengths")
  assert_close(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), what="vector norms")
  assert np.max(np.abs(out - x)) > 0.1  # it did rotate


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
def test_rope_score_depends_only_on_relative_position(interleaved):
  """q rotated to p and k rotated to s: q·k depends on p − s only (shifting both by Δ keeps it),
  and changes when p − s changes."""
  rope = ROPES["yarn"]
  q, k = _random((R,), seed=8), _random((R,), seed=9)
  shifts = np.array([0, 1, 7, 30, 100])

  def scores(p, s):
    n = len(shifts)
    q_rot = apply_rope(jnp.broadcast_to(q, (1, n, R)), _rotary(rope, (p + shifts)[None]), interleaved=interleaved)
    k_rot = apply_rope(jnp.broadcast_to(k, (1, n, R)), _rotary(rope, (s + shifts)[None]), interleaved=interleaved)
    return np.sum(np.asarray(q_rot, np.float64) * np.asarray(k_rot, np.float64), axis=-1)[0]

  same_offset = scores(9, 4)
  assert_close(same_offset, np.full_like(same_offset, same_offset[0]), what="q·k under a common shift")
  assert np.max(np.abs(scores(9, 2) - same_offset)) > 1e-2


def test_rope_keeps_bf16_and_broadcasts_over_heads():
  """bf16 in → bf16 out (math in fp32); [B, T, R] and [B, T, N, R] rotate by the same angles."""
  positions = np.random.default_rng(10).integers(0, 64, (B, T))
  rotary = _rotary(ROPES["yarn"], positions)
  x = _random((B, T, N, R), seed=11)
  heads = apply_rope(jnp.asarray(x), rotary, interleaved=True)
  one_head = apply_rope(jnp.asarray(x[:, :, 1]), rotary, interleaved=True)
  np.testing.assert_array_equal(np.asarray(heads)[:, :, 1], np.asarray(one_head))
  x_bf16 = jnp.asarray(x, jnp.bfloat16)
  out_bf16 = apply_rope(x_bf16, rotary, interleaved=True)
  assert out_bf16.dtype == jnp.bfloat16
  assert_close(out_bf16, apply_rope(x_bf16.astype(jnp.float32), rotary, interleaved=True), "bfloat16", "bf16 RoPE")


# --- norms -----------------------------------------------------------------------------------------


def _rms_norm_f64(x, weight, eps):
  x = np.asarray(x, np.float64)
  return np.asarray(weight, np.float64) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _layer_norm_f64(x, weight, bias, eps):
  x = np.asarray(x, np.float64)
  mean = x.mean(-1, keepdims=True)
  var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)


D = 64


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_matches_float64_formula(eps):
  """`weight · x / sqrt(mean(x²) + eps)`, fp32 result; eps is inside the sqrt (1e-2 on x ~ 0.1
  makes it matter)."""
  x = 0.1 * _random((3, 5, D), seed=12)
  weight = 1 + 0.1 * _random((D,), seed=13)
  out = rms_norm(jnp.asarray(x), jnp.asarray(weight), eps)
  assert out.dtype == jnp.float32
  assert_close(out, _rms_norm_f64(x, weight, eps), what="rms_norm")
  if eps == 1e-2:
    assert np.max(np.abs(np.asarray(out) - _rms_norm_f64(x, weight, 0.0))) > 0.1


def test_rms_norm_module_matches_float64_formula():
  """RMSNorm's `weight` param [D] (init ones) scales the fp32-normalised input."""
  module = RMSNorm(features=D, eps=1e-6)
  x = 3 * _random((2, 4, D), seed=14)
  params = module.init(jax.random.key(0), jnp.asarray(x))["params"]
  np.testing.assert_array_equal(params["weight"], np.ones(D, np.float32))
  weight = 1 + 0.1 * _random((D,), seed=15)
  out = module.apply({"params": {"weight": jnp.asarray(weight)}}, jnp.asarray(x))
  assert out.dtype == jnp.float32
  assert_close(out, _rms_norm_f64(x, weight, 1e-6), what="RMSNorm")


def test_layer_norm_module_matches_float64_formula():
  """LayerNorm (the indexer's k_norm): `(x − mean)/sqrt(var + eps) · weight + bias`, biased
  variance, fp32; an input offset of 50 does not cost precision."""
  module = LayerNorm(eps=1e-6)
  x = 50 + _random((2, 4, D), seed=16)
  params = module.init(jax.random.key(0), jnp.asarray(x))["params"]
  assert params["weight"].dtype == params["bias"].dtype == jnp.float32
  weight, bias = 1 + 0.1 * _random((D,), seed=17), 0.1 * _random((D,), seed=18)
  out = module.apply({"params": {"weight": jnp.asarray(weight), "bias": jnp.asarray(bias)}}, jnp.asarray(x))
  assert out.dtype == jnp.float32
  assert_close(out, _layer_norm_f64(x, weight, bias, 1e-6), what="LayerNorm")


def test_norms_bf16_in_bf16_out():
  """With the activation dtype bf16 (as MtpConfig.dtype sets it), bf16 input gives bf16 output that
  matches the float64 formula on the same bf16 values to bf16 tolerance; `rms_norm` itself
  returns fp32 (its callers cast)."""
  x_bf16 = jnp.asarray(3 * _random((2, 4, D), seed=19), jnp.bfloat16)
  x_exact = np.asarray(x_bf16.astype(jnp.float32))
  weight = 1 + 0.1 * _random((D,), seed=20)
  bias = 0.1 * _random((D,), seed=21)

  assert rms_norm(x_bf16, jnp.asarray(weight, jnp.bfloat16), 1e-6).dtype == jnp.float32
  rms = RMSNorm(features=D, eps=1e-6, dtype="bfloat16", param_dtype="bfloat16")
  assert rms.init(jax.random.key(0), x_bf16)["params"]["weight"].dtype == jnp.bfloat16
  weight_bf16 = jnp.asarray(weight, jnp.bfloat16)
  out = rms.apply({"params": {"weight": weight_bf16}}, x_bf16)
  assert out.dtype == jnp.bfloat16
  assert_close(out, _rms_norm_f64(x_exact, np.asarray(weight_bf16.astype(jnp.float32)), 1e-6), "bfloat16",
               "bf16 RMSNorm")

  layer_norm_params = {"weight": jnp.asarray(weight), "bias": jnp.asarray(bias)}
  out = LayerNorm(eps=1e-6, dtype="bfloat16").apply({"params": layer_norm_params}, x_bf16)
  assert out.dtype == jnp.bfloat16
  assert_close(out, _layer_norm_f64(x_exact, weight, bias, 1e-6), "bfloat16", "bf16 LayerNorm")
