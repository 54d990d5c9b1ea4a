"""The fused sparse-MLA decode kernel (kernels/sparse_mla.py): equal to a float64 formula and to the XLA
path (`kernels/sparse_mla.reference`) on awkward shapes, bf16 / fp16, padded selections and
splits, in Pallas interpret mode (and through Triton where a GPU is present); in the lowered CUDA
program of the MTP step when asked for; the same draft tokens as XLA in a model; refused with the
offending values where it cannot run."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.kernels.sparse_mla import KERNEL_NAME, Config, combine_splits, sparse_mla, splits_for
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference
from jax_mtp.mla import MOSAIC_MIN_QUERIES, resolve_sparse_attention_impl
from tests.conftest import FULL_ONLY, FULL_TESTS
from tests.sparse_mla_cases import assert_models_attention_equals_xlas, formula, problem
from tests.lowered_step import mtp_step_module
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


CASES = [  # b, t, n, c, r, s, k, block_heads, block_entries, splits
    (1, 1, 16, 64, 16, 64, 16, 16, 16, 1),
    (2, 3, 32, 64, 16, 100, 64, 16, 16, 2),  # T > 1 (verification), S not a power of two
    (3, 1, 64, 128, 32, 300, 128, 32, 32, 4),
    (1, 2, 16, 32, 16, 48, 32, 16, 16, None),  # splits by splits_for
]


@pytest.mark.parametrize("b,t,n,c,r,s,k,bh,be,splits", CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kernel_equals_the_formula_and_xla(b, t, n, c, r, s, k, bh, be, splits, dtype):
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, n, c, r, s, k, dtype, seed=b + t + n)
  got = sparse_mla(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.125,
                   config=Config(block_heads=bh, block_entries=be, splits=splits), backend="interpret")
  assert got.dtype == jnp.float32 and got.shape == (b, t, n, c)
  # bf16 / fp16 probabilities enter the output dot (as FlashMLA's and the XLA path's): the 16-bit row
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 0.125), "bfloat16", what="kernel vs formula")
  xla = sparse_mla_reference(q_lat, q_pe, latent, k_pe, slots, valid, 0.125, dot_dtype=dtype)
  assert_close(got, xla, "bfloat16", what="kernel vs XLA")


def test_a_split_with_nothing_attended_weighs_nothing():
  """Slots 8.. of every query are padding: the second of two splits sees none and must add nothing."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, 1, 16, 32, 16, 64, 16, "bfloat16", padded=0.0)
  valid = valid.at[..., 8:].set(False)
  got = sparse_mla(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.5,
                   config=Config(block_heads=16, block_entries=8, splits=2), backend="interpret")
  assert np.all(np.isfinite(np.asarray(got)))
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 0.5), "bfloat16", what="half-padded")


@pytest.mark.parametrize("splits", [1, 2])
def test_a_16_bit_output_is_the_fp32_output_rounded(splits):
  """out_dtype: one split rounds its fp32 accumulator once; splits round the fp32 combination once."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, 2, 16, 32, 16, 64, 32, "bfloat16")
  call = functools.partial(sparse_mla, q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.3,
                           config=Config(block_heads=16, block_entries=16, splits=splits), backend="interpret")
  got = call(out_dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(call().astype(jnp.bfloat16)))


def test_combine_splits_is_the_softmax_over_all_entries():
  """Two halves' normalised outputs and log-sum-exps merge to the whole softmax (fp32, exact-ish)."""
  rng = np.random.default_rng(3)
  scores, values = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 4))  # [Q, N, K], [K, C]
  halves = [(scores[..., i:i + 4], values[i:i + 4]) for i in (0, 4)]
  outs = [np.einsum("qnk,kc->qnc", np.exp(s - s.max(-1, keepdims=True)) / np.exp(s - s.max(-1, keepdims=True)).sum(
      -1, keepdims=True), v) for s, v in halves]
  lses = [np.log(np.exp(s).sum(-1)) for s, _ in halves]
  got = combine_splits(jnp.asarray(np.stack(outs, 1), jnp.float32), jnp.asarray(np.stack(lses, 1), jnp.float32))
  whole = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
  assert_close(got, np.einsum("qnk,kc->qnc", whole, values), "float32", what="combined halves")


