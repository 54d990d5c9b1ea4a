"""Chunked prefill: a prompt run `chunk` tokens at a time gives the hiddens and caches of one call
over the whole prompt (fp32; dense and DSA caches; a padded last chunk past the capacity), the
speculator with a small chunk equals plain greedy decoding, and the automatic chunk bounds memory."""

import re
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.config import ConfigError
from jax_mtp.model import TargetModel, init_target_caches
from jax_mtp.mla_blocked import KEY_BLOCK
from jax_mtp.prefill import (PREFILL_CHUNK_BYTES, PREFILL_SHARE_OF_FREE, TOPK_WORDS_PER_SLOT, apply_in_chunks,
                             auto_prefill_chunk, dense_cache_plan, prefill_budget, prefill_plan, target_prefill)
from jax_mtp.sharding import tensor_parallel
from jax_mtp.request import cache_bytes, pack_prompts, required_capacity, stop_id_array
from tests.tolerances import assert_close


def _one_call(cfg, params, prompt, capacity):
  """The reference: the whole prompt in one call, in the form the chunks use."""
  b, t = prompt.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  out = TargetModel(cfg).apply({"params": params}, prompt, positions, init_target_caches(cfg, b, capacity),
                               absorb=prefill_plan(cfg, b, capacity, tensor_parallel(1), tokens=t)[1])
  return out.hidden_BTD, out.caches


@pytest.mark.parametrize("capacity,chunk", [(40, 8), (40, 16), (8, 3)])  # DSA (40 > index_topk 4); dense (8)
def test_chunks_equal_one_call(capacity, chunk):
  """T = 37 prompt tokens (or 7 in a cache of 8): the last chunk is padded; with chunk 16 its padding
  runs to position 47, past the capacity of 40, and those writes are dropped."""
  cfg = jax_mtp.tiny(prefill_chunk=chunk)
  params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  t = min(37, capacity - 1)
  prompt = jnp.asarray(np.random.default_rng(t).integers(0, cfg.vocab_size, (2, t)), jnp.int32)
  lengths = jnp.asarray([t, t - 5], jnp.int32)
  hidden, last, caches = jax.jit(lambda p, x, n: target_prefill(TargetModel(cfg), {"params": p}, x, n, capacity))(
      params, prompt, lengths)
  want_hidden, want_caches = _one_call(cfg, params, prompt, capacity)
  assert_close(hidden, want_hidden, "float32", what=f"hidden, chunk {chunk}")
  assert_close(last[:, 0], want_hidden[jnp.arange(2), lengths - 1], "float32", what="last prompt hidden")
  for got, want in zip(jax.tree.leaves(caches), jax.tree.leaves(want_caches), strict=True):
    # slots ≥ t hold the padding's entries (stale by the cache contract, overwritten before read)
    assert_close(got[:, :t], want[:, :t], "float32", what=f"caches, chunk {chunk}")


def test_speculative_with_chunked_prefill_equals_plain_greedy():
  """Prompts of 30 and 11 tokens in chunks of 8 (DSA caches), k = 3: the tokens of plain greedy
  decoding (one-call prefill), exactly."""
  cfg = jax_mtp.tiny(vocab_size=8)
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(3)
  prompts = [[int(x) for x in rng.integers(0, 8, n)] for n in (30, 11)]
  plain = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  expected = plain.generate(plain.shard(target_params), prompts, 12, capacity=48)
  spec = jax_mtp.Speculator(cfg.replace(prefill_chunk=8), jax_mtp.make_mesh(1), 3)
  result = spec.generate(spec.shard(target_params, mtp_params), prompts, 12, capacity=48)
  assert result.tokens == expected


def _h200_mesh():
  from tests.lowered_step import H200  # noqa: PLC0415
  return jax.sharding.AbstractMesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=H200)


def test_auto_chunk_fits_the_budget():
  v32 = jax_mtp.deepseek_v32()
  topk_bytes = TOPK_WORDS_PER_SLOT * 4 * 32768  # the indexer's scores and the top-k's words over the slots
  chunk = auto_prefill_chunk(v32, 1, 32768, local_heads=128)  # XLA's sparse form: K gathered entries per query
  per_token = topk_bytes + v32.index_topk * (v32.kv_lora_rank + v32.qk_rope_head_dim) * 4 + 2 * 128 * v32.index_topk * 4
  assert chunk * per_token <= PREFILL_CHUNK_BYTES < 2 * chunk * per_token
  with jax.sharding.use_abstract_mesh(_h200_mesh()):  # a CUDA program: the sparse-MLA kernel gathers in registers
    kernel_chunk = auto_prefill_chunk(v32, 1, 32768, local_heads=128)
  per_token = topk_bytes + 128 * v32.kv_lora_rank * 4
  assert kernel_chunk * per_token <= PREFILL_CHUNK_BYTES < 2 * kernel_chunk * per_token
  assert kernel_chunk > chunk
  v3 = _v3()  # dense and past KEY_BLOCK slots: the naive form a block at a time (jax_mtp.mla_blocked)
  assert KEY_BLOCK == 2048
  block_token = 2 * 128 * KEY_BLOCK * 4 + 2 * 128 * v3.v_head_dim * 4  # a block's scores, the running output
  block_expansion = 128 * KEY_BLOCK * (v3.qk_nope_head_dim + v3.v_head_dim) * 2
  # whole, a 32K cache gave chunks of 128 (2 GiB of expansion, 32 MiB of scores a query) and 128K at B = 8 the floor
  assert auto_prefill_chunk(v3, 1, 32768, local_heads=128) == 2048
  assert block_expansion + 2048 * block_token <= PREFILL_CHUNK_BYTES < block_expansion + 4096 * block_token
  assert auto_prefill_chunk(v3, 8, 131072, local_heads=128) == 256
  assert 8 * (block_expansion + 256 * block_token) <= PREFILL_CHUNK_BYTES < 8 * (block_expansion + 512 * block_token)
  assert auto_prefill_chunk(jax_mtp.tiny(), 1, 64, local_heads=4) == 8192  # the ceiling


