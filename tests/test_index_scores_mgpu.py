"""The index-scores kernel on Pallas Mosaic GPU (kernels/index_scores_mgpu.py): equal to XLA's formulation and to
a float64 formula on awkward shapes (bf16 / f16), with and without the positions bound, in Pallas's GPU interpreter
(TMA copies, barriers and wgmma simulated on the CPU); lowered for CUDA at any T (the Mosaic GPU lowering runs on
any host); in the CUDA program of the MTP step when asked for and under `auto`; refused with the offending values
where it cannot run. On a GPU, the same cases run compiled."""

import jax
import jax.numpy as jnp
import pytest

import jax_mtp
from jax_mtp import indexer
from jax_mtp.indexer import quantize_queries, resolve_index_scores_impl
from jax_mtp.kernels.index_scores import KERNEL_NAME as TPU_KERNEL
from jax_mtp.kernels.index_scores_mgpu import (FLOAT8_DOT_SUFFIX, KERNEL_NAME, MIN_STEPS_PER_CTA, Config, config_for,
                                              index_scores_mgpu, leaves_a_cta_empty, uneven_splits)
from tests.index_scores_cases import (assert_equals_xla_and_the_formula, assert_positions_bound_the_scored_slots,
                                       inputs, keys_as)
from tests.lowered_step import mtp_step_module

ON_GPU = jax.devices()[0].platform == "gpu"


def _scores(*args, **kwargs):
  return index_scores_mgpu(*args, interpret=not ON_GPU, **kwargs)


# Config.keys_in_registers: compiled only (Pallas's GPU interpreter runs no wgmma with a register operand, so there
# the keys stay in shared memory; its CUDA lowering is tested below)
REGISTERS = [False, pytest.param(True, marks=pytest.mark.skipif(not ON_GPU, reason="keys_in_registers: compiled "
                                                                "only (the interpreter has no register-operand wgmma)"))]


# (2, 3, 8, 32, 640, 64, 3): an uneven split (10 key blocks over 3 CTAs: 4, 4, 2), the last CTA's window ending at
# the row's end, as the CLI's capacities need (4,352 slots: 34 blocks)
@pytest.mark.parametrize("b,t,i,j,s,block,splits", [(1, 1, 16, 16, 128, 64, 1), (3, 3, 8, 32, 384, 128, 3),
                                                     (2, 5, 16, 64, 512, 64, 2), (1, 4, 64, 128, 256, 128, 0),
                                                     (2, 3, 8, 32, 640, 64, 3)])
