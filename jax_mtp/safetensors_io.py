"""Lazy, sliced reads of a HF safetensors checkpoint (one file or shards + index), with FP8 dequantisation.

A checkpoint directory holds `model.safetensors`, or `model-*.safetensors` shards listed by
`model.safetensors.index.json` (`weight_map`: tensor name → file). `SafetensorsCheckpoint` opens
every file with `safetensors.safe_open` (which validates the header and that the data covers the
file: a truncated download fails here, and the error names the file), then reads any rectangular
slice of a tensor through `np.memmap` at the header's offsets: only the pages of that slice are read,
so a device's shard of a tensor costs that shard's bytes. (safetensors 0.8's numpy backend cannot
build `F8_E4M3` arrays — it looks for `numpy.float8_e4m3fn` — hence memmap for the bytes, with
ml_dtypes for the dtypes; the header safe_open validated is the one we read.)

FP8 (DeepSeek-V3 `README_WEIGHTS.md`): `W[i, j] = W_fp8[i, j] · weight_scale_inv[i // B0, j // B1]`
with B0 × B1 = 128 × 128 blocks (the config's `quantization_config.weight_block_size`); the last
block of a dim may be partial. The product is exact in fp32 (an e4m3 value has 4 significant bits),
and is then rounded once to the param dtype.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SCALE_SUFFIX = "_scale_inv"  # `x.weight` → `x.weight_scale_inv`
DEFAULT_BLOCK = (128, 128)

# safetensors dtype names → numpy dtypes (the ones a DeepSeek / GLM checkpoint can hold).
DTYPES = {
    "F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F64": np.dtype(np.float64), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
FLOAT_DTYPES = ("F32", "BF16", "F16")
FP8_DTYPE = "F8_E4M3"


class CheckpointError(ValueError):
  """A checkpoint file or tensor is missing, malformed, or does not match the config."""


class TensorInfo:
  """Where one tensor's bytes are: file, byte offset, dtype name, shape."""

  __slots__ = ("file", "offset", "dtype", "shape")

  def __init__(self, file: str, offset: int, dtype: str, shape: tuple[int, ...]):
    self.file, self.offset, self.dtype, self.shape = file, offset, dtype, shape


def scale_name(weight_name: str) -> str:
  return weight_name + SCALE_SUFFIX


class SafetensorsCheckpoint:
  """The tensors of a checkpoint directory, by name; `read(name, index)` returns a float32 slice."""

  def __init__(self, directory: str | os.PathLike, block: tuple[int, int] = DEFAULT_BLOCK):
    self.directory, self.block = os.fspath(directory), tuple(block)
    self.index_problems: dict[str, str] = {}  # name → what is wrong in the index; reported by the caller
    self.tensors: dict[str, TensorInfo] = {}
    index_path = os.path.join(self.directory, INDEX_FILE)
    if os.path.exists(index_path):
      self._from_index(index_path)
    elif os.path.exists(os.path.join(self.directory, SINGLE_FILE)):
      self.tensors.update(_read_file(os.path.join(self.directory, SINGLE_FILE)))
    elif os.path.islink(single := os.path.join(self.directory, SINGLE_FILE)):  # a link to nothing (os.path.exists
      # follows links): say so, not "no such file" beside a listing that shows it
      raise CheckpointError(f"{single!r} is a link to {os.readlink(single)!r}, which does not exist")
    else:
      shards = sorted(f for f in os.listdir(self.directory) if f.endswith(".safetensors"))
      what = f"shards {shards[:3]} but no {INDEX_FILE}" if shards else "no *.safetensors file"
      raise CheckpointError(f"checkpoint directory {self.directory!r} has {what}; expected {SINGLE_FILE} "
                            f"or model-*.safetensors with {INDEX_FILE}")

  def _from_index(self, index_path: str) -> None:
    weight_map = read_weight_map(index_path)
    for file in sorted(set(weight_map.values())):
      path = os.path.join(self.directory, file)
      if not os.path.exists(path):
        raise CheckpointError(f"{INDEX_FILE} lists file {file!r}, which is not in {self.directory!r}")
      for name, info in _read_file(path).items():
        if weight_map.get(name) == file:
          self.tensors[name] = info
        else:  # the index does not point here: a stale index or a stray tensor; never read it
          listed = "has no entry for it" if name not in weight_map else f"says {weight_map[name]}"
          self.index_problems[name] = f"in file {file} but {INDEX_FILE} {listed}"
    for name, file in sorted(weight_map.items()):
      if name not in self.tensors and name not in self.index_problems:
        self.index_problems[name] = f"{INDEX_FILE} says file {file}, which does not hold it"

  def raw(self, name: str) -> np.ndarray:
    """The stored tensor, lazily (a memmap), in its stored dtype."""
    return _memmap(self.tensors[name])

  def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """`tensor[index]` as float32, dequantised with its `_scale_inv` blocks if it is FP8."""
    info = self.tensors[name]
    index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, info.shape))
    values = _memmap(info)[index]
    if info.dtype != FP8_DTYPE:
      return _finite(values.astype(np.float32), name, info.file)
    scale = self.tensors[scale_name(name)]
    return _finite(dequantize_block(values, _memmap(scale), self.block, index, name), name, info.file)


  def read_codes(self, name: str, index: tuple[slice, slice]) -> np.ndarray:
    """The FP8 codes `tensor[index]` as stored (float8_e4m3fn), checked as `read` checks them; the
    slice must consist of whole blocks (a last partial block at the tensor's end included), so that
    its scales are whole rows and columns of `weight_scale_inv`."""
    info = self.tensors[name]
    index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, info.shape))
    problem = self.split_problem(name, index)
    if problem:
      raise CheckpointError(f"{problem}; keeping FP8 weights needs each device's share in whole blocks "
                            f"(dequantise them instead, or use another tp)")
    self.read(name, index)  # validates codes and scales (non-finite, zero scales) exactly as the dequantising path
    return np.asarray(_memmap(info)[index])

  def split_problem(self, name: str, index: tuple[slice, slice]) -> str | None:
    """Why `tensor[index]` is not whole FP8 blocks (a last partial block at the tensor's end counts as
    whole), or None."""
    shape = self.tensors[name].shape
    for s, n, b in zip(index, shape, self.block):
      start, stop = s.indices(n)[:2]
      if start % b or (stop % b and stop != n):
        return f"{name}: the slice [{start}:{stop}] of a dim of {n} does not fall on its FP8 blocks of {b}"
    return None

  def read_scales(self, name: str, block_index: tuple[slice, slice]) -> np.ndarray:
    """Rows and columns `block_index` of `name`'s `weight_scale_inv` (fp32); `read_codes` checks them."""
    return np.asarray(_memmap(self.tensors[scale_name(name)])[block_index], np.float32)


