"""DSA's sparse path: the indexer's chunked scores equal the one-shot formula, its selection is the
top-k of the visible slots, and MLA's decode form over the gathered selection equals dense attention
under the selection mask (fp32), at caches longer than index_topk and queries that see fewer slots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.cache import causal_mask
from jax_mtp.indexer import SCORE_CHUNK_ELEMENTS, index_scores, score_chunk, topk_selection
from tests.tolerances import assert_close


def _scores_formula(q, k, w, scale):
  """I[b,t,s] = Σ_i w[b,t,i]·ReLU(q[b,t,i]·k[b,s])·scale in float64."""
  q, k, w = (np.asarray(a, np.float64) for a in (q, k, w))
  return np.einsum("btis,bti->bts", np.maximum(np.einsum("btij,bsj->btis", q, k), 0) * scale, w)


@pytest.mark.parametrize("s,chunk", [(37, 8), (64, 16), (100, 128), (129, 128)])
def test_chunked_scores_equal_the_formula(s, chunk):
  rng = np.random.default_rng(s)
  q = jnp.asarray(rng.standard_normal((2, 3, 4, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((2, s, 16)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
  expected = _scores_formula(q, k, w, 0.25)
  assert_close(index_scores(q, k, w, 0.25, chunk=chunk), expected, "float32", what=f"chunk {chunk}")
  assert_close(index_scores(q, k, w, 0.25), expected, "float32", what="one shot")


def test_score_chunk_bounds_the_logits():
  assert score_chunk(1, 4, 64, 4096) == 4096  # decode: the whole cache in one chunk
  chunk = score_chunk(1, 4096, 64, 16384)  # a 4K prefill chunk: multiples of 128 within the budget
  assert chunk == 256 and 4096 * 64 * chunk <= SCORE_CHUNK_ELEMENTS
  assert score_chunk(1, 16384, 64, 16384) == 128  # never below one 128-slot tile (then 2× the budget)


def test_selection_is_the_top_k_of_visible_slots():
  rng = np.random.default_rng(0)
  scores = jnp.asarray(rng.standard_normal((2, 3, 12)), jnp.float32)
  positions = jnp.asarray([[2, 6, 11], [0, 5, 9]], jnp.int32)
  visible = causal_mask(positions, 12)
  selection = topk_selection(scores, visible, 4)
  mask = np.asarray(selection.mask(12))
  for b in range(2):
    for t in range(3):
      seen = np.flatnonzero(np.asarray(visible[b, t]))
      want = set(seen[np.argsort(-np.asarray(scores[b, t])[seen])[:4]])
      assert set(np.flatnonzero(mask[b, t])) == want, (b, t)
      assert int(np.asarray(selection.valid_BTK[b, t]).sum()) == min(4, len(seen))


@pytest.mark.parametrize("t", [1, 4])
def test_sparse_decode_equals_dense_attention_under_the_mask(t):
  """The MTP layer at a cache of 24 > index_topk = 4: decode-form (absorbed, sparse) vs naive-form
  (dense, masked) outputs, fp32; early positions see fewer than 4 slots (invalid fillers)."""
  cfg = jax_mtp.tiny()
  assert cfg.index_topk == 4
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  model = jax_mtp.MtpPredictor(cfg)
  rng = np.random.default_rng(t)
  caches = jax_mtp.init_caches(cfg, 2, 24)
  # Fill the caches with a 16-token prefix (naive form), then run T new tokens both ways.
  prefix_ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 16)), jnp.int32)
  prefix_hidden = jnp.asarray(rng.standard_normal((2, 16, cfg.hidden_size)), jnp.float32)
  prefix_pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
  caches = model.apply({"params": params}, prefix_ids, prefix_pos, prefix_hidden, caches, absorb=False).caches
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, t)), jnp.int32)
  hidden = jnp.asarray(rng.standard_normal((2, t, cfg.hidden_size)), jnp.float32)
  positions = jnp.asarray([[16 + i for i in range(t)], [2 + i for i in range(t)]], jnp.int32)  # row 1: few visible
  sparse = model.apply({"params": params}, ids, positions, hidden, caches, absorb=True)
  dense = model.apply({"params": params}, ids, positions, hidden, caches, absorb=False)
  assert_close(sparse.hidden_BTD, dense.hidden_BTD, "float32", what="sparse absorbed vs dense naive")
  for a, b in zip(jax.tree.leaves(sparse.caches), jax.tree.leaves(dense.caches)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
