"""Weights that cannot fit the devices are refused before any weight is read (jax_mtp.weights_fit): the planned form's
bytes on one device equal what the loader then places there, byte for byte, for FP8 kept, dequantised and split
meshes, HF and orbax; a device with too little free memory is one error naming the numbers, through `jax_mtp.load`
and the CLI, before a shard is opened."""

import os
import re
import shutil

import jax
import pytest

import jax_mtp
from jax_mtp import decode, loader, weights_fit
from jax_mtp.orbax_io import save_params
from jax_mtp.request import gpu_pool_hint
from jax_mtp.safetensors_io import CheckpointError
from jax_mtp.sharding import SHARED_WITH_TARGET, make_mesh
from tests.devices import needs_devices
from tests.hf_checkpoint import write_checkpoint

CFG = jax_mtp.tiny(vocab_size=250)  # tp = 2 pads the vocab to 250, tp = 4 to 252


@pytest.fixture(scope="module", params=[(8, 8), (16, 24)], ids=["block8x8", "block16x24"])
def checkpoint(request, tmp_path_factory):
  """(directory, block): an FP8 HF checkpoint; tp = 2 splits (16, 24) blocks, not (8, 8) ones."""
  directory = str(tmp_path_factory.mktemp("hf"))
  params = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  write_checkpoint(directory, CFG, *params, block=request.param)
  return directory, request.param


def _bytes_on(device, loaded: loader.Loaded) -> int:
  """What the loaded trees hold on `device` (the MTP tree's shared embedding and head counted once)."""
  own_mtp = {k: v for k, v in loaded.mtp.items() if k not in SHARED_WITH_TARGET}
  return sum(shard.data.nbytes for leaf in jax.tree.leaves((loaded.target, own_mtp))
             for shard in leaf.addressable_shards if shard.device == device)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("weights", ["auto", "bf16"])
def test_the_planned_bytes_are_what_the_loader_places(checkpoint, tmp_path, tp, weights):
  """From the config alone: FP8 codes + scales where the load keeps them (tp = 1 always; (8, 8) blocks at tp = 2),
  the param dtype where it dequantises (weights="bf16", or auto where tp splits blocks), padded vocab rows; equal to
  the bytes placed on a device by the HF loader and by an orbax copy's restore."""
  directory, block = checkpoint
  needs_devices(tp)
  mesh = make_mesh(tp)
  cfg = loader.checkpoint_config(directory)  # as the load runs it (config.json's dtype)
  split = weights_fit.fp8_split(cfg, mesh, block)
  planned = weights_fit.planned_bytes_per_device(cfg, mesh, fp8_kept=weights == "auto" and not split, block=block)
  loaded = loader.load(directory, mesh=mesh, weights=weights)
  if weights == "auto":  # the loader's own judgement, from the tensors' headers
    assert split == bool(loaded.dequantised)
  assert split == (tp > 1 and block == (16, 24))
  assert planned == _bytes_on(mesh.devices.flat[0], loaded)
  save_params(tmp_path / "orbax", loaded.cfg, loaded.target, loaded.mtp)
  assert planned == _bytes_on(mesh.devices.flat[0], loader.load(tmp_path / "orbax", mesh=mesh, weights=weights))


@pytest.mark.parametrize("fp8_kept", [True, False])
@pytest.mark.parametrize("tp", [1, 4])
def test_one_layer_of_each_kind_counts_every_layer(tp, fp8_kept):
  """The count from one dense and one MoE layer (a typo such as 6,100 layers costs no more to plan than 61) equals
  the whole planned tree's, for a model of 3 dense and 4 MoE layers and for the MTP layer alone."""
  needs_devices(tp)
  cfg, mesh = CFG.replace(num_hidden_layers=7, first_k_dense_replace=3), make_mesh(tp)
  for mtp_only in (False, True):
    whole = weights_fit.planned_weights(cfg, mesh, fp8_kept=fp8_kept, block=(8, 8), mtp_only=mtp_only)
    assert weights_fit.planned_bytes_per_device(cfg, mesh, fp8_kept=fp8_kept, block=(8, 8), mtp_only=mtp_only) \
        == weights_fit.bytes_per_device(whole, mesh)


def _without_weights(directory: str, tmp_path) -> str:
  """A copy of the checkpoint's config and index with its shards deleted: any read of a weight fails."""
  copy = str(tmp_path / "no_weights")
  shutil.copytree(directory, copy)
  for name in os.listdir(copy):
    if name.endswith(".safetensors"):
      os.remove(os.path.join(copy, name))
  return copy


