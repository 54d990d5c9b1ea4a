"""The kernels `auto` promises on GPUs reach the user's path: the CLI's capacity rule rounds a DSA cache up to
what the fused kernels take (any prompt length gets them), its compiled prefill and round for an H200 hold the
index-scores and sparse-MLA kernels at an odd prompt length (with and without index_share_for_mtp_iteration),
the reused shared selection runs through the kernel (padded to its blocks) with XLA's tokens, and an error
inside a run is one line and exit 2."""

import jax
import pytest

import jax_mtp
from jax_mtp import decode
from jax_mtp.indexer import SCORE_BLOCK_SLOTS, kernel_capacity
from jax_mtp.kernels.index_scores import KERNEL_NAME as INDEX_SCORES
from jax_mtp.kernels.sparse_mla import KERNEL_NAME as SPARSE_MLA
from jax_mtp.request import required_capacity
from tests.lowered_step import speculator_modules
from tests.tolerances import assert_close


def _kernel_cfg(**overrides):
  """The smallest bf16 model both DSA kernels take (16 heads, power-of-two latent and rope widths)."""
  return jax_mtp.tiny(**{"dtype": "bfloat16", "param_dtype": "bfloat16", "index_n_heads": 16,
                         "num_attention_heads": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 16, "index_topk": 16,
                         **overrides})


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
    assert INDEX_SCORES in module, name
    assert SPARSE_MLA in module, name


def test_index_sharing_runs_through_the_kernel_with_xlas_tokens():
  """k = 3 with the shared top-k: draft steps 2 and 3 attend over index_topk + 1 and + 2 slots, which the
  kernel takes padded to its blocks (interpret mode on CPU); greedy tokens equal XLA's attention's, and so do
  the MTP layer's caches (draft step j's attention output is step j + 1's input, whose latent it writes: the
  tokens alone cannot see the draft steps, since speculative output is the target's greedy output)."""
  prompts = [list(range(3, 24)), list(range(7, 30))]
  tokens, latents = {}, {}
  for impl in ("xla", "pallas_gpu"):
    cfg = _kernel_cfg(index_share_for_mtp_iteration=True, sparse_attention_impl=impl)
    spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), 3)
    target = jax_mtp.init_target_params(cfg, jax.random.key(0))
    target["embed_tokens"] = target["embed_tokens"] * 0.1  # else the embedding alone decides the tokens
    params = spec.shard(target, jax_mtp.init_params(cfg, jax.random.key(1)))
    result = spec.generate(params, prompts, 6)
    tokens[impl], latents[impl] = result.tokens, result.state.drafter_caches[0].latent_BSC
  assert tokens["pallas_gpu"] == tokens["xla"]
  assert_close(latents["pallas_gpu"], latents["xla"], "bfloat16", "MTP latent cache, kernel vs XLA")


def test_an_error_inside_a_run_is_one_line_and_exit_2(monkeypatch, capsys):
  def fails(*args, **kwargs):
    raise ValueError("18 selected slots are not a multiple of splits=1 × block_entries=16")
  monkeypatch.setattr(decode.Speculator, "generate", fails)
  assert decode.main(["--random-tiny", "--max-new-tokens", "4"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: 18 selected slots are not a multiple of splits=1 × block_entries=16"]
