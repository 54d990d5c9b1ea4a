"""Every kernel `auto` runs on a GPU — the sparse-MLA attention and the DSA index scores (Mosaic GPU's kernels), the FP8 grouped matmul (routed experts and dense FP8 linears), our 16-bit grouped matmul (bf16 routed experts) — has a bounded CI test
at the model level on a CPU host, beside the full form's longer decodes (docs/testing.md): a tiny model decoding
speculatively through the kernel (Pallas interpret mode on CPU) gives the tokens of plain greedy decoding through the
XLA path, on the smallest config the kernel takes, with random weights under which the layers decide the tokens
(test_speculative.py's test_attention_and_experts_decide_a_random_models_greedy_tokens); and for the FP8 kernel,
`auto` puts it in the MTP step exported for an H200 (the DSA kernels' `auto` lowering is test_sparse_mla_mgpu's, test_index_scores_mgpu's, test_index_scores_kernel's and
test_user_path_kernels'). The DSA top-k's k-th key kernel (`auto` from 64 queries a call) picks exactly XLA's
slots: its model-level decode (speculative == plain, and == XLA's tokens) is test_topk_mgpu's. A kernel's numerics
(a 10% error is below what tokens show) are its own tests'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

import jax_mtp
from jax_mtp import fp8, indexer
from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as FP8_KERNEL
from jax_mtp.request import required_capacity
from tests.conftest import FULL_TESTS
from tests.greedy import greedy_margin
from tests.lowered_step import H200, kernel_calls
from tests.sparse_mla_cases import dsa_kernel_cfg
from tests.test_experts import _loud_experts
from tests.tolerances import GREEDY_MIN_MARGIN

ON_GPU = jax.default_backend() == "gpu"
VOCAB = 512


def _dsa_cfg(**overrides) -> jax_mtp.MtpConfig:
  """The Mosaic GPU DSA kernels' test model (`dsa_kernel_cfg`) with a 512-token vocabulary."""
  return dsa_kernel_cfg(**{"vocab_size": VOCAB, **overrides})


K = 2  # draft tokens per round: verification at T = 3, drafts at T = 1


def _speculative(cfg, target, mtp, prompts, new: int) -> list[list[int]]:
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), K)
  return spec.generate(spec.shard(target, mtp), prompts, new, capacity=required_capacity(cfg, prompts, new, K)).tokens


def _plain(cfg, target, prompts, new: int) -> list[list[int]]:
  """Plain greedy decoding at the speculative run's cache capacity (the CLI's rule)."""
  plain = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  return plain.generate(plain.shard(target), prompts, new, capacity=required_capacity(cfg, prompts, new, K))


def _random_prompts(n_tokens, seed: int = 5) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(0, VOCAB, n)] for n in n_tokens]


@pytest.fixture(scope="module")
def dsa_plain_xla():
  """(params, prompts, plain greedy tokens through XLA's DSA) of the DSA config: prompts of 21 and 30 tokens, 8 new
  (every cache past top-16: the selection and both kernels matter at every step), drawn with no near-tie among the
  greedy tokens (seed 20; at seed 5 two logits 5e-4 apart split the kernel from XLA, 2026-12-05)."""
  cfg = _dsa_cfg(index_scores_impl="xla", sparse_attention_impl="xla")
  target = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp = jax_mtp.init_params(cfg, jax.random.key(1))
  prompts = _random_prompts((21, 30), seed=20)
  plain = _plain(cfg, target, prompts, 8)
  _assert_no_near_tie(cfg, target, prompts, plain)
  return (target, mtp), prompts, plain


def test_speculative_decoding_through_the_sparse_mla_kernel_gives_plain_xla_tokens(dsa_plain_xla):
  """Target and drafter attend through the Mosaic GPU sparse-MLA kernel (its interpreter on CPU): prefill, verification at
  T = 3 and drafts at T = 1 all take it; the tokens are plain greedy decoding's with XLA's attention. The fixture's 8
  new tokens on a GPU and in the full form; CI's bounded form takes 3 (the prefill's token and two rounds: every call
  form still runs), since each kernel call costs seconds in Pallas's GPU interpreter (~170 s for 8 on 2 cores, ~90 for
  5). Greedy tokens do not depend on how many follow, so fewer are a prefix of the fixture's."""
  (target, mtp), prompts, plain = dsa_plain_xla
  new = 8 if ON_GPU or FULL_TESTS else 3
  cfg = _dsa_cfg(index_scores_impl="xla", sparse_attention_impl="mosaic_gpu")
  assert required_capacity(cfg, prompts, new, K) == required_capacity(cfg, prompts, 8, K)  # the same caches
  assert _speculative(cfg, target, mtp, prompts, new) == [row[:new] for row in plain]


