"""The checkpoint name table: which Hugging Face tensor builds which jax_mtp param, and the strict check
of a checkpoint's tensors against it (jax_mtp.checkpoint loads by it; jax_mtp.export runs it backwards).

`NAME_TABLE` maps every checkpoint tensor to a param path and a transform:

  copy      same layout (norms, router gate [E, D] and bias, embedding / head [V, D])
  linear    HF [out, in] → ours [in, out] (transpose)
  experts   `mlp.experts.{e}.*_proj.weight` [out, in] for e < E → one stacked [E, in, out] param
  check     the MTP layer's own `embed_tokens` / `shared_head.head` copies: must be bit-equal to
            the target's (then dropped: one copy is shared, as in vLLM); optional

Layer `{t}` is a target layer (0 ≤ t < num_hidden_layers); layer `{m}` = num_hidden_layers + i is MTP
layer i. An entry applies where its param exists for the config (dense vs MoE layers, the DSA
indexer, shared experts), so the table also spells out which tensors a checkpoint must hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import jax
import numpy as np

from jax_mtp.config import MtpConfig
from jax_mtp.model import init_target_params
from jax_mtp.mtp import init_params
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.safetensors_io import FLOAT_DTYPES, FP8_DTYPE, CheckpointError, SafetensorsCheckpoint, scale_name

TARGET, MTP = "target", "mtp"
COPY, LINEAR, EXPERTS, CHECK = "copy", "linear", "experts", "check"
VALUES, CODES, SCALES = "values", "codes", "scales"

# One decoder block: checkpoint suffix, our path under the block, transform.
_BLOCK = (
    ("input_layernorm.weight", "input_layernorm/weight", COPY),
    ("post_attention_layernorm.weight", "post_attention_layernorm/weight", COPY),
    ("self_attn.q_a_proj.weight", "self_attn/q_a_proj/kernel", LINEAR),
    ("self_attn.q_a_layernorm.weight", "self_attn/q_a_layernorm/weight", COPY),
    ("self_attn.q_b_proj.weight", "self_attn/q_b_proj/kernel", LINEAR),
    ("self_attn.kv_a_proj_with_mqa.weight", "self_attn/kv_a_proj_with_mqa/kernel", LINEAR),
    ("self_attn.kv_a_layernorm.weight", "self_attn/kv_a_layernorm/weight", COPY),
    ("self_attn.kv_b_proj.weight", "self_attn/kv_b_proj/kernel", LINEAR),
    ("self_attn.o_proj.weight", "self_attn/o_proj/kernel", LINEAR),
    ("self_attn.indexer.wq_b.weight", "self_attn/indexer/wq_b/kernel", LINEAR),
    ("self_attn.indexer.wk.weight", "self_attn/indexer/wk/kernel", LINEAR),
    ("self_attn.indexer.k_norm.weight", "self_attn/indexer/k_norm/weight", COPY),
    ("self_attn.indexer.k_norm.bias", "self_attn/indexer/k_norm/bias", COPY),
    ("self_attn.indexer.weights_proj.weight", "self_attn/indexer/weights_proj/kernel", LINEAR),
    ("mlp.gate_proj.weight", "mlp/gate_proj/kernel", LINEAR),  # dense layers (< first_k_dense_replace)
    ("mlp.up_proj.weight", "mlp/up_proj/kernel", LINEAR),
    ("mlp.down_proj.weight", "mlp/down_proj/kernel", LINEAR),
    ("mlp.gate.weight", "mlp/gate/weight", COPY),  # MoE layers
    ("mlp.gate.e_score_correction_bias", "mlp/gate/e_score_correction_bias", COPY),
    ("mlp.experts.{e}.gate_proj.weight", "mlp/w_gate_EDF", EXPERTS),
    ("mlp.experts.{e}.up_proj.weight", "mlp/w_up_EDF", EXPERTS),
    ("mlp.experts.{e}.down_proj.weight", "mlp/w_down_EFD", EXPERTS),
    ("mlp.shared_experts.gate_proj.weight", "mlp/shared_experts/gate_proj/kernel", LINEAR),
    ("mlp.shared_experts.up_proj.weight", "mlp/shared_experts/up_proj/kernel", LINEAR),
    ("mlp.shared_experts.down_proj.weight", "mlp/shared_experts/down_proj/kernel", LINEAR),
)

# The whole model: checkpoint name, param tree, our path, transform.
NAME_TABLE = (
    ("model.embed_tokens.weight", TARGET, "embed_tokens", COPY),
    ("model.norm.weight", TARGET, "norm/weight", COPY),
    ("lm_head.weight", TARGET, "lm_head", COPY),
    *((f"model.layers.{{t}}.{name}", TARGET, f"layers_{{t}}/{path}", how) for name, path, how in _BLOCK),
    ("model.layers.{m}.enorm.weight", MTP, "layers_{i}/enorm/weight", COPY),
    ("model.layers.{m}.hnorm.weight", MTP, "layers_{i}/hnorm/weight", COPY),
    ("model.layers.{m}.eh_proj.weight", MTP, "layers_{i}/eh_proj/kernel", LINEAR),
    ("model.layers.{m}.shared_head.norm.weight", MTP, "layers_{i}/shared_head_norm/weight", COPY),
    ("model.layers.{m}.embed_tokens.weight", TARGET, "embed_tokens", CHECK),
    ("model.layers.{m}.shared_head.head.weight", TARGET, "lm_head", CHECK),
    *((f"model.layers.{{m}}.{name}", MTP, f"layers_{{i}}/mtp_block/{path}", how) for name, path, how in _BLOCK),
)


@dataclasses.dataclass(frozen=True)
class Param:
  """One of our params and the checkpoint tensors it is built from (E of them for `experts`)."""

  tree: str
  path: tuple[str, ...]
  sources: tuple[str, ...]
  transform: str
  shape: tuple[int, ...]  # ours, vocab unpadded
  dtype: np.dtype
  role: str = VALUES  # VALUES (dequantised to dtype), CODES (FP8 as stored) or SCALES (their block scales)

  def source_shape(self) -> tuple[int, ...]:
    """The shape each checkpoint tensor must have."""
    if self.transform == LINEAR:
      return self.shape[::-1]
    return self.shape[1:][::-1] if self.transform == EXPERTS else self.shape


def abstract_params(cfg: MtpConfig) -> dict[str, dict]:
  """ShapeDtypeStruct trees {"target": ..., "mtp": ...} (vocab unpadded; the MTP tree holds its
  layers only, the embedding and head being the target's)."""
  target = jax.eval_shape(lambda key: init_target_params(cfg, key), jax.random.key(0))
  mtp = jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))
  return {TARGET: target, MTP: {k: v for k, v in mtp.items() if k not in SHARED_WITH_TARGET}}


