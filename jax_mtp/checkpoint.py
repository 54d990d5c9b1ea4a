"""Hugging Face checkpoint → jax_mtp params: strict, sliced per device, by the name table of
jax_mtp.checkpoint_names.

    cfg, target_params, mtp_params = load_hf_checkpoint("DeepSeek-V3.2/", mesh=make_mesh(8))
    cfg, mtp_params = load_mtp_only("DeepSeek-V3.2/")          # the drafter: MTP layers + embed/head

FP8 weights (`F8_E4M3` + `weight_scale_inv`) are dequantised exactly (jax_mtp.safetensors_io), or kept
as codes + block scales (`fp8_weights=True`, jax_mtp.fp8). Which a run takes, and where its checkpoint
comes from (a directory, a Hugging Face repo, orbax), is jax_mtp.loader's to decide.

Strict: every missing, unexpected, wrong-shape or wrong-dtype tensor is gathered into ONE
`CheckpointError`. With a mesh, each param is built with `jax.make_array_from_callback`: each
device's shard is read from the file on its own (only those bytes), so no host ever holds a whole
sharded tensor; replicated params are read once per param and copied to the devices. Vocab rows
are padded to a multiple of tp as `jax_mtp.sharding.shard_params` does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from jax_mtp import fp8
from jax_mtp.checkpoint_names import (CODES, COPY, EXPERTS, LINEAR, MTP, SCALES, TARGET, Param,
                                      check_tensors, plan)
from jax_mtp.config import MtpConfig
from jax_mtp.hf_config import from_hf_config
from jax_mtp.safetensors_io import DEFAULT_BLOCK, FP8_DTYPE, CheckpointError, SafetensorsCheckpoint
from jax_mtp.sharding import SHARED_WITH_TARGET, TP_AXIS, padded_vocab, param_sharding, validate_tp


def load_hf_checkpoint(path: str | os.PathLike, *, cfg: MtpConfig | None = None, mesh: Mesh | None = None,
                       dtype: str | None = None, progress: bool | None = None,
                       fp8_weights: bool = False) -> tuple[MtpConfig, dict, dict]:
  """Loads a HF DeepSeek-V3.2 / GLM-5 checkpoint directory. Returns (cfg, target_params, mtp_params).

  `cfg` defaults to the directory's config.json (a given one must agree with it but for dtypes);
  `dtype` overrides `param_dtype`. Without a mesh the params are `init_target_params` /
  `init_params` trees on the default device. With a mesh they are placed as `shard_params` places
  them (vocab rows padded to a multiple of tp), each device's shard read on its own. `mtp_params`
  holds the target's `embed_tokens` / `lm_head` arrays (the same arrays, not copies).
  `progress`: a tqdm bar on stderr (None: only on a terminal). `fp8_weights`: keep the weights the
  checkpoint stores in FP8 as their codes + block scales (jax_mtp.fp8) instead of dequantising them;
  the returned config then carries the checkpoint's blocks (`fp8_block`), which the model needs.
  """
  return load_opened(open_hf_checkpoint(path, cfg=cfg, mesh=mesh, dtype=dtype), progress=progress,
                     fp8_weights=fp8_weights)


class Opened(NamedTuple):
  """A checkpoint directory opened and checked once (`open_hf_checkpoint`): what loading it, or asking
  whether its FP8 weights can be kept on the mesh (`fp8_split_problems`), needs."""

  cfg: MtpConfig
  ckpt: SafetensorsCheckpoint
  params: list[Param]
  checks: list[tuple[str, str]]
  mesh: Mesh | None
  fp8_stored: bool  # config.json declares DeepSeek's FP8 quantization (its weights may be kept as stored)


def open_hf_checkpoint(path: str | os.PathLike, *, cfg: MtpConfig | None = None, mesh: Mesh | None = None,
                       dtype: str | None = None, mtp_only: bool = False) -> Opened:
  """Reads a checkpoint's config and headers and checks every tensor (one CheckpointError); reads no
  weight. The arguments are `load_hf_checkpoint`'s; `mtp_only`: the drafter's tensors alone (`load_mtp_only`)."""
  cfg, ckpt, fp8_stored = _open(path, cfg, dtype, mesh)
  check_layer_count(cfg, ckpt, mtp_only)  # before `plan`, whose work grows with the layers config.json names
  params, checks = plan(cfg)
  if mtp_only:
    params = [p for p in params if p.tree == MTP or p.path[-1] in SHARED_WITH_TARGET]
  ignored = (lambda name: not drafter_reads(cfg, name)) if mtp_only else (lambda name: False)
  check_tensors(ckpt, cfg, params, checks, ignored)
  return Opened(cfg, ckpt, params, checks, mesh, fp8_stored)


def load_opened(opened: Opened, *, progress: bool | None = None,
                fp8_weights: bool = False) -> tuple[MtpConfig, dict, dict]:
  """`load_hf_checkpoint` of a checkpoint `open_hf_checkpoint` opened (with `mtp_only`, the target tree
  holds the embedding and head alone)."""
  cfg, ckpt, params, checks, mesh, _ = opened
  _check_copies(ckpt, checks)
  trees = _build(ckpt, cfg, keep_fp8(ckpt, params) if fp8_weights else params, mesh, progress)
  trees[MTP].update({name: trees[TARGET][name] for name in SHARED_WITH_TARGET})
  return (cfg.replace(fp8_block=ckpt.block) if fp8_weights else cfg), trees[TARGET], trees[MTP]


def load_mtp_only(path: str | os.PathLike, *, cfg: MtpConfig | None = None, mesh: Mesh | None = None,
                  dtype: str | None = None, progress: bool | None = None,
                  fp8_weights: bool = False) -> tuple[MtpConfig, dict]:
  """The drafter alone: the MTP layers plus the target's `embed_tokens` / `lm_head` (an
  `init_params` tree). The target layers and final norm are skipped unread; the rest is as strict
  as `load_hf_checkpoint`."""
  cfg, _, mtp = load_opened(open_hf_checkpoint(path, cfg=cfg, mesh=mesh, dtype=dtype, mtp_only=True),
                            progress=progress, fp8_weights=fp8_weights)
  return cfg, mtp


_TARGET_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def drafter_reads(cfg: MtpConfig, name: str) -> bool:
  """Whether the drafter alone (`load_mtp_only`) reads checkpoint tensor `name`: all but the target
  layers' and the final norm's."""
  match = _TARGET_LAYER.match(name)
  return name != "model.norm.weight" and (match is None or int(match[1]) >= cfg.num_hidden_layers)


def _open(path, cfg: MtpConfig | None, dtype: str | None, mesh: Mesh | None):
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint {path!r} is not a directory")
  from_file = from_hf_config(path)
  if cfg is not None:
    _check_same_model(cfg, from_file, path)
  cfg = from_file if cfg is None else cfg
  if dtype is not None:
    cfg = cfg.replace(param_dtype=dtype)
  if mesh is not None:
    validate_tp(cfg, mesh.shape[TP_AXIS])
  quant = quantization(path)
  return cfg, SafetensorsCheckpoint(path, _block_size(quant)), bool(quant)


def check_layer_count(cfg: MtpConfig, ckpt: SafetensorsCheckpoint, mtp_only: bool = False) -> None:
  """config.json's layer counts must name the layers whose tensors the checkpoint holds (`model.layers.{i}.`): a
  CheckpointError naming both otherwise. Checked from the tensor names alone, at once: a typo such as 6100 for 61
  would otherwise plan and check every missing tensor of thousands of layers (minutes, then gigabytes)."""
  held = {int(name.split(".")[2]) for name in [*ckpt.tensors, *ckpt.index_problems]
          if name.startswith("model.layers.") and name.split(".")[2].isdigit()}
  total = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
  wanted = set(range(cfg.num_hidden_layers if mtp_only else 0, total))
  missing = sorted(wanted - held)
  if missing:
    span = f"{min(held)}..{max(held)}" if held else "none"
    raise CheckpointError(
        f"{os.path.join(ckpt.directory, 'config.json')!r} names {cfg.num_hidden_layers} layers + "
        f"{cfg.num_nextn_predict_layers} MTP layer(s) (model.layers.0..{total - 1}), but the checkpoint's tensors "
        f"name layers {span}: {len(missing)} missing, from model.layers.{missing[0]}")


def _check_same_model(cfg: MtpConfig, from_file: MtpConfig, path: str) -> None:
  """A config passed in must describe the checkpoint's model; only how it runs may differ."""
  diff = cfg.model_differences(from_file, "config.json")
  if diff:
    raise CheckpointError(f"the config does not match {os.path.join(path, 'config.json')!r}: {', '.join(diff)}")