def test_speculative_decoding_through_the_index_scores_kernel_gives_plain_xla_tokens(dsa_plain_xla):
  """The indexer's scores through the Mosaic GPU kernel (`auto`'s on GPUs; on CPU in Pallas's GPU interpreter, which
  the model picks by platform), the cache rounded to 256-slot blocks; the tokens are plain greedy decoding's with
  XLA's scores."""
  (target, mtp), prompts, plain = dsa_plain_xla
  cfg = _dsa_cfg(index_scores_impl="mosaic_gpu", sparse_attention_impl="xla")
  assert required_capacity(cfg, prompts, 8, K) == 256
  assert _speculative(cfg, target, mtp, prompts, 8) == plain


def test_an_fp8_key_cache_through_the_float8_dot_gives_plain_xla_tokens(dsa_plain_xla, monkeypatch):
  """An fp8 index cache (e4m3 keys, q rounded to e4m3 too) with the kernel's float8 × float8 dot
  (`indexer.FLOAT8_SCORES_DOT`, on by default; set here so the case holds whatever it is): the tokens are plain
  greedy decoding's over the same cache with XLA's scores. 4 new tokens (each kernel call costs seconds in Pallas's
  GPU interpreter on a CPU)."""
  monkeypatch.setattr(indexer, "FLOAT8_SCORES_DOT", True)
  (target, mtp), prompts, _ = dsa_plain_xla
  xla = _dsa_cfg(index_cache_dtype="fp8", index_scores_impl="xla", sparse_attention_impl="xla")
  kernel = xla.replace(index_scores_impl="mosaic_gpu")
  want = _plain(xla, target, prompts, 4)
  _assert_no_near_tie(xla, target, prompts, want)  # over the fp8 cache: the fixture's margin is the bf16 cache's
  assert _speculative(kernel, target, mtp, prompts, 4) == want


def _grouped_matmul_cfg(moe_impl: str) -> jax_mtp.MtpConfig:
  """The smallest bf16 model whose experts and some dense linears the FP8 kernel takes (D = 256, F = 128: whole
  128 × 128 blocks), and whose experts the 16-bit kernel takes (D and F multiples of 128): one MoE target layer and
  the MTP layer; a dense MLA cache (index_topk above every position) keeps the DSA kernels out of it."""
  return jax_mtp.tiny(vocab_size=VOCAB, hidden_size=256, moe_intermediate_size=128, num_hidden_layers=1,
                      first_k_dense_replace=0, dtype="bfloat16", param_dtype="bfloat16", index_topk=64,
                      moe_impl=moe_impl)


def test_speculative_decoding_through_the_fp8_kernel_gives_the_gather_impls_plain_tokens():
  """FP8 codes + 128 × 128 block scales, as `--weights fp8` keeps them: the routed experts and the dense FP8
  linears through the FP8 grouped matmul (its Mosaic GPU kernel; Pallas's interpreter on CPU) decode speculatively
  the tokens of plain greedy decoding with the gather impl dequantising the same codes."""
  cfg = _grouped_matmul_cfg("fp8_grouped_gpu")
  # the routed experts × 4 (`_loud_experts`): at init scale their output is ~1e-3 of the residual stream and no
  # token would depend on them, nor on the kernel that runs them
  target = fp8.as_checkpoint_fp8(_loud_experts(jax_mtp.init_target_params(cfg, jax.random.key(0))),
                                 cfg.fp8_block, fp8.quantize)
  mtp = fp8.as_checkpoint_fp8(_loud_experts(jax_mtp.init_params(cfg, jax.random.key(1))), cfg.fp8_block,
                              fp8.quantize)
  prompts = _random_prompts((9, 14))
  gather = _grouped_matmul_cfg("gather")
  want = _plain(gather, target, prompts, 6)
  _assert_no_near_tie(gather, target, prompts, want)
  assert _speculative(cfg, target, mtp, prompts, 6) == want


# prompts long enough that, at the tiny model's 8 experts and top-2, the prefill's call (2 × 40 tokens: 160
# assignments) is inside `auto`'s range for the 16-bit kernel on a Hopper GPU (64 to 32 × 8 = 256), as B = 8 to 256's
# verification is at V3.2's 256 experts
EXPERTS_PROMPTS = (33, 40)


