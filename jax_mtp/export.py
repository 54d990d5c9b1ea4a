"""jax_mtp params → a Hugging Face checkpoint directory that `jax_mtp.checkpoint` (and HF) read back.

    save_hf_checkpoint("out/", cfg, target_params, mtp_params, tokenizer=tok, eos_ids=(0,))

writes config.json, model.safetensors, generation_config.json and, given a `tokenizers.Tokenizer`,
tokenizer.json. Names come from `jax_mtp.checkpoint_names.plan` — the loader's own table, run backwards:
`copy` as is, `linear` transposed back to [out, in], `experts` split into one [out, in] tensor per
expert. The MTP layer's copies of the embedding and head are not written (the loader treats them
as optional and shares the target's). Tensors are stored in `storage_dtype` (bf16 halves the files;
config.json's torch_dtype says the dtype the model computes in). The directory appears whole or not
at all: everything is written beside it and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import jax
import ml_dtypes
import numpy as np

from jax_mtp.checkpoint_names import COPY, EXPERTS, LINEAR, MTP, TARGET, leaf_at, plan
from jax_mtp.config import MtpConfig

ARCHITECTURES = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM",
                 "glm_moe_dsa": "GlmMoeDsaForCausalLM"}
STORAGE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def to_hf_config(cfg: MtpConfig, eos_ids: tuple[int, ...] = ()) -> dict:
  """config.json for `cfg`: what `from_hf_config` reads back into the same config."""
  keys = ("model_type vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers "
          "first_k_dense_replace num_attention_heads q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim "
          "v_head_dim n_routed_experts n_shared_experts num_experts_per_tok n_group topk_group routed_scaling_factor "
          "norm_topk_prob rms_norm_eps max_position_embeddings num_nextn_predict_layers").split()
  if cfg.has_indexer:
    keys += ["index_n_heads", "index_head_dim", "index_topk", "index_share_for_mtp_iteration"]
  d = {key: getattr(cfg, key) for key in keys}
  d.update(architectures=[ARCHITECTURES[cfg.model_type]], hidden_act="silu", scoring_func="sigmoid",
           topk_method="noaux_tc", rope_theta=cfg.rope.theta, torch_dtype=cfg.dtype, tie_word_embeddings=False)
  if cfg.rope.is_yarn:
    r = cfg.rope
    d["rope_scaling"] = dict(type="yarn", factor=r.factor, original_max_position_embeddings=r.original_max_position_embeddings,
                             beta_fast=r.beta_fast, beta_slow=r.beta_slow, mscale=r.mscale, mscale_all_dim=r.mscale_all_dim)
  if eos_ids:
    d["eos_token_id"] = _eos_value(eos_ids)
  return d


def _eos_value(eos_ids: tuple[int, ...]):
  """`eos_token_id` as HF writes it: one id, or a list of several."""
  return list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]


def hf_tensors(cfg: MtpConfig, target_params: dict, mtp_params: dict, storage_dtype: str = "float32") -> dict:
  """{checkpoint name: numpy array} for every tensor the loader's table expects of `cfg`."""
  if storage_dtype not in STORAGE_DTYPES:
    raise ValueError(f"storage_dtype={storage_dtype!r} must be one of {tuple(STORAGE_DTYPES)}")
  dtype, trees, out = STORAGE_DTYPES[storage_dtype], {TARGET: target_params, MTP: mtp_params}, {}
  params, _ = plan(cfg)
  for p in params:
    leaf = leaf_at(trees[p.tree], p.path)
    if leaf is None:
      raise ValueError(f"params lack {'/'.join(p.path)} ({p.tree}), which {p.sources[0]} needs")
    value = np.asarray(jax.device_get(leaf), np.float32)[tuple(slice(0, n) for n in p.shape)]  # vocab unpadded
    if p.transform == COPY:
      out[p.sources[0]] = value
    elif p.transform == LINEAR:
      out[p.sources[0]] = value.T
    elif p.transform == EXPERTS:
      out.update((name, value[e].T) for e, name in enumerate(p.sources))
    else:
      raise AssertionError(p.transform)
  # the router's fp32 params stay fp32, as HF keeps them
  return {k: np.ascontiguousarray(v if "mlp.gate." in k else v.astype(dtype)) for k, v in out.items()}


def save_hf_checkpoint(directory: str | os.PathLike, cfg: MtpConfig, target_params: dict, mtp_params: dict, *,
                       tokenizer=None, eos_ids: tuple[int, ...] = (), storage_dtype: str = "float32",
                       extra_files: dict[str, str] | None = None) -> None:
  """Writes the checkpoint to `directory` (which must not exist), atomically. `extra_files`:
  {name: text} written beside (a README, say)."""
  from safetensors.numpy import save_file  # noqa: PLC0415

  directory = os.path.abspath(os.fspath(directory))
  if os.path.exists(directory):
    raise FileExistsError(f"{directory!r} exists; export writes a new directory")
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
  try:
    save_file(hf_tensors(cfg, target_params, mtp_params, storage_dtype), os.path.join(staging, "model.safetensors"),
              metadata={"format": "pt"})
    _write_json(os.path.join(staging, "config.json"), to_hf_config(cfg, eos_ids))
    if eos_ids:
      _write_json(os.path.join(staging, "generation_config.json"), {"eos_token_id": _eos_value(eos_ids)})
    if tokenizer is not None:
      tokenizer.save(os.path.join(staging, "tokenizer.json"))
    for name, text in (extra_files or {}).items():
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the checkpoint from other users
    for name in os.listdir(staging):
      os.chmod(os.path.join(staging, name), 0o644)
    os.rename(staging, directory)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def _write_json(path: str, data: dict) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
