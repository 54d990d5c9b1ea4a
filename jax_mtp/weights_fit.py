"""Whether a checkpoint's weights fit the devices they are loaded onto, decided from its config before any weight
is read (or, for a Hugging Face repo id, fetched).

    check_weights_fit(cfg, mesh, fp8_kept=True, reserve_bytes=cache_bytes(...))

Loading DeepSeek-V3.2 (~690 GB in FP8) onto too few devices would otherwise read, or download, hundreds of gigabytes
before the device's allocator refuses. `planned_weights` is the abstract tree in the form the loader will place
(FP8 codes + fp32 block scales where kept, else the config's param dtype; the shared embedding and head padded to a
multiple of tp, as `shard_params` pads them), and `bytes_per_device` its share on one device of the mesh by
`jax_mtp.sharding`'s spec table; `planned_bytes_per_device` counts that from one layer of each kind.
`check_weights_fit` compares it, plus what the caller reserves (the decode caches), with what the first device of
the mesh that this process drives can still allocate (`request.device_free_bytes`): a CheckpointError naming the
numbers where it cannot, nothing otherwise. A pass does
not promise a fit (activations and XLA's temporaries come on top); a refusal is certain. On CPU devices, which share
the host's memory with everything else, nothing is checked.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from jax_mtp import fp8
from jax_mtp.checkpoint_names import MTP, TARGET, abstract_params
from jax_mtp.config import MtpConfig
from jax_mtp.request import device_free_bytes, gpu_pool_hint
from jax_mtp.safetensors_io import CheckpointError
from jax_mtp.sharding import SHARED_WITH_TARGET, TP_AXIS, fp8_split_problems, padded_vocab, param_sharding


def planned_weights(cfg: MtpConfig, mesh: Mesh | None, *, fp8_kept: bool, block: tuple[int, int] | None = None,
                    mtp_only: bool = False) -> dict:
  """{"target": ..., "mtp": ...} ShapeDtypeStructs as the loader places them: FP8 codes + block scales (`block`,
  default the config's) for the weights a V3.2 checkpoint stores in FP8 where `fp8_kept`, the config's param dtype
  otherwise. `mtp_only`: the MTP layer with the embedding and head it shares."""
  trees = abstract_params(cfg)
  if fp8_kept:
    trees = {name: fp8.as_checkpoint_fp8(tree, block or cfg.fp8_block, fp8.abstract_fp8) for name, tree in trees.items()}
  tp = 1 if mesh is None else mesh.shape[TP_AXIS]
  shared = {name: jax.ShapeDtypeStruct((padded_vocab(cfg, tp),) + trees[TARGET][name].shape[1:],
                                       trees[TARGET][name].dtype) for name in SHARED_WITH_TARGET}
  if mtp_only:
    return {MTP: {**trees[MTP], **shared}}
  return {TARGET: {**trees[TARGET], **shared}, MTP: trees[MTP]}


def fp8_split(cfg: MtpConfig, mesh: Mesh | None, block: tuple[int, int]) -> bool:
  """Whether `mesh` splits a block of a weight a V3.2 checkpoint stores in FP8 (the loader then cannot keep them).
  Judged on one layer of each kind (`_one_of_each`): every layer of a kind has the same shapes and specs."""
  if mesh is None:
    return False
  trees = planned_weights(_one_of_each(cfg), mesh, fp8_kept=True, block=block)
  return any(fp8_split_problems(tree, mesh, block) for tree in trees.values())


def planned_bytes_per_device(cfg: MtpConfig, mesh: Mesh | None, *, fp8_kept: bool,
                             block: tuple[int, int] | None = None, mtp_only: bool = False) -> int:
  """`bytes_per_device(planned_weights(...))`, planned on one layer of each kind and the rest counted: tracing the
  init of every layer of a 61-layer model (or of a config.json whose layer count is a typo: 6,100) takes minutes."""
  small = _one_of_each(cfg)
  trees = planned_weights(small, mesh, fp8_kept=fp8_kept, block=block, mtp_only=mtp_only)
  total = bytes_per_device(trees, mesh)
  if mtp_only or small.num_hidden_layers == cfg.num_hidden_layers:
    return total
  last = f"layers_{small.num_hidden_layers - 1}"  # a MoE layer, as every later one is
  per_layer = bytes_per_device({TARGET: {last: trees[TARGET][last]}}, mesh)
  return total + (cfg.num_hidden_layers - small.num_hidden_layers) * per_layer


def _one_of_each(cfg: MtpConfig) -> MtpConfig:
  """`cfg` with its dense layers and one MoE layer (layers differ only by `is_moe_layer`)."""
  return cfg.replace(num_hidden_layers=min(cfg.num_hidden_layers, cfg.first_k_dense_replace + 1))


def bytes_per_device(trees: dict, mesh: Mesh | None) -> int:
  """The bytes one device holds of `trees` (every device holds as many: the specs split evenly)."""
  total = 0
  for tree in trees.values():
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      shape = leaf.shape if mesh is None else param_sharding(mesh, tuple(k.key for k in path)).shard_shape(leaf.shape)
      total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
  return total


def free_bytes(device) -> int | None:
  """What `device` can still allocate (`request.device_free_bytes`); None for a CPU device, which shares the host's
  memory: its free figure does not say what a load may take."""
  return None if device.platform == "cpu" else device_free_bytes(device)


def check_weights_fit(cfg: MtpConfig, mesh: Mesh | None, *, fp8_kept: bool, block: tuple[int, int] | None = None,
                      mtp_only: bool = False, reserve_bytes: int = 0, hint: str = "") -> None:
  """A CheckpointError where the planned weights' share of one device (`planned_bytes_per_device`) plus
  `reserve_bytes` exceeds what the first device of `mesh` this process drives can still allocate (see the module
  docstring); nothing on CPU devices. `hint`: another remedy the caller knows of, said after a larger tp."""
  devices = jax.devices() if mesh is None else list(mesh.devices.flat)
  device = next((d for d in devices if d.process_index == jax.process_index()), None)
  free = None if device is None else free_bytes(device)
  if free is None:
    return
  need = planned_bytes_per_device(cfg, mesh, fp8_kept=fp8_kept, block=block, mtp_only=mtp_only)
  if need + reserve_bytes <= free:
    return
  tp = 1 if mesh is None else mesh.shape[TP_AXIS]
  layers = (f"{cfg.num_nextn_predict_layers} MTP layer(s)" if mtp_only else
            f"{cfg.num_hidden_layers} layers + {cfg.num_nextn_predict_layers} MTP layer(s)")
  form = "FP8 codes + block scales where stored" if fp8_kept else np.dtype(cfg.param_dtype).name
  caches = f" and {_size(reserve_bytes)} of decode caches" if reserve_bytes else ""
  raise CheckpointError(
      f"the weights of {layers} ({form}) need {_size(need)} on each device at tp={tp}{caches}, more than the "
      f"{_size(free)} free on {device}; nothing was read: spread them over more devices (a larger tp){hint}"
      f"{gpu_pool_hint(device)}")


def _size(nbytes: int) -> str:
  return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 // 10 else f"{nbytes / 2**20:.2f} MiB"
