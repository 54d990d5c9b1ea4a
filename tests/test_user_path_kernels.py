"""The kernels `auto` promises on GPUs reach the user's path: the CLI's capacity rule rounds a DSA cache up to
what the fused kernels take (any prompt length gets them), its compiled prefill and round for an H200 hold the
Mosaic GPU index-scores kernel (not the Triton one) and the sparse-MLA kernel at an odd prompt length (with and
without index_share_for_mtp_iteration), the top-k's k-th key kernel from 64 queries a call and the 16-bit experts
kernel where `--moe-impl mosaic_gpu` names it, the reused shared selection runs through the kernel (padded to `padded_entries`' width)
with XLA's tokens, each kernel launch is lowered once however many layers repeat it, and an error inside a run is one
line and exit 2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import decode
from jax_mtp.indexer import SCORE_BLOCK_SLOTS, Selection, kernel_capacity
from jax_mtp.kernels.grouped_matmul_mgpu import KERNEL_NAME as GROUPED16
from jax_mtp.kernels.index_scores import KERNEL_NAME as TRITON_INDEX_SCORES
from jax_mtp.kernels.index_scores_mgpu import KERNEL_NAME as INDEX_SCORES
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME as SPARSE_MLA
from jax_mtp.kernels.topk_mgpu import KERNEL_NAME as TOPK_KTH
from jax_mtp.mla import EVERY_SLOT_KERNEL_MIN_QUERIES, MLAttention, write_latent
from jax_mtp.mtp import MtpPredictor, init_caches
from jax_mtp.request import required_capacity
from jax_mtp.topk import TOPK_KERNEL_MIN_QUERIES
from tests.conftest import FULL_ONLY, FULL_TESTS
from tests.greedy import greedy_margin
from tests.lowered_step import kernel_calls, kernel_lowerings, mtp_step_module, speculator_modules
from tests.sparse_mla_cases import dsa_kernel_cfg as _kernel_cfg
from tests.tolerances import GREEDY_MIN_MARGIN, assert_close


@pytest.mark.parametrize("prompt, max_new, k, expected", [
    (37, 20, 3, 256),  # 60 positions, past index_topk: one whole kernel block
    (250, 4, 3, 512),  # 257: the next block
    (5, 5, 3, 13),  # within index_topk: a dense cache, no DSA kernel, the exact need
    (630, 5, 3, 638),  # 638 rounds to 768, past max_position_embeddings (640): the exact need
])
def test_a_dsa_cache_is_rounded_up_to_the_kernels_blocks(prompt, max_new, k, expected):
  cfg = _kernel_cfg()
  assert required_capacity(cfg, [[1] * prompt], max_new, k) == expected


def test_models_the_kernel_cannot_take_keep_the_exact_capacity():
  fp32 = _kernel_cfg(dtype="float32", param_dtype="float32")
  assert required_capacity(fp32, [[1] * 37], 20, 3) == 60
  assert kernel_capacity(jax_mtp.tiny(), 300) == 300  # fp32, 4 indexer heads
  assert kernel_capacity(_kernel_cfg(), 3 * SCORE_BLOCK_SLOTS) == 3 * SCORE_BLOCK_SLOTS


def test_a_prompt_too_long_for_the_model_is_named_as_such():
  with pytest.raises(ValueError, match=r"the longest prompt \(637 tokens\) leaves no room.* at most 636 tokens"):
    required_capacity(_kernel_cfg(), [[1] * 637], 1, 3)
  with pytest.raises(ValueError, match=r"max_new_tokens=30 needs a cache of 643 .* at most 27 new tokens fit"):
    required_capacity(_kernel_cfg(), [[1] * 610], 30, 3)


@pytest.mark.parametrize("share", [False, True])
def test_the_clis_gpu_programs_hold_both_kernels_at_an_odd_prompt_length(share):
  cfg = _kernel_cfg(moe_impl="ragged_dot", index_share_for_mtp_iteration=share)
  modules = speculator_modules(cfg, [list(range(1, 38))], 20, 3)  # 37 tokens: capacity 60 → 256
  for name, module in modules.items():
    assert INDEX_SCORES in module and TRITON_INDEX_SCORES not in module, name  # auto's index scores: Mosaic GPU's
    assert SPARSE_MLA in module and "xla.gpu.triton" not in module, name  # no Pallas Triton kernel at all


def test_the_clis_gpu_programs_hold_the_16_bit_experts_kernel_where_named():
  """`--moe-impl mosaic_gpu` (kernels/grouped_matmul_mgpu.py; `auto`'s at decode sizes, not at a prefill's): the CLI's
  prefill and round for an H200 run the routed experts' products in it (a model whose hidden and expert sizes it
  takes: 128)."""
  cfg = _kernel_cfg(moe_impl="mosaic_gpu", hidden_size=128, moe_intermediate_size=128)
  modules = speculator_modules(cfg, [list(range(1, 38))], 20, 3)
  for name, module in modules.items():
    assert kernel_calls(module, GROUPED16) >= 3, name  # gate, up, down of each MoE layer
    # the calls, in the experts' named scope (the kernel's entry is jitted: mosaic_gpu_common.lowered_once_per_launch)
    assert "routed_experts_mosaic_gpu/jit(grouped_matmul_mgpu)" in module, name
    assert "routed_experts_ragged_dot" not in module and "routed_experts_gather" not in module, name


def test_each_kernel_launch_is_lowered_once_however_many_layers_repeat_it():
  """Each Mosaic GPU kernel's entry is jitted with its launch arguments static
  (`mosaic_gpu_common.lowered_once_per_launch`): the CLI's programs for an H200 with 3 MoE layers hold each kernel's
  lowering fewer times than they launch it (once per distinct launch, called from every layer), so a deep model
  lowers a kernel once, not once a layer (V3.2's 61 layers: ~104 s to ~11 s, benchmarks.lowering_time). Each call
  that lowered its own kernel would make the two counts equal."""
  cfg = _kernel_cfg(moe_impl="mosaic_gpu", hidden_size=128, moe_intermediate_size=128, num_hidden_layers=3,
                    first_k_dense_replace=0)
  for name, module in speculator_modules(cfg, [list(range(1, 38))], 20, 3).items():
    for kernel in (GROUPED16, SPARSE_MLA, INDEX_SCORES):
      lowered = kernel_lowerings(module, kernel)
      assert 0 < lowered < kernel_calls(module, kernel), (name, kernel, lowered)


@pytest.mark.parametrize("batch", [32, 128])
def test_auto_runs_the_draft_steps_experts_through_the_16_bit_kernel(batch):
  """Under "auto" a Hopper's draft step at 64 to 32 × E assignments (8 experts, top-2: 32 to 128 rows) runs the
  routed experts' three products through the 16-bit Mosaic kernel, as the explicit impl does (tokamax's kernel below
  and above that range: `experts.uses_mosaic_gpu_experts`)."""
  cfg = jax_mtp.tiny(dtype="bfloat16", param_dtype="bfloat16", hidden_size=128, moe_intermediate_size=128)
  assert (cfg.n_routed_experts, cfg.num_experts_per_tok) == (8, 2)
  auto, named = (mtp_step_module(cfg.replace(moe_impl=impl), "cuda", batch, 64) for impl in ("auto", "mosaic_gpu"))
  assert kernel_calls(auto, GROUPED16) == kernel_calls(named, GROUPED16) == 3  # gate, up, down
  assert "routed_experts_mosaic_gpu" in auto


@pytest.mark.parametrize("rows", [1, 16])
def test_the_clis_gpu_programs_take_the_topk_kernel_from_64_queries(rows):
  """Under "auto" the top-k's k-th key runs in the Mosaic GPU kernel from topk.TOPK_KERNEL_MIN_QUERIES (64) queries a
  call: a 70-token prompt's prefill chunk has them at one row; the round's verification has them at 16 rows × 4
  tokens, not at one row's 4."""
  assert TOPK_KERNEL_MIN_QUERIES == 64
  cfg = _kernel_cfg(moe_impl="ragged_dot")
  modules = speculator_modules(cfg, [list(range(1, 71))] * rows, 20, 3)  # 93 slots: past index_topk, a DSA cache
  assert TOPK_KTH in modules["prefill"]
  assert (TOPK_KTH in modules["round"]) == (rows == 16)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_short_requests_gpu_round_attends_through_the_sparse_kernel_from_8_queries(rows):
  """A request whose cache fits within index_topk (5 + 5 + 3 = 13 slots ≤ top-16): no indexer runs, and under "auto"
  the round's absorbed calls of at least EVERY_SLOT_KERNEL_MIN_QUERIES (8) queries attend over every visible slot
  through the sparse-MLA kernel, as over a top-k (XLA's dense form ran at 0.1 of its floor); fewer keep the dense
  form. Two rows: the verification's 2 × 4 queries take the kernel, the draft steps' 2 the dense form; one row: 4
  and 1, the dense form alone."""
  cfg = _kernel_cfg(moe_impl="ragged_dot")
  assert EVERY_SLOT_KERNEL_MIN_QUERIES == 8
  prompts = [list(range(1, 6))] * rows
  assert required_capacity(cfg, prompts, 5, 3) <= cfg.index_topk
  modules = speculator_modules(cfg, prompts, 5, 3)
  assert (SPARSE_MLA in modules["round"]) == (rows == 2)
  assert "dense_attention" in modules["round"]  # the draft steps' (and at one row the verification's) calls
  assert all(INDEX_SCORES not in module for module in modules.values())


