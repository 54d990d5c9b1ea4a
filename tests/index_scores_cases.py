"""The index-scores op's checks that every implementation runs (tests/test_index_scores_kernel.py: the Triton /
TPU kernel; tests/test_index_scores_mgpu.py: the Mosaic GPU one): equal to XLA's formulation and to a float64
formula of the values the dot sees; the positions bound (skipped slots exactly 0, every slot a query of its block
can see scored as without it)."""

import jax.numpy as jnp
import numpy as np

from jax_mtp.indexer import quantize_keys
from jax_mtp.kernels.index_scores import reference
from tests.tolerances import assert_close


def inputs(b, t, i, j, s, seed=0):
  """fp32 q [B, T, I, J], keys [B, S, J], weights [B, T, I], standard normal."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  return normal(b, t, i, j), normal(b, s, j), normal(b, t, i)


def keys_as(k, keys: str):
  """(keys in `keys`' dtype, their per-key scales or None, the dot's input dtype): float8 keys are quantised with
  scales and dotted in bf16 (a bf16 model's), 16-bit keys in their own dtype, fp32 keys exactly."""
  if keys.startswith("float8"):
    k8, k_scale = quantize_keys(k, jnp.dtype(keys))
    return k8, k_scale, jnp.bfloat16
  return k.astype(keys), None, jnp.dtype(keys)


def assert_equals_xla_and_the_formula(got, q, k, w, scale, *, k_scale, dot, what: str,
                                      tolerance: str = "float32") -> None:
  """`tolerance`: the row of tests/tolerances.py (a float8 × float8 wgmma's sums are not fp32's)."""
  assert_close(got, reference(q, k, w, scale, k_scale_BS=k_scale, dot_dtype=dot), tolerance, what=f"{what} vs XLA")
  # float64 on the values the dot sees (q rounded to the dot dtype, keys dequantised)
  q64 = np.asarray(q.astype(dot).astype(jnp.float32), np.float64)
  k64 = np.asarray(k.astype(jnp.float32), np.float64) * (1 if k_scale is None else np.asarray(k_scale)[..., None])
  formula = np.einsum("btis,bti->bts", np.maximum(np.einsum("btij,bsj->btis", q64, k64), 0) * scale, np.asarray(w))
  assert_close(got, formula, tolerance, what=f"{what} vs float64 formula")


def assert_positions_bound_the_scored_slots(scores, t: int, tokens: int, block: int, *, j: int = 16) -> None:
  """`scores(q, k, w, scale, positions_BT)` for one implementation at query blocks of `tokens` and slot blocks (or
  pipeline steps) of `block`: with positions, blocks past a query block's last position are exactly 0 and the rest
  equal the unbounded call's up to the fp32 accumulation order (two programs: on a GPU XLA may pick another dot
  algorithm for each, in interpret mode too); positions span several blocks and pad the last query block."""
  b, i, s = 2, 16, 512
  q, k, w = inputs(b, t, i, j, s, seed=3)
  positions = jnp.asarray([[130 + 37 * n for n in range(t)], [0] * t], jnp.int32)
  full = np.asarray(scores(q, k, w, 0.5, None))
  got = np.asarray(scores(q, k, w, 0.5, positions))
  pad = -(-t // tokens) * tokens - t
  last_BT = np.repeat(np.asarray(jnp.pad(positions, [(0, 0), (0, pad)], constant_values=-1))
                      .reshape(b, -1, tokens).max(-1), tokens, axis=1)[:, :t]
  scored_BTS = np.arange(s)[None, None] // block * block <= last_BT[..., None]
  np.testing.assert_array_equal(got[~scored_BTS], 0.0)
  assert_close(np.where(scored_BTS, got, 0.0), np.where(scored_BTS, full, 0.0), "float32",
               what="bounded vs unbounded scores on the scored slots")
  assert scored_BTS[1, :, :block].all() and not scored_BTS[1, :, block:].any()  # row 1 sits at position 0
  assert scored_BTS[0].sum() < scored_BTS[0].size  # some blocks were skipped
  visible = np.arange(s)[None, None] <= np.asarray(positions)[..., None]
  assert scored_BTS[visible].all()
