"""DSA's sparse path: the indexer's chunked scores equal the one-shot formula, its selection is the
top-k of the visible slots, and MLA's decode form over the gathered selection equals dense attention
under the selection mask (fp32), at caches longer than index_topk and queries that see fewer slots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.cache import causal_mask
from jax_mtp import decode, decode_flags, topk
from jax_mtp.indexer import SCORE_CHUNK_ELEMENTS, score_chunk
from jax_mtp.topk import topk_selection, topk_selection_radix
from jax_mtp.kernels.index_scores import reference as index_scores
from tests.greedy import plain_and_speculative
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


@pytest.mark.parametrize("b,t,s,k", [(2, 3, 300, 8), (1, 1, 5000, 2048), (3, 2, 40, 64), (2, 2, 1000, 100),
                                     (1, 4, 129, 1), (4, 9, 700, 64)])
@pytest.mark.parametrize("one_reduction_queries", [0, 10**6], ids=["sibling reductions", "one reduction"])
def test_radix_selection_picks_the_top_k_set(b, t, s, k, one_reduction_queries, monkeypatch):
  """The radix select picks the slots lax.top_k picks — ties (many equal scores) to the lowest slots,
  invalid fillers where fewer than k are visible (k > S included), negative and -inf scores — in both forms of
  its passes (4-bit digits counted by one reduction; 2-bit digits by sibling reductions)."""
  monkeypatch.setattr(topk, "RADIX_ONE_REDUCTION_QUERIES", one_reduction_queries)
  rng = np.random.default_rng(s)
  scores = jnp.asarray(rng.standard_normal((b, t, s)), jnp.float32)
  scores = scores.at[:, :, ::7].set(0.5).at[0, 0, :50].set(-3.0)
  visible = causal_mask(jnp.asarray(rng.integers(0, s, (b, t)), jnp.int32), s)
  want, got = topk_selection(scores, visible, k), topk_selection_radix(scores, visible, k)
  np.testing.assert_array_equal(np.sort(np.asarray(got.slots_BTK), -1), np.sort(np.asarray(want.slots_BTK), -1))
  np.testing.assert_array_equal(np.asarray(got.mask(s)), np.asarray(want.mask(s)))


@pytest.mark.parametrize("b,t,s,k", [(2, 3, 300, 8), (1, 1, 5000, 2048), (3, 2, 40, 64), (2, 2, 1000, 100),
                                     (1, 4, 129, 1), (4, 9, 700, 64)])
@pytest.mark.parametrize("digit_bits", [8, 16])
def test_histogram_passes_find_the_radix_selects_kth_key(b, t, s, k, digit_bits):
  """`kth_key_histograms` (a histogram a pass) finds the k-th largest key the sibling passes find, on the same
  awkward scores (ties, -inf, fewer visible than k, k > S), so the selection built from it is lax.top_k's set."""
  rng = np.random.default_rng(s + digit_bits)
  scores = jnp.asarray(rng.standard_normal((b, t, s)), jnp.float32)
  scores = scores.at[:, :, ::7].set(0.5).at[0, 0, :50].set(-3.0)
  visible = causal_mask(jnp.asarray(rng.integers(0, s, (b, t)), jnp.int32), s)
  keys = topk.order_keys(scores, visible)
  kk = min(k, s)
  got = topk.kth_key_histograms(keys, kk, digit_bits)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(topk.kth_key_sibling_reductions(keys, kk)))
  selected = topk.select_from_kth(keys, visible, got, kk)
  want = topk_selection(scores, visible, k)
  np.testing.assert_array_equal(np.sort(np.asarray(selected.slots_BTK), -1), np.sort(np.asarray(want.slots_BTK), -1))


@pytest.mark.parametrize("s,k", [(300, 8), (5000, 2048), (40, 64), (129, 1)], ids=["300", "5000", "k>S", "k=1"])
def test_compaction_lists_the_chosen_slots_in_slot_order(s, k):
  """`select_from_kth` lists exactly the slots above the k-th key and the lowest tied ones, in slot order, as a
  numpy loop over the row finds them."""
  rng = np.random.default_rng(s)
  b, t = 2, 3
  scores = jnp.asarray(rng.standard_normal((b, t, s)), jnp.float32).at[:, :, ::5].set(0.25)
  visible = causal_mask(jnp.asarray(rng.integers(0, s, (b, t)), jnp.int32), s)
  keys = topk.order_keys(scores, visible)
  kk = min(k, s)
  kth = jnp.sort(keys, axis=-1)[..., s - kk]
  got = topk.select_from_kth(keys, visible, kth, kk)
  keys_np, kth_np, visible_np = np.asarray(keys), np.asarray(kth), np.asarray(visible)
  for bi in range(b):
    for ti in range(t):
      row, want = keys_np[bi, ti], []
      ties_wanted = kk - int((row > kth_np[bi, ti]).sum())
      for slot in range(s):
        if row[slot] > kth_np[bi, ti] or (row[slot] == kth_np[bi, ti] and ties_wanted > 0):
          ties_wanted -= row[slot] == kth_np[bi, ti]
          want.append(slot)
      np.testing.assert_array_equal(np.asarray(got.slots_BTK[bi, ti]), want)
      np.testing.assert_array_equal(np.asarray(got.valid_BTK[bi, ti]), visible_np[bi, ti, want])


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


