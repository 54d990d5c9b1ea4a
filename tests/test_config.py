"""`MtpConfig`: reading HF `config.json` dicts / files / directories, the presets, and that every
inconsistent value raises a `ConfigError` naming the offending key and value.

The HF dicts are `tests.hf_reference.tiny_hf_config_dict(model_type)`, the same ones the HF parity
tests build torch models from; the full-size dicts below copy reference/deepseek_v32.md §1.1 / §1.3.
"""

import dataclasses
import functools
import json
import math
import re

import jax
import jax.numpy as jnp
import pytest

import jax_mtp
from jax_mtp import ConfigError, MtpConfig, RopeConfig, from_hf_config
from tests.hf_reference import hf_config_object, tiny_hf_config_dict

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
_DROP = object()  # marks a key to remove in `_hf`

# The tiny dicts' YaRN block (rope_scaling of tiny_hf_config_dict for the DeepSeek families).
TINY_YARN = RopeConfig(theta=10000.0, factor=40.0, original_max_position_embeddings=16, beta_fast=32.0,
                       beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)

# DeepSeek-V3.2 HF config.json (reference/deepseek_v32.md §1.1), the keys we read.
FULL_V32_HF = dict(
    model_type="deepseek_v32", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, first_k_dense_replace=3, moe_layer_freq=1,
    num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
    num_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling_factor=2.5, scoring_func="sigmoid",
    topk_method="noaux_tc", norm_topk_prob=True, rms_norm_eps=1e-6, hidden_act="silu",
    max_position_embeddings=163840, rope_theta=10000,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    num_nextn_predict_layers=1, index_n_heads=64, index_head_dim=128, index_topk=2048,
)

# GLM-5 (reference/deepseek_v32.md §1.3), HF 5.x style `rope_parameters`.
FULL_GLM5_HF = dict(
    model_type="glm_moe_dsa", vocab_size=154880, hidden_size=6144, intermediate_size=12288,
    moe_intermediate_size=2048, num_hidden_layers=78, first_k_dense_replace=3, num_attention_heads=64,
    num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64,
    v_head_dim=256, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
    routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True,
    rms_norm_eps=1e-5, hidden_act="silu", max_position_embeddings=202752,
    rope_parameters={"rope_theta": 1000000, "rope_type": "default"}, rope_interleave=True,
    indexer_rope_interleave=True, index_n_heads=32, index_head_dim=128, index_topk=2048,
    num_nextn_predict_layers=1,
)


def _hf(family: str = "deepseek_v32", /, **changes) -> dict:
  """The tiny HF dict of `family` with `changes` applied; a value `_DROP` removes the key."""
  d = tiny_hf_config_dict(family)
  for key, value in changes.items():
    if value is _DROP:
      d.pop(key, None)
    else:
      d[key] = value
  return d


def _raises(match: str):
  """`pytest.raises(ConfigError)` whose message must contain `match` literally."""
  return pytest.raises(ConfigError, match=re.escape(match))


# --- from_hf_config: the three families ------------------------------------------------------------


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_from_hf_config_reads_the_family_fields(model_type):
  """Sizes are copied, the indexer exists except for deepseek_v3, only GLM rotates its indexer
  interleaved, DeepSeek reads the YaRN block and GLM plain RoPE at theta 1e6, n_group as given."""
  hf = tiny_hf_config_dict(model_type)
  cfg = from_hf_config(hf)
  for key in ("vocab_size", "hidden_size", "moe_intermediate_size", "num_attention_heads", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
              "num_experts_per_tok", "routed_scaling_factor", "rms_norm_eps", "max_position_embeddings",
              "first_k_dense_replace", "num_hidden_layers", "num_nextn_predict_layers"):
    assert getattr(cfg, key) == hf[key], key
  assert cfg.model_type == model_type
  assert cfg.has_indexer == (model_type != "deepseek_v3")
  if cfg.has_indexer:
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (4, 16, 4)
  else:
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (0, 0, 0)
  assert cfg.rope_interleave is True
  assert cfg.indexer_rope_interleave is (model_type == "glm_moe_dsa")
  if model_type == "glm_moe_dsa":
    assert cfg.rope == RopeConfig(theta=1e6) and not cfg.rope.is_yarn
    assert (cfg.n_group, cfg.topk_group) == (1, 1)
    assert cfg.softmax_scale == cfg.qk_head_dim**-0.5  # no YaRN temperature
  else:
    assert cfg.rope == TINY_YARN and cfg.rope.is_yarn
    assert (cfg.n_group, cfg.topk_group) == (4, 2)
    assert cfg.softmax_scale == pytest.approx(24**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)
  assert cfg.latent_norm_eps == 1e-6  # hard-coded in HF for every family, even GLM (rms_norm_eps 1e-5)


