"""Loading, decided in one place: where a model's files are, which format they hold, and in what form the
weights run.

    loaded = load("deepseek-ai/DeepSeek-V3.2-Exp", mesh=make_mesh(8))    # Loaded(cfg, target, mtp, dequantised)
    loaded = load(None)                                                   # the embedded default

A checkpoint is a HF directory (config.json + safetensors: jax_mtp.checkpoint), an orbax directory
(`jax_mtp.orbax_io.save_params`), a Hugging Face repo id (`owner/name`, not a local path: jax_mtp.hub
fetches only the files the run reads), or None: the embedded default (`DEFAULT_MODEL`). `locate` says
where its config, tokenizer and EOS ids are read before any weight (the CLI validates a request there);
`load` then places the weights on the mesh and returns the config they run with. `weights`:

  fp8   keep FP8 weights as stored (codes + block scales, jax_mtp.fp8); an error if none are stored
  bf16  dequantise them on load, to the config's `param_dtype`
  auto  as the checkpoint stores them: FP8 weights (a HF checkpoint's, an orbax step's) kept where the
        mesh splits whole blocks, else dequantised (`Loaded.dequantised` says which tensors split)

The checkpoint modules are imported where used: the random tiny model runs without safetensors, orbax,
tqdm and huggingface_hub installed (the lent GPU machines' images lack some and cannot install them).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax
from jax.sharding import Mesh

from jax_mtp.config import MtpConfig
from jax_mtp.hf_config import from_hf_config
from jax_mtp.model import init_target_params
from jax_mtp.mtp import init_params

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model")
WEIGHT_SEED = 0  # random_weights' seed (the CLI's --random-tiny; its --seed only drives sampling)
WEIGHTS = ("auto", "fp8", "bf16")


class Source(NamedTuple):
  """Where a checkpoint's files are (`locate`)."""

  directory: str  # config.json, the tokenizer and EOS ids; for a local checkpoint the weights too
  repo_id: str | None = None  # a Hugging Face repo, whose shards `load` fetches into the cache

  @property
  def revision(self) -> str | None:
    """A Hub checkpoint's commit (its snapshot directory's name)."""
    return None if self.repo_id is None else os.path.basename(self.directory)


class Loaded(NamedTuple):
  """A checkpoint's params on the mesh (vocab rows padded, as `shard_params` leaves them) or, without a
  mesh, on the default device, and the config they run with."""

  cfg: MtpConfig  # FP8 weights kept as stored carry their block size in it (`fp8_block`)
  target: dict | None  # None for the drafter alone (`mtp_only`)
  mtp: dict  # holds the target's embedding and head (the same arrays)
  dequantised: tuple[str, ...] = ()  # weights="auto": why the stored FP8 weights were dequantised, a line a tensor


def locate(checkpoint: str | os.PathLike | Source | None) -> Source:
  """Where `checkpoint`'s config, tokenizer and EOS ids are: the directory itself, a repo id's snapshot
  in the Hugging Face cache (its small files fetched, no weight), or the embedded default's for None."""
  if isinstance(checkpoint, Source):
    return checkpoint
  if checkpoint is None:
    if not os.path.isfile(os.path.join(DEFAULT_MODEL, "config.json")):
      raise _error(f"the embedded default model is missing from this installation ({DEFAULT_MODEL}); "
                   f"reinstall jax_mtp, or use --checkpoint or --random-tiny")
    return Source(DEFAULT_MODEL)
  path = os.fspath(checkpoint)
  from jax_mtp import hub  # noqa: PLC0415 (see the module docstring)
  if hub.is_repo_id(path):
    return Source(hub.fetch_metadata(path), path)
  return Source(path)


def checkpoint_config(checkpoint: str | os.PathLike | Source | None) -> MtpConfig:
  """The config of a HF or orbax checkpoint (read before any weight)."""
  directory = locate(checkpoint).directory
  from jax_mtp.orbax_io import is_orbax_checkpoint, read_config  # noqa: PLC0415 (see the module docstring)
  if not os.path.isdir(directory):  # a local path (a Hub repo id was fetched above): say what is wrong with it
    what = "is a file, not a directory" if os.path.exists(directory) else "does not exist"
    raise _error(f"--checkpoint {directory!r} {what} (a HF checkpoint directory, an orbax checkpoint written by "
                 f"jax_mtp.orbax_io.save_params, or a Hub repo id owner/name)")
  if is_orbax_checkpoint(directory):
    return read_config(directory)
  if os.path.isfile(os.path.join(directory, "config.json")):
    return from_hf_config(directory)
  raise _error(f"--checkpoint {directory!r} is neither a HF checkpoint directory (config.json + "
               f"*.safetensors) nor an orbax checkpoint written by jax_mtp.orbax_io.save_params")


def random_weights(cfg: MtpConfig) -> tuple[dict, dict]:
  """(target, MTP) params at random (`WEIGHT_SEED`), on the default device."""
  return init_target_params(cfg, jax.random.key(WEIGHT_SEED)), init_params(cfg, jax.random.key(WEIGHT_SEED + 1))