def test_splits_fill_the_machine_at_small_batches_only():
  assert splits_for(queries=1, head_blocks=4, entries=2048, block_entries=32) == 16  # B = 1: at most MAX_SPLITS
  assert splits_for(queries=4, head_blocks=4, entries=2048, block_entries=64) == 16  # B = 1, T = 4: 256 programs
  assert splits_for(queries=8, head_blocks=4, entries=2048, block_entries=32) == 8  # 32 programs → 256
  assert splits_for(queries=64, head_blocks=4, entries=2048, block_entries=32) == 1  # 256 programs already
  assert splits_for(queries=1, head_blocks=1, entries=32, block_entries=16) == 2  # no more chunks than that


def test_kernel_refuses_what_it_cannot_run():
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 1, 16, 32, 16, 64, 32, "bfloat16")
  call = functools.partial(sparse_mla, scale=1.0, backend="interpret")
  with pytest.raises(ValueError, match="backend='cuda'"):
    sparse_mla(q_lat, q_pe, latent, k_pe, slots, 1.0, backend="cuda")
  with pytest.raises(ValueError, match="do not agree"):
    call(q_lat, q_pe, latent[:, :, :16], k_pe, slots)
  with pytest.raises(ValueError, match="one 16-bit float dtype.*float32"):
    call(q_lat.astype(jnp.float32), q_pe, latent, k_pe, slots)
  with pytest.raises(ValueError, match="16 heads are not a multiple of block_heads=12"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(block_heads=12))
  with pytest.raises(ValueError, match="32 selected slots are not a multiple of splits=3"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(block_entries=16, splits=3))


def _kernel_cfg(**overrides):
  """The smallest bf16 DSA config the kernel takes on a GPU: 16 heads, 16-wide rope, top-16 of a longer cache."""
  return jax_mtp.tiny(dtype="bfloat16", param_dtype="bfloat16", num_attention_heads=16, qk_rope_head_dim=16,
                      index_n_heads=16, index_topk=16, **overrides)


def test_resolution_table():
  few = MOSAIC_MIN_QUERIES - 1
  assert resolve_sparse_attention_impl(_kernel_cfg(), "gpu", 16, few) == "pallas_gpu"  # auto on a GPU, few queries
  assert resolve_sparse_attention_impl(_kernel_cfg(), "tpu", 16, few) == "xla"  # no TPU kernel
  assert resolve_sparse_attention_impl(_kernel_cfg(), "cpu", 16, few) == "xla"
  assert resolve_sparse_attention_impl(_kernel_cfg(), "gpu", 8, few) == "xla"  # auto: heads the kernel cannot take
  # from MOSAIC_MIN_QUERIES up the Mosaic kernel where it takes the model; here (a 16-wide rope) it does not
  assert resolve_sparse_attention_impl(_kernel_cfg(), "gpu", 16, MOSAIC_MIN_QUERIES) == "pallas_gpu"
  wide = _kernel_cfg().replace(qk_rope_head_dim=64, index_head_dim=64, kv_lora_rank=128)
  assert resolve_sparse_attention_impl(wide, "gpu", 16, MOSAIC_MIN_QUERIES) == "mosaic_gpu"
  assert resolve_sparse_attention_impl(wide, "gpu", 16, few) == "pallas_gpu"
  assert resolve_sparse_attention_impl(wide, "gpu", 8, MOSAIC_MIN_QUERIES) == "mosaic_gpu"  # any head count
  assert resolve_sparse_attention_impl(wide, "gpu", 8, few) == "xla"
  explicit = _kernel_cfg(sparse_attention_impl="pallas_gpu")
  assert resolve_sparse_attention_impl(explicit, "cpu", 16, MOSAIC_MIN_QUERIES) == "pallas_gpu"
  assert resolve_sparse_attention_impl(_kernel_cfg(sparse_attention_impl="xla"), "gpu", 16, MOSAIC_MIN_QUERIES) == "xla"
  with pytest.raises(ValueError, match="float32.*qk_rope_head_dim=8 is not a power of two ≥ 16.*8 heads.*index_topk=4"):
    resolve_sparse_attention_impl(jax_mtp.tiny(sparse_attention_impl="pallas_gpu"), "gpu", 8, 1)
  with pytest.raises(jax_mtp.ConfigError, match="sparse_attention_impl='flashmla'"):
    jax_mtp.tiny(sparse_attention_impl="flashmla")


