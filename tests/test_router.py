"""The router's logits in a bf16 model from ROUTER_SPLIT_MIN_TOKENS tokens (jax_mtp/moe.py): three bf16 dots over the
fp32 weight's exact three-part split, equal to the fp32 dot to fp32's accuracy, and the routing they give equal to a
float64 noaux_tc routing written here from the official formula (not from moe.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp import config as config_lib
from jax_mtp.moe import ROUTER_SPLIT_MIN_TOKENS, Router, router_logits, split_bf16x3
from tests.tolerances import assert_close


@pytest.mark.parametrize("scale", [1e-25, 1e-3, 1.0, 1e20])  # samples down to ~1e-4 · scale: ≥ 2^-110 at 1e-25
def test_the_three_bf16_parts_sum_to_the_fp32_weight_exactly(scale):
  w = (jax.random.normal(jax.random.key(0), (64, 96), jnp.float32) * scale).astype(jnp.float32)
  parts = [np.asarray(p.astype(jnp.float32), np.float64) for p in split_bf16x3(w)]
  assert all(p.dtype == np.float64 for p in parts)
  np.testing.assert_array_equal(parts[0] + parts[1] + parts[2], np.asarray(w, np.float64))


@pytest.mark.parametrize("tokens", [ROUTER_SPLIT_MIN_TOKENS - 1, ROUTER_SPLIT_MIN_TOKENS, 200])
def test_bf16_logits_equal_the_float64_dot_to_fp32_accuracy(tokens):
  """Below the threshold one fp32 dot, from it the three-part dots: both within fp32's tolerance of float64 (on a
  GPU too: there a split by float roundings lost its residuals to XLA's excess precision, 2^-9 off, 2026-12-05)."""
  kx, kw = jax.random.split(jax.random.key(1))
  x = jax.random.normal(kx, (tokens, 7168), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (256, 7168), jnp.float32) * 0.02
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
  assert_close(router_logits(x, w), want, "float32", f"router logits at {tokens} tokens")


def test_the_split_is_taken_only_for_bf16_inputs_from_the_threshold():
  """fp32 inputs keep the one fp32 dot (an fp32 model's parity with HF is at fp32's tolerance); the jaxpr shows the
  three bf16 dots only for bf16 inputs of ROUTER_SPLIT_MIN_TOKENS rows."""
  w = jnp.zeros((8, 64), jnp.float32)

  def dots(x):
    text = str(jax.make_jaxpr(router_logits)(x, w))
    return text.count("dot_general")

  assert dots(jnp.zeros((ROUTER_SPLIT_MIN_TOKENS, 64), jnp.bfloat16)) == 3
  assert dots(jnp.zeros((ROUTER_SPLIT_MIN_TOKENS - 1, 64), jnp.bfloat16)) == 1
  assert dots(jnp.zeros((ROUTER_SPLIT_MIN_TOKENS, 64), jnp.float32)) == 1


def _noaux_tc_float64(x, w, bias, cfg):
  """DeepSeek-V3's routing in float64 numpy: sigmoid scores, biased for selection, groups by their top-2 sums."""
  scores = 1.0 / (1.0 + np.exp(-(x @ w.T)))
  biased = scores + bias
  t, e = biased.shape
  grouped = biased.reshape(t, cfg.n_group, e // cfg.n_group)
  group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
  kept = np.argsort(-group_scores, axis=-1, kind="stable")[:, :cfg.topk_group]
  allowed = np.zeros((t, cfg.n_group), bool)
  np.put_along_axis(allowed, kept, True, axis=-1)
  masked = np.where(np.repeat(allowed, e // cfg.n_group, axis=-1), biased, -np.inf)
  ids = np.argsort(-masked, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok]
  weights = np.take_along_axis(scores, ids, -1)
  return ids, weights / weights.sum(-1, keepdims=True) * cfg.routed_scaling_factor


def test_bf16_routing_at_the_threshold_equals_float64_noaux_tc():
  cfg = config_lib.tiny(hidden_size=256, n_routed_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
                        dtype="bfloat16")
  tokens = ROUTER_SPLIT_MIN_TOKENS * 2
  x = jax.random.normal(jax.random.key(2), (tokens, cfg.hidden_size), jnp.float32).astype(jnp.bfloat16)
  router = Router(cfg)
  params = router.init(jax.random.key(3), x)
  bias = jax.random.uniform(jax.random.key(4), (cfg.n_routed_experts,), jnp.float32, -0.05, 0.05)
  params = {"params": {**params["params"], "e_score_correction_bias": bias}}
  ids, weights = router.apply(params, x)
  want_ids, want_weights = _noaux_tc_float64(np.asarray(x, np.float64), np.asarray(params["params"]["weight"],
                                                                                 np.float64),
                                             np.asarray(bias, np.float64), cfg)
  np.testing.assert_array_equal(np.sort(np.asarray(ids), -1), np.sort(want_ids, -1))
  order, want_order = np.argsort(np.asarray(ids), -1), np.argsort(want_ids, -1)
  assert_close(np.take_along_axis(np.asarray(weights), order, -1), np.take_along_axis(want_weights, want_order, -1),
               "float32", "routing weights")


def test_the_split_logits_gradients_are_the_fp32_dots():
  """Training a bf16 model's router from ROUTER_SPLIT_MIN_TOKENS tokens: the weight's and x's gradients equal the fp32
  dot's (through the bit-mask split alone the weight's would reach only its last bf16 part)."""
  kx, kw, kg = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(kx, (ROUTER_SPLIT_MIN_TOKENS, 256), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (16, 256), jnp.float32) * 0.02
  g = jax.random.normal(kg, (ROUTER_SPLIT_MIN_TOKENS, 16), jnp.float32)
  fp32 = lambda x, w: jnp.einsum("td,ed->te", x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
  got = jax.vjp(router_logits, x, w)[1](g)
  want = jax.vjp(fp32, x, w)[1](g)
  assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
  np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32))
