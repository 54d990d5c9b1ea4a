"""Bad draft-step inputs raise a `ValueError` that names the offending value, both from
`MtpPredictor.__call__` (through `model.apply`, not jitted, so values are concrete) and from
`validate_inputs` itself. Under `jax.jit` the shape / dtype checks still raise (they are static);
the value checks cannot run on tracers, which is documented: validate before jitting.

Every bad case changes exactly one thing in a valid step (`_step()`), whose ids and positions sit on
the allowed boundaries (id 255 = vocab − 1, position 7 = max_position_embeddings − 1).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import init_caches, validate_inputs
from jax_mtp.cache import init_layer_cache

CFG = jax_mtp.tiny(max_position_embeddings=8)  # below the cache capacity, so it is the binding limit
B, T, CAPACITY = 2, 3, 16
MODEL = jax_mtp.MtpPredictor(CFG)


@pytest.fixture(scope="module")
def params():
  return jax.jit(jax_mtp.init_params, static_argnums=0)(CFG, jax.random.key(0))


def _step(**changes) -> dict:
  """A valid draft step (ids 0..255 and positions 0..7 both reached), with `changes` applied."""
  step = dict(
      input_ids_BT=jnp.array([[0, 17, 255], [3, 255, 128]], jnp.int32),
      positions_BT=jnp.array([[0, 1, 2], [5, 6, 7]], jnp.int32),
      prev_hidden_BTD=jax.random.normal(jax.random.key(1), (B, T, CFG.hidden_size), jnp.float32),
      caches=init_caches(CFG, B, CAPACITY),
  )
  step.update(changes)
  return step


def _call(how: str, params, step: dict) -> None:
  if how == "apply":
    MODEL.apply({"params": params}, **step)
  elif how == "jit-apply":
    jax.jit(MODEL.apply)({"params": params}, **step)
  else:
    validate_inputs(CFG, step["input_ids_BT"], step["positions_BT"], step["prev_hidden_BTD"], step["caches"])


def test_valid_step_runs(params):
  """The unchanged step passes validation and runs (jitted, for speed) to a finite [B, T, D] hidden."""
  step = _step()
  validate_inputs(CFG, *step.values())
  out = jax.jit(MODEL.apply)({"params": params}, **step)
  assert out.hidden_BTD.shape == (B, T, CFG.hidden_size)
  assert np.isfinite(np.asarray(out.hidden_BTD)).all()


_GOOD = _step()
ids, positions, hidden = _GOOD["input_ids_BT"], _GOOD["positions_BT"], _GOOD["prev_hidden_BTD"]
VALUE_CASES = [
    pytest.param(dict(input_ids_BT=ids.at[1, 2].set(256)),
                 "input_ids value 256 is outside [0, 256) (vocab_size=256)", id="id-equals-vocab"),
    pytest.param(dict(input_ids_BT=ids.at[1, 2].set(100_000)),
                 "input_ids value 100000 is outside [0, 256) (vocab_size=256)", id="id-above-vocab"),
    pytest.param(dict(input_ids_BT=ids.at[0, 1].set(-1)),
                 "input_ids value -1 is outside [0, 256) (vocab_size=256)", id="id-negative"),
    pytest.param(dict(positions_BT=positions.at[0, 0].set(-3)),
                 "positions value -3 is outside [0, 8)", id="position-negative"),
    pytest.param(dict(positions_BT=positions.at[1, 2].set(8)),
                 "positions value 8 is outside [0, 8) (max_position_embeddings=8)", id="position-equals-max-pos"),
    pytest.param(dict(positions_BT=positions.at[1, 2].set(15)),
                 "positions value 15 is outside [0, 8) (max_position_embeddings=8)", id="position-past-max-pos"),
    pytest.param(dict(caches=init_caches(CFG, B, 6), positions_BT=positions.at[1, 2].set(6)),
                 "positions value 6 is outside [0, 6) (cache capacity=6)", id="position-equals-capacity"),
]

SHAPE_CASES = [
    pytest.param(dict(input_ids_BT=ids[0], positions_BT=positions[0], prev_hidden_BTD=hidden[0]),
                 "input_ids must be [B, T], got shape (3,)", id="ids-1d"),
    pytest.param(dict(input_ids_BT=ids[..., None]), "input_ids must be [B, T], got shape (2, 3, 1)", id="ids-3d"),
    pytest.param(dict(positions_BT=positions[:, :2]),
                 "positions shape (2, 2) != input_ids shape (2, 3)", id="positions-shape"),
    pytest.param(dict(positions_BT=positions.T),
                 "positions shape (3, 2) != input_ids shape (2, 3)", id="positions-transposed"),
    pytest.param(dict(input_ids_BT=ids.astype(jnp.float32)),
                 "input_ids must be an integer array, got dtype float32", id="ids-float"),
    pytest.param(dict(positions_BT=positions.astype(jnp.float32)),
                 "positions must be an integer array, got dtype float32", id="positions-float"),
    pytest.param(dict(prev_hidden_BTD=jnp.zeros((B, T, 32))),
                 "prev_hidden shape (2, 3, 32) != (2, 3, 64)", id="prev-hidden-D"),
    pytest.param(dict(prev_hidden_BTD=jnp.zeros((B, T - 1, CFG.hidden_size))),
                 "prev_hidden shape (2, 2, 64) != (2, 3, 64)", id="prev-hidden-T"),
    pytest.param(dict(caches=()), "got 0 caches for num_nextn_predict_layers=1", id="no-caches"),
    pytest.param(dict(caches=init_caches(CFG, B, CAPACITY) * 2),
                 "got 2 caches for num_nextn_predict_layers=1", id="two-caches"),
    pytest.param(dict(caches=init_caches(CFG, 1, CAPACITY)), "cache batch 1 != input batch 2", id="cache-batch"),
]


@pytest.mark.parametrize("how", ["apply", "validate"])
@pytest.mark.parametrize("changes, message", VALUE_CASES + SHAPE_CASES)
def test_bad_input_raises_naming_the_value(params, how, changes, message):
  """One bad value or shape in an otherwise valid step: ValueError whose message names it."""
  with pytest.raises(ValueError, match=re.escape(message)):
    _call(how, params, _step(**changes))


@pytest.mark.parametrize("changes, message", SHAPE_CASES)
def test_shape_checks_still_raise_under_jit(params, changes, message):
  """Shapes and dtypes are static under `jax.jit`, so the same errors raise at trace time."""
  with pytest.raises(ValueError, match=re.escape(message)):
    _call("jit-apply", params, _step(**changes))


@pytest.mark.parametrize("changes, message", VALUE_CASES)
def test_value_checks_are_skipped_on_tracers(changes, message):
  """Documented limitation: under `jit` ids / positions are tracers, so out-of-range values pass
  `validate_inputs` silently (callers validate concrete inputs before jitting)."""
  step = _step(**changes)
  jax.jit(functools.partial(validate_inputs, CFG))(*step.values())  # no error
  with pytest.raises(ValueError, match=re.escape(message)):
    validate_inputs(CFG, *step.values())  # ...while the same concrete values are refused, as without jit


# --- several MTP layers: every cache must fit --------------------------------------------------------

CFG2 = jax_mtp.tiny(max_position_embeddings=8, num_nextn_predict_layers=2)


def test_second_layer_cache_batch_is_checked():
  """With two MTP layers, step 1 reads caches[1]: its batch must match the input's too (unchecked,
  `model.apply(..., spec_step_idx=1)` would broadcast the one cached row over both sequences and
  drop sequence 1's writes); `validate_inputs` checks every cache."""
  step = _step(caches=(init_layer_cache(CFG2, B, CAPACITY), init_layer_cache(CFG2, 1, CAPACITY)))
  with pytest.raises(ValueError, match=re.escape("cache batch 1 != input batch 2")):
    validate_inputs(CFG2, *step.values())