def test_from_hf_config_n_group_null_or_absent_means_one_group():
  """`n_group: null` (V2-style configs) forces one group and topk_group 1; absent keys default to 1."""
  cfg = from_hf_config(_hf(n_group=None, topk_group=None))
  assert (cfg.n_group, cfg.topk_group) == (1, 1)
  cfg = from_hf_config(_hf(n_group=_DROP, topk_group=_DROP))
  assert (cfg.n_group, cfg.topk_group) == (1, 1)


def test_from_hf_config_optional_keys_take_their_defaults():
  """Keys with defaults may be absent: first_k_dense_replace 0, one shared expert, scaling 1,
  norm_topk_prob, eps 1e-6, one MTP layer."""
  optional = ("first_k_dense_replace", "n_shared_experts", "routed_scaling_factor", "norm_topk_prob",
              "rms_norm_eps", "num_nextn_predict_layers")
  cfg = from_hf_config(_hf(**{key: _DROP for key in optional}))
  assert (cfg.first_k_dense_replace, cfg.n_shared_experts, cfg.routed_scaling_factor, cfg.norm_topk_prob,
          cfg.rms_norm_eps, cfg.num_nextn_predict_layers) == (0, 1, 1.0, True, 1e-6, 1)


def test_from_hf_config_overrides_win():
  """Keyword overrides replace what the dict says (how the tests pick fp32)."""
  cfg = from_hf_config(tiny_hf_config_dict(), dtype="float32", param_dtype="float32", index_topk=2)
  assert (cfg.dtype, cfg.param_dtype, cfg.index_topk) == ("float32", "float32", 2)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_config_json_file_and_directory_give_the_same_config(model_type, tmp_path):
  """The dict, its `config.json` (str or Path) and the directory holding it parse to equal configs."""
  hf = tiny_hf_config_dict(model_type)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(hf), encoding="utf-8")
  from_dict = from_hf_config(hf)
  assert from_hf_config(path) == from_hf_config(str(path)) == from_dict
  assert from_hf_config(tmp_path) == from_hf_config(str(tmp_path)) == from_dict
  assert MtpConfig.from_hf_config(tmp_path) == from_dict


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_config_json_written_by_hf_save_pretrained_parses_the_same(model_type, tmp_path):
  """HF 5.24 rewrites legacy rope keys into `rope_parameters` on save; the saved file gives the same
  config as the legacy dict it came from."""
  hf = tiny_hf_config_dict(model_type)
  hf_config_object(hf).save_pretrained(tmp_path)
  saved = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
  assert "rope_parameters" in saved and "rope_scaling" not in saved  # really the 5.x layout
  assert from_hf_config(tmp_path) == from_hf_config(hf)


@pytest.mark.parametrize("theta", [10000.0, 50000.0])
def test_rope_parameters_yarn_equals_legacy_rope_scaling(theta):
  """HF 5.x `rope_parameters{rope_type: yarn, rope_theta, ...}` and legacy `rope_theta` +
  `rope_scaling{type: yarn, ...}` give the same RopeConfig, and theta is read from inside."""
  yarn = dict(factor=40.0, original_max_position_embeddings=16, beta_fast=32, beta_slow=1, mscale=1.0,
              mscale_all_dim=1.0)
  legacy = _hf(rope_theta=theta, rope_scaling=dict(type="yarn", **yarn))
  new = _hf(rope_theta=_DROP, rope_scaling=_DROP, rope_parameters=dict(rope_type="yarn", rope_theta=theta, **yarn))
  assert from_hf_config(new).rope == from_hf_config(legacy).rope == dataclasses.replace(TINY_YARN, theta=theta)


def test_rope_parameters_default_equals_legacy_rope_theta():
  """`rope_parameters{rope_type: default, rope_theta}` equals a bare legacy `rope_theta` (plain RoPE)."""
  legacy = _hf("glm_moe_dsa", rope_theta=1e6, rope_scaling=None)
  new = _hf("glm_moe_dsa", rope_theta=_DROP, rope_scaling=_DROP,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6})
  assert from_hf_config(new).rope == from_hf_config(legacy).rope == RopeConfig(theta=1e6)