def plan(cfg: MtpConfig, trees: Iterable[str] = (TARGET, MTP)) -> tuple[list[Param], list[tuple[str, str]]]:
  """The table expanded for `cfg`: the params to build and the (MTP copy, target tensor) pairs to check."""
  abstract, params, checks = abstract_params(cfg), [], []
  for name, tree, path, how in NAME_TABLE:
    for fields in _layer_fields(cfg, name):
      path_keys = tuple(path.format(**fields).split("/"))
      leaf = leaf_at(abstract[tree], path_keys)
      if leaf is None:  # not in this config (dense vs MoE layer, no indexer, no shared expert)
        continue
      if how == CHECK:
        checks.append((name.format(**fields), _TARGET_NAMES[path]))
        continue
      experts = range(cfg.n_routed_experts) if how == EXPERTS else [None]
      sources = tuple(name.format(e=e, **fields) for e in experts)
      params.append(Param(tree, path_keys, sources, how, tuple(leaf.shape), np.dtype(leaf.dtype)))
  wanted = set(trees)
  return [p for p in params if p.tree in wanted], checks if MTP in wanted else []


_TARGET_NAMES = {path: name for name, tree, path, how in NAME_TABLE[:3]}  # e.g. "lm_head" → "lm_head.weight"


def _layer_fields(cfg: MtpConfig, name: str) -> list[dict]:
  if "{t}" in name:
    return [{"t": t} for t in range(cfg.num_hidden_layers)]
  if "{m}" in name:
    return [{"m": cfg.num_hidden_layers + i, "i": i} for i in range(cfg.num_nextn_predict_layers)]
  return [{}]