def test_fp8_keys_round_trip_within_one_e4m3_rounding():
  from jax_mtp.indexer import FP8_MAX, quantize_keys
  rng = np.random.default_rng(0)
  k = jnp.asarray(rng.standard_normal((2, 5, 32)) * np.array([1e-3, 1.0, 30.0, 1e3, 0.5])[None, :, None], jnp.float32)
  q8, scale = quantize_keys(k, jnp.float8_e4m3fn)
  assert q8.dtype == jnp.float8_e4m3fn and scale.shape == (2, 5)
  np.testing.assert_array_equal(np.max(np.abs(np.asarray(q8, np.float32)), -1), FP8_MAX)  # amax maps to 448
  back = np.asarray(q8, np.float64) * np.asarray(scale, np.float64)[..., None]
  bound = np.maximum(np.abs(np.asarray(k)) * 2**-4, np.asarray(scale)[..., None] * 2**-9)  # normal / subnormal ulp/2
  assert np.all(np.abs(back - np.asarray(k)) <= bound * (1 + 1e-6))


def test_fp8_key_scores_track_fp32_keys():
  from jax_mtp.indexer import quantize_keys
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((2, 3, 4, 32)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((2, 70, 32)), jnp.float32)
  w = jnp.asarray(rng.uniform(0, 1, (2, 3, 4)), jnp.float32)
  k8, scale = quantize_keys(k, jnp.float8_e4m3fn)
  fp8 = index_scores(q, k8, w, 0.2, chunk=32, k_scale_BS=scale)
  assert_close(fp8, _scores_formula(q, k, w, 0.2), "float8_e4m3fn", what="fp8-key scores")


def test_fp8_queries_fold_their_scales_into_the_weights_and_track_fp32_scores():
  """`quantize_queries`: each (token, head) query's amax → 448 in e4m3, its scale in that head's weight, so that
  the scores over e4m3 q and keys track the fp32 formula within two e4m3 roundings (the official FP8 indexer)."""
  from jax_mtp.indexer import FP8_MAX, quantize_keys, quantize_queries
  rng = np.random.default_rng(2)
  q = jnp.asarray(rng.standard_normal((2, 3, 4, 32)) * np.array([1e-2, 1.0, 40.0, 0.3])[None, None, :, None],
                  jnp.float32)
  k = jnp.asarray(rng.standard_normal((2, 70, 32)), jnp.float32)
  w = jnp.asarray(rng.uniform(0, 1, (2, 3, 4)), jnp.float32)
  q8, w8 = quantize_queries(q, w, jnp.float8_e4m3fn)
  assert q8.dtype == jnp.float8_e4m3fn
  np.testing.assert_array_equal(np.max(np.abs(np.asarray(q8, np.float32)), -1), FP8_MAX)
  q_scale = np.max(np.abs(np.asarray(q, np.float64)), -1) / FP8_MAX
  assert_close(w8, np.asarray(w, np.float64) * q_scale, "float32", what="w with q's scales")
  k8, k_scale = quantize_keys(k, jnp.float8_e4m3fn)
  fp8 = index_scores(q8, k8, w8, 0.2, chunk=32, k_scale_BS=k_scale)
  assert_close(fp8, _scores_formula(q, k, w, 0.2), "float8_e4m3fn_qk", what="fp8 q and key scores")


def test_fp8_index_cache_speculative_equals_plain_greedy():
  """With e4m3 indexer keys (vLLM's storage) the cache holds e4m3 + scales, and speculative decoding
  still equals plain greedy decoding token for token (both read the same quantised keys)."""
  cfg = jax_mtp.tiny(vocab_size=32, index_cache_dtype="fp8")
  cache = jax_mtp.init_caches(cfg, 1, 8)[0]
  assert cache.index_k_BSJ.dtype == jnp.float8_e4m3fn and cache.index_k_scale_BS.shape == (1, 8)
  assert jax_mtp.init_caches(jax_mtp.tiny(), 1, 8)[0].index_k_scale_BS is None
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(7))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(8))
  prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8]]
  plain, result = plain_and_speculative(cfg, target_params, mtp_params, prompts, 10, capacity=32)
  assert result.tokens == plain


def test_bad_index_cache_dtype_is_named():
  with pytest.raises(jax_mtp.ConfigError, match="index_cache_dtype='int8' is not one of"):
    jax_mtp.tiny(index_cache_dtype="int8")


def test_index_cache_dtype_flag(capsys):
  """--index-cache-dtype fp8 keeps the indexer's keys in e4m3 + a scale a token (vLLM's storage) and --check finds
  speculative == plain; bfloat16 and auto map as named; on a model without an indexer it is one error."""
  parse = decode_flags.parser().parse_args
  tiny = jax_mtp.tiny()
  assert decode.with_flags(tiny, parse(["--index-cache-dtype", "fp8"])).index_key_dtype == "float8_e4m3fn"
  assert decode.with_flags(tiny, parse(["--index-cache-dtype", "bfloat16"])).index_key_dtype == "bfloat16"
  assert decode.with_flags(tiny.replace(dtype="float32"), parse([])).index_key_dtype == "float32"  # auto: compute
  assert decode.main(["--random-tiny", "--index-cache-dtype", "fp8", "--max-new-tokens", "6", "--check"]) == 0
  capsys.readouterr()
  v3 = jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0)
  with pytest.raises(ValueError, match="--index-cache-dtype=fp8 is for DSA models .* \\(deepseek_v3\\) has no indexer"):
    decode.with_flags(v3, parse(["--index-cache-dtype", "fp8"]))
  assert decode.with_flags(v3, parse([])) == v3.replace(index_cache_dtype="auto")