@pytest.mark.parametrize("chunk, absorbed", [(8, True), (64, False)])
def test_a_short_requests_gpu_prefill_takes_the_kernel_where_the_naive_form_would_expand_the_cache_per_chunk(
    chunk, absorbed):
  """A 37-token prompt in a 45-slot cache within index_topk (64): no indexer runs. In chunks of 8 the naive form
  would expand the whole cache by kv_b_proj five times (`prefill.dense_cache_plan` counts more multiply-adds than
  the absorbed form's), so the CLI's prefill attends over every visible slot through the sparse-MLA kernel; in one
  chunk of 64 the naive form's one expansion stays (no sparse-MLA kernel in the prefill)."""
  cfg = _kernel_cfg(moe_impl="ragged_dot", index_topk=64, prefill_chunk=chunk)
  prompts = [list(range(1, 38))]
  assert required_capacity(cfg, prompts, 5, 3) == 45 <= cfg.index_topk
  modules = speculator_modules(cfg, prompts, 5, 3)
  assert (SPARSE_MLA in modules["prefill"]) == absorbed
  assert INDEX_SCORES not in modules["prefill"]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_attention_within_index_topk_through_the_kernel_equals_xlas_dense_form(kv_cache_dtype):
  """One MTP draft step over a cache of index_topk slots (every visible slot attended, rows at different lengths)
  through the sparse-MLA kernel (interpret mode on CPU) equals XLA's dense absorbed form, to bf16's tolerance; over
  an fp8 MLA cache both read the same codes (the kernel dequantises in its gather, XLA the whole cache)."""
  base = _kernel_cfg(kv_cache_dtype=kv_cache_dtype)
  batch, capacity = 2, base.index_topk
  params = jax_mtp.init_params(base, jax.random.key(1))
  keys = jax.random.split(jax.random.key(3), 4)
  (cache,) = init_caches(base, batch, capacity)
  cache = write_latent(cache, jax.random.normal(keys[0], (batch, capacity, base.kv_lora_rank), jnp.bfloat16),
                       jax.random.normal(keys[1], cache.k_pe_BSR.shape, cache.k_pe_BSR.dtype),
                       jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (batch, capacity)))
  positions_B1 = jnp.array([[6], [capacity - 1]], jnp.int32)  # 7 and 16 visible slots
  ids_B1 = jax.random.randint(keys[2], (batch, 1), 0, base.vocab_size, jnp.int32)
  hidden_B1D = jax.random.normal(keys[3], (batch, 1, base.hidden_size), jnp.bfloat16)
  attention = {}
  for impl in ("xla", "mosaic_gpu"):
    model = MtpPredictor(base.replace(sparse_attention_impl=impl))
    step = jax.jit(lambda p, c, model=model: model.apply(
        {"params": p}, ids_B1, positions_B1, hidden_B1D, (c,),
        capture_intermediates=lambda module, method: isinstance(module, MLAttention) and method == "__call__"))
    ((attention[impl], _),) = step(params, cache)[1]["intermediates"]["layers_0"]["mtp_block"]["self_attn"][
        "__call__"]
    assert (SPARSE_MLA in str(jax.make_jaxpr(step)(params, cache))) == (impl == "mosaic_gpu"), impl
  assert_close(attention["mosaic_gpu"], attention["xla"], "bfloat16", "attention within index_topk, kernel vs XLA")