def test_yarn_without_mscale_keys_reads_zero():
  """Absent (or null) mscale / mscale_all_dim read as 0: no mscale² in softmax_scale (as HF)."""
  cfg = from_hf_config(_hf(rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=16,
                                             mscale=None)))
  assert (cfg.rope.mscale, cfg.rope.mscale_all_dim) == (0.0, 0.0)
  assert cfg.softmax_scale == cfg.qk_head_dim**-0.5


# --- presets ---------------------------------------------------------------------------------------


def test_deepseek_v32_softmax_scale_is_the_reference_value():
  """192^-0.5 · mscale², mscale = 0.1·ln 40 + 1 = 0.13523378 (reference §4.2)."""
  cfg = jax_mtp.deepseek_v32()
  assert cfg.qk_head_dim == 192
  assert abs(cfg.softmax_scale - 0.13523378) <= 1e-7
  assert cfg.softmax_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)


def test_glm5_softmax_scale_has_no_yarn():
  """GLM-5 uses plain RoPE: softmax_scale is exactly 256^-0.5."""
  cfg = jax_mtp.glm5()
  assert not cfg.rope.is_yarn and cfg.qk_head_dim == 256
  assert cfg.softmax_scale == 256**-0.5


def test_presets_equal_their_hf_configs():
  """deepseek_v32() is §1.1's config.json, glm5() is §1.3's, and tiny() is the tiny HF dict in fp32
  up to the head count (tiny() picks its own, so that tensor-parallel tests divide it)."""
  assert from_hf_config(FULL_V32_HF) == jax_mtp.deepseek_v32()
  assert from_hf_config(FULL_GLM5_HF) == jax_mtp.glm5()
  tiny = jax_mtp.tiny()
  assert from_hf_config(tiny_hf_config_dict("deepseek_v32"), dtype="float32", param_dtype="float32",
                        num_attention_heads=tiny.num_attention_heads) == tiny


def test_tiny_validates_and_exercises_sparse_yarn_paths():
  """tiny() builds (validation passes), has an indexer with top-k below a test sequence and YaRN."""
  cfg = jax_mtp.tiny()
  assert cfg.has_indexer and cfg.index_topk == 4 and cfg.rope.is_yarn
  assert cfg.softmax_scale != cfg.qk_head_dim**-0.5
  assert jax_mtp.tiny(index_topk=8).index_topk == 8  # overrides validate too


def test_configs_are_frozen_hashable_and_jit_static():
  """Configs cannot be mutated, equal configs hash equal, and jit re-traces only for a changed config."""
  cfg = jax_mtp.tiny()
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.hidden_size = 128
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.rope.theta = 1.0
  assert jax_mtp.tiny() == cfg and hash(jax_mtp.tiny()) == hash(cfg)
  assert hash(jax_mtp.deepseek_v32()) == hash(jax_mtp.deepseek_v32())

  traces = []

  @functools.partial(jax.jit, static_argnums=0)
  def scaled(c: MtpConfig, x):
    traces.append(c)
    return x * c.softmax_scale

  x = jnp.ones(3)
  scaled(cfg, x)
  scaled(jax_mtp.tiny(), x)  # equal config: cache hit
  assert len(traces) == 1
  scaled(cfg.replace(rms_norm_eps=1e-5), x)
  assert len(traces) == 2


def test_replace_validates():
  """`replace` builds a new config through the same validation."""
  assert jax_mtp.tiny().replace(vocab_size=512).vocab_size == 512
  with _raises("vocab_size=0 must be a positive integer"):
    jax_mtp.tiny().replace(vocab_size=0)


# --- ConfigError: every branch names the key and the value ----------------------------------------


def test_config_error_is_a_value_error():
  assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("model_type", ["llama", None], ids=["llama", "absent"])
def test_unknown_model_type_in_hf_dict(model_type):
  hf = _hf(model_type=model_type if model_type else _DROP)
  with _raises(f"model_type={model_type!r} is not supported"):
    from_hf_config(hf)


def test_unknown_model_type_in_direct_construction():
  with _raises("model_type='deepseek_v4' is not supported"):
    jax_mtp.tiny(model_type="deepseek_v4")
  with _raises("model_type='llama' is not supported"):
    from_hf_config(tiny_hf_config_dict(), model_type="llama")


