"""`MtpConfig` from a Hugging Face `config.json` (a dict, the file, or its checkpoint directory): the keys each
supported family must carry, the defaults and family switches HF configs leave out, the rope parameters (HF 4.x
`rope_scaling` or 5.x `rope_parameters`) and the dtype; every value is then validated by `MtpConfig` itself."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from jax_mtp.config import DTYPES, SUPPORTED_MODEL_TYPES, ConfigError, MtpConfig, RopeConfig, is_number

_REQUIRED_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_routed_experts", "num_experts_per_tok", "max_position_embeddings",
)
_INDEXER_KEYS = ("index_n_heads", "index_head_dim", "index_topk")
_DEFAULTS = {
    "first_k_dense_replace": 0, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1, "index_share_for_mtp_iteration": False,
}
# Family-level switches the HF configs do not always spell out.
_FAMILY = {
    "deepseek_v3": {"rope_interleave": True, "indexer_rope_interleave": False},
    "deepseek_v32": {"rope_interleave": True, "indexer_rope_interleave": False},
    "glm_moe_dsa": {"rope_interleave": True, "indexer_rope_interleave": True},
}
_EXPECTED = {"hidden_act": "silu", "scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def from_hf_config(source: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> MtpConfig:
  """`MtpConfig` from a HF config dict, a `config.json` path, or a checkpoint directory."""
  hf = _read_hf_dict(source)
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ConfigError(f"model_type={model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}")
  required = _REQUIRED_KEYS + (_INDEXER_KEYS if model_type != "deepseek_v3" else ())
  missing = [key for key in required if key not in hf]
  if missing:
    raise ConfigError(f"config for model_type={model_type!r} is missing key(s) {missing}")
  for key, expected in _EXPECTED.items():
    if key in hf and hf[key] != expected:
      raise ConfigError(f"{key}={hf[key]!r} is not supported; expected {expected!r}")
  fields = {key: hf[key] for key in required}
  fields.update({key: hf.get(key, default) for key, default in _DEFAULTS.items()})
  fields.update({key: hf.get(key, default) for key, default in _FAMILY[model_type].items()})
  if "n_group" in hf and hf["n_group"] is None:
    fields["n_group"] = fields["topk_group"] = 1
  for key in ("rms_norm_eps", "routed_scaling_factor"):  # JSON may spell them as integers: JAX would take an int
    fields[key] = float(fields[key]) if is_number(fields[key]) and math.isfinite(fields[key]) else fields[key]
  fields["rope"] = _rope_from_hf(hf)
  fields["model_type"] = model_type
  fields.update(_dtypes_from_hf(hf))
  fields.update(overrides)
  return MtpConfig(**fields)


def _dtypes_from_hf(hf: Mapping[str, Any]) -> dict[str, str]:
  """Compute and parameter dtypes from `torch_dtype` (newer HF writes `dtype`), as vLLM's
  `--dtype auto` follows it; none given: the defaults (bf16). FP8 weights are declared by
  `quantization_config`, not here."""
  torch_dtype = hf.get("torch_dtype", hf.get("dtype"))
  if torch_dtype is None:
    return {}
  if torch_dtype not in DTYPES:
    raise ConfigError(f"torch_dtype={torch_dtype!r} is not supported; expected one of {DTYPES}")
  return {"dtype": torch_dtype, "param_dtype": torch_dtype}


def _read_hf_dict(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
  if isinstance(source, Mapping):
    return dict(source)
  path = os.fspath(source)
  if os.path.isdir(path):
    path = os.path.join(path, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except FileNotFoundError:
    raise ConfigError(f"config file {path!r} does not exist") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConfigError(f"config file {path!r} is not valid JSON: {e}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"config file {path!r} holds a {type(data).__name__}, expected a JSON object")
  return data


def _rope_from_hf(hf: Mapping[str, Any]) -> RopeConfig:
  """Reads `rope_scaling` (HF 4.x) or `rope_parameters` (HF 5.x); both carry the YaRN keys."""
  params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if not isinstance(params, Mapping):
    raise ConfigError(f"rope_scaling / rope_parameters={params!r} must be an object")
  try:
    return _rope_from_params(dict(params), hf.get("rope_theta", 10000.0))
  except ConfigError:
    raise
  except (TypeError, ValueError, OverflowError) as e:  # a value float() / int() cannot take
    raise ConfigError(f"rope parameters {params!r} (rope_theta={hf.get('rope_theta')!r}): {e}") from None


def _rope_from_params(params: dict[str, Any], theta: Any) -> RopeConfig:
  theta = params.get("rope_theta", theta)
  kind = params.get("rope_type", params.get("type", "default"))
  if kind == "default":
    return RopeConfig(theta=float(theta))
  if kind != "yarn":
    raise ConfigError(f"rope type {kind!r} is not supported; expected 'yarn' or 'default'")
  for key, supported in (("attention_factor", None), ("truncate", True)):
    if params.get(key, supported) != supported:
      raise ConfigError(f"rope parameter {key}={params[key]!r} is not supported (DeepSeek/GLM never set it)")
  if params.get("factor") is None or params.get("original_max_position_embeddings") is None:
    raise ConfigError(f"yarn rope parameters need 'factor' and 'original_max_position_embeddings', got {params}")
  return RopeConfig(
      theta=float(theta),
      factor=float(params["factor"]),
      original_max_position_embeddings=int(params["original_max_position_embeddings"]),
      beta_fast=float(params.get("beta_fast") or 32.0),
      beta_slow=float(params.get("beta_slow") or 1.0),
      mscale=float(params.get("mscale") or 0.0),
      mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
  )
