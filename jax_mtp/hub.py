"""Checkpoints named by a Hugging Face repo id: only the files a run reads, fetched into (or found in) the
Hugging Face cache.

    snapshot = fetch_metadata("deepseek-ai/DeepSeek-V3.2-Exp")      # config, index, tokenizer: a few MB
    directory = fetch_weights("deepseek-ai/DeepSeek-V3.2-Exp", snapshot, wanted)   # the shards it reads

A string that is an existing local path is a path; one shaped `owner/name` that is not is a repo id
(`is_repo_id`). `fetch_metadata` fetches config.json, the safetensors index, tokenizer.json,
tokenizer_config.json and generation_config.json, and returns the snapshot directory they sit in: the
config, tokenizer and EOS ids are then read from it as from a local checkpoint directory. `fetch_weights`
fetches the shards holding the tensors `wanted` names — the index's `weight_map` says which file holds which
tensor: every shard for a whole model (the strict check reads every header), only the MTP layers' and the
embedding / head's for the drafter alone (`jax_mtp.loader.load(..., mtp_only=True)`).

Every file goes through `huggingface_hub.hf_hub_download` at the commit config.json came from (a branch that
moves mid-run cannot mix two revisions), so the cache (HF_HUB_CACHE, HF_HOME), HF_HUB_OFFLINE and HF_TOKEN
behave as they do for `transformers`: offline, a file comes from the cache or not at all. So does every file
where the Hub's host name does not resolve (no network): huggingface_hub would retry each request five times
first. A repo or file that is neither cached nor reachable is a CheckpointError naming it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import urllib.parse
from collections.abc import Callable

from jax_mtp.errors import first_line
from jax_mtp.model_files import MODEL_FILES
from jax_mtp.safetensors_io import INDEX_FILE, SINGLE_FILE, CheckpointError, read_weight_map

CONFIG_FILE = "config.json"
OPTIONAL_FILES = (INDEX_FILE, *MODEL_FILES)  # read beside the config when present (jax_mtp.model_files)
# The Hub's rule for a repo id: owner/name of letters, digits, '-', '_', '.', neither '--' nor '..' inside.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")


def is_repo_id(checkpoint: str) -> bool:
  """Whether `checkpoint` names a Hub repo: shaped `owner/name`, and not an existing local path."""
  return (_REPO_ID.fullmatch(checkpoint) is not None and "--" not in checkpoint and ".." not in checkpoint
          and not os.path.exists(checkpoint))


def fetch_metadata(repo_id: str) -> str:
  """The snapshot directory holding the repo's config.json and, where the repo has them, its index,
  tokenizer files and generation_config.json (fetched if not cached)."""
  config = _download(repo_id, CONFIG_FILE, revision=None)
  snapshot = os.path.dirname(config)
  for name in OPTIONAL_FILES:
    _download(repo_id, name, revision=os.path.basename(snapshot), optional=True)
  return snapshot


def fetch_weights(repo_id: str, snapshot: str, wanted: Callable[[str], bool] | None = None) -> str:
  """A directory holding the shards that hold the tensors `wanted` accepts (None: every shard), fetched
  into `snapshot` (the directory `fetch_metadata` returned): `snapshot` itself when that is every shard,
  else a temporary directory of links to config.json and those shards, with an index of them alone."""
  revision = os.path.basename(snapshot)
  index = os.path.join(snapshot, INDEX_FILE)
  if not os.path.isfile(index):  # one file holds every tensor
    _download(repo_id, SINGLE_FILE, revision)
    return snapshot
  weight_map = read_weight_map(index)  # a damaged index: a CheckpointError naming it
  files = sorted({file for name, file in weight_map.items() if wanted is None or wanted(name)})
  for file in files:
    _download(repo_id, file, revision)
  if len(files) == len(set(weight_map.values())):
    return snapshot
  return _view(snapshot, {name: file for name, file in weight_map.items() if file in files})


def _view(snapshot: str, weight_map: dict[str, str]) -> str:
  """config.json and the fetched shards, linked from `snapshot`, and an index of their tensors: the
  checkpoint reader opens every file an index lists, and the others were not fetched. Removed at exit."""
  view = tempfile.mkdtemp(prefix="jax_mtp-hub-")
  atexit.register(shutil.rmtree, view, True)
  for name in (CONFIG_FILE, *sorted(set(weight_map.values()))):
    os.symlink(os.path.join(snapshot, name), os.path.join(view, name))
  with open(os.path.join(view, INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return view


@functools.cache
def _resolves(host: str) -> bool:
  """Whether the Hub's host name resolves (once a process)."""
  try:
    socket.getaddrinfo(host, 443)
  except OSError:
    return False
  return True


