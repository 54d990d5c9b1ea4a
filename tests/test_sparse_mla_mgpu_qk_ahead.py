"""The Mosaic GPU sparse MLA with `Config.qk_ahead` (the scores warpgroup issues a step's P · V and the next step's
qk in one wgmma scope): equal to the float64 formula and to the form without it (the same products, summed in the
same order) in Pallas's GPU interpreter over the two-set form, one step and odd step counts, free of shared-memory races under the interpreter's detector, lowered for CUDA at V3.2's widths, and
refused where it cannot run. The interpreter runs the products one wait each (it has no `pl.run_state`), so the
one-scope issue is checked by the CUDA lowering here and by these cases compiled on a GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.sparse_mla_mgpu import Config, config_for, sparse_mla_mgpu
from jax_mtp.mla import quantize_latent
from tests.sparse_mla_cases import formula, problem
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"
FORMS = {"two sets": Config(double_buffered=True, splits=1)}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("steps", [1, 3])
def test_qk_ahead_equals_the_formula_and_the_form_without_it(form, steps):
  """One step (no next qk: the loop is empty, the last step's P · V alone) and three (set 0 twice)."""
  config = FORMS[form]
  k = steps * config_for(2, 64, 2048, 512, config).block_entries
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 2, 64, 512, 64, 300, k, "bfloat16", seed=steps)

  def attend(config):
    return sparse_mla_mgpu(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5, config=config,
                           interpret=not ON_GPU)

  got = attend(dataclasses.replace(config, qk_ahead=True))
  assert_close(got, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what=f"{form} vs formula")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(attend(config)))


def test_qk_ahead_over_an_fp8_cache_equals_the_form_without_it():
  """The scores warpgroup's order is the cache's dtype's concern nowhere: over the fp8 MLA cache (dequantised in the
  gather's re-layout) the two-set form gives the same output with and without qk_ahead."""
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 2, 64, 512, 64, 300, 96, "bfloat16", seed=4)
  codes, scales = quantize_latent(latent, 128)

  def attend(**options):
    return sparse_mla_mgpu(q_lat, q_pe, codes, k_pe, jnp.where(valid, slots, -1), 512**-0.5, latent_scale_BSG=scales,
                           config=Config(double_buffered=True, splits=1, **options), interpret=not ON_GPU)

  np.testing.assert_array_equal(np.asarray(attend(qk_ahead=True)), np.asarray(attend()))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("form", FORMS)
def test_no_shared_memory_race_with_qk_ahead(form):
  """Three steps: a set freed only after the next step's qk, which waited for the next set."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  config = dataclasses.replace(FORMS[form], qk_ahead=True)
  k = 3 * config_for(1, 64, 2048, 512, config).block_entries
  q_lat, q_pe, latent, k_pe, slots, valid = problem(1, 1, 64, 512, 64, 192, k, "bfloat16", seed=11)
  out = sparse_mla_mgpu(q_lat, q_pe, latent, k_pe, jnp.where(valid, slots, -1), 512**-0.5, config=config,
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_close(out, formula(q_lat, q_pe, latent, k_pe, slots, valid, 512**-0.5), "bfloat16", what="vs formula")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("b,t", [(1, 2), (64, 4)])
def test_qk_ahead_lowers_for_cuda_at_v32_widths(form, b, t):
  """The one-scope issue (two accumulators in one pl.run_state, a barrier wait between their wgmmas) lowers."""
  shapes = [((b, t, 128, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16), ((b, 32768, 512), jnp.bfloat16),
            ((b, 32768, 64), jnp.bfloat16), ((b, t, 2048), jnp.int32)]
  config = dataclasses.replace(FORMS[form], qk_ahead=True, splits=0)
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a, 512**-0.5, out_dtype=jnp.bfloat16, config=config))
  text = fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def test_qk_ahead_takes_two_sets_and_is_dropped_where_auto_picks_one():
  q_lat, q_pe, latent, k_pe, slots, _ = problem(1, 2, 64, 512, 64, 128, 64, "bfloat16")  # 2 queries: two sets
  for config in (Config(double_buffered=False, qk_ahead=True), Config(qk_ahead=True, ids_before_dots=True)):
    with pytest.raises(ValueError, match="qk_ahead takes two operand sets .* and no ids_before_dots"):
      sparse_mla_mgpu(q_lat, q_pe, latent, k_pe, slots, 1.0, config=config, interpret=True)
  assert not config_for(1, 128, 2048, 512, Config(qk_ahead=True)).qk_ahead  # one query: auto's one set
  assert config_for(8, 128, 2048, 512, Config(qk_ahead=True)).qk_ahead