@pytest.mark.parametrize("keys", ["bfloat16", "float16"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("registers", REGISTERS)
def test_kernel_equals_xla_and_the_formula(b, t, i, j, s, block, splits, keys, overlap, registers):
  q, k, w = inputs(b, t, i, j, s)
  k, _, dot = keys_as(k, keys)
  got = _scores(q.astype(dot), k, w, 0.25, config=Config(block_slots=block, splits=splits, overlap_queries=overlap,
                                                         keys_in_registers=registers))
  assert_equals_xla_and_the_formula(got, q, k, w, 0.25, k_scale=None, dot=dot, what=f"kernel, {keys} keys")


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("keys", ["bfloat16", "float8_e4m3fn", "float8 q"])
@pytest.mark.parametrize("overlap", [False, True])
def test_no_shared_memory_race_between_the_warpgroups(keys, overlap):
  """The GPU interpreter's race detector (vector clocks over every shared-memory access, TMA copies included) finds
  no unordered access over several key blocks and splits, bf16 keys, float8 keys widened in shared memory and
  float8 keys beside float8 q; it raises at the first race."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  q, k, w = inputs(2, 3, 16, 64, 384)
  k, k_scale, dot = keys_as(k, "float8_e4m3fn" if keys == "float8 q" else keys)
  q = quantize_queries(q, w, k.dtype) if keys == "float8 q" else (q.astype(dot), w)
  q, w = q
  got = index_scores_mgpu(q, k, w, 0.25, k_scale_BS=k_scale,
                          config=Config(block_slots=64, splits=2, overlap_queries=overlap),
                          interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_equals_xla_and_the_formula(got, q, k, w, 0.25, k_scale=k_scale, dot=dot, what=f"race-checked, {keys} keys")


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
def test_no_shared_memory_race_with_an_uneven_split():
  """7 key blocks over 2 CTAs (4, 3; the last CTA's window ends at the row's end) with positions: no race."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  q, k, w = inputs(2, 3, 16, 64, 448)
  q, k = q.astype(jnp.bfloat16), k.astype(jnp.bfloat16)
  positions = jnp.asarray([[300, 301, 447], [10, 11, 12]], jnp.int32)
  got = index_scores_mgpu(q, k, w, 0.25, positions_BT=positions, config=Config(block_slots=64, splits=2),
                          interpret=plgpu.InterpretGPUParams(detect_races=True))
  full = index_scores_mgpu(q, k, w, 0.25, config=Config(block_slots=64, splits=7), interpret=True)
  seen = jnp.arange(448)[None, None] // 64 * 64 <= positions.max(-1)[:, None, None]  # one query block of 3
  assert_equals_xla_and_the_formula(jnp.where(seen, got, full), q, k, w, 0.25, k_scale=None, dot=jnp.bfloat16,
                                    what="race-checked, uneven split")
  assert not jnp.where(seen, 0.0, got).any()  # the unseen blocks are zeros, up to the row's end


@pytest.mark.parametrize("b,t,i,j,s,block,splits", [(1, 1, 16, 32, 128, 64, 1), (2, 5, 16, 128, 512, 128, 2),
                                                     (1, 2, 16, 32, 640, 64, 4)])  # uneven: 3, 3, 3, 1 blocks
@pytest.mark.parametrize("keys", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("registers", REGISTERS)
def test_float8_keys_equal_xla_and_the_formula(b, t, i, j, s, block, splits, keys, overlap, registers):
  """Keys widened to bf16 in shared memory (exact) and their per-key scales on the fp32 logits, as XLA's form."""
  q, k, w = inputs(b, t, i, j, s)
  k, k_scale, dot = keys_as(k, keys)
  got = _scores(q.astype(dot), k, w, 0.25, k_scale_BS=k_scale,
                config=Config(block_slots=block, splits=splits, overlap_queries=overlap, keys_in_registers=registers))
  assert_equals_xla_and_the_formula(got, q, k, w, 0.25, k_scale=k_scale, dot=dot, what=f"kernel, {keys} keys")


@pytest.mark.parametrize("b,t,i,j,s,block,splits", [(1, 1, 16, 32, 128, 64, 1), (2, 5, 16, 128, 512, 128, 2)])
@pytest.mark.parametrize("keys", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("overlap", [False, True])
def test_float8_queries_beside_float8_keys_equal_xla_and_the_formula(b, t, i, j, s, block, splits, keys, overlap):
  """q in the keys' float8 (`quantize_queries`, its scales in w): a float8 × float8 wgmma over the keys as they
  landed, equal to XLA's form (whose bf16 dot takes the same values exactly) and to the float64 formula: within fp32's
  summation order in the interpreter, within the tensor cores' float8 accumulation compiled."""
  q, k, w = inputs(b, t, i, j, s)
  k, k_scale, dot = keys_as(k, keys)
  q8, w8 = quantize_queries(q, w, k.dtype)
  got = _scores(q8, k, w8, 0.25, k_scale_BS=k_scale,
                config=Config(block_slots=block, splits=splits, overlap_queries=overlap))
  assert_equals_xla_and_the_formula(got, q8, k, w8, 0.25, k_scale=k_scale, dot=dot, what=f"kernel, {keys} q and keys",
                                    tolerance="float8_wgmma" if ON_GPU else "float32")


@pytest.mark.parametrize("bound_reads,splits", [(False, 2), (True, 2), (True, 3)])
@pytest.mark.parametrize("t,tokens", [(5, 4), (3, 1), (3, 4)])
def test_positions_bound_the_scored_slots(t, tokens, bound_reads, splits):
  """Steps past a query block's last position are zeros (with bound_reads never read: the pipeline is shorter),
  also where the split is uneven (8 key blocks over 3 CTAs: the last one's zeros stop at the row's end)."""
  config = Config(block_slots=64, block_tokens=tokens, splits=splits, bound_reads=bound_reads)
  assert_positions_bound_the_scored_slots(
      lambda q, k, w, scale, positions: _scores(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), w, scale,
                                                positions_BT=positions, config=config), t, tokens, 64, j=32)


@pytest.mark.parametrize("t", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("overlap,registers", [(False, False), (True, False), (True, True)])
def test_kernel_lowers_for_cuda_at_any_t(t, overlap, registers):
  """The Mosaic GPU lowering (TMA descriptors, wgmma operand layouts) at V3.2's widths, with and without positions."""
  args = (jax.ShapeDtypeStruct((2, t, 64, 128), jnp.bfloat16), jax.ShapeDtypeStruct((2, 4096, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((2, t, 64), jnp.float32))
  for positions, bound_reads in [(None, False), (jax.ShapeDtypeStruct((2, t), jnp.int32), False),
                                 (jax.ShapeDtypeStruct((2, t), jnp.int32), True)]:
    fn = jax.jit(lambda q, k, w, p, b=bound_reads: index_scores_mgpu(
        q, k, w, 0.5, positions_BT=p, config=Config(bound_reads=b, overlap_queries=overlap,
                                                    keys_in_registers=registers)))
    text = fn.trace(*args, positions).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and KERNEL_NAME in text
  k8 = jax.ShapeDtypeStruct((2, 4096, 128), jnp.float8_e4m3fn)
  for q, in_registers in [(args[0], registers), (jax.ShapeDtypeStruct(args[0].shape, jnp.float8_e4m3fn), False)]:
    fp8 = jax.jit(lambda q, k, w, ks, r=in_registers: index_scores_mgpu(  # bf16 q (keys widened), float8 q
        q, k, w, 0.5, k_scale_BS=ks, config=Config(overlap_queries=overlap, keys_in_registers=r)))
    text = fp8.trace(q, k8, args[2], jax.ShapeDtypeStruct((2, 4096), jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert KERNEL_NAME in text


@pytest.mark.parametrize("keys", [jnp.bfloat16, jnp.float8_e4m3fn])
def test_an_uneven_split_lowers_for_cuda_at_the_clis_capacity(keys):
  """4,352 slots (the CLI's capacity for a 4K prompt: 34 key blocks) over 7 CTAs (5 blocks each, the last 4), with positions."""
  b, t = 1, 4
  args = [jax.ShapeDtypeStruct((b, t, 64, 128), jnp.bfloat16), jax.ShapeDtypeStruct((b, 4352, 128), keys),
          jax.ShapeDtypeStruct((b, t, 64), jnp.float32), jax.ShapeDtypeStruct((b, t), jnp.int32)]
  scaled = keys == jnp.float8_e4m3fn
  fn = jax.jit(lambda q, k, w, p, *ks: index_scores_mgpu(q, k, w, 0.5, positions_BT=p, k_scale_BS=ks[0] if ks else None,
                                                          config=Config(splits=7)))
  extra = [jax.ShapeDtypeStruct((b, 4352), jnp.float32)] if scaled else []
  assert KERNEL_NAME in fn.trace(*args, *extra).lower(lowering_platforms=("cuda",)).as_text()


def test_config_fills_the_machine():
  assert config_for(1, 4, 131072).splits == 256  # 1 query block: 264 CTAs wanted, each ≥ 4 of the 1,024 steps
  assert config_for(64, 4, 131072).splits == 8  # 64 query blocks × 8 ≥ 264
  assert config_for(64, 4, 131072).block_tokens == 4 and config_for(2, 3, 256).block_tokens == 3
  assert config_for(1, 1, 256).splits == 1  # 2 steps: one CTA
  assert config_for(8, 1, 4096).splits == 8  # 32 steps: 8 × 8 = 64 CTAs of 4 steps


def test_config_splits_unevenly_where_no_divisor_fills_two_waves():
  """The CLI's capacities (a 4K prompt: 4,352 slots = 34 steps; 32K: 33,024 = 258): where no divisor of the steps
  gives two CTAs a core with ≥ 4 steps each, the fewest waves × steps a CTA over uneven splits too (RESULTS
  2026-12-07 15:27: 9 uneven CTAs 1.1–2.3× faster than 2 at B = 1 and 8)."""
  assert uneven_splits(34)[-1] == 9 and leaves_a_cta_empty(34, 10)  # ⌈34 / 10⌉ = 4: the tenth CTA would get none
  # B = 1, 8: one wave of 4 steps; B = 64: 2 splits, one wave of 17 steps (5 would be 3 waves of 7)
  assert [config_for(b, 4, 4352).splits for b in (1, 8, 64)] == [9, 9, 2]
  assert config_for(1, 4, 33024).splits == 65 and config_for(8, 4, 33024).splits == 43  # 8 × 43 ≥ 264: a divisor
  assert config_for(1, 4, 4352, Config(bound_reads=False)).splits == 2  # an uneven split needs bound_reads
  assert config_for(1, 1, 4096).splits == 8 and config_for(8, 1, 32768).splits == 64  # divisors as before
  for steps in (34, 66, 258, 1026):
    assert all(-(-steps // s) >= MIN_STEPS_PER_CTA and not leaves_a_cta_empty(steps, s)
               for s in uneven_splits(steps)[1:])


def test_config_reads_16_bit_keys_into_registers_and_widens_float8_ones_in_shared_memory():
  """As timed on the H200 (Config.keys_in_registers): unset, it follows the keys' dtype; set, it is kept."""
  assert config_for(64, 4, 131072).keys_in_registers is True
  assert config_for(64, 4, 131072, float8_keys=True).keys_in_registers is False
  assert config_for(64, 4, 131072, Config(keys_in_registers=False)).keys_in_registers is False
  assert config_for(64, 4, 131072, Config(keys_in_registers=True), float8_keys=True).keys_in_registers is True


@pytest.mark.parametrize("float8_dot", [False, True])
def test_an_fp8_key_cache_gives_the_kernel_q_as_indexer_float8_scores_dot_says(monkeypatch, float8_dot):
  """The kernel's q operand ([B, T·I, J] as the call passes it, the keys [B, S, J] beside it) in the CUDA step of a
  model with an fp8 key cache: q's float8 values in bf16 (the keys widened) while FLOAT8_SCORES_DOT is off, float8
  (a float8 × float8 wgmma) once it is on."""
  monkeypatch.setattr(indexer, "FLOAT8_SCORES_DOT", float8_dot)
  step = mtp_step_module(_model_cfg(index_cache_dtype="fp8", index_head_dim=32), "cuda", 2, 512)
  (call,) = [line for line in step.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
  q = "f8E4M3FN" if float8_dot else "bf16"
  assert call[call.rindex(": ("):].startswith(f": (tensor<2x16x32x{q}>, tensor<2x512x32xf8E4M3FN>")
  assert (KERNEL_NAME + FLOAT8_DOT_SUFFIX in step) == float8_dot  # its name says which form (benchmarks.e2e reads it)


def test_kernel_refuses_what_it_cannot_run():
  q, k, w = (x.astype(jnp.bfloat16) for x in inputs(1, 1, 16, 16, 256))
  with pytest.raises(ValueError, match="200 is not a multiple of block_slots=128"):
    index_scores_mgpu(q, k[:, :200], w, 1.0)
  with pytest.raises(ValueError, match="splits=3 over 4 key blocks leaves a CTA none"):
    index_scores_mgpu(q, k, w, 1.0, config=Config(block_slots=64, splits=3))  # 2, 2, 0
  with pytest.raises(ValueError, match="splits=3 does not divide 5 key blocks: .* takes bound_reads=True"):
    index_scores_mgpu(q, jnp.pad(k, [(0, 0), (0, 64), (0, 0)]), w, 1.0,
                      config=Config(block_slots=64, splits=3, bound_reads=False))
  with pytest.raises(ValueError, match="float8_e4m3fn with k_scale_BS None: float8 keys take one scale a key"):
    index_scores_mgpu(q, k.astype(jnp.float8_e4m3fn), w, 1.0)
  with pytest.raises(ValueError, match="a multiple of 32 \\(got 16\\)"):
    index_scores_mgpu(q, k.astype(jnp.float8_e4m3fn), w, 1.0, k_scale_BS=jnp.ones((1, 256)))
  with pytest.raises(ValueError, match="q float32 and keys float32: q must be bfloat16 or float16"):
    index_scores_mgpu(q.astype(jnp.float32), k.astype(jnp.float32), w, 1.0)
  q32, k32 = (x.astype(jnp.bfloat16) for x in inputs(1, 1, 16, 32, 256)[:2])
  with pytest.raises(ValueError, match="q float8_e4m3fn and keys float8_e5m2: .* q in the float8 keys' own dtype"):
    index_scores_mgpu(q32.astype(jnp.float8_e4m3fn), k32.astype(jnp.float8_e5m2), w, 1.0, k_scale_BS=jnp.ones((1, 256)))
  with pytest.raises(ValueError, match="keys_in_registers loads 16-bit keys .* with q float8_e4m3fn"):
    index_scores_mgpu(q32.astype(jnp.float8_e4m3fn), k32.astype(jnp.float8_e4m3fn), w, 1.0,
                      k_scale_BS=jnp.ones((1, 256)), config=Config(keys_in_registers=True))
  with pytest.raises(ValueError, match="do not agree"):
    index_scores_mgpu(q, k[..., :8], w, 1.0)
  with pytest.raises(ValueError, match="index heads 12"):
    index_scores_mgpu(q[:, :, :12], k, w[:, :, :12], 1.0)
  with pytest.raises(ValueError, match=r"positions_BT of shape \(1, 2\)"):
    index_scores_mgpu(q, k, w, 1.0, positions_BT=jnp.zeros((1, 2), jnp.int32))


def _model_cfg(**overrides):
  return jax_mtp.tiny(**{"dtype": "bfloat16", "param_dtype": "bfloat16", "index_n_heads": 16,
                         "index_scores_impl": "mosaic_gpu", **overrides})


def test_the_kernel_is_in_the_clis_lowered_step_when_asked_for():
  assert KERNEL_NAME in mtp_step_module(_model_cfg(), "cuda", 2, 512)
  # auto: this kernel on CUDA (not Triton's: neither name contains the other), neither on a TPU
  auto_cuda = mtp_step_module(_model_cfg(index_scores_impl="auto"), "cuda", 2, 512)
  assert KERNEL_NAME in auto_cuda and TPU_KERNEL not in auto_cuda
  assert KERNEL_NAME not in mtp_step_module(_model_cfg(index_scores_impl="auto"), "tpu", 2, 512)
  assert resolve_index_scores_impl(_model_cfg(), "gpu", 512) == "mosaic_gpu"
  fp8_keys_cfg = _model_cfg(index_cache_dtype="fp8", index_head_dim=32)
  assert resolve_index_scores_impl(fp8_keys_cfg, "gpu", 512) == "mosaic_gpu"
  assert KERNEL_NAME in mtp_step_module(fp8_keys_cfg, "cuda", 2, 512)
  fp8_keys_16 = _model_cfg(index_cache_dtype="fp8", index_head_dim=16)
  with pytest.raises(ValueError, match="float8 keys of a head dim that is a multiple of 32, not index_head_dim=16"):
    resolve_index_scores_impl(fp8_keys_16, "gpu", 512)
  assert resolve_index_scores_impl(fp8_keys_16.replace(index_scores_impl="auto"), "gpu", 512) == "xla"