def test_second_layer_cache_capacity_is_checked():
  """With two MTP layers, positions must fit the smallest cache, not just caches[0] (a 4-slot
  caches[1] would drop the writes of positions 5..7, whose queries would then attend without
  themselves); `validate_inputs` takes the smallest capacity."""
  step = _step(caches=(init_layer_cache(CFG2, B, CAPACITY), init_layer_cache(CFG2, B, 4)))
  with pytest.raises(ValueError, match=re.escape("positions value 5 is outside [0, 4) (cache capacity=4)")):
    validate_inputs(CFG2, *step.values())


def test_a_temperature_below_the_floor_is_refused():
  """A positive temperature below MIN_TEMPERATURE would overflow fp32 logits to inf and sample
  NaN probabilities (token 0); it is refused, as a negative one is. The floor itself samples."""
  from jax_mtp.request import MIN_TEMPERATURE, validate_temperature  # noqa: PLC0415
  validate_temperature(MIN_TEMPERATURE)
  validate_temperature(0.0)
  for bad in (1e-30, MIN_TEMPERATURE / 2, -1.0, float("nan")):
    with pytest.raises(ValueError, match=re.escape(f"temperature={bad!r}")):
      validate_temperature(bad)


def test_a_seed_past_64_bits_is_refused_naming_it():
  """jax.random.key takes an int64: past it, an OverflowError that names no argument ("Python int too large to
  convert to C long"). The sampling seed is checked first, by the API as the CLI checks --seed."""
  from jax_mtp.request import validate_seed  # noqa: PLC0415
  for good in (0, -1, 2**63 - 1, -2**63, np.int64(3), jnp.asarray(3), np.asarray(-3)):
    validate_seed(good)  # the integers a count may be (request._integer's): numpy and 0-d jax ones too
  for bad in (2**63, -2**63 - 1, 2**70, np.uint64(2**63), 1.5, 2.0, jnp.asarray(2.0), True, np.bool_(True), "3",
              jnp.asarray([3])):
    with pytest.raises(ValueError, match=re.escape(f"seed={bad!r} must be an integer in [-2^63, 2^63)")):
      validate_seed(bad)
  spec = jax_mtp.Speculator(CFG, jax_mtp.make_mesh(1), 1)
  with pytest.raises(ValueError, match=re.escape(f"seed={2**64} must be")):  # before any params are read
    spec.generate(None, [[1, 2]], 2, temperature=1.0, seed=2**64)
