"""The sparse-MLA kernel on Pallas Mosaic GPU (kernels/sparse_mla_mgpu.py): equal to a float64 formula and to XLA's
path on awkward shapes (heads padded to its blocks, S not a power of two, narrow rope, bf16 / fp16, splits,
padded selections) in Pallas's GPU interpreter (TMA copies, barriers, wgmma and the three warpgroups simulated on
the CPU); lowered for CUDA at V3.2's widths; in the CUDA program of the MTP step when asked for; the model's
attention through it equals XLA's, and speculative decoding through it keeps XLA's tokens; `auto` picks it on Hopper
GPUs at every query count; refused with the offending values where it cannot run. On a GPU the same cases run
compiled. The split partials' merge (`sparse_mla.combine_splits`) against the whole softmax."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp.kernels.sparse_mla import combine_splits, dequantize_latent, reference
from jax_mtp.kernels.sparse_mla_mgpu import FORM_SUFFIXES, KERNEL_NAME, Config, config_for, form_of, padded_entries, sparse_mla_mgpu
from jax_mtp.mla import quantize_latent, resolve_sparse_attention_impl
from tests.conftest import FULL_ONLY, FULL_TESTS
from tests.lowered_step import mtp_step_module
from tests.sparse_mla_cases import (assert_models_attention_equals_xlas,
                                    assert_speculative_decoding_through_the_kernel_keeps_xlas_tokens, formula, problem)
from tests.sparse_mla_cases import dsa_kernel_cfg as _kernel_cfg
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"


def _attend(*args, **kwargs):
  return sparse_mla_mgpu(*args, interpret=not ON_GPU, **kwargs)


CASES = [  # b, t, n, c, r, s, k, block_entries, splits
    (1, 1, 64, 128, 64, 256, 128, 64, 1),
    (2, 3, 32, 128, 64, 300, 128, 64, 2),  # heads padded to 64, T > 1 (verification), S not a power of two
    (1, 2, 80, 128, 64, 200, 128, 128, 1),  # 80 heads: two blocks, the second padded; 128 entries a step
    (2, 1, 64, 512, 64, 192, 128, 64, 0),  # V3.2's widths: config_for's two buffer sets of 32 entries, its splits
]


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous re-layout", "WGMMA-piece re-layout"])
@pytest.mark.parametrize("t", [1, 3])
def test_one_buffer_set_equals_the_formula_and_xla(t, contiguous):
  """One buffer set of 64 entries a step (config_for's form at latent widths other than 512) at V3.2's widths, with
  each re-layout of the bf16 latent (Config.contiguous_relayout: row-contiguous register pieces, or WGMMA's)."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, t, 64, 512, 64, 192, 128, "bfloat16", seed=t)
  got = _attend(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5,
                config=Config(double_buffered=False, contiguous_relayout=contiguous))
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype=jnp.bfloat16)
  assert_close(got, xla, "bfloat16", what=f"one buffer set, contiguous={contiguous}, vs XLA")


@pytest.mark.parametrize("t,splits,k,fp8", [(1, 1, 128, False), (3, 2, 192, False), (2, 1, 32, False),
                                            (3, 2, 192, True)],
                         ids=["4 steps", "splits of 3 steps", "one step", "fp8 cache, splits of 3 steps"])
def test_the_double_buffered_form_equals_the_formula_and_xla(t, splits, k, fp8):
  """Config.double_buffered (two staging / operand / P sets, 32 entries a step, 64-byte swizzles, the 32-row
  re-layout) at V3.2's widths: an odd step count per split (set 0 twice), one step (the second set unused), padded
  selections, a bf16 and an fp8 cache (its codes times their rows' scales a group at a time); every step's rows land
  in its own set and its rescale reaches the values warpgroup."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, t, 64, 512, 64, 192, k, "bfloat16", seed=11 + t)
  codes, scales = quantize_latent(latent, 128) if fp8 else (latent, None)
  values = dequantize_latent(codes, scales, jnp.bfloat16) if fp8 else latent
  config = Config(double_buffered=True, splits=splits)
  assert config_for(2 * t, 64, k, 512, config).block_entries == 32
  got = _attend(q_lat, q_pe, codes, k_pe, jnp.where(valid, slots, -1), 512**-0.5, latent_scale_BSG=scales,
                config=config)
  assert_close(got, formula(q_lat, q_pe, values, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")
  xla = reference(q_lat, q_pe, codes, k_pe, slots, valid, 512**-0.5, dot_dtype=jnp.bfloat16, latent_scale_BSG=scales)
  assert_close(got, xla, "bfloat16", what="double-buffered vs XLA")


@pytest.mark.parametrize("t,splits,k", [(1, 1, 128), (3, 1, 192), (2, 1, 64), (1, 2, 384)],
                         ids=["2 steps", "3 steps (set 0 twice)", "one step", "splits of 3 steps"])
def test_the_direct_gather_equals_the_formula_and_xla(t, splits, k):
  """Config.direct_gather (the rows copied straight into two 64-entry operand sets, one P buffer and its p_free
  hand-off) at V3.2's widths: an odd step count (set 0 twice), one step (the second set unused), splits, padded
  selections. In the interpreter the rows land by TMA in the same tiled operands (inline_mgpu's cp.async runs
  compiled only: test_the_direct_gathers_rows_land_where_wgmma_reads_them and the GPU cases below), so this checks
  the steps, the sets and the hand-offs around the copies."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, t, 64, 512, 64, 400, k, "bfloat16", seed=23 + t)
  config = Config(direct_gather=True, splits=splits)
  assert config_for(2 * t, 64, k, 512, config).block_entries == 64 and form_of(config) == "direct"
  got = _attend(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5, config=config)
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype=jnp.bfloat16)
  assert_close(got, xla, "bfloat16", what="direct gather vs XLA")