def _step_module(impl: str) -> str:
  """The MTP step of the kernel config (a 64-slot cache: top-16 is sparse) lowered for CUDA."""
  return mtp_step_module(_kernel_cfg(sparse_attention_impl=impl), "cuda", 2, 64)


def test_the_kernel_is_in_the_lowered_step_when_asked_for():
  assert KERNEL_NAME in _step_module("pallas_gpu")
  assert KERNEL_NAME in _step_module("auto")  # auto follows the program's platform (jax_mtp.platform): CUDA
  assert KERNEL_NAME not in _step_module("xla")


@pytest.mark.parametrize("t", [1, 3])
def test_the_models_attention_output_equals_xlas(t):
  """The MTP layer's sparse attention heads (before o_proj; bf16 model, a 64-slot cache > top-16; row 1 at early
  positions sees fewer than 16 slots: padded selections) through the kernel and through XLA."""
  assert_models_attention_equals_xlas(_kernel_cfg(), "pallas_gpu", t, f"attention output, T = {t}")


def test_speculative_decoding_with_the_kernel_keeps_xlas_tokens():
  """A bf16 DSA model (caches longer than top-16) decoding speculatively, target and drafter through
  the kernel (interpret mode on a CPU, Triton on a GPU) or XLA: the same tokens, the same drafts accepted.
  Every call shape goes through the kernel (prefill chunks of 34 tokens, verification T = 3, drafts T = 1). On
  CPU in the full form only (~50 s in interpret mode): CI's bounded form is the attention test above."""
  if not ON_GPU and not FULL_TESTS:
    pytest.skip(f"on CPU: {FULL_ONLY}")
  cfg = _kernel_cfg(vocab_size=512)
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(5)
  prompts = [[int(t) for t in rng.integers(0, 512, n)] for n in (21, 34)]
  runs = {}
  for impl in ("xla", "pallas_gpu"):
    spec = jax_mtp.Speculator(cfg.replace(sparse_attention_impl=impl), jax_mtp.make_mesh(1), 2)
    runs[impl] = spec.generate(spec.shard(target_params, mtp_params), prompts, 10)
  assert runs["pallas_gpu"].tokens == runs["xla"].tokens
  assert runs["pallas_gpu"].metrics.accepted_per_position == runs["xla"].metrics.accepted_per_position


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (Triton)")
@pytest.mark.parametrize("b,t", [(1, 1), (8, 1), (4, 3)])
def test_triton_kernel_at_v32_widths(b, t):
  """V3.2's widths (128 heads × 512 latent + 64 rope, top-2048 of a 4,096-slot cache) through Triton."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, 128, 512, 64, 4096, 2048, "bfloat16", seed=b)
  fn = jax.jit(lambda *a: sparse_mla(*a, 512**-0.5, backend="gpu"))
  got = fn(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1))
  xla = sparse_mla_reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype="bfloat16")
  assert_close(got, xla, "bfloat16", what="Triton kernel vs XLA")
  assert KERNEL_NAME in fn.lower(q_lat, q_pe, latent, k_pe, slots).compile().as_text()