def quantization(path: str) -> dict:
  """config.json's `quantization_config` ({} for none); only DeepSeek's block-scaled FP8 (e4m3) is read."""
  with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
    quant = json.load(f).get("quantization_config") or {}
  if not isinstance(quant, dict):
    raise CheckpointError(f"quantization_config={quant!r} in {path!r} must be an object")
  method, fmt = quant.get("quant_method", "fp8"), quant.get("fmt", "e4m3")
  if method != "fp8" or fmt != "e4m3":
    raise CheckpointError(f"quantization_config quant_method={method!r}, fmt={fmt!r} in {path!r}: only DeepSeek's "
                          f"block-scaled FP8 (quant_method 'fp8', fmt 'e4m3') is supported")
  return quant


def fp8_block_of(path: str) -> tuple[int, int] | None:
  """The FP8 block size config.json's quantization_config declares; None where it declares none (no FP8 weights)."""
  quant = quantization(path)
  return _block_size(quant) if quant else None


def _block_size(quant: dict) -> tuple[int, int]:
  block = quant.get("weight_block_size", DEFAULT_BLOCK)
  if (not isinstance(block, (list, tuple)) or len(block) != 2
      or not all(isinstance(b, int) and b > 0 for b in block)):
    raise CheckpointError(f"quantization_config.weight_block_size={block!r} must be two positive integers")
  return tuple(block)