def test_missing_keys_are_all_listed():
  """The message lists every missing required key (indexer keys only for DSA families)."""
  with _raises("model_type='deepseek_v32' is missing key(s) ['hidden_size', 'v_head_dim', 'index_topk']"):
    from_hf_config(_hf(hidden_size=_DROP, v_head_dim=_DROP, index_topk=_DROP))
  with _raises("model_type='glm_moe_dsa' is missing key(s) ['index_n_heads', 'index_head_dim']"):
    from_hf_config(_hf("glm_moe_dsa", index_n_heads=_DROP, index_head_dim=_DROP))
  with _raises("model_type='deepseek_v3' is missing key(s) ['max_position_embeddings']"):
    from_hf_config(_hf("deepseek_v3", max_position_embeddings=_DROP))


@pytest.mark.parametrize("key, value", [
    ("hidden_size", 0), ("hidden_size", -64), ("hidden_size", 64.0), ("hidden_size", "64"),
    ("vocab_size", True), ("num_attention_heads", None), ("max_position_embeddings", 0),
    ("num_nextn_predict_layers", 0), ("n_group", 0), ("topk_group", 0), ("num_experts_per_tok", 0),
])
def test_non_positive_or_non_int_size(key, value):
  with _raises(f"{key}={value!r} must be a positive integer"):
    from_hf_config(_hf(**{key: value}))


@pytest.mark.parametrize("key, value", [
    ("first_k_dense_replace", -1), ("n_shared_experts", -1), ("n_shared_experts", 1.0),
    ("index_n_heads", -4), ("index_topk", 2.5),
])
def test_negative_or_non_int_count(key, value):
  with _raises(f"{key}={value!r} must be a non-negative integer"):
    from_hf_config(_hf(**{key: value}))


@pytest.mark.parametrize("key", ["vocab_size", "max_position_embeddings", "index_topk"])
def test_sizes_past_int32_are_named(key):
  """Ids, positions and slots are int32 on the device: 2**31 is refused by name (a damaged config.json's vocab_size
  of 2**31 was an OverflowError inside JAX's trace); 2**31 - 1 passes the bound."""
  with _raises(f"{key}={2**31} must be below 2**31"):
    from_hf_config(_hf("deepseek_v32", **{key: 2**31}))
  assert getattr(from_hf_config(_hf("deepseek_v32", **{key: 2**31 - 1})), key) == 2**31 - 1


def test_odd_qk_rope_head_dim():
  with _raises("qk_rope_head_dim=7 must be even"):
    from_hf_config(_hf(qk_rope_head_dim=7))


def test_experts_not_divisible_into_groups():
  with _raises("n_routed_experts=10 is not divisible by n_group=4"):
    from_hf_config(_hf(n_routed_experts=10))


def test_topk_group_exceeds_n_group():
  with _raises("topk_group=5 exceeds n_group=4"):
    from_hf_config(_hf(topk_group=5))


def test_num_experts_per_tok_exceeds_experts_in_kept_groups():
  """2 kept groups of 8/4 = 2 experts hold 4 experts: top-5 cannot be routed."""
  with _raises("num_experts_per_tok=5 exceeds the 4 experts in topk_group=2 groups"):
    from_hf_config(_hf(num_experts_per_tok=5))


def test_groups_of_one_expert():
  """The group score is a top-2 sum, so each group needs two experts."""
  with _raises("each of n_group=8 groups needs ≥ 2 experts"):
    from_hf_config(_hf(n_group=8, topk_group=2))


def test_first_k_dense_replace_exceeds_num_hidden_layers():
  with _raises("first_k_dense_replace=3 exceeds num_hidden_layers=2"):
    from_hf_config(_hf(first_k_dense_replace=3))


@pytest.mark.parametrize("key", ["rms_norm_eps", "indexer_norm_eps", "latent_norm_eps"])
@pytest.mark.parametrize("value", [0.0, -1e-6, float("nan")])
def test_non_positive_eps(key, value):
  with _raises(f"{key}={value!r} must be > 0"):
    from_hf_config(tiny_hf_config_dict(), **{key: value})


@pytest.mark.parametrize("value", [[2.5], "2.5", 0.0, -1.0, float("inf"), True])
def test_routed_scaling_factor_is_a_finite_positive_number(value):
  with _raises(f"routed_scaling_factor={value!r} must be > 0 and finite"):
    from_hf_config(_hf(routed_scaling_factor=value))


def test_integer_eps_and_scaling_in_json_become_floats():
  """JSON may write 1 for 1.0; JAX would take 2**31 as an int32 and overflow."""
  cfg = from_hf_config(_hf(rms_norm_eps=2**31, routed_scaling_factor=3))
  assert (cfg.rms_norm_eps, cfg.routed_scaling_factor) == (2.0**31, 3.0)
  assert all(isinstance(x, float) for x in (cfg.rms_norm_eps, cfg.routed_scaling_factor))