def _download(repo_id: str, filename: str, revision: str | None, optional: bool = False) -> str | None:
  """The cached path of `filename` (fetched if need be); None for an absent optional file; else a
  CheckpointError saying why it cannot be had."""
  import huggingface_hub  # noqa: PLC0415 — only repo ids need it
  from huggingface_hub import _CACHED_NO_EXIST, constants, errors  # noqa: PLC0415
  host = urllib.parse.urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
  unresolved = not constants.HF_HUB_OFFLINE and not _resolves(host)
  try:
    # A Hub whose host does not resolve (no network) would be asked five times a file, ~25 s and ten lines of
    # warnings each, before huggingface_hub looks in the cache: ask the cache alone, as HF_HUB_OFFLINE would.
    return huggingface_hub.hf_hub_download(repo_id, filename, revision=revision, local_files_only=unresolved)
  except errors.LocalEntryNotFoundError:  # not cached, and offline or the Hub unreachable
    why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
           f"the Hub's host {host} does not resolve" if unresolved else "the Hub did not answer")
    if optional:
      # the cache may know the repo lacks it (a 404 it recorded): then silently absent; else say that the run goes
      # on without a file the repo may have (a tokenizer's BOS rule, the EOS ids), which can change its output
      if huggingface_hub.try_to_load_from_cache(repo_id, filename, revision=revision) is not _CACHED_NO_EXIST:
        print(f"note: {filename} of the Hugging Face repo {repo_id!r} is not in the cache and cannot be fetched "
              f"({why}): running without it", file=sys.stderr)
      return None
    if filename == CONFIG_FILE:
      raise CheckpointError(f"--checkpoint {repo_id!r} is not a local directory, and as a Hugging Face repo id it is "
                            f"neither in the cache ({constants.HF_HUB_CACHE}) nor reachable ({why})") from None
    raise CheckpointError(f"{filename} of the Hugging Face repo {repo_id!r} is not in the cache "
                          f"({constants.HF_HUB_CACHE}) and cannot be fetched ({why})") from None
  except errors.GatedRepoError:
    raise CheckpointError(f"the Hugging Face repo {repo_id!r} is gated: accept its terms on the Hub and log in "
                          f"(`hf auth login` or HF_TOKEN)") from None
  except errors.RepositoryNotFoundError:
    raise CheckpointError(f"--checkpoint {repo_id!r} is not a local directory, and the Hugging Face Hub has no "
                          f"repo of that id (or it is private: log in with `hf auth login` or HF_TOKEN)") from None
  except errors.RevisionNotFoundError:
    raise CheckpointError(f"the Hugging Face repo {repo_id!r} has no revision {revision or 'main'!r}") from None
  except errors.EntryNotFoundError:  # the repo exists and lacks the file
    if optional:
      return None
    raise CheckpointError(f"the Hugging Face repo {repo_id!r} has no {filename}; expected a HF checkpoint "
                          f"(config.json + *.safetensors)") from None
  except errors.HfHubHTTPError as e:
    first = first_line(e)
    raise CheckpointError(f"cannot fetch {filename} of the Hugging Face repo {repo_id!r}: {first}") from None