def leaf_at(tree: dict, keys: tuple[str, ...]):
  """The leaf of a nested dict at `keys` (a param path), or None where the tree has no such path."""
  for key in keys:
    if not isinstance(tree, dict) or key not in tree:
      return None
    tree = tree[key]
  return tree


# --- strict check -------------------------------------------------------------------------------


def check_tensors(ckpt: SafetensorsCheckpoint, cfg: MtpConfig, params: list[Param],
                  checks: list[tuple[str, str]], ignored: Callable[[str], bool] = lambda name: False) -> None:
  """Raises ONE CheckpointError listing every missing / unexpected / wrong-shape / wrong-dtype tensor."""
  problems, used, notes = [], set(), dict(ckpt.index_problems)
  for param in params:
    for name in param.sources:
      problems += _check_one(ckpt, name, param.source_shape(), param.transform in (LINEAR, EXPERTS), used, notes)
  for copy_name, _ in checks:
    if copy_name in ckpt.tensors:
      problems += _check_one(ckpt, copy_name, (cfg.vocab_size, cfg.hidden_size), False, used, notes)
  for name in sorted(set(ckpt.tensors) - used):
    if not ignored(name):
      problems.append(f"{name}: unexpected (no param for it in the name table for this config)")
  problems += [f"{name}: {note}" for name, note in sorted(notes.items()) if not ignored(name) and name not in used]
  if problems:
    shown = "\n  ".join(problems[:60]) + (f"\n  ... and {len(problems) - 60} more" if len(problems) > 60 else "")
    raise CheckpointError(
        f"checkpoint {ckpt.directory!r} does not match the config (model_type={cfg.model_type}, "
        f"num_hidden_layers={cfg.num_hidden_layers}, num_nextn_predict_layers={cfg.num_nextn_predict_layers}, "
        f"n_routed_experts={cfg.n_routed_experts}): {len(problems)} problem(s):\n  {shown}")


def _check_one(ckpt: SafetensorsCheckpoint, name: str, shape: tuple[int, ...], fp8_ok: bool, used: set,
               notes: dict[str, str]) -> list[str]:
  info = ckpt.tensors.get(name)
  if info is None:
    note = f"; {notes.pop(name)}" if name in notes else ""
    return [f"{name}: missing (expected shape {list(shape)}){note}"]
  used.add(name)
  problems = []
  if info.shape != tuple(shape):
    problems.append(f"{name}: shape {list(info.shape)}, expected {list(shape)}")
  allowed = FLOAT_DTYPES + ((FP8_DTYPE,) if fp8_ok else ())
  if info.dtype not in allowed:
    problems.append(f"{name}: dtype {info.dtype}, expected one of {list(allowed)}")
  if info.dtype == FP8_DTYPE and fp8_ok:
    problems += _check_scale(ckpt, name, shape, used, notes)
  return problems


def _check_scale(ckpt: SafetensorsCheckpoint, name: str, shape: tuple[int, ...], used: set,
                 notes: dict[str, str]) -> list[str]:
  scale = scale_name(name)
  expected = tuple(-(-n // b) for n, b in zip(shape, ckpt.block))
  info = ckpt.tensors.get(scale)
  if info is None:
    note = f"; {notes.pop(scale)}" if scale in notes else ""
    return [f"{scale}: missing (FP8 {name} needs its block scales, shape {list(expected)}){note}"]
  used.add(scale)
  if info.shape != expected:
    return [f"{scale}: shape {list(info.shape)}, expected {list(expected)} (blocks {list(ckpt.block)})"]
  if info.dtype != "F32":
    return [f"{scale}: dtype {info.dtype}, expected F32"]
  return []


# --- loading ------------------------------------------------------------------------------------
