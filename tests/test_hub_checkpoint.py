"""`--checkpoint owner/name`: a Hugging Face repo id, read through huggingface_hub's cache (jax_mtp.hub), offline.

The repo is the embedded default exported (jax_mtp.export) into the cache layout huggingface_hub keeps
(`models--owner--name/snapshots/<commit>/...`, `refs/main`), one shard per layer with an index, as DeepSeek's
checkpoints are sharded. HF_HUB_CACHE and HF_HUB_OFFLINE point huggingface_hub at it, so nothing is fetched:
every file comes from the cache or the run is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_mtp import decode, hub, loader
from jax_mtp.checkpoint import load_hf_checkpoint, load_mtp_only
from jax_mtp.export import hf_tensors
from jax_mtp.loader import DEFAULT_MODEL

REPO_ID = "jax-mtp/tiny-default"
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a snapshot is named by its 40-hex commit
METADATA = {"config.json", "model.safetensors.index.json", "tokenizer.json", "generation_config.json"}


@pytest.fixture(scope="module")
def snapshot_files(tmp_path_factory):
  """The embedded default as a repo's files: config, tokenizer, generation config, a shard per layer (the
  embedding, final norm and head in the first) and the index saying which holds which tensor."""
  from safetensors.numpy import save_file  # noqa: PLC0415
  directory = tmp_path_factory.mktemp("repo")
  for name in ("config.json", "tokenizer.json", "generation_config.json"):
    shutil.copy(os.path.join(DEFAULT_MODEL, name), directory)
  cfg, target, mtp = load_hf_checkpoint(DEFAULT_MODEL, progress=False)
  groups: dict[int, dict] = {}
  for name, value in hf_tensors(cfg, target, mtp, storage_dtype="bfloat16").items():  # as stored: bf16, fp32 router
    layer = re.match(r"model\.layers\.(\d+)\.", name)
    groups.setdefault(0 if layer is None else int(layer[1]) + 1, {})[name] = value
  weight_map = {}
  for k, part in sorted(groups.items()):
    file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    save_file(part, str(directory / file), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(part, file))
  (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  return directory


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty huggingface_hub cache, offline."""
  from huggingface_hub import constants  # noqa: PLC0415
  cache = tmp_path / "hf-cache"
  cache.mkdir()
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  # huggingface_hub reads both when first imported, maybe earlier in this process: set what it read too
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  return cache


@pytest.fixture
def cached_repo(cache, snapshot_files):
  """REPO_ID in the cache as an online fetch leaves it: its snapshot, `refs/main` naming it, and the optional files
  the repo lacks recorded as absent (huggingface_hub's `.no_exist`, written on a 404). Returns the snapshot
  directory."""
  repo = cache / f"models--{REPO_ID.replace('/', '--')}"
  shutil.copytree(snapshot_files, repo / "snapshots" / COMMIT)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(COMMIT)
  (repo / ".no_exist" / COMMIT).mkdir(parents=True)
  for name in set(hub.OPTIONAL_FILES) - set(os.listdir(repo / "snapshots" / COMMIT)):
    (repo / ".no_exist" / COMMIT / name).touch()
  return repo / "snapshots" / COMMIT


@pytest.fixture
def resolved(monkeypatch):
  """The names of the files huggingface_hub resolved (found in the cache or fetched), in order."""
  import huggingface_hub  # noqa: PLC0415
  names, real = [], huggingface_hub.hf_hub_download

  def spy(repo_id, filename, **kwargs):
    path = real(repo_id, filename, **kwargs)
    names.append(filename)
    return path

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
  return names


def _shards(snapshot) -> list[str]:
  return sorted(name for name in os.listdir(snapshot) if name.endswith(".safetensors"))