@pytest.mark.parametrize("key", ["norm_topk_prob", "rope_interleave", "indexer_rope_interleave"])
def test_switches_are_true_or_false(key):
  with _raises(f"{key}='yes' must be true or false"):
    from_hf_config(_hf(**{key: "yes"}))


@pytest.mark.parametrize("rope_scaling, match", [
    (5, "rope_scaling / rope_parameters=5 must be an object"),
    ([1, 2], "rope_scaling / rope_parameters=[1, 2] must be an object"),
    ({"type": "yarn", "factor": [40], "original_max_position_embeddings": 16}, "rope parameters {'type': 'yarn'"),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": float("inf")}, "rope parameters"),
    ({"type": "yarn", "factor": float("nan"), "original_max_position_embeddings": 16},
     "rope factor=nan must be a finite number"),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": -3},
     "rope original_max_position_embeddings=-3 must be a positive integer"),
])
def test_malformed_rope_parameters_are_config_errors(rope_scaling, match):
  with _raises(match):
    from_hf_config(_hf(rope_scaling=rope_scaling))
  with _raises("rope parameters {} (rope_theta=[1]):"):
    from_hf_config(_hf(rope_theta=[1], rope_scaling=None))


def test_config_json_that_is_not_utf8_is_named(tmp_path):
  (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
  with _raises(f"config file {str(tmp_path / 'config.json')!r} is not valid JSON"):
    from_hf_config(str(tmp_path))


@pytest.mark.parametrize("key, value, expected", [
    ("hidden_act", "gelu", "silu"), ("scoring_func", "softmax", "sigmoid"), ("topk_method", "greedy", "noaux_tc"),
])
def test_unsupported_activation_scoring_or_topk_method(key, value, expected):
  with _raises(f"{key}={value!r} is not supported; expected {expected!r}"):
    from_hf_config(_hf(**{key: value}))


@pytest.mark.parametrize("kind", ["linear", "dynamic", "longrope", "llama3"])
def test_unsupported_rope_type(kind):
  """Legacy `rope_scaling.type` and HF 5.x `rope_parameters.rope_type` both name the type."""
  with _raises(f"rope type {kind!r} is not supported"):
    from_hf_config(_hf(rope_scaling={"type": kind, "factor": 2.0}))
  with _raises(f"rope type {kind!r} is not supported"):
    from_hf_config(_hf(rope_scaling=_DROP, rope_parameters={"rope_type": kind, "rope_theta": 1e4, "factor": 2.0}))


@pytest.mark.parametrize("missing", ["factor", "original_max_position_embeddings"])
def test_yarn_without_factor_or_original_length(missing):
  params = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16}
  del params[missing]
  with _raises(f"yarn rope parameters need 'factor' and 'original_max_position_embeddings', got {params}"):
    from_hf_config(_hf(rope_scaling=params))


def test_yarn_with_null_factor_is_a_config_error():
  """`factor: null` is as missing as an absent factor (HF itself only warns on it).

  BUG (jax_mtp/config.py `_rope_from_hf`): the check is `"factor" not in params`, so a null factor
  reaches `float(None)` and raises TypeError, not ConfigError.
  """
  params = {"type": "yarn", "factor": None, "original_max_position_embeddings": 16}
  with _raises("'factor': None"):
    from_hf_config(_hf(rope_scaling=params))


