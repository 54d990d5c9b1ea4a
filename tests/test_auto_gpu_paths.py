"""Every kernel `auto` runs on a GPU — the sparse-MLA attention and the DSA index scores (Mosaic GPU's kernels), the FP8 grouped matmul (routed experts and dense FP8 linears) — has a bounded CI test
at the model level on a CPU host, beside the full form's longer decodes (docs/testing.md): a tiny model decoding
speculatively through the kernel (Pallas interpret mode on CPU) gives the tokens of plain greedy decoding through the
XLA path, on the smallest config the kernel takes, with random weights under which the layers decide the tokens
(test_speculative.py's test_attention_and_experts_decide_a_random_models_greedy_tokens); and for the FP8 kernel,
`auto` puts it in the MTP step exported for an H200 (the DSA kernels' `auto` lowering is test_sparse_mla_mgpu's, test_index_scores_mgpu's, test_index_scores_kernel's and
test_user_path_kernels'). A kernel's numerics (a 10% error is below what tokens show) are its own tests'."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

import jax_mtp
from jax_mtp import fp8, indexer
from jax_mtp.kernels.fp8_grouped_matmul import KERNEL_NAME as FP8_KERNEL
from jax_mtp.request import required_capacity
from tests.greedy import greedy_margin
from tests.lowered_step import H200
from tests.sparse_mla_cases import dsa_kernel_cfg
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
  margin = greedy_margin(cfg, target, prompts, plain, capacity=required_capacity(cfg, prompts, 8, K))
  assert margin >= GREEDY_MIN_MARGIN, f"a near-tie ({margin:.2g}) among the prompts' greedy tokens: pick another seed"
  return (target, mtp), prompts, plain


def test_speculative_decoding_through_the_sparse_mla_kernel_gives_plain_xla_tokens(dsa_plain_xla):
  """Target and drafter attend through the Mosaic GPU sparse-MLA kernel (its interpreter on CPU): prefill, verification at
  T = 3 and drafts at T = 1 all take it; the tokens are plain greedy decoding's with XLA's attention. 5 new tokens,
  not the fixture's 8 (a prefix of them: greedy tokens do not depend on how many follow), since each kernel call
  costs seconds in Pallas's GPU interpreter (~170 s for 8)."""
  (target, mtp), prompts, plain = dsa_plain_xla
  cfg = _dsa_cfg(index_scores_impl="xla", sparse_attention_impl="mosaic_gpu")
  assert required_capacity(cfg, prompts, 5, K) == required_capacity(cfg, prompts, 8, K)  # the same caches
  assert _speculative(cfg, target, mtp, prompts, 5) == [row[:5] for row in plain]


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
  assert _speculative(kernel, target, mtp, prompts, 4) == _plain(xla, target, prompts, 4)


def _fp8_cfg(moe_impl: str) -> jax_mtp.MtpConfig:
  """The smallest bf16 model whose experts and some dense linears the FP8 kernel takes (D = 256, F = 128: whole
  128 × 128 blocks): one MoE target layer and the MTP layer; a dense MLA cache (index_topk above every position)
  keeps the DSA kernels out of it."""
  return jax_mtp.tiny(vocab_size=VOCAB, hidden_size=256, moe_intermediate_size=128, num_hidden_layers=1,
                      first_k_dense_replace=0, dtype="bfloat16", param_dtype="bfloat16", index_topk=64,
                      moe_impl=moe_impl)


@pytest.mark.parametrize("fp8_matmul_impl", ["auto", "mosaic_gpu"])
def test_speculative_decoding_through_the_fp8_kernel_gives_the_gather_impls_plain_tokens(fp8_matmul_impl):
  """FP8 codes + 128 × 128 block scales, as `--weights fp8` keeps them: the routed experts and the dense FP8
  linears through the FP8 grouped matmul (`auto`'s kernel, or the Mosaic GPU one; interpret mode on CPU) decode
  speculatively the tokens of plain greedy decoding with the gather impl dequantising the same codes."""
  cfg = _fp8_cfg("fp8_grouped_gpu").replace(fp8_matmul_impl=fp8_matmul_impl)
  target = fp8.as_checkpoint_fp8(jax_mtp.init_target_params(cfg, jax.random.key(0)),
                                 cfg.fp8_block, fp8.quantize)
  mtp = fp8.as_checkpoint_fp8(jax_mtp.init_params(cfg, jax.random.key(1)), cfg.fp8_block, fp8.quantize)
  prompts = _random_prompts((9, 14))
  assert _speculative(cfg, target, mtp, prompts, 6) == _plain(_fp8_cfg("gather"), target, prompts, 6)


