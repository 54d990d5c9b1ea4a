"""The Mosaic GPU sparse MLA with `Config.values_warpgroups=2` (a fourth warpgroup multiplies P · V's first half; the
scores warpgroup computes S, the online softmax and P only): equal to the float64 formula, and to the three-warpgroup
form at fp32's tolerance (the same products in other warpgroups; each values warpgroup's half in two [64, 128]
wgmmas, which a dot may sum in another order than one [64, 256]) in Pallas's GPU interpreter, over
two buffer sets and one, bf16 and fp8 caches, splits, one step and odd step counts, a 16-bit output (whose two halves
meet in shared memory before one copy out); free of shared-memory races under the interpreter's detector; lowered for
CUDA at V3.2's widths with its four warpgroups' registers within the launch's; refused with the forms it excludes.
On a GPU the same cases run compiled."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mtp.kernels.sparse_mla import dequantize_latent
from jax_mtp.kernels.sparse_mla_mgpu import (KERNEL_NAME, VALUES_APART_SUFFIX, Config, config_for, sparse_mla_mgpu,
                                             warpgroups)
from jax_mtp.kernels.sparse_mla_mgpu_plan import REGISTER_FILE, register_action, registers
from jax_mtp.mla import quantize_latent
from tests.sparse_mla_cases import formula, problem
from tests.tolerances import assert_close

ON_GPU = jax.devices()[0].platform == "gpu"
APART = Config(values_warpgroups=2)


def _attend(args, config, **kwargs):
  q_lat, q_pe, latent, k_pe, slots, scales = args
  return sparse_mla_mgpu(q_lat, q_pe, latent, k_pe, slots, 512**-0.5, latent_scale_BSG=scales, config=config,
                         interpret=not ON_GPU, **kwargs)


def _problem(t, k, fp8, seed):
  q_lat, q_pe, latent, k_pe, slots, valid = problem(2, t, 64, 512, 64, 192, k, "bfloat16", seed=seed)
  codes, scales = quantize_latent(latent, 128) if fp8 else (latent, None)
  values = dequantize_latent(codes, scales, jnp.bfloat16) if fp8 else latent
  want = formula(q_lat, q_pe, values, k_pe, slots, valid, 512**-0.5)
  return (q_lat, q_pe, codes, k_pe, jnp.where(valid, slots, -1), scales), want


@pytest.mark.parametrize("double,k,splits", [(True, 32, 1), (True, 96, 1), (True, 128, 2), (False, 128, 1),
                                             (False, 128, 2)],
                         ids=["two sets, one step", "two sets, three steps", "two sets, 2 splits of 2",
                              "one set, two steps", "one set, 2 splits of 1"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_two_values_warpgroups_equal_the_formula_and_the_three_warpgroup_form(double, k, splits, fp8):
  args, want = _problem(3, k, fp8, seed=k + splits)
  base = Config(double_buffered=double, splits=splits)
  got = _attend(args, dataclasses.replace(base, values_warpgroups=2))
  assert_close(got, want, "bfloat16", what="vs formula")
  assert_close(got, _attend(args, base), "float32", what="vs the three-warpgroup form")


@pytest.mark.parametrize("splits", [1, 2])
def test_a_16_bit_output_meets_in_shared_memory_from_both_values_warpgroups(splits):
  """One split writes bf16 halves through q~'s buffer, the first half's warpgroup copying both out once the second's
  has arrived: the fp32 output rounded (two splits: rounded after the combination)."""
  args, _ = _problem(2, 128, False, seed=7)
  config = Config(splits=splits, values_warpgroups=2)
  got = _attend(args, config, out_dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(_attend(args, config).astype(jnp.bfloat16)))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's race detector (on a CPU)")
@pytest.mark.parametrize("double", [True, False], ids=["two sets", "one set"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_no_shared_memory_race_with_two_values_warpgroups(double, fp8):
  """Three steps of one CTA: P and its rescale, read by both values warpgroups, rewritten only after both freed the
  step's operand set; the output's halves through q~'s buffer."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415
  args, want = _problem(1, 96 if double else 192, fp8, seed=19)
  args = tuple(x[:1] if x is not None else None for x in args)
  out = sparse_mla_mgpu(*args[:5], 512**-0.5, latent_scale_BSG=args[5], out_dtype=jnp.bfloat16,
                        config=Config(double_buffered=double, splits=1, values_warpgroups=2),
                        interpret=plgpu.InterpretGPUParams(detect_races=True))
  assert_close(out, want[:1], "bfloat16", what="vs formula")


def test_the_four_warpgroups_registers_fit_the_launch():
  """Each form's per-thread registers summed over its warpgroups are within the register file's share for its
  threads (a sum above it would block setmaxnreg forever), and each role's action matches what ptxas gave."""
  for values in (1, 2):
    config = Config(values_warpgroups=values)
    groups, counts = warpgroups(config), registers(values)
    roles = ["scores", "gather"] + ["values"] * values
    assert len(roles) == groups
    assert sum(counts[role] for role in roles) * 128 <= REGISTER_FILE
    assert all(counts[role] % 8 == 0 and 24 <= counts[role] <= 256 for role in roles)
  assert [register_action(registers(2)[role], 4) for role in ("scores", "values", "gather")] == \
      ["decrease", "increase", "decrease"]
  assert [register_action(registers(1)[role], 3) for role in ("scores", "values", "gather")] == \
      ["increase", "decrease", "decrease"]


@pytest.mark.parametrize("double", [True, False], ids=["two sets", "one set"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_two_values_warpgroups_lower_for_cuda_at_v32_widths(double, fp8):
  """128 heads × 512 + 64, top-2048 of a 32K cache, B = 64 × T = 4 (verification): four warpgroups, the kernel's
  name saying so."""
  b, t = 64, 4
  shapes = [((b, t, 128, 512), jnp.bfloat16), ((b, t, 128, 64), jnp.bfloat16),
            ((b, 32768, 512), jnp.float8_e4m3fn if fp8 else jnp.bfloat16), ((b, 32768, 64), jnp.bfloat16),
            ((b, t, 2048), jnp.int32), ((b, 32768, 4), jnp.float32)]
  config = Config(double_buffered=double, values_warpgroups=2)
  fn = jax.jit(lambda *a: sparse_mla_mgpu(*a[:5], 512**-0.5, latent_scale_BSG=a[5] if fp8 else None,
                                          out_dtype=jnp.bfloat16, config=config))
  text = fn.trace(*(jax.ShapeDtypeStruct(*x) for x in shapes)).lower(lowering_platforms=("cuda",)).as_text()
  assert KERNEL_NAME in text and VALUES_APART_SUFFIX in text


def test_config_for_keeps_values_warpgroups_and_it_is_off_by_default():
  assert config_for(256, 128, 2048, 512, APART).values_warpgroups == 2
  assert config_for(1, 128, 2048, 512, APART).values_warpgroups == 2
  assert config_for(256, 128, 2048, 512).values_warpgroups == 1  # untimed: off


@pytest.mark.parametrize("config,match", [
    (Config(values_warpgroups=3), "values_warpgroups=3: one or two warpgroups"),
])
def test_the_forms_it_excludes_are_refused(config, match):
  args, _ = _problem(1, 64, False, seed=1)
  with pytest.raises(ValueError, match=match):
    _attend(args, config)