def test_the_cli_decodes_a_repo_id_as_it_decodes_the_directory(cached_repo, resolved, capsys):
  """The same tokens and text from the repo id as from the embedded default's directory; huggingface_hub
  resolves the config, index, tokenizer and generation config, then the shards (a whole model reads every
  one), at the snapshot's commit, and nothing else."""
  argv = ["--prompt", "def add(a, b):\n", "--max-new-tokens", "6", "--json"]
  assert decode.main(["--checkpoint", DEFAULT_MODEL, *argv]) == 0
  from_directory = json.loads(capsys.readouterr().out)
  assert decode.main(["--checkpoint", REPO_ID, *argv]) == 0
  from_repo = json.loads(capsys.readouterr().out)
  assert from_repo["tokens"] == from_directory["tokens"] and from_repo["text"] == from_directory["text"]
  assert set(resolved) == METADATA | set(_shards(cached_repo)) and len(resolved) == len(set(resolved))
  assert len(_shards(cached_repo)) == 6  # embedding / norm / head, 4 target layers, the MTP layer


def test_the_drafter_alone_resolves_only_its_shards(cached_repo, resolved):
  """`load(repo, mtp_only=True)` fetches the MTP layer's shard and the embedding / head's, not the target
  layers'; its params are the directory's drafter's."""
  loaded = loader.load(REPO_ID, mtp_only=True)
  assert loaded.target is None
  assert set(resolved) == METADATA | {"model-00001-of-00006.safetensors", "model-00006-of-00006.safetensors"}
  _, expected = load_mtp_only(DEFAULT_MODEL, progress=False)
  got, want = jax.tree_util.tree_flatten_with_path(loaded.mtp)[0], jax.tree_util.tree_flatten_with_path(expected)[0]
  assert [path for path, _ in got] == [path for path, _ in want]
  for (path, a), (_, b) in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_a_repo_id_neither_cached_nor_reachable_is_exit_2_with_one_error(cache, capsys):
  assert decode.main(["--checkpoint", "nobody/nothing", "--prompt-ids", "1,2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1, err
  assert err.startswith("error: --checkpoint 'nobody/nothing' is not a local directory, and as a Hugging Face repo "
                        f"id it is neither in the cache ({cache}) nor reachable (HF_HUB_OFFLINE is set)"), err


@pytest.fixture
def unresolvable_hub(cache, monkeypatch):
  """Online as far as the settings go, but the Hub's host does not resolve (`.invalid`, RFC 2606): no network."""
  from huggingface_hub import constants  # noqa: PLC0415
  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")


def test_without_a_network_a_cached_repo_is_read_from_the_cache_alone(cached_repo, unresolvable_hub, monkeypatch,
                                                                      capsys):
  """No request is made (huggingface_hub would retry each file five times, ~25 s and ten warnings a file): every
  file is asked of the cache alone, the run decodes, and an id not cached is one error naming the host."""
  import huggingface_hub  # noqa: PLC0415
  asked, real = [], huggingface_hub.hf_hub_download
  monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                      lambda repo_id, filename, **kw: asked.append(kw["local_files_only"]) or real(repo_id, filename,
                                                                                                    **kw))
  assert decode.main(["--checkpoint", REPO_ID, "--prompt-ids", "1,2", "--max-new-tokens", "2", "--json"]) == 0
  assert asked and all(asked), asked
  capsys.readouterr()
  assert decode.main(["--checkpoint", "nobody/nothing", "--prompt-ids", "1,2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1, err
  assert "neither in the cache" in err and "nor reachable (the Hub's host hub.invalid does not resolve)" in err, err


def test_an_optional_file_missing_from_the_cache_offline_is_a_note_not_silence(cached_repo, capsys):
  """Offline, generation_config.json not cached (the repo may have it: the cache records no 404): the run goes on
  without it (the EOS ids then come from config.json) and says so on stderr; a file the cache knows the repo lacks
  (a recorded 404, `.no_exist`) stays silent (found by an audit: both were silent)."""
  os.remove(cached_repo / "generation_config.json")
  argv = ["--checkpoint", REPO_ID, "--prompt-ids", "1,2", "--max-new-tokens", "2", "--json"]
  assert decode.main(argv) == 0
  notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
  assert notes == [f"note: generation_config.json of the Hugging Face repo {REPO_ID!r} is not in the cache and "
                   "cannot be fetched (HF_HUB_OFFLINE is set): running without it"]
  (cached_repo.parents[1] / ".no_exist" / COMMIT / "generation_config.json").touch()
  assert decode.main(argv) == 0
  assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]


def test_a_shard_missing_from_the_cache_is_exit_2_naming_it(cached_repo, capsys):
  """Offline, the metadata is cached but one shard is not: refused before any weight is read, by name."""
  os.remove(cached_repo / "model-00003-of-00006.safetensors")
  assert decode.main(["--checkpoint", REPO_ID, "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1, err
  assert err.startswith(f"error: model-00003-of-00006.safetensors of the Hugging Face repo {REPO_ID!r} is not in "
                        f"the cache ({cached_repo.parents[2]}) and cannot be fetched (HF_HUB_OFFLINE is set)"), err


def test_the_environment_reaches_huggingface_hub(tmp_path):
  """A fresh process reads HF_HUB_CACHE and HF_HUB_OFFLINE from its environment: no network, this cache."""
  env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "jax_mtp.decode", "--checkpoint", "nobody/nothing"], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and proc.stdout == "", proc.stderr
  assert proc.stderr == (f"error: --checkpoint 'nobody/nothing' is not a local directory, and as a Hugging Face repo "
                         f"id it is neither in the cache ({tmp_path}) nor reachable (HF_HUB_OFFLINE is set)\n")


@pytest.mark.parametrize("text, is_repo", [
    ("deepseek-ai/DeepSeek-V3.2-Exp", True), ("zai-org/GLM-5", True), ("owner/name.v2_b", True),
    ("/no/such/dir", False), ("no/such/dir", False), ("./name", False), ("../name", False), ("name", False),
    ("owner--x/name", False), ("owner/na..me", False), ("-owner/name", False), ("owner/", False),
])
def test_what_is_a_repo_id(text, is_repo):
  assert hub.is_repo_id(text) is is_repo


def test_an_existing_directory_shaped_like_a_repo_id_is_a_path(tmp_path, monkeypatch):
  """`owner/name` that exists locally is the local directory: the Hub is not asked."""
  monkeypatch.chdir(tmp_path)
  shutil.copytree(DEFAULT_MODEL, tmp_path / "jax-mtp" / "tiny-default")
  assert not hub.is_repo_id(REPO_ID)
  assert loader.locate(REPO_ID) == loader.Source(REPO_ID)


@pytest.mark.parametrize("content", ["[]", "{", '{"weight_map": [1]}', "\udcff"])
def test_a_damaged_index_in_the_cache_is_exit_2_naming_it(cached_repo, capsys, content):
  """The repo's model.safetensors.index.json holding no object, no JSON, no map, or bytes that are not UTF-8: one
  error naming the file (an AttributeError's traceback before)."""
  index = cached_repo / "model.safetensors.index.json"
  index.unlink()  # a link into the cache's blobs: write a file of its own
  index.write_bytes(content.encode("utf-8", "surrogateescape"))
  assert decode.main(["--checkpoint", REPO_ID, "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and repr(str(index)) in err, err


def test_a_repo_id_converts_to_an_orbax_copy_with_its_files(cached_repo, tmp_path, capsys):
  """`python -m jax_mtp.convert --checkpoint owner/name`: the copy holds the repo's tokenizer and generation config
  (read through the snapshot's links into the cache's blobs) and decodes the embedded default's tokens and text."""
  from jax_mtp import convert  # noqa: PLC0415
  out = tmp_path / "orbax"
  assert convert.main(["--checkpoint", REPO_ID, "--out", str(out)]) == 0
  assert capsys.readouterr().out.rstrip().endswith("beside it: tokenizer.json, generation_config.json")
  assert sorted(os.listdir(out)) == ["0", "generation_config.json", "tokenizer.json"]
  assert not any(os.path.islink(out / name) for name in os.listdir(out))  # copies, not links into the cache
  argv = ["--prompt", "def add(a, b):\n", "--max-new-tokens", "6", "--json"]
  assert decode.main(["--checkpoint", DEFAULT_MODEL, *argv]) == 0
  from_directory = json.loads(capsys.readouterr().out)
  assert decode.main(["--checkpoint", str(out), *argv]) == 0
  from_copy = json.loads(capsys.readouterr().out)
  assert from_copy["tokens"] == from_directory["tokens"] and from_copy["text"] == from_directory["text"]
