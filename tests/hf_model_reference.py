"""A whole HF transformers model as an independent reference: a tiny DeepSeek-V3.2 / GLM-5 / V3
`*ForCausalLM` (fp32, eager, randomised as tests/hf_reference.py does), written as a HF checkpoint
directory our CLI loads — `save_pretrained`'s config.json and target tensors, plus the MTP layer
HF's causal LM does not hold (an HF `MtpLayer`, randomised), under the checkpoint's names
(`model.layers.{L}.*`, per-expert tensors, `shared_head.*`, the embed/head copies) and an index.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as _v3
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as _v32
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as _glm

from tests import hf_reference

CAUSAL_LM = {"deepseek_v3": _v3.DeepseekV3ForCausalLM, "deepseek_v32": _v32.DeepseekV32ForCausalLM,
             "glm_moe_dsa": _glm.GlmMoeDsaForCausalLM}


def write_hf_model_checkpoint(directory: str, model_type: str, seed: int, **overrides) -> torch.nn.Module:
  """Writes the checkpoint; returns the HF causal LM (eval, fp32) whose weights it holds."""
  cfg = hf_reference.tiny_hf_config_dict(model_type, **overrides)
  model = hf_reference._randomize_(CAUSAL_LM[model_type](hf_reference._hf_config(cfg)), seed)
  model.save_pretrained(directory, safe_serialization=True)
  mtp = hf_reference.build_hf_mtp_layer(cfg, seed + 1)
  layer = f"model.layers.{cfg['num_hidden_layers']}"
  target = _read_all(os.path.join(directory, "model.safetensors"))
  tensors = {f"{layer}.embed_tokens.weight": target["model.embed_tokens.weight"],
             f"{layer}.shared_head.head.weight": target["lm_head.weight"]}
  for name, value in hf_reference.hf_state_dict_numpy(mtp).items():
    if name == "post_norm.weight":
      tensors[f"{layer}.shared_head.norm.weight"] = value
    elif name.endswith("mlp.experts.gate_up_proj"):  # [E, 2F, D] → per-expert gate / up [F, D]
      prefix = f"{layer}.{name.removeprefix('mtp_block.').removesuffix('gate_up_proj')}"
      f = value.shape[1] // 2
      for e, w in enumerate(value):
        tensors[f"{prefix}{e}.gate_proj.weight"], tensors[f"{prefix}{e}.up_proj.weight"] = w[:f], w[f:]
    elif name.endswith("mlp.experts.down_proj"):
      prefix = f"{layer}.{name.removeprefix('mtp_block.').removesuffix('down_proj')}"
      for e, w in enumerate(value):
        tensors[f"{prefix}{e}.down_proj.weight"] = w
    else:
      tensors[f"{layer}.{name.removeprefix('mtp_block.')}"] = value
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(directory, "mtp.safetensors"))
  weight_map = {**{k: "model.safetensors" for k in target}, **{k: "mtp.safetensors" for k in tensors}}
  with open(os.path.join(directory, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return model


def _read_all(path: str) -> dict[str, np.ndarray]:
  with safe_open(path, "np") as f:
    return {k: f.get_tensor(k) for k in f.keys()}