def _check_copies(ckpt: SafetensorsCheckpoint, checks: list[tuple[str, str]], rows: int = 4096) -> None:
  """The MTP layer's embed/head copies must equal the target's bit for bit (read in row chunks)."""
  for copy_name, target_name in checks:
    if copy_name not in ckpt.tensors:
      continue  # optional: the target's tensor is used either way
    copy, target = ckpt.raw(copy_name), ckpt.raw(target_name)
    same = copy.dtype == target.dtype and copy.shape == target.shape
    for start in range(0, copy.shape[0] if same else 0, rows):
      a, b = np.asarray(copy[start:start + rows]), np.asarray(target[start:start + rows])
      if a.tobytes() != b.tobytes():
        same = False
        break
    if not same:
      raise CheckpointError(f"{copy_name} differs from {target_name}; the MTP layer shares the target's "
                            f"tensor, so the checkpoint's copy must be identical")


def _build(ckpt: SafetensorsCheckpoint, cfg: MtpConfig, params: list[Param], mesh: Mesh | None,
           progress: bool | None) -> dict[str, dict]:
  trees: dict[str, dict] = {TARGET: {}, MTP: {}}
  total = sum(len(p.sources) for p in params)
  disable = None if progress is None else not progress
  with tqdm(total=total, unit="tensor", desc="loading checkpoint", file=sys.stderr, disable=disable) as bar:
    for p in params:
      tree = trees[p.tree]
      for key in p.path[:-1]:
        tree = tree.setdefault(key, {})
      tree[p.path[-1]] = _place(ckpt, cfg, p, mesh)
      bar.update(len(p.sources))
  return trees