def test_rope_factor_below_one_theta_not_above_one_or_a_non_positive_yarn_beta():
  with _raises("rope factor=0.5 must be ≥ 1"):
    from_hf_config(_hf(rope_scaling={"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 16}))
  with _raises("theta=0.0 > 1"):
    from_hf_config(_hf("glm_moe_dsa", rope_theta=0))
  with _raises("theta=1.0 > 1"):  # the fuzzer's damaged config: a ZeroDivisionError in YaRN's correction range
    from_hf_config(_hf(rope_theta=1))
  with _raises("theta=-1.0 > 1"):
    jax_mtp.tiny(rope=RopeConfig(theta=-1.0))
  with _raises("beta_fast=-1.0 and beta_slow=1.0 must be > 0"):  # (a 0 in an HF dict is HF's default, as HF reads it)
    from_hf_config(_hf(rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 16,
                                     "beta_fast": -1, "beta_slow": 1}))
  with _raises("beta_fast=32.0 and beta_slow=0.0 must be > 0"):
    jax_mtp.tiny(rope=RopeConfig(theta=1e4, factor=40.0, original_max_position_embeddings=16, beta_slow=0.0))


def test_deepseek_v3_with_indexer_fields():
  """deepseek_v3 has no DSA indexer: any indexer size is an error (the HF dict's keys are not read)."""
  with _raises("model_type='deepseek_v3' has no DSA indexer, got index_n_heads/head_dim/topk=(4, 0, 0)"):
    from_hf_config(_hf("deepseek_v3"), index_n_heads=4)
  with _raises("model_type='deepseek_v3' has no DSA indexer, got index_n_heads/head_dim/topk=(4, 16, 4)"):
    jax_mtp.tiny(model_type="deepseek_v3")


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_family_without_indexer_fields(model_type):
  with _raises(f"model_type={model_type!r} needs index_n_heads, index_head_dim and index_topk > 0, got (4, 16, 0)"):
    from_hf_config(_hf(model_type, index_topk=0))
  with _raises(f"model_type={model_type!r} needs index_n_heads, index_head_dim and index_topk > 0, got (0, 0, 0)"):
    jax_mtp.tiny(model_type=model_type, index_n_heads=0, index_head_dim=0, index_topk=0)


def test_index_head_dim_smaller_than_rope_dim():
  with _raises("index_head_dim=4 is smaller than qk_rope_head_dim=8"):
    from_hf_config(_hf(index_head_dim=4))


@pytest.mark.parametrize("key, value", [("dtype", "fp8"), ("dtype", "float64"), ("param_dtype", "int8"),
                                        ("param_dtype", None)])
def test_bad_dtype_string(key, value):
  with _raises(f"{key}={value!r} must be float32, bfloat16 or float16"):
    jax_mtp.tiny(**{key: value})


def test_config_file_not_found(tmp_path):
  """A missing file, and a directory without config.json, name the path looked for."""
  path = tmp_path / "nowhere" / "config.json"
  with _raises(f"config file {str(path)!r} does not exist"):
    from_hf_config(path)
  with _raises(f"config file {str(tmp_path / 'config.json')!r} does not exist"):
    from_hf_config(tmp_path)


def test_config_file_invalid_json(tmp_path):
  path = tmp_path / "config.json"
  path.write_text('{"model_type": "deepseek_v32",', encoding="utf-8")
  with _raises(f"config file {str(path)!r} is not valid JSON: "):
    from_hf_config(tmp_path)


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ("null", "NoneType"), ('"deepseek_v32"', "str")])
def test_config_file_not_a_json_object(tmp_path, text, kind):
  path = tmp_path / "config.json"
  path.write_text(text, encoding="utf-8")
  with _raises(f"config file {str(path)!r} holds a {kind}, expected a JSON object"):
    from_hf_config(path)


@pytest.mark.parametrize("key, value", [("attention_factor", 1.5), ("truncate", False)])
def test_rope_parameters_we_do_not_model_are_rejected(key, value):
  hf = _hf()
  hf["rope_scaling"] = dict(hf["rope_scaling"], **{key: value})
  with _raises(f"rope parameter {key}={value!r} is not supported"):
    from_hf_config(hf)


def test_non_numeric_eps_is_a_config_error():
  with _raises("rms_norm_eps='1e-6' must be > 0"):
    from_hf_config(_hf(rms_norm_eps="1e-6"))


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float32", "bfloat16", "float16"])
def test_torch_dtype_sets_compute_and_param_dtypes(key, value):
  """As vLLM's --dtype auto: the checkpoint's torch_dtype (newer HF: dtype) sets both dtypes."""
  cfg = from_hf_config(tiny_hf_config_dict() | {key: value})
  assert (cfg.dtype, cfg.param_dtype) == (value, value)
  assert from_hf_config(tiny_hf_config_dict() | {key: value}, dtype="float32").dtype == "float32"  # overrides win


def test_unsupported_torch_dtype_is_named():
  with _raises("torch_dtype='float8_e4m3fn' is not supported; expected one of"):
    from_hf_config(tiny_hf_config_dict() | {"torch_dtype": "float8_e4m3fn"})


@pytest.mark.parametrize("rope", [0, None, {"theta": 1e4}], ids=["int", "None", "dict"])
def test_a_rope_that_is_not_a_rope_config_is_refused(rope):
  """`MtpConfig.replace(rope=...)` with something else: a ConfigError naming it (was an AttributeError on `.theta`)."""
  with _raises(f"rope={rope!r} must be a RopeConfig"):
    jax_mtp.tiny().replace(rope=rope)