@pytest.mark.parametrize("weights", ["auto", "bf16"])
def test_too_little_free_memory_is_one_error_before_any_weight_is_read(checkpoint, tmp_path, monkeypatch, weights):
  """A device with one byte less than the planned weights and the caller's reserve: refused, naming both, with no
  shard opened (they are deleted); with exactly enough, the load goes on to read (and fails on the missing shard)."""
  directory, block = checkpoint
  tp = min(2, len(jax.devices()))  # one lent GPU: tp 1
  mesh = make_mesh(tp)
  cfg = loader.checkpoint_config(directory)
  kept = weights == "auto" and not weights_fit.fp8_split(cfg, mesh, block)
  need = weights_fit.planned_bytes_per_device(cfg, mesh, fp8_kept=kept, block=block)
  source = _without_weights(directory, tmp_path)
  monkeypatch.setattr(weights_fit, "free_bytes", lambda device: need + 1000 - 1)
  form = re.escape("FP8 codes + block scales where stored" if kept else "bfloat16")
  with pytest.raises(CheckpointError, match=rf"^the weights of 2 layers \+ 1 MTP layer\(s\) \({form}\) need {need / 2**20:.2f} MiB on each device at "
                                            rf"tp={tp} and 0.00 MiB of decode caches, more than the "
                                            rf"{(need + 999) / 2**20:.2f} MiB free on {jax.devices()[0]}; nothing was "
                                            rf"read: spread "
                                            rf"them over more devices \(a larger tp\)"):
    loader.load(source, mesh=mesh, weights=weights, reserve_bytes=1000)
  monkeypatch.setattr(weights_fit, "free_bytes", lambda device: need + 1000)
  with pytest.raises(CheckpointError, match="safetensors"):  # checked, then read: the shards are gone
    loader.load(source, mesh=mesh, weights=weights, reserve_bytes=1000)


def test_the_cli_refuses_weights_and_caches_that_cannot_fit_in_one_line(checkpoint, tmp_path, monkeypatch, capsys):
  """decode reserves its caches beside the weights; `--weights bf16` of an FP8 checkpoint names the remedy of
  keeping FP8. Exit 2, one line, nothing on stdout (that nothing was read: the test above)."""
  directory, _ = checkpoint
  monkeypatch.setattr(weights_fit, "free_bytes", lambda device: 2**17)  # 0.125 MiB: neither form fits
  argv = ["--checkpoint", directory, "--prompt-ids", "1,2,3", "--max-new-tokens", "4"]
  assert decode.main([*argv, "--weights", "bf16"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.count("\n") == 1 and err.startswith("error: the weights of 2 layers + 1 MTP layer(s) (bfloat16) need "), err
  assert " MiB of decode caches, more than the 0.12 MiB free on " in err and err.rstrip().endswith(
      "(a larger tp); or keep the stored FP8 weights as they are (half the bytes: --weights fp8, or auto at a tp "
      f"that splits no block){gpu_pool_hint(jax.devices()[0])}"), err


@pytest.mark.skipif(jax.devices()[0].platform == "cpu", reason="needs an accelerator: CPU devices are not checked")
def test_the_full_v32_on_one_accelerator_is_refused_from_its_config_alone(tmp_path):
  """DeepSeek-V3.2's config.json (FP8) with no weight beside it, onto one GPU or TPU: ~690 GB cannot fit, refused
  with the numbers before a shard is looked for; at a width that fits, the same directory fails on its missing
  shards instead (the check passed, the load went on to read)."""
  import json  # noqa: PLC0415

  from tests.hf_checkpoint import hf_config_dict  # noqa: PLC0415
  (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(jax_mtp.deepseek_v32())))
  with pytest.raises(CheckpointError, match=r"^the weights of 61 layers \+ 1 MTP layer\(s\) \(FP8 codes \+ block "
                                            r"scales where stored\) need \d+\.\d\d GiB on each device at tp=1, more "
                                            r"than the .* free on .*; nothing was read"):
    loader.load(str(tmp_path), mesh=make_mesh(1))
  small = tmp_path / "small"
  small.mkdir()
  (small / "config.json").write_text(json.dumps(hf_config_dict(CFG)))
  with pytest.raises(CheckpointError, match="safetensors"):
    loader.load(str(small), mesh=make_mesh(1))
