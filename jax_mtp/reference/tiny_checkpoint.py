"""Tiny DeepSeek checkpoints rebuilt bit for bit from numpy's frozen legacy RNG (numpy + safetensors).

The vLLM generator writes one and runs vLLM on it; the parity tests write the same one and run
jax_mtp on it, so no weights are committed — only `weights_sha256`, which both sides check.

Shapes: vLLM's CPU MLA decode kernel only exists for kv_lora_rank + qk_rope_head_dim = 576, hence
512 + 64; everything else is small (3 M params). Layer 0 is dense, layer 1 MoE, layer 2 the MTP
layer (MoE). Names are the original DeepSeek ones (`mlp.experts.{e}.*`, `model.layers.2.enorm`, ...),
all float32, and the MTP layer carries its own copies of `embed_tokens` / `shared_head.head`.

Values: tensors are drawn in sorted-name order from `np.random.RandomState(seed)`; linears are
N(0, 1/fan_in), norms 1 + 0.1·N, the router bias 0.1·N, the embedding N(0, 1). HOT_TOKENS rows of
`lm_head` are scaled up so both the target and the MTP layer (which shares the head) favour a few
tokens: drafts are then accepted often enough to exercise acceptance, and still rejected at times.

`with_indexer` turns a config into DeepSeek-V3.2 (DSA indexer, `index_topk`): the V3 tensors stay
identical and the indexer's come from a second stream (seed + 1). While a sequence is no longer
than `index_topk` every query selects every key, so V3.2 computes exactly what V3 does.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from safetensors.numpy import save_file

BASE = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
    "num_hidden_layers": 2, "num_nextn_predict_layers": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32",
}
YARN = {"max_position_embeddings": 2560,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
CONFIGS = {"v3": BASE, "v3_yarn": {**BASE, **YARN}}
HOT_TOKENS, HOT_SCALE = (7, 99, 300, 42),8.0
INDEXER = {"index_n_heads": 4, "index_head_dim": 128}


def config(name: str) -> dict:
  """The config.json dict of a named tiny config."""
  if name not in CONFIGS:
    raise ValueError(f"unknown tiny config {name!r}; expected one of {sorted(CONFIGS)}")
  return json.loads(json.dumps(CONFIGS[name]))  # a deep copy


def with_indexer(cfg: dict, index_topk: int) -> dict:
  """The same model as DeepSeek-V3.2: a DSA indexer in every attention block."""
  return {**cfg, **INDEXER, "index_topk": index_topk, "model_type": "deepseek_v32",
          "architectures": ["DeepseekV32ForCausalLM"]}


def _block_shapes(cfg: dict, moe: bool) -> dict[str, tuple[tuple[int, ...], str]]:
  """Decoder block tensors: name → (shape [out, in] for linears, init kind)."""
  d, n = cfg["hidden_size"], cfg["num_attention_heads"]
  q_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
  s = {
      "input_layernorm.weight": ((d,), "norm"), "post_attention_layernorm.weight": ((d,), "norm"),
      "self_attn.q_a_proj.weight": ((cfg["q_lora_rank"], d), "linear"),
      "self_attn.q_a_layernorm.weight": ((cfg["q_lora_rank"],), "norm"),
      "self_attn.q_b_proj.weight": ((n * q_head, cfg["q_lora_rank"]), "linear"),
      "self_attn.kv_a_proj_with_mqa.weight": ((cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], d), "linear"),
      "self_attn.kv_a_layernorm.weight": ((cfg["kv_lora_rank"],), "norm"),
      "self_attn.kv_b_proj.weight": ((n * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]),
                                     "linear"),
      "self_attn.o_proj.weight": ((d, n * cfg["v_head_dim"]), "linear"),
  }
  if not moe:
    f = cfg["intermediate_size"]
    return {**s, "mlp.gate_proj.weight": ((f, d), "linear"), "mlp.up_proj.weight": ((f, d), "linear"),
            "mlp.down_proj.weight": ((d, f), "linear")}
  f, e = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
  s.update({"mlp.gate.weight": ((e, d), "linear"), "mlp.gate.e_score_correction_bias": ((e,), "bias")})
  for stem in [f"mlp.experts.{j}" for j in range(e)] + ["mlp.shared_experts"] * (cfg["n_shared_experts"] > 0):
    width = f * (cfg["n_shared_experts"] if stem == "mlp.shared_experts" else 1)
    s.update({f"{stem}.gate_proj.weight": ((width, d), "linear"), f"{stem}.up_proj.weight": ((width, d), "linear"),
              f"{stem}.down_proj.weight": ((d, width), "linear")})
  return s


def _indexer_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
  i, j, d = cfg["index_n_heads"], cfg["index_head_dim"], cfg["hidden_size"]
  return {"self_attn.indexer.wq_b.weight": ((i * j, cfg["q_lora_rank"]), "linear"),
          "self_attn.indexer.wk.weight": ((j, d), "linear"),
          "self_attn.indexer.k_norm.weight": ((j,), "norm"), "self_attn.indexer.k_norm.bias": ((j,), "bias"),
          "self_attn.indexer.weights_proj.weight": ((i, d), "linear")}


def tensor_shapes(cfg: dict, indexer: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
  """name → (shape, init kind): every V3 tensor but the MTP layer's embed/head copies, or with
  `indexer` only the DSA indexer's."""
  d, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
  out = {} if indexer else {"model.embed_tokens.weight": ((v, d), "embed"), "model.norm.weight": ((d,), "norm"),
                            "lm_head.weight": ((v, d), "head")}
  for layer in range(layers + cfg["num_nextn_predict_layers"]):
    moe = layer >= cfg["first_k_dense_replace"]
    parts = _indexer_shapes(cfg) if indexer else _block_shapes(cfg, moe)
    out.update({f"model.layers.{layer}.{name}": value for name, value in parts.items()})
    if layer >= layers and not indexer:
      out.update({f"model.layers.{layer}.{name}": value for name, value in (
          ("enorm.weight", ((d,), "norm")), ("hnorm.weight", ((d,), "norm")),
          ("eh_proj.weight", ((d, 2 * d), "linear")), ("shared_head.norm.weight", ((d,), "norm")))})
  return out


