"""The sparse-MLA kernel's heads-major operand layout (`sparse_mla_mgpu(heads_major=True)`: q~ in and the output out
as [N, B, T, C], the layout of XLA's batched dots over the heads around it; `mla.KERNEL_HEADS_MAJOR` puts the model's
W_UK absorption and W_UV product in it): the same values as the token-major launch, bit for bit, in Pallas's GPU
interpreter (splits with fp32 partials, padded head blocks, V3.2's widths double-buffered, an fp8 cache) and compiled
on a GPU; lowered for CUDA at V3.2's widths; the model's attention through it equals XLA's, and speculative decoding
keeps XLA's tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp import mla
from jax_mtp.kernels.sparse_mla import reference
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME, Config, sparse_mla_mgpu
from jax_mtp.mla import quantize_latent
from tests.conftest import FULL_ONLY, FULL_TESTS
from tests.sparse_mla_cases import (assert_models_attention_equals_xlas,
                                    assert_speculative_decoding_through_the_kernel_keeps_xlas_tokens, problem)
from tests.sparse_mla_cases import dsa_kernel_cfg as _kernel_cfg
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


def _both_layouts(q_lat, *operands, **kwargs):
  """(token-major output, heads-major output transposed back to [B, T, N, C])."""
  call = lambda q, heads_major: sparse_mla_mgpu(q, *operands, heads_major=heads_major, interpret=not ON_GPU,  # noqa: E731
                                                **kwargs)
  heads_major = call(q_lat.transpose(2, 0, 1, 3), True)
  assert heads_major.shape == (q_lat.shape[2], *q_lat.shape[:2], q_lat.shape[3])
  return call(q_lat, False), heads_major.transpose(1, 2, 0, 3)


@pytest.mark.parametrize("b,t,n,c,s,k,config,out_dtype,fp8", [
    (2, 3, 32, 128, 300, 128, Config(splits=2), jnp.float32, False),  # fp32 partials merged; heads padded to 64
    (2, 1, 80, 128, 200, 128, Config(splits=1, block_entries=128), jnp.bfloat16, False),  # two head blocks, TMA out
    (1, 2, 64, 512, 192, 128, Config(), jnp.bfloat16, True),  # V3.2's latent, two buffer sets, an fp8 cache
], ids=["splits, fp32", "80 heads, bf16", "v32 latent, fp8 cache"])
def test_heads_major_gives_the_token_major_values(b, t, n, c, s, k, config, out_dtype, fp8):
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, n, c, 64, s, k, "bfloat16", seed=n + s)
  scales = None
  if fp8:
    latent, scales = quantize_latent(latent, 128)
  token_major, heads_major = _both_layouts(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), c**-0.5,
                                           latent_scale_BSG=scales, config=config, out_dtype=out_dtype)
  assert float(jnp.max(jnp.abs(token_major.astype(jnp.float32)))) > 0
  np.testing.assert_array_equal(np.asarray(heads_major), np.asarray(token_major))


@pytest.mark.parametrize("b,t", [(1, 1), (64, 4)])
@pytest.mark.parametrize("cache", ["bfloat16", "fp8"])
def test_heads_major_lowers_for_cuda_at_v32_widths(b, t, cache):
  """128 heads × 512 + 64, top-2048 of a 32K cache: q~'s TMA load and the output's store over rows B · T · C apart
  (one split's bf16 TMA store at B = 64, T = 4; sixteen splits' fp32 register stores at B = 1, T = 1)."""
  fp8 = cache == "fp8"
  shapes = [((128, b, t, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16),
            ((b, 32768, 512), jnp.float8_e4m3fn if fp8 else jnp.bfloat16), ((b, 32768, 64), jnp.bfloat16),
            ((b, t, 2048), jnp.int32), ((b, 32768, 4), jnp.float32)]
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a[:5], 512**-0.5, latent_scale_BSG=a[5] if fp8 else None,
                                          out_dtype=jnp.bfloat16, heads_major=True))
  lowered = fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",))
  assert lowered.out_info.shape == (128, b, t, 512)
  assert "mosaic_gpu" in lowered.as_text() and KERNEL_NAME in lowered.as_text()


def test_a_heads_major_call_is_checked_in_the_ops_order():
  """The operand checks name the shapes as the op takes them: a q~ of the wrong head count is refused."""
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 2, 64, 128, 64, 128, 64, "bfloat16")
  with pytest.raises(ValueError, match="do not agree"):
    sparse_mla_mgpu(q_lat.transpose(2, 0, 1, 3)[:32], q_pe, latent, k_pe, slots, 0.1, heads_major=True,
                    interpret=True)


@pytest.mark.parametrize("t,cache", [(3, "bfloat16"), (3, "fp8")])
def test_the_models_attention_through_the_heads_major_kernel_equals_xlas(t, cache, monkeypatch):
  """mla.KERNEL_HEADS_MAJOR: the absorption writes q~ as [N, B, T, C], the kernel returns [N, B, T, C] and W_UV's
  product reads it; the MTP layer's attention heads equal XLA's path's (bf16 and fp8 MLA caches)."""
  monkeypatch.setattr(mla, "KERNEL_HEADS_MAJOR", True)
  cfg = _kernel_cfg(kv_cache_dtype="fp8") if cache == "fp8" else _kernel_cfg()
  assert_models_attention_equals_xlas(cfg, "mosaic_gpu", t, f"heads-major attention, T = {t}, {cache} cache")


def test_speculative_decoding_through_the_heads_major_kernel_keeps_xlas_tokens(monkeypatch):
  """Greedy speculative decoding (k = 2, top-16 of caches past it; prefill chunks, verification and drafts all
  through the kernel) with the heads-major layout gives XLA's tokens and acceptance, which are plain greedy
  decoding's. On a CPU in the full form only (the interpreter's cost): CI's bounded form is the attention test."""
  if not ON_GPU and not FULL_TESTS:
    pytest.skip(f"on CPU: {FULL_ONLY}")
  monkeypatch.setattr(mla, "KERNEL_HEADS_MAJOR", True)
  assert_speculative_decoding_through_the_kernel_keeps_xlas_tokens()


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("b,t", [(1, 1), (4, 4)])
def test_heads_major_at_v32_widths_on_the_gpu(b, t):
  """Compiled at V3.2's widths (top-2048 of 4,096 slots): equal to the token-major launch and to XLA."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, 128, 512, 64, 4096, 2048, "bfloat16", seed=b)
  token_major, heads_major = _both_layouts(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5)
  np.testing.assert_array_equal(np.asarray(heads_major), np.asarray(token_major))
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype="bfloat16")
  assert_close(heads_major, xla, "bfloat16", what="heads-major kernel vs XLA")
