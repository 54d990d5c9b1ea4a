"""The FP8 MLA cache (`kv_cache_dtype="fp8"`, vLLM's fp8_ds_mla): e4m3 latent codes with one fp32 scale per 128
values and the rope key in the compute dtype. The quantiser against a float64 formula, attention over it against a
bf16 cache in every MLA form (naive, dense absorbed, sparse absorbed), speculative == plain greedy decoding over it,
its bytes per token, the kernel choice, and the CLI flag."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import decode
from jax_mtp.cache import init_layer_cache
from jax_mtp.config import ConfigError
from jax_mtp.indexer import Selection
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME as SPARSE_MLA_MGPU_KERNEL
from jax_mtp.layers import rotary_for_positions
from jax_mtp.kernels.sparse_mla import dequantize_latent
from jax_mtp.kernels.sparse_mla import reference as sparse_mla_reference
from jax_mtp.mla import MLAttention, quantize_latent, read_latent, resolve_sparse_attention_impl
from jax_mtp.request import cache_bytes
from tests.greedy import assert_same_greedy_tokens, plain_and_speculative
from tests.lowered_step import mtp_step_module
from tests.tolerances import GREEDY_MIN_MARGIN, assert_close

E4M3_MAX = 448.0


def _e4m3_half_step(m: np.ndarray) -> np.ndarray:
  """Half the e4m3 spacing at magnitude m: 2^(e − 4) in the binade [2^e, 2^(e+1)) (3 mantissa bits), 2^-10 among
  the subnormals (below 2^-6)."""
  e = np.floor(np.log2(np.maximum(m, 2.0**-6)))
  return 2.0 ** (e - 4)


@pytest.mark.parametrize("group", [16, 128])
def test_quantiser_matches_the_float64_formula(group):
  """scale = amax / 448 per group (fp32, within an ulp of the float64 quotient); each code within half an e4m3
  step of value / scale (the fp32 quotient's own rounding is 2^-24 relative, hence the 1 + 2^-20); zero groups
  stay zero."""
  rng = np.random.default_rng(group)
  c = 4 * group
  magnitudes = np.array([1e-3, 1.0, 30.0, 0.0])[None, None, :, None]  # per group: tiny, unit, large, all zero
  x = (rng.standard_normal((2, 3, 4, group)) * magnitudes).reshape(2, 3, c).astype(np.float32)
  codes, scale = quantize_latent(jnp.asarray(x), group)
  assert codes.dtype == jnp.float8_e4m3fn and codes.shape == (2, 3, c)
  assert scale.dtype == jnp.float32 and scale.shape == (2, 3, 4)
  x64 = x.astype(np.float64).reshape(2, 3, 4, group)
  amax = np.abs(x64).max(-1)
  # fp32's rounding of the float64 quotient, to one ulp: XLA divides by the constant 448 as a product with 1/448
  np.testing.assert_array_max_ulp(np.asarray(scale), (np.maximum(amax, 1e-12) / E4M3_MAX).astype(np.float32), 1)
  ratio = x64 / np.asarray(scale, np.float64)[..., None]
  got = np.asarray(codes, np.float64).reshape(ratio.shape)
  assert np.all(np.abs(got - ratio) <= _e4m3_half_step(np.abs(ratio)) * (1 + 2**-20))
  np.testing.assert_array_equal(np.abs(got[..., :3, :]).max(-1), E4M3_MAX)  # each group's amax maps to 448
  assert not np.any(got[..., 3, :])
  back = dequantize_latent(codes, scale, jnp.float32)  # codes · scale per group, one fp32 rounding
  np.testing.assert_array_equal(np.asarray(back), (got * np.asarray(scale, np.float64)[..., None]).reshape(x.shape).astype(np.float32))


def _cfg(kv, index_topk, **overrides):
  """The tiny model at V3.2's scale groups: kv_lora_rank 256 = two groups of 128; fp32 compute."""
  return jax_mtp.tiny(kv_lora_rank=256, index_topk=index_topk, kv_cache_dtype=kv, **overrides)


def _attend(kv: str, absorb: bool, index_topk: int):
  """MLA outputs for a 16-token prefix (the naive form, as prefill's dense chunks) and then 3 tokens in the asked
  form, over a cache of 24 (dense: index_topk 32 keeps every slot; sparse: 8 of them). Row 1's queries see few
  slots."""
  cfg = _cfg(kv, index_topk)
  rng = np.random.default_rng(0)
  b, s = 2, 24
  module = MLAttention(cfg)
  prefix = jnp.asarray(rng.standard_normal((b, 16, cfg.hidden_size)), jnp.float32)
  prefix_pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (b, 16))
  x = jnp.asarray(rng.standard_normal((b, 3, cfg.hidden_size)), jnp.float32)
  pos = jnp.asarray([[16, 17, 18], [2, 3, 4]], jnp.int32)

  def call(params, x, pos, cache, absorb):
    rotary = rotary_for_positions(cfg.rope, cfg.qk_rope_head_dim, pos)
    return module.apply(params, x, pos, rotary, cache, absorb=absorb, mutable=["dsa"])[0]

  cache = init_layer_cache(cfg, b, s)
  init_cfg = _cfg("auto", 8)  # a sparse cache: the indexer's parameters too
  rotary = rotary_for_positions(init_cfg.rope, init_cfg.qk_rope_head_dim, prefix_pos)
  params = MLAttention(init_cfg).init(jax.random.key(3), prefix, prefix_pos, rotary, init_layer_cache(init_cfg, b, s),
                                      absorb=True)
  out_prefix, cache = call(params, prefix, prefix_pos, cache, absorb=False)
  out, cache = call(params, x, pos, cache, absorb=absorb)
  return out_prefix, out, cache


