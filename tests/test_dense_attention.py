"""MLA's dense absorbed attention (`mla.dense_latent_attention`): over a 16-bit cache its dots take 16-bit operands
only (q~ and the probabilities as hi + lo parts) and stay within the split's tolerance of a float64 formula; over
an fp32 cache, fp32 dots within fp32's; the benchmark that times the two forms runs on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import dense_attention
from jax_mtp.mla import dense_latent_attention, split16
from tests.tolerances import assert_close

SCALE = 0.125


def _problem(b=2, t=3, n=4, c=64, r=16, s=37, seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  positions = jnp.asarray([[20, 21, 22], [34, 35, 36]])[:b, :t]
  visible = jnp.arange(s)[None, None] <= positions[..., None]
  return (normal(b, t, n, c), normal(b, t, n, r).astype(jnp.bfloat16), normal(b, s, c).astype(jnp.bfloat16),
          normal(b, s, r).astype(jnp.bfloat16), visible)


def _formula(q_lat, q_pe, latent, k_pe, visible):
  f64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)  # noqa: E731
  scores = (np.einsum("btnc,bsc->bnts", f64(q_lat), f64(latent)) + np.einsum("btnr,bsr->bnts", f64(q_pe), f64(k_pe)))
  scores = np.where(np.asarray(visible)[:, None], scores * SCALE, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bnts,bsc->btnc", probs, f64(latent))


@pytest.mark.parametrize("cache", ["bfloat16", "float32"])
def test_dense_attention_equals_the_float64_formula(cache):
  q_lat, q_pe, latent, k_pe, visible = _problem()
  latent = latent.astype(cache)
  got = dense_latent_attention(q_lat, q_pe, latent, k_pe, visible, SCALE)
  assert got.dtype == jnp.float32
  assert_close(got, _formula(q_lat, q_pe, latent, k_pe, visible), "bfloat16_split" if cache == "bfloat16" else
               "float32", what=f"{cache} cache vs float64")


def test_a_16_bit_cache_puts_only_16_bit_operands_on_the_dots():
  """The property the speed rests on: no fp32 dot (an H200 runs fp32 HIGHEST dots on its CUDA cores)."""
  args = _problem()
  jaxpr = jax.make_jaxpr(lambda *a: dense_latent_attention(*a, SCALE))(*args)
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(dots) == 5  # scores: two parts of q~ and the rope term; output: two parts of the probabilities
  assert all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
  fp32 = jax.make_jaxpr(lambda *a: dense_latent_attention(*a, SCALE))(*args[:2], args[2].astype(jnp.float32), *args[3:])
  assert any(v.aval.dtype == jnp.float32 for e in fp32.jaxpr.eqns if e.primitive.name == "dot_general" for v in e.invars)


def test_split16_holds_twice_the_16_bit_precision():
  x = jnp.asarray(np.random.default_rng(1).standard_normal(4096), jnp.float32)
  hi, lo = split16(x, jnp.bfloat16)
  assert hi.dtype == lo.dtype == jnp.bfloat16
  rest = np.abs(np.asarray(x, np.float64) - np.asarray(hi, np.float64) - np.asarray(lo, np.float64))
  assert np.all(rest <= 2.0**-17 * np.abs(np.asarray(x)))  # twice bf16's 8 significant bits, each part rounded
  assert np.max(rest / np.abs(np.asarray(x))) > 2.0**-24  # and not exact: the split is the point of the bound


def test_the_benchmark_times_both_forms_on_cpu(capsys):
  assert dense_attention.main(["--batch", "1", "--tokens", "2", "--capacity", "40", "--iters", "1"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 | 2 | 40 |")]
  assert [row.split(" | ")[3] for row in rows] == ["fp32", "bf16 split"]
  assert "f32" in rows[0].split(" | ")[-1] and "f32" not in rows[1].split(" | ")[-1]