@pytest.mark.parametrize("double", [True, False], ids=["two buffer sets", "one set"])
def test_the_ids_loaded_before_the_dots_give_the_same_output(double):
  """Config.ids_before_dots (the mask's slot ids loaded ahead of the operand wait and the dots) at V3.2's widths,
  with padded selections and splits: the formula's output, and bit for bit the default order's (one program order
  apart, the same arithmetic)."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, 3, 64, 512, 64, 192, 128, "bfloat16", seed=5)
  attend = functools.partial(_attend, q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5)
  got = attend(config=Config(double_buffered=double, splits=2, ids_before_dots=True))
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(attend(config=Config(double_buffered=double, splits=2))))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("config,fp8", [(Config(double_buffered=True), False), (Config(double_buffered=True), True),
                                        (Config(double_buffered=False), False), (Config(double_buffered=False), True),
                                        (Config(direct_gather=True), False)],
                         ids=["two sets, bf16", "two sets, fp8", "one set, bf16", "one set, fp8", "direct, bf16"])
def test_no_shared_memory_race_between_the_warpgroups(config, fp8):
  """The interpreter's race detector (vector clocks over every shared-memory access, the TMA copies' included) finds
  no access of one warpgroup or warp unordered with another's write, three steps of one CTA: each hand-off (ids,
  copies, re-layout, operands, P, the output) is ordered by a barrier. It raises at the first race (it caught the
  gather's first steps: step 2's ids landing over step 0's while a warp could still read them)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  k = 96 if config.double_buffered else 192  # three steps
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 1, 64, 512, 64, 192, k, "bfloat16", seed=17)
  codes, scales = quantize_latent(latent, 128) if fp8 else (latent, None)
  out = sparse_mla_mgpu(q_lat, q_pe, codes, k_pe, jnp.where(valid, slots, -1), 512**-0.5, latent_scale_BSG=scales,
                        config=dataclasses.replace(config, splits=1),
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  values = dequantize_latent(codes, scales, jnp.bfloat16) if fp8 else latent
  assert_close(out, formula(q_lat, q_pe, values, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")


@pytest.mark.parametrize("gather", [dict(whole_rows=False, issue_warps=1), dict(whole_rows=False), dict(issue_warps=2)],
                         ids=["a copy a piece, one thread", "a copy a piece, 4 issuing warps", "whole rows, 2 warps"])
@pytest.mark.parametrize("t,fp8", [(1, False), (3, True)])
def test_the_gathers_copy_variants_equal_the_formula(gather, t, fp8):
  """Config.whole_rows (a latent row in one TMA box; else a copy a 256-wide piece) and Config.issue_warps (the row
  copies issued from several warps through plgpu.warp_map) in the forms other than the default (whole rows, 4
  warps), one buffer set at V3.2's widths, bf16 and fp8 caches: every row lands where the dots read it."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, t, 64, 512, 64, 192, 128, "bfloat16", seed=7 + t)
  codes, scales = quantize_latent(latent, 128) if fp8 else (latent, None)
  values = dequantize_latent(codes, scales, jnp.bfloat16) if fp8 else latent
  got = _attend(q_lat, q_pe, codes, k_pe, jnp.where(valid, slots, -1), 512**-0.5, latent_scale_BSG=scales,
                config=Config(splits=2, double_buffered=False, **gather))
  assert_close(got, formula(q_lat, q_pe, values, k_pe, slots, valid, 512**-0.5), "bfloat16", what=f"{gather}")


@pytest.mark.parametrize("b,t,n,c,r,s,k,e,splits", CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kernel_equals_the_formula_and_xla(b, t, n, c, r, s, k, e, splits, dtype):
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, n, c, r, s, k, dtype, seed=b + t + n)
  got = _attend(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), c**-0.5,
                config=Config(block_entries=e, splits=splits))
  assert got.dtype == jnp.float32 and got.shape == (b, t, n, c)
  # 16-bit probabilities enter the output dot (as FlashMLA's and the XLA path's): the 16-bit row
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, c**-0.5), "bfloat16", what="kernel vs formula")
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, c**-0.5, dot_dtype=dtype)
  assert_close(got, xla, "bfloat16", what="kernel vs XLA")


@pytest.mark.parametrize("b,t,c,s,k,splits", [(1, 2, 256, 200, 128, 1), (2, 1, 512, 256, 128, 2)])
def test_an_fp8_cache_equals_the_formula_and_xla_on_its_values(b, t, c, s, k, splits):
  """An fp8 MLA cache (e4m3 codes, one fp32 scale per 128 values, `quantize_latent`'s writer): dequantised by the
  gather warpgroup, the same attention as XLA's fp8 path and as the float64 formula over the dequantised values."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, 64, c, 64, s, k, "bfloat16", seed=c + s)
  codes, scales = quantize_latent(latent, 128)
  attended = jnp.where(valid, slots, -1)
  got = _attend(q_lat, q_pe, codes, k_pe, attended, c**-0.5, latent_scale_BSG=scales, config=Config(splits=splits))
  values = dequantize_latent(codes, scales, jnp.bfloat16)  # what the kernel's operand holds
  assert_close(got, formula(q_lat, q_pe, values, k_pe, slots, valid, c**-0.5), "bfloat16", what="fp8 vs formula")
  xla = reference(q_lat, q_pe, codes, k_pe, slots, valid, c**-0.5, dot_dtype=jnp.bfloat16, latent_scale_BSG=scales)
  assert_close(got, xla, "bfloat16", what="fp8 cache, kernel vs XLA")


def test_a_split_with_nothing_attended_weighs_nothing():
  """Slots 64.. of every query are padding: the second of two splits sees none and must add nothing."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, 1, 64, 128, 64, 256, 128, "bfloat16", padded=0.0)
  valid = valid.at[..., 64:].set(False)
  got = _attend(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.5, config=Config(splits=2))
  assert np.all(np.isfinite(np.asarray(got)))
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 0.5), "bfloat16", what="half-padded")


@pytest.mark.parametrize("splits", [1, 2])
def test_a_16_bit_output_is_the_fp32_output_rounded(splits):
  """out_dtype: one split rounds its fp32 accumulator once; splits round the fp32 combination once."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 2, 64, 128, 64, 128, 128, "bfloat16")
  call = functools.partial(_attend, q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.3,
                           config=Config(splits=splits))
  got = call(out_dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(call().astype(jnp.bfloat16)))


ONE_SET = Config(double_buffered=False)
LOWERED_CONFIGS = {"bfloat16 (double-buffered)": Config(), "fp8 (double-buffered)": Config(),
                   "bfloat16, one buffer set": ONE_SET, "fp8, one buffer set": ONE_SET,
                   "bfloat16, one set, contiguous re-layout": Config(double_buffered=False, contiguous_relayout=True),
                   "bfloat16, one set, a copy a piece from one thread":
                       Config(double_buffered=False, whole_rows=False, issue_warps=1),
                   "fp8, one set, a copy a piece from one thread":
                       Config(double_buffered=False, whole_rows=False, issue_warps=1),
                   "bfloat16, ids before the dots": Config(ids_before_dots=True),
                   "fp8, one set, ids before the dots": Config(double_buffered=False, ids_before_dots=True),
                   "bfloat16, direct gather": Config(direct_gather=True)}


@pytest.mark.parametrize("b,t", [(1, 1), (2, 4), (64, 4)])
@pytest.mark.parametrize("cache", LOWERED_CONFIGS)
def test_kernel_lowers_for_cuda_at_v32_widths(b, t, cache):
  """The Mosaic GPU lowering (one-row TMA copies, the staging re-layout and the fp8 dequantisation, wgmma operands,
  shared memory checked against the H200's limit) at 128 heads × 512 + 64, top-2048 of a 32K cache."""
  fp8 = cache.startswith("fp8")
  shapes = [((b, t, 128, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16),
            ((b, 32768, 512), jnp.float8_e4m3fn if fp8 else jnp.bfloat16), ((b, 32768, 64), jnp.bfloat16),
            ((b, t, 2048), jnp.int32), ((b, 32768, 4), jnp.float32)]
  config = LOWERED_CONFIGS[cache]
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a[:5], 512**-0.5, latent_scale_BSG=a[5] if fp8 else None,
                                          out_dtype=jnp.bfloat16, config=config))
  text = fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",)).as_text()
  form = form_of(config_for(b * t, 128, 2048, 512, config))
  assert "mosaic_gpu" in text and KERNEL_NAME + FORM_SUFFIXES[form] in text  # its name says which form runs
  assert not any(KERNEL_NAME + suffix in text for other, suffix in FORM_SUFFIXES.items() if other != form)


def test_config_fills_one_wave():
  """The most splits that keep the CTAs to one wave of one a core (132), at most MAX_SPLITS and the steps."""
  one = Config(double_buffered=False)  # 64 entries a step: 32 steps of top-2048
  assert config_for(1, 128, 2048, 512, one).splits == 16  # 2 head blocks × 16 = 32 CTAs: MAX_SPLITS binds
  assert config_for(8, 128, 2048, 512, one).splits == 8  # 16 blocks × 8 = 128 ≤ 132 < 256
  assert config_for(64, 128, 2048, 512, one).splits == 1  # 128 blocks: a second split would make two waves
  assert config_for(256, 128, 2048, 512, one).splits == 1  # B = 64 × T = 4: 512 CTAs already
  assert config_for(1, 64, 128, 128).splits == 2  # no more splits than steps
  assert [config_for(q, 128, 2048, 512).splits for q in (4, 32, 33, 34, 64)] == [16, 2, 2, 1, 1]  # two sets: 64 steps
  assert config_for(8, 128, 2048, 512, wave=264).splits == 16  # the wave is a parameter
  # the row-contiguous re-layout where it measured faster: B · T ≥ 32
  assert [config_for(q, 128, 2048, 512, one).contiguous_relayout for q in (1, 2, 4, 8, 31, 32, 64, 256)] == \
      [True] + [False] * 4 + [True] * 3
  assert not config_for(256, 128, 2048, 512, Config(contiguous_relayout=False)).contiguous_relayout


def test_a_selection_is_padded_to_the_width_leaving_a_cta_the_fewest_steps():
  """padded_entries: index_share's 2,050 entries and a short request's 1,059 slots (odd step counts, one or two
  splits) padded to widths that split into one wave; where the CTAs fill it, only to whole steps."""
  def steps_a_cta(queries, entries):
    width = padded_entries(queries, 128, entries, 512)
    config = config_for(queries, 128, width, 512)
    assert width >= entries and width % (config.block_entries * config.splits) == 0
    return width, config.splits, width // (config.block_entries * config.splits)
  assert steps_a_cta(1, 2050) == (3072, 16, 3)  # 33 steps of 64 would run 1 split: 2 CTAs of 33 steps
  assert steps_a_cta(1, 2048) == (2048, 16, 2)  # a whole top-k: unpadded
  assert steps_a_cta(8, 1059) == (1280, 8, 5)  # 1,088 = 34 steps of 32: 2 splits of 17
  assert steps_a_cta(4, 2050) == (2560, 16, 5)
  assert steps_a_cta(256, 2050) == (2080, 1, 65)  # 512 CTAs fill the wave: whole steps only
  assert padded_entries(2, 16, 18, 512) == 32 and padded_entries(1, 64, 18, 128) == 64  # one whole step of the form


def test_config_double_buffers_a_512_wide_latent_from_two_queries():
  """Two buffer sets (32 entries a step) where they measured faster: V3.2's 512-wide latent from two queries a call;
  one set of 64 at one query and at the widths the double-buffered form does not take; an explicit choice kept."""
  for queries in (2, 8, 256):
    auto = config_for(queries, 128, 2048, 512)
    assert auto.double_buffered and auto.block_entries == 32
    assert auto.splits == config_for(queries, 128, 2048, 512, auto).splits
  one_query = config_for(1, 128, 2048, 512)
  assert not one_query.double_buffered and one_query.block_entries == 64
  for width in (128, 256):
    narrow = config_for(8, 128, 2048, width)
    assert not narrow.double_buffered and narrow.block_entries == 64
  assert not config_for(8, 128, 2048, 512, Config(double_buffered=False)).double_buffered
  assert config_for(1, 128, 2048, 512, Config(double_buffered=True)).double_buffered


def test_kernel_refuses_what_it_cannot_run():
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 1, 64, 128, 64, 128, 128, "bfloat16")
  call = functools.partial(sparse_mla_mgpu, scale=1.0, interpret=True)
  with pytest.raises(ValueError, match="do not agree"):
    call(q_lat, q_pe, latent[:, :, :64], k_pe, slots)
  with pytest.raises(ValueError, match="one 16-bit float dtype.*float32"):
    call(q_lat.astype(jnp.float32), q_pe, latent, k_pe, slots)
  with pytest.raises(ValueError, match="latent width 64"):
    call(q_lat[..., :64], q_pe, latent[..., :64], k_pe, slots)
  with pytest.raises(ValueError, match="rope width 32"):
    call(q_lat, q_pe[..., :32], latent, k_pe[..., :32], slots)
  with pytest.raises(ValueError, match="128 selected slots are not a multiple of splits=3"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(splits=3))
  with pytest.raises(ValueError, match="issue_warps=3: the gather warpgroup's 1, 2 or 4 warps"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(issue_warps=3))
  # 128 entries a step at a 256-wide latent and a 128-wide rope: 264,264 bytes (the H200's lowering refused it)
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 1, 64, 256, 128, 128, 128, "bfloat16")
  with pytest.raises(ValueError, match="block_entries=128 at latent width 256 and rope width 128 needs 264,264"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(block_entries=128))


@pytest.mark.parametrize("c,r,e,fp8", [(512, 64, 64, False), (512, 64, 64, True), (256, 128, 128, False),
                                       (128, 64, 128, False)])
def test_the_smem_count_is_the_lowerings(c, r, e, fp8, monkeypatch):
  """`smem_bytes` is what the CUDA lowering allocates: under the limit the kernel lowers; above it the lowering's
  own refusal (reached with the kernel's check lifted) names the same count."""
  import jax_mtp.kernels.sparse_mla_mgpu as kernel  # noqa: PLC0415
  lat = jnp.float8_e4m3fn if fp8 else jnp.bfloat16
  need = kernel.smem_bytes(c, r, e, jnp.dtype(lat).itemsize, c // 128 if fp8 else 0)
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (((1, 1, 64, c), jnp.bfloat16), ((1, 1, 64, r),
          jnp.bfloat16), ((1, 256, c), lat), ((1, 256, r), jnp.bfloat16), ((1, 1, 128), jnp.int32))]
  args += [jax.ShapeDtypeStruct((1, 256, c // 128), jnp.float32)] if fp8 else []

  def lower():
    call = lambda *a: sparse_mla_mgpu(*a[:5], 1.0, latent_scale_BSG=a[5] if fp8 else None,  # noqa: E731
                                      config=Config(block_entries=e, splits=1))
    jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",))

  if need <= kernel.SMEM_BYTES:
    lower()
    return
  monkeypatch.setattr(kernel, "SMEM_BYTES", 10**9)
  try:
    with pytest.raises(ValueError, match=f"smem_bytes={need} > max_smem_bytes="):
      lower()
  finally:  # the launch traced with the check lifted is cached (the entry is jitted): no later trace may reuse it
    jax.clear_caches()


def test_the_direct_gathers_smem_count_is_the_lowerings():
  """The direct gather's shared memory (q~, q_pe, two 64-entry operand sets, one P, no staging) is what the CUDA
  lowering allocates: it lowers within that many bytes (under the H200's limit) and is refused one byte short, the
  refusal naming the count; a second P buffer would not fit."""
  from jax.experimental.mosaic.gpu import core as mgpu_core  # noqa: PLC0415

  import jax_mtp.kernels.sparse_mla_mgpu as kernel  # noqa: PLC0415
  config = Config(direct_gather=True, splits=1)
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
      ((1, 1, 64, 512), jnp.bfloat16), ((1, 1, 64, 64), jnp.bfloat16), ((1, 256, 512), jnp.bfloat16),
      ((1, 256, 64), jnp.bfloat16), ((1, 1, 128), jnp.int32))]
  need = kernel.smem_bytes(512, 64, 64, 2, sets=2, staged=False, p_sets=1)
  assert need == kernel.launch_smem_bytes(kernel.config_for(1, 64, 128, 512, config), args[2], args[3])
  assert need <= kernel.SMEM_BYTES < kernel.smem_bytes(512, 64, 64, 2, sets=2, staged=False)

  def lower(limit):
    jax.clear_caches()  # the entry is jitted: each limit lowers afresh
    with mgpu_core.artificial_shared_memory_limit(limit):
      jax.jit(lambda *a: sparse_mla_mgpu(*a, 1.0, config=config)).trace(*args).lower(lowering_platforms=("cuda",))

  lower(need)
  with pytest.raises(ValueError, match=f"smem_bytes={need} > max_smem_bytes={need - 1}"):
    lower(need - 1)
  jax.clear_caches()


def test_resolution():
  cfg = _kernel_cfg()
  # auto on a Hopper: the kernel, over a bf16 or an fp8 cache, any head count (padded to its 64-head blocks)
  assert resolve_sparse_attention_impl(cfg, "gpu") == "mosaic_gpu"
  assert resolve_sparse_attention_impl(cfg.replace(kv_cache_dtype="fp8"), "gpu") == "mosaic_gpu"
  assert resolve_sparse_attention_impl(cfg.replace(num_attention_heads=8), "gpu") == "mosaic_gpu"
  for platform in ("tpu", "cpu"):  # no TPU kernel; a CPU runs the kernel only when asked (its interpreter)
    assert resolve_sparse_attention_impl(cfg, platform) == "xla"
  assert resolve_sparse_attention_impl(cfg.replace(qk_rope_head_dim=16), "gpu") == "xla"  # auto: not the kernel's
  assert resolve_sparse_attention_impl(cfg.replace(sparse_attention_impl="xla"), "gpu") == "xla"
  explicit = _kernel_cfg(sparse_attention_impl="mosaic_gpu")
  assert resolve_sparse_attention_impl(explicit, "gpu") == resolve_sparse_attention_impl(explicit, "cpu") == "mosaic_gpu"
  with pytest.raises(ValueError, match="float32.*kv_lora_rank=16 is not a multiple of 128 up to 512; qk_rope_head_dim=8"):
    resolve_sparse_attention_impl(jax_mtp.tiny(sparse_attention_impl="mosaic_gpu"), "gpu")
  with pytest.raises(jax_mtp.ConfigError, match="sparse_attention_impl='pallas_gpu': the Pallas Triton sparse-MLA "
                     "kernel was removed.*use 'mosaic_gpu' or 'auto'"):
    _kernel_cfg(sparse_attention_impl="pallas_gpu")
  with pytest.raises(jax_mtp.ConfigError, match="sparse_attention_impl='flashmla'"):
    jax_mtp.tiny(sparse_attention_impl="flashmla")


@pytest.mark.parametrize("batch", [1, 2, 64])
def test_auto_runs_the_kernel_at_every_batch_in_the_lowered_step(batch):
  """`auto` in the MTP draft step exported for an H200 (T = 1: B queries): the Mosaic GPU kernel at one query as at
  64, and no Pallas Triton kernel anywhere in the program."""
  module = mtp_step_module(_kernel_cfg(), "cuda", batch, 64)
  assert KERNEL_NAME in module
  assert "xla.gpu.triton" not in module  # Pallas's Triton backend lowers to this custom call


def test_the_kernel_is_in_the_lowered_step_when_asked_for():
  assert KERNEL_NAME in mtp_step_module(_kernel_cfg(sparse_attention_impl="mosaic_gpu"), "cuda", 2, 64)
  assert KERNEL_NAME not in mtp_step_module(_kernel_cfg(sparse_attention_impl="xla"), "cuda", 2, 64)


def test_combine_splits_is_the_softmax_over_all_entries():
  """Two halves' normalised outputs and log-sum-exps merge to the whole softmax (fp32, exact-ish)."""
  rng = np.random.default_rng(3)
  scores, values = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 4))  # [Q, N, K], [K, C]
  halves = [(scores[..., i:i + 4], values[i:i + 4]) for i in (0, 4)]
  softmax = lambda s: np.exp(s - s.max(-1, keepdims=True)) / np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)  # noqa: E731
  outs = [np.einsum("qnk,kc->qnc", softmax(s), v) for s, v in halves]
  lses = [np.log(np.exp(s).sum(-1)) for s, _ in halves]
  got = combine_splits(jnp.asarray(np.stack(outs, 1), jnp.float32), jnp.asarray(np.stack(lses, 1), jnp.float32))
  assert_close(got, np.einsum("qnk,kc->qnc", softmax(scores), values), "float32", what="combined halves")