def _draw(rng: np.random.RandomState, shape: tuple[int, ...], kind: str) -> np.ndarray:
  x = rng.standard_normal(shape)  # float64, the frozen legacy stream
  if kind in ("linear", "head"):
    x = x / np.sqrt(shape[-1])
  elif kind == "norm":
    x = 1.0 + 0.1 * x
  elif kind == "bias":
    x = 0.1 * x
  return x.astype(np.float32)


def build_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """All tensors, by checkpoint name, float32; V3.2 configs (with `index_topk`) add the indexer's."""
  rng = np.random.RandomState(seed)
  tensors = {name: _draw(rng, shape, kind) for name, (shape, kind) in sorted(tensor_shapes(cfg).items())}
  tensors["lm_head.weight"][list(HOT_TOKENS)] *= HOT_SCALE
  if "index_topk" in cfg:
    rng = np.random.RandomState(seed + 1)
    tensors.update({name: _draw(rng, shape, kind)
                    for name, (shape, kind) in sorted(tensor_shapes(cfg, indexer=True).items())})
  for layer in range(cfg["num_hidden_layers"], cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
    tensors[f"model.layers.{layer}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].copy()
    tensors[f"model.layers.{layer}.shared_head.head.weight"] = tensors["lm_head.weight"].copy()
  return tensors


def weights_sha256(tensors: dict[str, np.ndarray]) -> str:
  """A digest of the values (names, dtypes, shapes, bytes in name order), independent of the file
  format, so two safetensors versions that lay a file out differently still agree."""
  digest = hashlib.sha256()
  for name in sorted(tensors):
    t = np.ascontiguousarray(tensors[name])
    digest.update(f"{name}|{t.dtype.str}|{t.shape}\n".encode())
    digest.update(t.tobytes())
  return digest.hexdigest()


def write(directory: str | os.PathLike, cfg: dict, seed: int = 0) -> str:
  """config.json + model.safetensors into `directory` (created; must not hold a checkpoint).
  Returns `weights_sha256` of what was written."""
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  for name in ("config.json", "model.safetensors"):
    if os.path.exists(os.path.join(directory, name)):
      raise FileExistsError(f"{os.path.join(directory, name)!r} exists; write a tiny checkpoint into a fresh directory")
  tensors = build_tensors(cfg, seed)
  save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=1, sort_keys=True)
  return weights_sha256(tensors)