def test_index_sharing_runs_through_the_kernel_with_xlas_tokens():
  """k = 3 with the shared top-k end to end: draft steps 2 and 3 attend over index_topk + 1 and + 2 slots, which
  the kernel takes padded to `padded_entries`' width (interpret mode on CPU); the greedy tokens equal XLA's attention's. The
  MTP caches are not compared here: the draft tokens are argmaxes of bf16 logits, whose ties a rounding flips
  (on the H200 a tie changed a draft slot's whole latent, 2026-12-03), and the speculative output is the target's
  greedy output whatever the drafts; the next test compares the reused selection's attention itself. On a CPU in the
  full form only (minutes in Pallas's GPU interpreter): CI's bounded form is that next test, one draft step over the
  reused 18-slot selection, the call that crashed."""
  if jax.default_backend() != "gpu" and not FULL_TESTS:
    pytest.skip(f"on CPU: {FULL_ONLY}")
  prompts = [list(range(1, 22)), list(range(9, 32))]  # no near-tie among the tokens (below)
  tokens = {}
  for impl in ("xla", "mosaic_gpu"):
    cfg = _kernel_cfg(index_share_for_mtp_iteration=True, sparse_attention_impl=impl)
    spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), 3)
    params = spec.shard(jax_mtp.init_target_params(cfg, jax.random.key(0)), jax_mtp.init_params(cfg, jax.random.key(1)))
    tokens[impl] = spec.generate(params, prompts, 6).tokens
  cfg = _kernel_cfg(index_share_for_mtp_iteration=True)
  margin = greedy_margin(cfg, jax_mtp.init_target_params(cfg, jax.random.key(0)), prompts, tokens["xla"],
                         capacity=required_capacity(cfg, prompts, 6, 3))
  assert margin >= GREEDY_MIN_MARGIN, f"a near-tie ({margin:.2g}) among the prompts' greedy tokens: pick others"
  assert tokens["mosaic_gpu"] == tokens["xla"]