def load(checkpoint: str | os.PathLike | Source | None, *, cfg: MtpConfig | None = None, mesh: Mesh | None = None,
         weights: str = "auto", mtp_only: bool = False, progress: bool | None = None,
         reserve_bytes: int = 0) -> Loaded:
  """`checkpoint`'s weights on `mesh` (None: the default device), in the form `weights` asks for (see the
  module docstring), and the config they run with. `cfg` defaults to the checkpoint's own and must
  describe its model (only the run settings may differ). `mtp_only`: the drafter alone (a repo's other
  shards are not fetched). `progress`: a tqdm bar on stderr (None: on a terminal; never for the embedded
  default). Before any weight is read, weights that cannot fit the mesh's devices beside `reserve_bytes` (the
  caller's caches) are a CheckpointError naming the numbers (jax_mtp.weights_fit; not checked on CPU devices)."""
  if weights not in WEIGHTS:
    raise ValueError(f"weights={weights!r} must be one of {WEIGHTS}")
  source = locate(checkpoint)
  cfg = checkpoint_config(source) if cfg is None else cfg
  from jax_mtp.orbax_io import is_orbax_checkpoint  # noqa: PLC0415 (see the module docstring)
  split = _check_fit(source.directory, cfg, mesh, weights, mtp_only, reserve_bytes)  # before a weight is read
  if is_orbax_checkpoint(source.directory):
    loaded = _load_orbax(source.directory, cfg, mesh, weights, split)
  else:
    progress = False if source.directory == DEFAULT_MODEL else progress
    loaded = _load_hf(source, cfg, mesh, weights, mtp_only, progress)
  return loaded._replace(target=None) if mtp_only else loaded


def _check_fit(directory: str, cfg: MtpConfig, mesh: Mesh | None, weights: str, mtp_only: bool,
               reserve_bytes: int) -> tuple[str, ...]:
  """`weights_fit.check_weights_fit` on the form the load will place: FP8 where the checkpoint stores it and the
  load keeps it (as `_load_orbax` / `_load_hf` decide), else the param dtype. Reads config files only. Returns an
  orbax step's split FP8 weights (`orbax_io.saved_fp8`), which `_load_orbax` dequantises under "auto"."""
  from jax_mtp import orbax_io, weights_fit  # noqa: PLC0415
  problems = ()
  if orbax_io.is_orbax_checkpoint(directory):
    cfg, paths, problems = orbax_io.saved_fp8(directory, mesh)  # its params keep their saved dtypes
    stored, block, split = bool(paths), cfg.fp8_block, bool(problems)
  else:
    from jax_mtp.checkpoint import fp8_block_of  # noqa: PLC0415
    block = fp8_block_of(directory)  # None: no FP8 weights stored
    stored = block is not None
    split = stored and weights_fit.fp8_split(cfg, mesh, block)
  kept = stored and (weights == "fp8" or (weights == "auto" and not split))  # "fp8" with split: refused later
  hint = ("; or keep the stored FP8 weights as they are (half the bytes: --weights fp8, or auto at a tp that splits "
          "no block)") if stored and not kept else ""
  weights_fit.check_weights_fit(cfg, mesh, fp8_kept=kept, block=block, mtp_only=mtp_only, reserve_bytes=reserve_bytes,
                                hint=hint)
  return tuple(problems)


def _load_orbax(directory: str, cfg: MtpConfig, mesh: Mesh | None, weights: str, split: tuple[str, ...]) -> Loaded:
  """An orbax step as saved (FP8 weights stay FP8 where the mesh splits whole blocks, as for a HF checkpoint: `split`
  names those it does not), dequantised for weights="bf16"."""
  from jax_mtp import fp8  # noqa: PLC0415
  from jax_mtp.orbax_io import restore_params  # noqa: PLC0415
  split = split if weights == "auto" else ()
  saved, target, mtp = restore_params(directory, cfg, mesh, dequantise_fp8=weights == "bf16" or bool(split))
  if weights == "fp8" and not (fp8.fp8_paths(target) or fp8.fp8_paths(mtp)):
    raise _error(f"--weights fp8: the orbax checkpoint {directory!r} stores no FP8 weights")
  return Loaded(cfg.replace(fp8_block=saved.fp8_block), target, mtp, split)


def _load_hf(source: Source, cfg: MtpConfig, mesh: Mesh | None, weights: str, mtp_only: bool,
             progress: bool | None) -> Loaded:
  """A HF checkpoint, its headers read and checked once; weights="auto" keeps stored FP8 weights where
  every device's share is whole blocks."""
  from jax_mtp.checkpoint import drafter_reads, fp8_split_problems, load_opened, open_hf_checkpoint  # noqa: PLC0415
  directory = source.directory
  if source.repo_id is not None:  # the shards holding what this run reads, fetched into the cache
    from jax_mtp import hub  # noqa: PLC0415
    directory = hub.fetch_weights(source.repo_id, directory, (lambda name: drafter_reads(cfg, name)) if mtp_only
                                  else None)
  opened = open_hf_checkpoint(directory, cfg=cfg, mesh=mesh, mtp_only=mtp_only)
  split = tuple(fp8_split_problems(opened)) if weights == "auto" and opened.fp8_stored else ()
  fp8_weights = weights == "fp8" or (weights == "auto" and opened.fp8_stored and not split)
  cfg, target, mtp = load_opened(opened, progress=progress, fp8_weights=fp8_weights)
  return Loaded(cfg, target, mtp, split)


def _error(message: str) -> ValueError:
  from jax_mtp.safetensors_io import CheckpointError  # noqa: PLC0415 (see the module docstring)
  return CheckpointError(message)
