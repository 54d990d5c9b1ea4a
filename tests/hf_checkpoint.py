"""Writes a HF-format DeepSeek-V3.2 checkpoint (config.json, FP8 safetensors shards, index) from our params.

Independent of `jax_mtp.checkpoint`'s name table: names come from rewriting our param paths the way
the checkpoint spells them (README_WEIGHTS.md), and FP8 is the official per-block quantiser
(`s = max|W_blk| / 448`, `W_fp8 = W_blk / s`, `weight_scale_inv = s`), partial edge blocks included.
`write_checkpoint` returns the values a loader must produce: our params after the same storage
(FP8 dequantised block by block, BF16 tensors rounded), in our layout, float32.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
_EXPERTS = {"w_gate_EDF": "gate_proj", "w_up_EDF": "up_proj", "w_down_EFD": "down_proj"}


def hf_config_dict(cfg, block=(128, 128)) -> dict:
  """config.json for `cfg` (what from_hf_config reads), with an FP8 quantization_config."""
  d = {name: getattr(cfg, name) for name in (
      "model_type vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers "
      "first_k_dense_replace num_attention_heads q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim "
      "v_head_dim n_routed_experts n_shared_experts num_experts_per_tok n_group topk_group routed_scaling_factor "
      "norm_topk_prob rms_norm_eps max_position_embeddings index_n_heads index_head_dim index_topk "
      "num_nextn_predict_layers").split()}
  r = cfg.rope
  d.update(rope_theta=r.theta, scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu",
           rope_scaling=dict(type="yarn", factor=r.factor,
                             original_max_position_embeddings=r.original_max_position_embeddings,
                             beta_fast=r.beta_fast, beta_slow=r.beta_slow, mscale=r.mscale,
                             mscale_all_dim=r.mscale_all_dim),
           quantization_config=dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                    weight_block_size=list(block)))
  return d


def quantize(w: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
  """Official block quantiser: one fp32 scale per (partial) block."""
  (b0, b1), (rows, cols) = block, w.shape
  scale = np.zeros((-(-rows // b0), -(-cols // b1)), np.float32)
  q = np.zeros(w.shape, E4M3)
  for i in range(scale.shape[0]):
    for j in range(scale.shape[1]):
      blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1].astype(np.float32)
      s = np.float32(max(float(np.abs(blk).max()), 1e-4) / 448.0)
      q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (blk / s).astype(E4M3)
      scale[i, j] = s
  return q, scale


def dequantize(q: np.ndarray, scale: np.ndarray, block) -> np.ndarray:
  """Block by block, as DeepSeek's `weight_dequant` does."""
  (b0, b1) = block
  w = np.zeros(q.shape, np.float32)
  for i in range(scale.shape[0]):
    for j in range(scale.shape[1]):
      blk = (slice(i * b0, (i + 1) * b0), slice(j * b1, (j + 1) * b1))
      w[blk] = q[blk].astype(np.float32) * scale[i, j]
  return w


def _is_fp8(name: str) -> bool:
  """V3.2 stores these linears in FP8; eh_proj, the indexer's weights_proj and the router stay BF16."""
  if "eh_proj" in name or "weights_proj" in name or "mlp.gate.weight" in name:
    return False
  return name.endswith(("_proj.weight", "_mqa.weight", ".wq_b.weight", ".wk.weight"))


def _store(name: str, value_hf: np.ndarray, block, out: dict) -> np.ndarray:
  """Adds the stored tensor(s) to `out`; returns what a loader reads back (float32, HF layout)."""
  if _is_fp8(name):
    q, scale = quantize(value_hf, block)
    out[name], out[name + "_scale_inv"] = q, scale
    return dequantize(q, scale, block)
  keep_fp32 = name.endswith(("e_score_correction_bias", "k_norm.weight", "k_norm.bias"))
  out[name] = np.ascontiguousarray(value_hf, np.float32 if keep_fp32 else BF16)  # save_file writes the buffer
  return out[name].astype(np.float32)


def _block_leaf(prefix: str, path: tuple[str, ...], value: np.ndarray, block, out: dict) -> np.ndarray:
  """One param of a decoder block (or MTP layer) → checkpoint tensor(s); returns the reference value."""
  if path[-1] in _EXPERTS:  # stacked [E, in, out] → E tensors [out, in]
    proj = _EXPERTS[path[-1]]
    stem = prefix + ".".join(path[:-1])
    return np.stack([_store(f"{stem}.experts.{e}.{proj}.weight", w.T, block, out).T for e, w in enumerate(value)])
  if path[-1] == "kernel":
    return _store(prefix + ".".join(path[:-1]) + ".weight", value.T, block, out).T
  return _store(prefix + ".".join(path), value, block, out)


def _leaves(tree: dict, path=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, path + (key,))
    else:
      yield path + (key,), np.asarray(value, np.float32)


def _set(tree: dict, path, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def hf_tensors(cfg, target: dict, mtp: dict, block=(128, 128), mtp_copies: bool = True):
  """(checkpoint tensors by name, reference target tree, reference MTP tree)."""
  out, ref_t, ref_m = {}, {}, {}
  top = {"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight", "norm": "model.norm.weight"}
  for path, value in _leaves(target):
    if path[0] in top:
      _set(ref_t, path, _store(top[path[0]], value, block, out))
    else:
      layer = int(path[0].removeprefix("layers_"))
      _set(ref_t, path, _block_leaf(f"model.layers.{layer}.", path[1:], value, block, out))
  for path, value in _leaves(mtp):
    if path[0] in top:
      continue  # the target's
    layer, rest = cfg.num_hidden_layers + int(path[0].removeprefix("layers_")), path[1:]
    if rest[0] == "mtp_block":
      rest = rest[1:]
    elif rest[0] == "shared_head_norm":
      rest = ("shared_head", "norm") + rest[1:]
    _set(ref_m, path, _block_leaf(f"model.layers.{layer}.", rest, value, block, out))
  for i in range(cfg.num_nextn_predict_layers if mtp_copies else 0):
    layer = cfg.num_hidden_layers + i
    out[f"model.layers.{layer}.embed_tokens.weight"] = out["model.embed_tokens.weight"].copy()
    out[f"model.layers.{layer}.shared_head.head.weight"] = out["lm_head.weight"].copy()
  ref_m.update(embed_tokens=ref_t["embed_tokens"], lm_head=ref_t["lm_head"])
  return out, ref_t, ref_m


def save_checkpoint(directory: str, cfg, tensors: dict, *, block=(128, 128), num_files: int = 3) -> None:
  """config.json + `model.safetensors`, or `num_files` shards + `model.safetensors.index.json`."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config_dict(cfg, block), f, indent=1)
  names = sorted(tensors)
  if num_files == 1:
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return
  weight_map = {}
  for k in range(num_files):
    file = f"model-{k + 1:05d}-of-{num_files:05d}.safetensors"
    part = {name: tensors[name] for name in names[k::num_files]}
    save_file(part, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(part, file))
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def write_checkpoint(directory: str, cfg, target: dict, mtp: dict, *, block=(128, 128), num_files: int = 3,
                     mtp_copies: bool = True) -> tuple[dict, dict]:
  """Writes the checkpoint; returns the reference (target, mtp) trees a loader must reproduce."""
  tensors, ref_t, ref_m = hf_tensors(cfg, target, mtp, block, mtp_copies)
  save_checkpoint(directory, cfg, tensors, block=block, num_files=num_files)
  return ref_t, ref_m