@pytest.mark.parametrize("absorb,index_topk", [(False, 32), (True, 32), (True, 8), (False, 8)],
                         ids=["naive dense", "absorbed dense", "absorbed sparse", "naive sparse"])
def test_attention_over_the_fp8_cache_tracks_the_bf16_cache(absorb, index_topk):
  prefix8, out8, cache8 = _attend("fp8", absorb, index_topk)
  prefix16, out16, cache16 = _attend("bfloat16", absorb, index_topk)
  assert cache8.latent_BSC.dtype == jnp.float8_e4m3fn and cache8.latent_scale_BSG.shape == (2, 24, 2)
  assert cache8.k_pe_BSR.dtype == jnp.float32 and cache16.latent_BSC.dtype == jnp.bfloat16
  assert cache16.latent_scale_BSG is None
  assert not np.array_equal(np.asarray(out8), np.asarray(out16))  # the fp8 cache was read
  assert_close(prefix8, prefix16, "fp8_mla_cache", what="prefix (naive)")
  assert_close(out8, out16, "fp8_mla_cache", what=f"absorb={absorb}, index_topk={index_topk}")


def test_sparse_form_dequantises_the_gathered_entries_as_the_whole_cache():
  """Gathering the codes and scales of the K selected slots, then dequantising them, gives exactly what
  attention over the dequantised cache gives (fp32)."""
  rng = np.random.default_rng(1)
  b, t, n, c, r, s, k = 2, 3, 4, 256, 8, 40, 6
  codes, scale = quantize_latent(jnp.asarray(rng.standard_normal((b, s, c)), jnp.float32), 128)
  k_pe = jnp.asarray(rng.standard_normal((b, s, r)), jnp.float32)
  q_lat = jnp.asarray(rng.standard_normal((b, t, n, c)), jnp.float32)
  q_pe = jnp.asarray(rng.standard_normal((b, t, n, r)), jnp.float32)
  slots = jnp.asarray(np.stack([np.stack([rng.permutation(s)[:k] for _ in range(t)]) for _ in range(b)]), jnp.int32)
  selection = Selection(slots, jnp.asarray(rng.uniform(size=(b, t, k)) < 0.8).at[..., 0].set(True))
  fp8 = sparse_mla_reference(q_lat, q_pe, codes, k_pe, *selection, 0.1, latent_scale_BSG=scale)
  whole = read_latent(jax_mtp.LayerCache(codes, k_pe, None, None, scale), jnp.float32)
  np.testing.assert_array_equal(np.asarray(fp8), np.asarray(sparse_mla_reference(q_lat, q_pe, whole, k_pe,
                                                                                  *selection, 0.1)))


@pytest.mark.parametrize("share,dtype", [(False, "float32"), (True, "float32"), (False, "bfloat16")],
                         ids=["own top-k", "index_share", "bf16 model"])
def test_speculative_equals_plain_greedy_with_the_fp8_cache(share, dtype):
  """Both decoders write and read the fp8 cache (target and MTP layers), so their greedy tokens are equal
  exactly; prompts past index_topk = 4, so the sparse form (and with index_share the drafter's reused
  selection) reads the gathered codes; in a bf16 model it dequantises them to bf16 for the dots."""
  cfg = jax_mtp.tiny(vocab_size=8, kv_lora_rank=128, kv_cache_dtype="fp8", index_share_for_mtp_iteration=share,
                     dtype=dtype, param_dtype=dtype)
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  prompts = [[3, 1, 4, 1, 5, 7, 2, 6, 5, 3, 5], [2, 7, 1, 0]]
  plain, result = plain_and_speculative(cfg, target_params, mtp_params, prompts, 16, capacity=40)
  # bf16: verification (T = k + 1) and a plain step (T = 1) round differently and may break a near-tie either way
  assert_same_greedy_tokens(cfg, target_params, prompts, result.tokens, plain, capacity=40,
                            min_margin=GREEDY_MIN_MARGIN if dtype == "bfloat16" else 0.0)
  if dtype == "float32":  # drafts accepted in part (rollback over the fp8 cache)
    assert 0 < sum(result.metrics.accepted_per_position) < 3 * result.metrics.rounds
  for cache in (result.state.target_caches[0], result.state.drafter_caches[0]):
    assert cache.latent_BSC.dtype == jnp.float8_e4m3fn and cache.latent_scale_BSG.shape == (2, 40, 1)
    assert np.any(np.asarray(cache.latent_scale_BSG) > 0)


