"""The Mosaic GPU sparse MLA with a landing ring (`sparse_mla_mgpu.Config.landing_ring`: two 48-entry operand sets,
the rows landing in a ring of three 8-row groups, `kernels/sparse_mla_mgpu_ring.py`): equal to a float64 formula and
to XLA's path at V3.2's latent width in Pallas's GPU interpreter (one step, an odd step count, selections padded to
whole steps per split, two head blocks, fp16, a 16-bit output), free of shared-memory races under the interpreter's
detector, lowered for CUDA at V3.2's widths on this jax (tests/test_sparse_mla_mgpu.py's lowering test holds the
form too), fitting shared memory, and refused with the offending values where it cannot run. On a GPU the same
cases run compiled."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.sparse_mla import reference
from jax_mtp.kernels.sparse_mla_mgpu import (FORM_SUFFIXES, KERNEL_NAME, SMEM_BYTES, Config, config_for,
                                             padded_entries, smem_bytes, sparse_mla_mgpu)
from jax_mtp.kernels.sparse_mla_mgpu_ring import GROUP_ROWS, RING_ENTRIES, RING_SLOTS
from jax_mtp.mla import quantize_latent
from tests.sparse_mla_cases import formula, problem
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"
RING = Config(landing_ring=True)


def _attend(*args, **kwargs):
  return sparse_mla_mgpu(*args, interpret=not ON_GPU, **kwargs)


@pytest.mark.parametrize("b,t,n,k,splits,dtype", [
    (1, 1, 64, 48, 1, "bfloat16"),  # one step: the second operand set unused, the ids' fetch past the selection
    (1, 2, 64, 144, 1, "bfloat16"),  # three steps: set 0 twice, the next step's groups copied from group 3 on
    (2, 1, 128, 200, 2, "bfloat16"),  # 200 slots in 2 splits: each padded to 3 steps (144); two head blocks
    (1, 3, 64, 192, 0, "float16"),  # config_for's splits (2 of 2 steps), fp16
], ids=["one step", "three steps", "padded splits, two head blocks", "config_for's splits, fp16"])
def test_the_landing_ring_equals_the_formula_and_xla(b, t, n, k, splits, dtype):
  q_lat, q_pe, latent, k_pe, slots, valid = problem(b, t, n, 512, 64, 300, k, dtype, seed=k)
  got = _attend(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5,
                config=Config(landing_ring=True, splits=splits))
  # 16-bit probabilities enter the output dot (as FlashMLA's and the XLA path's): the 16-bit row
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="ring vs formula")
  xla = reference(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5, dot_dtype=jnp.dtype(dtype))
  assert_close(got, xla, "bfloat16", what="landing ring vs XLA")


def test_a_16_bit_output_is_the_fp32_output_rounded():
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 1, 64, 512, 64, 256, 96, "bfloat16", seed=3)
  call = functools.partial(_attend, q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 0.05,
                           config=Config(landing_ring=True, splits=1))
  got = call(out_dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(call().astype(jnp.bfloat16)))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
def test_no_shared_memory_race_in_the_ring():
  """Three steps of one CTA under the interpreter's race detector (vector clocks over every shared-memory access, the
  TMA copies' included): a ring slot's next copies land only after every warp has read it, a step's ids are fetched
  over only after its last group's copies were issued, an operand set is re-laid only after its dots."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 1, 64, 512, 64, 192, 144, "bfloat16", seed=17)
  out = sparse_mla_mgpu(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5,
                        config=Config(landing_ring=True, splits=1),
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_close(out, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")


@pytest.mark.parametrize("b,t", [(1, 1), (64, 4)])
def test_the_ring_lowers_for_cuda_at_v32_widths(b, t):
  """128 heads × 512 + 64, top-2048 of a 32K cache (42⅔ steps: padded to 43), named as its form."""
  shapes = [((b, t, 128, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16), ((b, 32768, 512), jnp.bfloat16),
            ((b, 32768, 64), jnp.bfloat16), ((b, t, 2048), jnp.int32)]
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a, 512**-0.5, out_dtype=jnp.bfloat16, config=RING))
  text = fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",)).as_text()
  assert KERNEL_NAME + FORM_SUFFIXES["landing ring"] in text
  assert KERNEL_NAME + FORM_SUFFIXES["two sets"] not in text


def test_the_ring_fits_where_two_staged_48_entry_sets_do_not():
  ring = smem_bytes(512, 64, RING_ENTRIES, 2, sets=2, ring=True)
  assert ring == 226_416 <= SMEM_BYTES < smem_bytes(512, 64, RING_ENTRIES, 2, sets=2)
  # its landing area: RING_SLOTS groups of GROUP_ROWS rows, against two sets' worth of staging
  staged = smem_bytes(512, 64, RING_ENTRIES, 2, sets=2) - ring
  assert staged == (2 * RING_ENTRIES - RING_SLOTS * GROUP_ROWS) * (512 + 64) * 2 - 8 * (RING_SLOTS - 2)  # (barriers)


def test_config_for_the_ring():
  """48 entries a step in two operand sets; the one-wave splits, each at least two steps; the slots padded to whole
  steps per split."""
  for queries, splits in [(1, 16), (8, 8), (32, 2), (64, 1), (256, 1)]:
    config = config_for(queries, 128, 2048, 512, RING)
    assert (config.block_entries, config.double_buffered, config.splits) == (RING_ENTRIES, True, splits)
  assert config_for(1, 128, 192, 512, RING).splits == 2  # 4 steps: no more splits than leave two steps each
  assert padded_entries(2048, config_for(64, 128, 2048, 512, RING)) == 43 * 48
  assert padded_entries(2048, config_for(1, 128, 2048, 512, RING)) == 16 * 3 * 48
  assert padded_entries(2048, config_for(64, 128, 2048, 512)) == 2048  # the other forms take whole steps only


def test_the_ring_refuses_what_it_cannot_run():
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 1, 64, 512, 64, 128, 96, "bfloat16")
  call = functools.partial(sparse_mla_mgpu, scale=1.0, interpret=True)
  codes, scales = quantize_latent(latent, 128)
  with pytest.raises(ValueError, match="landing_ring takes .*16-bit cache.*float8_e4m3fn"):
    call(q_lat, q_pe, codes, k_pe, slots, latent_scale_BSG=scales, config=RING)
  with pytest.raises(ValueError, match="landing_ring takes .*values_relayout=True"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(landing_ring=True, values_relayout=True))
  with pytest.raises(ValueError, match="landing_ring takes .*whole_rows=False"):
    call(q_lat, q_pe, latent, k_pe, slots, config=Config(landing_ring=True, whole_rows=False))
  narrow = problem(1, 1, 64, 256, 64, 128, 96, "bfloat16")
  with pytest.raises(ValueError, match="landing_ring takes .*a latent of width 256"):
    call(*narrow[:5], config=RING)