def _v3():
  return jax_mtp.deepseek_v32(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0)


def _naive_bytes(cfg, batch, capacity, chunk, heads=128):
  """The naive form's bytes as `dense_cache_plan` counts them: [B, S, N, P + H] expanded, N × S fp32 scores and
  probabilities a query."""
  expansion = batch * capacity * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * 2
  return expansion + batch * chunk * 2 * heads * capacity * 4


@pytest.mark.parametrize("model", ["deepseek_v32", "deepseek_v3"])
def test_a_dense_cache_counts_the_naive_forms_expansion(model):
  """A 1K prompt's 1,283-slot cache (within index_topk: no selection) at B = 64: on 2026-12-07 an 80 GB H100 holding a
  2-layer V3.2 in bf16 ran out of memory in the naive form's expansion of the cache, [64, 1283, 128, 256] bf16 (5.0
  GiB a layer), which the budget did not count. The plan now counts it: at B = 64 it leaves the naive form only
  chunks of 32 (32 expansions of the cache for 1,024 tokens), so the absorbed form runs — the sparse-MLA kernel
  over every visible slot on an H200 (q~ and its output, [N, C] each, a query: chunks of 128), XLA's dense form elsewhere. At
  B = 1 and 8 the naive form fits in one and two chunks and stays."""
  cfg = jax_mtp.deepseek_v32() if model == "deepseek_v32" else _v3()
  budget, capacity, tokens = PREFILL_CHUNK_BYTES, 1283, 1024
  assert _naive_bytes(cfg, 64, capacity, 0) > 5 * 2**30
  with jax.sharding.use_abstract_mesh(_h200_mesh()):
    chunk, absorbed = dense_cache_plan(cfg, 64, capacity, 128, tokens, budget)
    by_kernel = model == "deepseek_v32"  # a V3 model's dense form is not a selection: XLA's dense form
    assert (chunk, absorbed) == ((128, True) if by_kernel else (64, True))
    for batch, want in [(8, 512), (1, 4096)]:
      chunk, absorbed = dense_cache_plan(cfg, batch, capacity, 128, tokens, budget)
      assert (chunk, absorbed) == (want, False)
      assert _naive_bytes(cfg, batch, capacity, chunk) <= budget < _naive_bytes(cfg, batch, capacity, 2 * chunk)
  # the CLI's own question, through the speculator's plan: the absorbed form at B = 64 on a CPU too (XLA's form)
  assert prefill_plan(cfg, 64, capacity, tensor_parallel(1), budget, tokens=tokens) == (64, True)


def test_the_naive_form_stays_where_its_expansion_is_paid_once():
  """One chunk holds the whole prompt: the naive form, whatever the count says (at a small model's proportions it
  favours the absorbed form at any S > T); two chunks of a small model: the absorbed form, its count smaller."""
  cfg = jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0)
  assert dense_cache_plan(cfg, 2, 40, 8, tokens=37) == (8192, False)
  assert dense_cache_plan(cfg.replace(prefill_chunk=16), 2, 40, 8, tokens=37) == (16, True)
  assert dense_cache_plan(cfg.replace(prefill_chunk=64), 2, 40, 8, tokens=37) == (64, False)