def test_speculative_decoding_with_the_kernel_keeps_xlas_tokens():
  """A bf16 DSA model (caches longer than top-16) decoding speculatively, target and drafter through the kernel
  (its interpreter on a CPU, compiled on a GPU) or XLA: the same tokens, the same drafts accepted. Every call shape
  goes through the kernel (prefill chunks, verification T = 3, drafts T = 1). On a CPU in the full form only: CI's
  bounded form is the attention test below."""
  if not ON_GPU and not FULL_TESTS:
    pytest.skip(f"on CPU: {FULL_ONLY}")
  assert_speculative_decoding_through_the_kernel_keeps_xlas_tokens()


@pytest.mark.parametrize("t,cache", [(1, "bfloat16"), (3, "bfloat16"), (3, "fp8")])
def test_the_models_attention_output_equals_xlas(t, cache):
  """The MTP layer's sparse attention heads (before o_proj; a 64-slot cache > top-16, padded to a 64-entry step;
  row 1 at early positions sees fewer than 16 slots) through the kernel and through XLA, with a bf16 and an fp8
  MLA cache (the kernel dequantises the codes, XLA the gathered entries)."""
  cfg = _kernel_cfg(kv_cache_dtype="fp8") if cache == "fp8" else _kernel_cfg()
  assert_models_attention_equals_xlas(cfg, "mosaic_gpu", t, f"attention output, T = {t}, {cache} cache")


GPU_CONFIGS = {"one buffer set": Config(double_buffered=False), "double-buffered": Config(double_buffered=True),
               "ids before the dots": Config(ids_before_dots=True), "direct gather": Config(direct_gather=True)}


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("form", GPU_CONFIGS)
@pytest.mark.parametrize("b,t", [(1, 1), (8, 1), (4, 4)])
def test_kernel_at_v32_widths_on_the_gpu(b, t, form):
  """V3.2's widths (128 heads × 512 latent + 64 rope, top-2048 of a 4,096-slot cache), compiled."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, 128, 512, 64, 4096, 2048, "bfloat16", seed=b)
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a, 512**-0.5, config=GPU_CONFIGS[form]))
  got = fn(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1))
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype="bfloat16")
  assert_close(got, xla, "bfloat16", what="Mosaic GPU kernel vs XLA")
  assert KERNEL_NAME in fn.lower(q_lat, q_pe, latent, k_pe, slots).compile().as_text()