def _finite(values: np.ndarray, name: str, file: str) -> np.ndarray:
  """`values`, or a CheckpointError naming the tensor and its first non-finite element: a NaN or
  inf weight would turn every logit it reaches into NaN, and greedy decoding into token 0."""
  bad = ~np.isfinite(values)
  if bad.any():
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise CheckpointError(f"tensor {name} in {file} holds {np.count_nonzero(bad)} non-finite value(s) in the slice "
                          f"read (the first at {where}: {values[where]}); the checkpoint is corrupt")
  return values


def dequantize_block(w_fp8: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int],
                     index: tuple[slice, slice], name: str = "the tensor") -> np.ndarray:
  """`w_fp8 = W_fp8[index]` times the scale of each element's block, in float32.

  `scale_inv` is the whole [ceil(rows / B0), ceil(cols / B1)] scale tensor (tiny) or a memmap of it;
  only the blocks `index` touches are read. Partial edge blocks need nothing special: element (i, j)
  uses block (i // B0, j // B1) wherever the tensor ends.
  """
  (r0, r1), (c0, c1) = ((s.start, s.stop) for s in index)
  (b0, b1) = block
  s = np.asarray(scale_inv[r0 // b0: -(-r1 // b0), c0 // b1: -(-c1 // b1)], np.float32)
  if not (np.isfinite(s).all() and (s >= 0).all()):
    raise CheckpointError(f"{scale_name(name)} holds a scale that is not a finite number ≥ 0 "
                          f"({s[~(np.isfinite(s) & (s >= 0))][0]}); the checkpoint is corrupt")
  s = np.repeat(np.repeat(s, b0, axis=0), b1, axis=1)
  row_off, col_off = r0 % b0, c0 % b1  # where the slice starts inside its first block
  s = s[row_off: row_off + r1 - r0, col_off: col_off + c1 - c0]
  w = w_fp8.astype(np.float32)
  if ((s == 0) & (w != 0)).any():  # a zero scale would silently zero codes the quantiser wrote
    raise CheckpointError(f"{scale_name(name)} has a zero scale for a block of {name} whose codes are not all "
                          f"zero; the checkpoint is corrupt")
  return w * s


def _memmap(info: TensorInfo) -> np.ndarray:
  dtype = DTYPES[info.dtype]
  if not info.shape or 0 in info.shape:
    return np.zeros(info.shape, dtype)
  return np.memmap(info.file, dtype=dtype, mode="r", offset=info.offset, shape=info.shape)


def _read_file(path: str) -> dict[str, TensorInfo]:
  """Validates `path` with safe_open and returns its tensors' locations (from the same header)."""
  try:
    with safe_open(path, framework="numpy") as f:
      names = set(f.keys())
  except (SafetensorError, OSError) as e:
    raise CheckpointError(f"safetensors file {path!r} is truncated or corrupt ({e}); re-download it") from None
  with open(path, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(header_len))
  data_start = 8 + header_len
  tensors = {}
  for name in names:
    entry = header[name]  # an unreadable dtype is reported by the caller's strict check
    tensors[name] = TensorInfo(path, data_start + entry["data_offsets"][0], entry["dtype"], tuple(entry["shape"]))
  return tensors


def read_weight_map(index_path: str) -> dict[str, str]:
  """A safetensors index's tensor name → file name map; a CheckpointError naming the file where it holds none."""
  try:
    with open(index_path, encoding="utf-8") as f:
      weight_map = json.load(f)["weight_map"]
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
    raise CheckpointError(f"{index_path!r} is not a safetensors index (JSON with a 'weight_map'): {e!r}") from None
  if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
    raise CheckpointError(f"'weight_map' in {index_path!r} must map tensor names to file names")
  return weight_map
