"""Converted params to and from orbax: atomic saves, restores straight onto a mesh.

    save_params("ckpt/", cfg, target_params, mtp_params, model_files_from="DeepSeek-V3.2/")  # step 0
    cfg, target_params, mtp_params = restore_params("ckpt/", mesh=make_mesh(8))

(`python -m jax_mtp.convert` does the first for a whole checkpoint.) The directory is an orbax
`CheckpointManager` root; beside its steps it keeps the source checkpoint's tokenizer, chat template and
generation settings (`jax_mtp.model_files`), which the CLI reads there. A step holds three items: `params`
{"target": ..., "mtp": ...} (vocab rows unpadded, so any tp can restore it; the MTP tree without the
shared embedding / head), `config` (the MtpConfig as JSON) and `fp8` (the paths of FP8 weights kept as
codes + block scales, jax_mtp.fp8, restored in that form). Orbax writes a step into a temporary
directory and renames it into place when complete, so a save killed midway leaves no step behind and
every earlier step readable; `restore_params` reads the latest complete step.

Restores build `jax.ShapeDtypeStruct` targets carrying each param's `NamedSharding`
(`jax_mtp.sharding`'s spec table): orbax reads each device's shard into that device; no host
holds a whole sharded tensor. The vocab rows are then padded on the devices (as `shard_params` does).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.sharding import Mesh, SingleDeviceSharding

from jax_mtp import fp8
from jax_mtp.checkpoint_names import MTP, TARGET, abstract_params
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.config import MtpConfig, RopeConfig
from jax_mtp.errors import first_line
from jax_mtp.model_files import MODEL_FILES, copy_model_files
from jax_mtp.safetensors_io import CheckpointError
from jax_mtp import sharding
from jax_mtp.sharding import TP_AXIS, padded_vocab, param_sharding, validate_tp

PARAMS, CONFIG, FP8_ITEM = "params", "config", "fp8"


def is_orbax_checkpoint(directory: str | os.PathLike) -> bool:
  """True if `directory` holds at least one complete step written by `save_params`."""
  directory = os.fspath(directory)
  return os.path.isdir(directory) and bool(_steps(directory))


def _steps(directory: str) -> list[int]:
  return sorted(int(name) for name in os.listdir(directory)
                if name.isdigit() and os.path.isdir(os.path.join(directory, name, PARAMS)))


def _manager(directory: str, create: bool) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(create=create, enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options)


def save_params(directory: str | os.PathLike, cfg: MtpConfig, target_params: dict, mtp_params: dict, *,
                step: int = 0, model_files_from: str | os.PathLike | None = None) -> tuple[str, ...]:
  """Saves the params as checkpoint `step` of `directory`, atomically; returns the model files copied.

  Refuses (CheckpointError, nothing written) what `check_destination` refuses. Params may be placed on a mesh
  (padded vocab rows are dropped) or not. `model_files_from`: a checkpoint directory whose tokenizer, chat template
  and generation settings (EOS ids) are copied beside the steps (`jax_mtp.model_files`), so that the CLI reads them
  from this directory as from that one.
  """
  directory = check_destination(directory, step)
  try:  # an unwritable target fails here, before orbax starts, naming the path
    os.makedirs(directory, exist_ok=True)
    if not os.access(directory, os.W_OK):
      raise PermissionError(13, "Permission denied", directory)
    copied = () if model_files_from is None else copy_model_files(model_files_from, directory)  # before the step
  except OSError as e:
    raise CheckpointError(f"cannot write the checkpoint to {directory!r}: {e.strerror or e}; nothing written") from None
  trees = {TARGET: _unpadded(target_params, cfg),
           MTP: {k: v for k, v in _unpadded(mtp_params, cfg).items() if k not in SHARED_WITH_TARGET}}
  kept = ["/".join(path) for path in fp8.fp8_paths(trees)]  # FP8 weights stay FP8 (jax_mtp.fp8)
  with _manager(directory, create=True) as manager:
    manager.save(step, args=ocp.args.Composite(**{
        PARAMS: ocp.args.StandardSave(trees), CONFIG: ocp.args.JsonSave(dataclasses.asdict(cfg)),
        FP8_ITEM: ocp.args.JsonSave({"paths": kept})}))
    manager.wait_until_finished()
  return copied


def check_destination(directory: str | os.PathLike, step: int = 0) -> str:
  """`directory` as an absolute path, if `save_params` can write checkpoint `step` there: a new or empty directory,
  or one holding orbax steps other than `step` (and the model files saved beside them). A CheckpointError naming
  what is in the way otherwise. Cheap, so a conversion calls it before reading any weight."""
  directory = os.path.abspath(os.fspath(directory))
  if os.path.isdir(directory):
    if step in _steps(directory):
      raise CheckpointError(f"{directory!r} already holds checkpoint step {step}; nothing written "
                            f"(pick another directory or step)")
    strangers = [n for n in os.listdir(directory)
                 if not (n.split(".")[0].isdigit() or n in MODEL_FILES or n.startswith("."))]
    if strangers:
      raise CheckpointError(f"{directory!r} holds {sorted(strangers)[:3]}, which are not orbax checkpoint "
                            f"steps; save into an empty or new directory")
  elif os.path.exists(directory):
    raise CheckpointError(f"{directory!r} is a file, not a directory; nothing written")
  return directory


def _unpadded(params: dict, cfg: MtpConfig) -> dict:
  return {k: (v[:cfg.vocab_size] if k in SHARED_WITH_TARGET else v) for k, v in params.items()}


def read_config(directory: str | os.PathLike) -> MtpConfig:
  """The config saved with the latest complete step."""
  directory = os.path.abspath(os.fspath(directory))
  if not is_orbax_checkpoint(directory):
    raise CheckpointError(f"{directory!r} holds no complete jax_mtp orbax checkpoint")
  with _manager(directory, create=False) as manager:
    step = manager.latest_step()
    try:
      saved = manager.restore(step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))[CONFIG]
    except KeyError as e:  # another tool's orbax checkpoint: no config item beside its params
      raise CheckpointError(f"{directory!r} step {step} holds no jax_mtp config item ({e.args[0] if e.args else e})"
                            ) from None
    except Exception as e:  # noqa: BLE001 (a damaged item: orbax raises what its layers raise)
      raise _unreadable(directory, step, CONFIG, e) from e
    return _config_from_json(saved, f"{directory!r} step {step}")


def _unreadable(directory: str, step: int, item: str, error: Exception) -> CheckpointError:
  """A CheckpointError naming the step's item that orbax could not read, with the first line of why (orbax's own
  messages run to kilobytes of TensorStore spec)."""
  first = first_line(error)
  why = first if len(first) <= 200 else first[:200] + " …"
  return CheckpointError(f"{directory!r} step {step}: its {item!r} item cannot be read (damaged or incomplete): "
                         f"{type(error).__name__}: {why}")


def restore_params(directory: str | os.PathLike, cfg: MtpConfig | None = None, mesh: Mesh | None = None, *,
                   dequantise_fp8: bool = False) -> tuple[MtpConfig, dict, dict]:
  """The latest complete step: (cfg, target_params, mtp_params), as `load_hf_checkpoint` returns them.

  `cfg` defaults to the saved one; a given one must describe the saved model (its run settings may differ; the
  params keep their saved dtypes). With a mesh every param is restored with its spec's sharding and the vocab rows
  are padded to a multiple of tp. FP8 weights saved as codes + block scales are restored so, where every device's
  share is whole blocks (else a CheckpointError naming the first tensor: a kernel would pair codes with another
  block's scales), or with `dequantise_fp8` as `cfg`'s param_dtype (jax_mtp.fp8.dequantize, on the global arrays).
  """
  directory = os.path.abspath(os.fspath(directory))
  saved = read_config(directory)
  with _manager(directory, create=False) as manager:
    step = manager.latest_step()
    # the model must be the saved one; how it runs may differ, as for a HF checkpoint
    diff = [] if cfg is None else cfg.model_differences(saved, "saved")
    if diff:
      raise CheckpointError(f"the config does not match the one saved in {directory!r} step {step}: {', '.join(diff)}")
    if mesh is not None:
      validate_tp(saved, mesh.shape[TP_AXIS])
    kept = _fp8_kept(manager, directory, step)
    split = _split_problems(saved, mesh, kept)
    if split and not dequantise_fp8:
      raise CheckpointError(f"{split[0]}; keeping FP8 weights needs each device's share in whole blocks (dequantise "
                            f"them instead, or use another tp)")
    restore = ocp.args.StandardRestore(_abstract_targets(saved, mesh, kept), strict=False)  # strict=False: pad vocab
    try:
      trees = manager.restore(step, args=ocp.args.Composite(**{PARAMS: restore}))[PARAMS]
    except Exception as e:  # noqa: BLE001 (missing or truncated array files, a damaged manifest)
      raise _unreadable(directory, step, PARAMS, e) from e
  if dequantise_fp8 and kept:
    dtype = (saved if cfg is None else cfg).param_dtype
    trees = {name: fp8.dequantize_params(tree, dtype, saved.fp8_block) for name, tree in trees.items()}
  target = trees[TARGET]
  return saved, target, {**trees[MTP], **{name: target[name] for name in SHARED_WITH_TARGET}}


def saved_fp8(directory: str | os.PathLike, mesh: Mesh | None) -> tuple[MtpConfig, list[str], list[str]]:
  """The latest step's config, its FP8 weights' paths ("target/layers_0/...", saved as codes + block scales) and
  why each cannot be kept on `mesh` as saved (a device's share not whole blocks; [] with no mesh). Reads the config
  and the FP8 item, no weight."""
  directory = os.path.abspath(os.fspath(directory))
  cfg = read_config(directory)
  with _manager(directory, create=False) as manager:
    kept = _fp8_kept(manager, directory, manager.latest_step())
  return cfg, kept, _split_problems(cfg, mesh, kept)


def _split_problems(cfg: MtpConfig, mesh: Mesh | None, kept: list[str]) -> list[str]:
  """`sharding.fp8_split_problems` of the step's trees as saved (the `kept` paths as codes + block scales)."""
  if mesh is None:
    return []
  return [problem for name, tree in _saved_form(cfg, kept).items()
          for problem in sharding.fp8_split_problems(tree, mesh, cfg.fp8_block, f"{name}/")]


def _fp8_kept(manager: ocp.CheckpointManager, directory: str, step: int) -> list[str]:
  """The step's FP8 item: the paths ("target/layers_0/...") of the weights saved as codes + block scales."""
  if not os.path.isdir(os.path.join(directory, str(step), FP8_ITEM)):  # steps saved before FP8 trees have none
    return []
  try:
    return manager.restore(step, args=ocp.args.Composite(**{FP8_ITEM: ocp.args.JsonRestore()}))[FP8_ITEM]["paths"]
  except Exception as e:  # noqa: BLE001 (as in read_config)
    raise _unreadable(directory, step, FP8_ITEM, e) from e


def _config_from_json(data, where: str) -> MtpConfig:
  """The saved config as an MtpConfig; a CheckpointError naming `where` and what is wrong otherwise."""
  if not isinstance(data, dict) or not isinstance(data.get("rope"), dict):
    raise CheckpointError(f"the config saved in {where} is not a jax_mtp config (no 'rope' section)")
  try:
    fields = {**data, "rope": RopeConfig(**data["rope"])}
    if "fp8_block" in fields:  # JSON has lists, the config a tuple
      fields["fp8_block"] = tuple(fields["fp8_block"])
    return MtpConfig(**fields)
  except TypeError as e:  # a field this version does not have, or one missing
    raise CheckpointError(f"the config saved in {where} does not fit this jax_mtp's MtpConfig: {e}") from None


def _abstract_targets(cfg: MtpConfig, mesh: Mesh | None, fp8_kept: list[str]) -> dict:
  """ShapeDtypeStructs with the sharding each param is restored with; the `fp8_kept` paths as FP8
  codes with their block scales beside them."""
  def target(path, leaf):
    keys = tuple(k.key for k in path[1:])  # drop "target" / "mtp"
    if mesh is None:
      return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=SingleDeviceSharding(jax.devices()[0]))
    shape = leaf.shape
    if keys[-1] in SHARED_WITH_TARGET:  # orbax pads the saved rows with zeros (strict=False)
      shape = (padded_vocab(cfg, mesh.shape[TP_AXIS]),) + shape[1:]
    return jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=param_sharding(mesh, keys))
  return jax.tree_util.tree_map_with_path(target, _saved_form(cfg, fp8_kept))


def _saved_form(cfg: MtpConfig, fp8_kept: list[str]) -> dict:
  """`abstract_params(cfg)` with the `fp8_kept` paths as FP8 codes and their block scales beside them."""
  abstract = abstract_params(cfg)
  for path in fp8_kept:
    *parents, name = path.split("/")
    node = abstract
    for key in parents:
      node = node[key]
    leaf = node[name]
    node[name] = jax.ShapeDtypeStruct(leaf.shape, fp8.FP8)
    node[fp8.scale_name(name)] = jax.ShapeDtypeStruct(fp8.scale_shape(leaf.shape, cfg.fp8_block), jnp.float32)
  return abstract