def _fp8_step_for_an_h200(cfg: jax_mtp.MtpConfig) -> str:
  """The MTP step of `cfg` with FP8 weights (codes + block scales), exported for an abstract H200 from this host."""
  params = fp8.as_checkpoint_fp8(jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0)),
                                 cfg.fp8_block, fp8.abstract_fp8)
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, 2, 64))
  ids, hidden = jax.ShapeDtypeStruct((2, 1), jnp.int32), jax.ShapeDtypeStruct((2, 1, 256), jnp.bfloat16)
  step = jax.jit(lambda p, i, pos, h, c: jax_mtp.MtpPredictor(cfg).apply({"params": p}, i, pos, h, c).hidden_BTD)
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=H200)
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(step, platforms=["cuda"], disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])
    return exported(params, ids, ids, hidden, caches).mlir_module()


def test_auto_puts_the_fp8_kernel_in_the_mtp_step_exported_for_an_h200():
  """moe_impl='auto' with FP8 weights, exported for an abstract H200 from this host: the kernel runs the three
  routed-expert projections and every dense FP8 linear it takes, as the explicit impl does (a call names it)."""
  calls = {impl: _fp8_step_for_an_h200(_fp8_cfg(impl)).count(f'"{FP8_KERNEL}"')
           for impl in ("auto", "fp8_grouped_gpu", "gather")}
  # gather dequantises the experts (the dense linears keep the kernel: the program is for a GPU)
  assert calls["auto"] == calls["fp8_grouped_gpu"] == calls["gather"] + 3, calls


def test_fp8_matmul_impl_mosaic_gpu_puts_the_mosaic_kernel_where_the_triton_one_was():
  """fp8_matmul_impl='mosaic_gpu' (--fp8-matmul-impl): the MTP step exported for an H200 multiplies the codes of the
  routed experts and of every dense FP8 linear by the Mosaic GPU kernel, as many calls as the Triton kernel has
  under 'triton', and holds no Triton FP8 kernel."""
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as MOSAIC_FP8  # noqa: PLC0415

  def module(fp8_matmul_impl):
    return _fp8_step_for_an_h200(_fp8_cfg("fp8_grouped_gpu").replace(fp8_matmul_impl=fp8_matmul_impl))

  triton, mosaic = module("triton"), module("mosaic_gpu")
  triton_calls = len(re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", triton))
  assert triton_calls > 3 and f'"{FP8_KERNEL}"' in triton and MOSAIC_FP8 in mosaic  # experts + dense linears
  assert len(re.findall(r"custom_call @mosaic_gpu_v2", mosaic)) == triton_calls
  assert "xla.gpu.triton" not in mosaic


def test_auto_runs_the_mosaic_fp8_kernel_once_jax_has_no_pallas_triton(monkeypatch):
  """fp8_matmul_impl='auto' in the MTP step exported for an H200: the Triton kernel while this JAX has Pallas's
  Triton backend (the control), the Mosaic GPU kernel in each of its places once a JAX release removes the backend
  (simulated: `has_pallas_triton` answers False), so FP8 models keep decoding."""
  from jax_mtp.kernels import fp8_grouped_matmul  # noqa: PLC0415
  from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as MOSAIC_FP8  # noqa: PLC0415

  cfg = _fp8_cfg("fp8_grouped_gpu")
  assert fp8_grouped_matmul.auto_impl() == "triton"
  with_triton = _fp8_step_for_an_h200(cfg)
  monkeypatch.setattr(fp8_grouped_matmul, "has_pallas_triton", lambda: False)
  assert fp8_grouped_matmul.auto_impl() == "mosaic_gpu"
  without = _fp8_step_for_an_h200(cfg)
  triton_calls = len(re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", with_triton))
  assert triton_calls > 3 and MOSAIC_FP8 not in with_triton
  assert "xla.gpu.triton" not in without and MOSAIC_FP8 in without
  assert len(re.findall(r"custom_call @mosaic_gpu_v2", without)) == triton_calls