@pytest.mark.parametrize("impl", ["mosaic_gpu", "auto"])
def test_speculative_decoding_through_the_16_bit_experts_kernel_gives_the_gather_impls_plain_tokens(impl):
  """bf16 routed experts through our Mosaic GPU grouped matmul (kernels/grouped_matmul_mgpu.py; its interpreter on a
  CPU), named or picked by `auto` on a Hopper GPU: speculative decoding gives the tokens of plain greedy decoding
  with the gather impl. `auto` is a GPU case (on a CPU it resolves to gather / ragged_dot); the resolver's pick at
  the prefill's call is asserted there, so the case cannot pass with the kernel out of the program."""
  if impl == "auto":
    if not ON_GPU:
      pytest.skip("auto takes the 16-bit kernel on Hopper GPUs only (a CPU resolves it to gather / ragged_dot)")
    from jax_mtp.experts import resolve_expert_impl  # noqa: PLC0415
    from jax_mtp.platform import lowering_gpu_is_hopper  # noqa: PLC0415
    cfg = _grouped_matmul_cfg("auto")
    w = jax.ShapeDtypeStruct((cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size), jnp.bfloat16)
    tokens = len(EXPERTS_PROMPTS) * max(EXPERTS_PROMPTS)
    assert resolve_expert_impl("auto", "gpu", tokens, cfg.num_experts_per_tok, w,
                               hopper=lowering_gpu_is_hopper()) == "mosaic_gpu"
  cfg = _grouped_matmul_cfg(impl)
  # the routed experts × 4 (`_loud_experts`): at init scale no token would depend on them (the FP8 kernel's test)
  target = _loud_experts(jax_mtp.init_target_params(cfg, jax.random.key(0)))
  mtp = _loud_experts(jax_mtp.init_params(cfg, jax.random.key(1)))
  prompts = _random_prompts(EXPERTS_PROMPTS, seed=13)  # seeds 5–12 leave a near-tie (< 2^-6) among the tokens
  new = 6 if ON_GPU or FULL_TESTS else 3
  gather = _grouped_matmul_cfg("gather")
  want = _plain(gather, target, prompts, 6)
  _assert_no_near_tie(gather, target, prompts, want)
  assert _speculative(cfg, target, mtp, prompts, new) == [row[:new] for row in want]


def _assert_no_near_tie(cfg, target, prompts, tokens) -> None:
  """The bf16 kernels' tokens are the reference's to agree on only above GREEDY_MIN_MARGIN (tests/tolerances.py)."""
  capacity = required_capacity(cfg, prompts, len(tokens[0]), K)
  margin = greedy_margin(cfg, target, prompts, tokens, capacity=capacity)
  assert margin >= GREEDY_MIN_MARGIN, f"a near-tie ({margin:.2g}) among the prompts' greedy tokens: pick another seed"


def _fp8_step_for(cfg: jax_mtp.MtpConfig, device=H200) -> str:
  """The MTP step of `cfg` with FP8 weights (codes + block scales), exported for an abstract `device` from this host."""
  params = fp8.as_checkpoint_fp8(jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0)),
                                 cfg.fp8_block, fp8.abstract_fp8)
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, 2, 64))
  ids, hidden = jax.ShapeDtypeStruct((2, 1), jnp.int32), jax.ShapeDtypeStruct((2, 1, 256), jnp.bfloat16)
  step = jax.jit(lambda p, i, pos, h, c: jax_mtp.MtpPredictor(cfg).apply({"params": p}, i, pos, h, c).hidden_BTD)
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.export.export(step, platforms=["cuda"])(params, ids, ids, hidden, caches).mlir_module()


def test_auto_puts_the_fp8_kernel_in_the_mtp_step_exported_for_an_h200():
  """moe_impl='auto' with FP8 weights, exported for an abstract H200 from this host: the kernel runs the three
  routed-expert projections and every dense FP8 linear it takes, as the explicit impl does; fp8_matmul_impl
  'mosaic_gpu' is the same program's kernel. No Pallas Triton kernel anywhere (that backend is deprecated)."""
  modules = {impl: _fp8_step_for(_grouped_matmul_cfg(impl)) for impl in ("auto", "fp8_grouped_gpu", "gather")}
  modules["mosaic_gpu"] = _fp8_step_for(_grouped_matmul_cfg("auto").replace(fp8_matmul_impl="mosaic_gpu"))
  calls = {impl: kernel_calls(text, FP8_KERNEL) for impl, text in modules.items()}
  # gather dequantises the experts (the dense linears keep the kernel: the program is for a Hopper GPU)
  assert calls["auto"] == calls["fp8_grouped_gpu"] == calls["mosaic_gpu"] == calls["gather"] + 3 > 3, calls
  assert not any("xla.gpu.triton" in text for text in modules.values())


def test_fp8_weights_on_a_gpu_without_wgmma_are_dequantised_in_the_program():
  """The same step exported for an A100 (no wgmma, no TMA: the FP8 kernel cannot run there): no FP8 kernel call; the
  codes are dequantised in the program (the experts gathered), as on a CPU."""
  a100 = jax.sharding.AbstractDevice(device_kind="NVIDIA A100-SXM4-80GB", num_cores=108, platform="cuda")
  text = _fp8_step_for(_grouped_matmul_cfg("auto"), a100)
  assert kernel_calls(text, FP8_KERNEL) == 0 and FP8_KERNEL not in text