def _bytes_per_token(layer: jax_mtp.LayerCache, *fields: str) -> int:
  return sum(math.prod(getattr(layer, f).shape[2:]) * getattr(layer, f).dtype.itemsize for f in fields)


@pytest.mark.parametrize("kv,index,mla_bytes,index_bytes", [("fp8", "auto", 656, 256), ("auto", "auto", 1152, 256),
                                                            ("bfloat16", "fp8", 1152, 132),
                                                            ("fp8", "fp8", 656, 132)])
def test_cache_bytes_per_token_at_v32_widths(kv, index, mla_bytes, index_bytes):
  """A V3.2 layer's MLA cache is 512 e4m3 + 4 fp32 scales + 64 bf16 rope values = 656 bytes a token in fp8,
  (512 + 64) · 2 = 1,152 in bf16; the indexer's keys (128 bf16, or 128 e4m3 + one fp32 scale) apart.
  request.cache_bytes counts every layer's, and the output slots' 4 bytes."""
  cfg = jax_mtp.deepseek_v32(kv_cache_dtype=kv, index_cache_dtype=index)
  layer = jax.eval_shape(lambda: init_layer_cache(cfg, 1, 1))
  mla = ("latent_BSC", "k_pe_BSR") + (("latent_scale_BSG",) if kv == "fp8" else ())
  indexer = ("index_k_BSJ",) + (("index_k_scale_BS",) if index != "auto" else ())
  assert _bytes_per_token(layer, *mla) == mla_bytes
  assert _bytes_per_token(layer, *indexer) == index_bytes
  b, s = 3, 1000
  assert cache_bytes(cfg, b, s) == (61 + 1) * b * s * (mla_bytes + index_bytes) + b * s * 4


def test_auto_runs_the_mosaic_kernel_over_an_fp8_cache():
  """`auto` on a GPU over an fp8 cache: the Mosaic GPU kernel (it dequantises the codes) where it takes the model (a
  64-wide rope), XLA's sparse form where it does not (a 16-wide rope)."""
  widths = dict(dtype="bfloat16", param_dtype="bfloat16", kv_lora_rank=128, qk_rope_head_dim=16,
                num_attention_heads=16, index_topk=16)
  fp8 = jax_mtp.tiny(kv_cache_dtype="fp8", **widths)
  assert resolve_sparse_attention_impl(fp8, "gpu") == "xla"  # rope 16: not the Mosaic kernel's
  assert resolve_sparse_attention_impl(fp8.replace(qk_rope_head_dim=64, index_head_dim=64), "gpu") == "mosaic_gpu"


def test_step_lowered_for_cuda_over_an_fp8_cache():
  """The MTP draft step exported for an H200 with `auto` over an fp8 cache: the Mosaic kernel where it takes the
  model, else XLA's sparse form reading e4m3 codes, and no kernel."""
  widths = dict(dtype="bfloat16", param_dtype="bfloat16", kv_lora_rank=128, qk_rope_head_dim=16,
                num_attention_heads=16, index_topk=16, index_n_heads=16)
  fp8 = mtp_step_module(jax_mtp.tiny(kv_cache_dtype="fp8", **widths), "cuda", 2, 64)
  assert SPARSE_MLA_MGPU_KERNEL not in fp8 and "f8E4M3FN" in fp8
  mosaic = mtp_step_module(jax_mtp.tiny(kv_cache_dtype="fp8", **(widths | dict(qk_rope_head_dim=64, index_head_dim=64))), "cuda", 2, 64)
  assert SPARSE_MLA_MGPU_KERNEL in mosaic and "f8E4M3FN" in mosaic


def test_config_values():
  assert jax_mtp.deepseek_v32().mla_cache_dtype == "bfloat16"  # auto: the compute dtype
  assert jax_mtp.tiny().mla_cache_dtype == "float32"
  assert jax_mtp.tiny(kv_cache_dtype="bfloat16").mla_cache_dtype == "bfloat16"
  assert jax_mtp.deepseek_v32(kv_cache_dtype="fp8").kv_scale_group == 128
  assert jax_mtp.tiny(kv_cache_dtype="fp8").kv_scale_group == 16  # narrower than 128: one scale a token
  with pytest.raises(ConfigError, match="kv_lora_rank=192 is not a multiple of 128"):
    jax_mtp.tiny(kv_lora_rank=192, kv_cache_dtype="fp8")
  with pytest.raises(ConfigError, match="kv_cache_dtype='int8' is not one of"):
    jax_mtp.tiny(kv_cache_dtype="int8")


def test_cli_flag(capsys):
  """--kv-cache-dtype fp8 decodes the random tiny model and --check finds speculative == plain; a bad value is
  exit 2 with one error line."""
  assert decode.main(["--random-tiny", "--kv-cache-dtype", "fp8", "--max-new-tokens", "6", "--check"]) == 0
  assert decode.main(["--random-tiny", "--kv-cache-dtype", "fp8", "--max-new-tokens", "4", "--tp", "2",
                      "--check"]) == 0  # the scales are replicated over tp with the rest of the cache
  capsys.readouterr()
  assert decode.main(["--random-tiny", "--kv-cache-dtype", "fp4"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: argument --kv-cache-dtype")