def test_a_reused_selection_attends_through_the_kernel_as_xla_does():
  """A draft step under index sharing (step 0's index_topk slots plus two draft slots, one not yet visible: 18
  slots, not a multiple of the kernel's 64-entry steps) through the MTP layer with the sparse-MLA kernel equals
  the same step with XLA's attention (the attention block's output), to bf16's tolerance: the padded selection attends the same entries."""
  base = _kernel_cfg(index_share_for_mtp_iteration=True)
  batch, capacity, topk = 2, 64, base.index_topk
  params = jax_mtp.init_params(base, jax.random.key(1))
  keys = jax.random.split(jax.random.key(2), 5)
  (cache,) = init_caches(base, batch, capacity)
  cache = cache._replace(latent_BSC=jax.random.normal(keys[0], cache.latent_BSC.shape, cache.latent_BSC.dtype),
                         k_pe_BSR=jax.random.normal(keys[1], cache.k_pe_BSR.shape, cache.k_pe_BSR.dtype))
  length = jnp.array([40, 57], jnp.int32)  # t1's positions; the step attends at length − 1 + 1
  rng = np.random.default_rng(2)
  shared_B1K = jnp.array([rng.permutation(int(n))[:topk] for n in length], jnp.int32)[:, None]  # distinct, < length
  drafts_B1M = (length[:, None] + jnp.arange(2, dtype=jnp.int32))[:, None]  # the draft slots length, length + 1
  selection = Selection(jnp.concatenate([shared_B1K, drafts_B1M], -1),
                        jnp.concatenate([jnp.ones((batch, 1, topk), bool), jnp.array([[[True, False]]] * batch)], -1))
  ids_B1 = jax.random.randint(keys[3], (batch, 1), 0, base.vocab_size, jnp.int32)
  hidden_B1D = jax.random.normal(keys[4], (batch, 1, base.hidden_size), jnp.bfloat16)
  attention = {}
  for impl in ("xla", "mosaic_gpu"):
    model = MtpPredictor(base.replace(sparse_attention_impl=impl))
    step = jax.jit(lambda p, c, s, model=model: model.apply(
        {"params": p}, ids_B1, length[:, None], hidden_B1D, (c,), selection=s,
        capture_intermediates=lambda module, method: isinstance(module, MLAttention) and method == "__call__"))
    ((attention[impl], _),) = step(params, cache, selection)[1]["intermediates"]["layers_0"]["mtp_block"][
        "self_attn"]["__call__"]  # (o_proj output, cache) of its one call
  assert_close(attention["mosaic_gpu"], attention["xla"], "bfloat16", "attention over a reused selection, kernel vs XLA")


def test_an_error_inside_a_run_is_one_line_and_exit_2(monkeypatch, capsys):
  def fails(*args, **kwargs):
    raise ValueError("18 selected slots are not a multiple of splits=1 × block_entries=16")
  monkeypatch.setattr(decode.Speculator, "generate", fails)
  assert decode.main(["--random-tiny", "--max-new-tokens", "4"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: 18 selected slots are not a multiple of splits=1 × block_entries=16"]