def _place(ckpt: SafetensorsCheckpoint, cfg: MtpConfig, p: Param, mesh: Mesh | None) -> jax.Array:
  """One param, on the default device or sharded over the mesh shard by shard."""
  if mesh is None:
    return jax.device_put(read_param(ckpt, p, tuple(slice(0, n) for n in p.shape)))
  shape = p.shape
  if p.path[-1] in SHARED_WITH_TARGET:
    shape = (padded_vocab(cfg, mesh.shape[TP_AXIS]),) + shape[1:]
  sharding = param_sharding(mesh, p.path)
  arrays, last = [], (None, None)
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
    key = tuple((s.start, s.stop) for s in index)
    if key != last[0]:  # replicated params: read once, copied to each device
      last = (key, read_param(ckpt, p, index))
    arrays.append(jax.device_put(last[1], device))
  return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def keep_fp8(ckpt: SafetensorsCheckpoint, params: list[Param]) -> list[Param]:
  """`params` with every linear / expert weight the checkpoint stores in FP8 kept as its codes plus a
  `<name>_scale_inv` param of its block scales (jax_mtp.fp8), instead of dequantised."""
  kept = []
  for p in params:
    stored = {ckpt.tensors[name].dtype == FP8_DTYPE for name in p.sources}
    if p.transform not in (LINEAR, EXPERTS) or stored == {False}:
      kept.append(p)
      continue
    if stored != {True}:
      raise CheckpointError(f"{p.sources[0]} ...: some of the {len(p.sources)} experts of one param are FP8 and "
                            f"some are not; FP8 weights can be kept only when all are")
    kept.append(dataclasses.replace(p, dtype=np.dtype(fp8.FP8), role=CODES))
    kept.append(dataclasses.replace(p, path=p.path[:-1] + (fp8.scale_name(p.path[-1]),),
                                    shape=fp8.scale_shape(p.shape, ckpt.block), dtype=np.dtype(np.float32),
                                    role=SCALES))
  if len(kept) == len(params):
    raise CheckpointError(f"checkpoint {ckpt.directory!r} stores no FP8 weights to keep (its linear and expert "
                          f"weights are {sorted({ckpt.tensors[p.sources[0]].dtype for p in params})})")
  return kept


def fp8_split_problems(opened: Opened) -> list[str]:
  """Why the opened checkpoint's FP8 weights cannot be kept on its mesh (a device's share not whole
  blocks), one line per tensor; [] when they can (no mesh: one device). Reads headers only."""
  ckpt, problems = opened.ckpt, []
  if opened.mesh is None:
    return problems
  for p in keep_fp8(ckpt, opened.params):
    if p.role != CODES:
      continue
    sharding = param_sharding(opened.mesh, p.path)
    for index in sharding.addressable_devices_indices_map(p.shape).values():
      ours = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, p.shape))
      problem = ckpt.split_problem(p.sources[0], ours[-2:][::-1])
      if problem:
        problems.append(problem)
        break
  return problems


def read_param(ckpt: SafetensorsCheckpoint, p: Param, index: tuple[slice, ...]) -> np.ndarray:
  """`param[index]` in our layout and dtype; rows past the checkpoint's (vocab padding) are zero."""
  clipped = tuple(slice(s.start, min(s.stop, n)) for s, n in zip(index, p.shape))
  if p.transform == COPY:
    values = ckpt.read(p.sources[0], clipped).astype(p.dtype)
  elif p.transform == LINEAR:
    values = _read_matrix(ckpt, p, p.sources[0], clipped)
  else:
    values = _read_experts(ckpt, p, clipped)
  pad = [(0, (s.stop - s.start) - (c.stop - c.start)) for s, c in zip(index, clipped)]
  return np.pad(values, pad) if any(after for _, after in pad) else values


# Dequantisation is numpy work that releases the GIL, and experts hold most of a MoE checkpoint's
# bytes: a few threads fill one stacked param's experts at once.
_EXPERT_THREADS = min(8, os.cpu_count() or 1)


def _read_experts(ckpt: SafetensorsCheckpoint, p: Param, clipped: tuple[slice, ...]) -> np.ndarray:
  """[E, in, out] from E tensors [out, in], filled in place: at most _EXPERT_THREADS fp32 experts in
  flight and no stacking copy, so the host peak stays about one param."""
  experts, rest = clipped[0], clipped[1:]
  values = np.empty((experts.stop - experts.start, *(s.stop - s.start for s in rest)), p.dtype)

  def fill(i: int) -> None:
    values[i] = _read_matrix(ckpt, p, p.sources[experts.start + i], rest)

  with ThreadPoolExecutor(_EXPERT_THREADS) as pool:
    list(pool.map(fill, range(len(values))))  # list(): re-raises the first error
  return values


def _read_matrix(ckpt: SafetensorsCheckpoint, p: Param, name: str, index: tuple[slice, slice]) -> np.ndarray:
  """One [out, in] checkpoint matrix's `index` in our [in, out] layout: values, FP8 codes or scales."""
  if p.role == CODES:
    return ckpt.read_codes(name, index[::-1]).T
  if p.role == SCALES:
    return ckpt.read_scales(name, index[::-1]).T
  return ckpt.read(name, index[::-1]).T.astype(p.dtype)
