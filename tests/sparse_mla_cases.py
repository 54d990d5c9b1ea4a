"""The sparse-MLA op's inputs and float64 formula that every implementation's tests use
(tests/test_sparse_mla_kernel.py: the Triton kernel; tests/test_sparse_mla_mgpu.py: the Mosaic GPU one)."""

import jax.numpy as jnp
import numpy as np


def problem(b, t, n, c, r, s, k, dtype, seed=0, padded=0.2):
  """Queries, a cache, and per query k distinct slots of which a `padded` share is not attended
  (slot −1, as the selection's padding); the first slot is always attended."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
  slots = np.stack([[rng.permutation(s)[:k] for _ in range(t)] for _ in range(b)]).astype(np.int32)
  valid = rng.random((b, t, k)) >= padded
  valid[..., 0] = True
  return (normal(b, t, n, c), normal(b, t, n, r), normal(b, s, c), normal(b, s, r), jnp.asarray(slots),
          jnp.asarray(valid))


def formula(q_lat, q_pe, latent, k_pe, slots, valid, scale):
  """float64 softmax attention over the attended slots, on the values the kernel reads."""
  f64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)  # noqa: E731
  q_lat, q_pe, latent, k_pe, slots, valid = map(np.asarray, (f64(q_lat), f64(q_pe), f64(latent), f64(k_pe),
                                                             slots, valid))
  rows = np.arange(latent.shape[0])[:, None, None]
  lat_g, pe_g = latent[rows, slots], k_pe[rows, slots]  # [B, T, K, ·]
  scores = (np.einsum("btnc,btkc->btnk", q_lat, lat_g) + np.einsum("btnr,btkr->btnk", q_pe, pe_g)) * scale
  scores = np.where(valid[:, :, None], scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("btnk,btkc->btnc", probs, lat_g)