@pytest.mark.parametrize("absorb", [False, True])
def test_a_dense_caches_chunks_equal_one_call_in_both_forms(absorb):
  """Over a dense cache (a V3 model) the naive and the absorbed forms in chunks of 8 give the hidden states and
  caches of one call in the same form; the two forms agree to fp32 rounding."""
  cfg = jax_mtp.tiny(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0)
  params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  capacity, t = 40, 37
  prompt = jnp.asarray(np.random.default_rng(5).integers(0, cfg.vocab_size, (2, t)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (2, t))
  model = TargetModel(cfg)

  def run(ids_BC, positions_BC, caches, absorb=absorb):
    out = model.apply({"params": params}, ids_BC, positions_BC, caches, absorb=absorb)
    return out.hidden_BTD, out.caches

  hidden, caches = jax.jit(lambda x: apply_in_chunks(run, x, init_target_caches(cfg, 2, capacity), 8))(prompt)
  want_hidden, want_caches = run(prompt, positions, init_target_caches(cfg, 2, capacity))
  assert_close(hidden, want_hidden, "float32", what=f"hidden, absorb={absorb}")
  for got, want in zip(jax.tree.leaves(caches), jax.tree.leaves(want_caches), strict=True):
    assert_close(got[:, :t], want[:, :t], "float32", what="caches")
  other, _ = run(prompt, positions, init_target_caches(cfg, 2, capacity), absorb=not absorb)
  assert_close(hidden, other, "float32", what="naive against absorbed")


def test_auto_chunk_fits_a_smaller_budget():
  """The chunk for `prefill_budget`'s budget on a device with less memory left: the largest that fits it."""
  v32 = jax_mtp.deepseek_v32()
  with jax.sharding.use_abstract_mesh(_h200_mesh()):
    full, half = (auto_prefill_chunk(v32, 8, 4608, 128, budget) for budget in (PREFILL_CHUNK_BYTES, 2**31))
  assert (full, half) == (2048, 512)


class _Accelerator:
  """A device as `prefill_budget` reads one: its platform, process and allocator's statistics (a GPU's numbers
  without a GPU)."""

  def __init__(self, limit: int, in_use: int):
    self.platform, self.process_index, self._stats = "gpu", 0, {"bytes_limit": limit, "bytes_in_use": in_use}

  def memory_stats(self):
    return self._stats


def test_prefill_budget_is_a_share_of_the_memory_left_on_an_accelerator():
  """2026-12-07, an 80 GB H100 holding a 2-layer full-width V3.2 target + MTP layer (51 GiB of its 60 GiB pool): the
  fixed 8 GiB budget's chunk of 2,048 at B = 8 × 4K prompts ran out of memory; the budget is now half of what the
  caches leave, a power of two, at most PREFILL_CHUNK_BYTES; a CPU keeps the fixed one, as does an explicit chunk."""
  cfg = jax_mtp.deepseek_v32().replace(num_hidden_layers=2, first_k_dense_replace=1)
  gib, batch, capacity = 2**30, 8, 4608
  h100 = _Accelerator(limit=int(59.7 * gib), in_use=51 * gib)
  left = (int(59.7 * gib) - 51 * gib - cache_bytes(cfg, batch, capacity)) * PREFILL_SHARE_OF_FREE
  budget = prefill_budget(cfg, batch, capacity, [h100])
  assert budget == 2**int(np.log2(left)) == 4 * gib
  assert prefill_budget(cfg, batch, capacity, [_Accelerator(141 * gib, 51 * gib)]) == PREFILL_CHUNK_BYTES
  assert prefill_budget(cfg, batch, capacity, jax.devices("cpu")) == PREFILL_CHUNK_BYTES
  assert prefill_budget(cfg.replace(prefill_chunk=2048), batch, capacity, [h100]) == PREFILL_CHUNK_BYTES
  full = _Accelerator(limit=int(59.7 * gib), in_use=int(59.6 * gib))  # nothing left: the smallest chunk
  assert prefill_budget(cfg, batch, capacity, [full]) == 1
  with jax.sharding.use_abstract_mesh(_h200_mesh()):
    assert auto_prefill_chunk(cfg, batch, capacity, 128, budget) == 1024  # the chunk that ran on the H100


def test_the_speculators_prefill_holds_no_prompt_wide_hidden_states():
  """The target's hidden states go from each prefill chunk straight into the MTP layer's catch-up: the prefill's
  temporaries do not grow with the prompt by a hidden state ([D] in the compute dtype) a token. Before 2026-12-07 the
  target's were kept for the whole prompt, split, joined and re-padded around the chunks: 1.77 hidden states a token
  by XLA's own count on this CPU, at prompts of 300 and 600 tokens (not a multiple of the chunk)."""
  cfg = jax_mtp.tiny(hidden_size=1024, prefill_chunk=16)  # wide hidden states beside small chunk temporaries
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), 3)
  target = jax.eval_shape(lambda: jax_mtp.init_target_params(cfg, jax.random.key(0)))
  mtp = jax.eval_shape(lambda: jax_mtp.init_params(cfg, jax.random.key(1)))
  batch = 16

  def temporaries(prompt_len: int) -> int:
    prompts = [[1] * prompt_len] * batch
    capacity = required_capacity(cfg, prompts, 8, 3)
    args = (target, mtp, *pack_prompts(prompts), jax.random.key(0), np.float32(0), stop_id_array(cfg, []))
    compiled = spec.program("prefill", capacity, False, args).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  per_token = (temporaries(600) - temporaries(300)) / (batch * 300)
  assert per_token < 0.25 * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize, per_token


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_bad_prefill_chunk_is_named(bad):
  with pytest.raises(ConfigError, match=re.escape(f"prefill_chunk={bad!r} must be a whole number of tokens")):
    jax_mtp.tiny(prefill_chunk=bad)
