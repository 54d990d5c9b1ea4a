"""HF checkpoint loading (jax_mtp.checkpoint) and orbax save / restore (jax_mtp.orbax_io).

A tiny random model is written as a multi-shard FP8 checkpoint by tests/hf_checkpoint.py (official
block quantiser, partial edge blocks); loading must give exactly the numpy dequantisation, on one
device and sharded over tp = 4; orbax round trips must give identical draft tokens on tp = 4; and
every bad input must fail with one clear error, writing nothing.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import jax_mtp
from jax_mtp.checkpoint import load_hf_checkpoint, load_mtp_only
from jax_mtp.config import ConfigError
from jax_mtp.orbax_io import is_orbax_checkpoint, restore_params, save_params
from jax_mtp import ShardedMtp, decode
from jax_mtp.safetensors_io import CheckpointError, SafetensorsCheckpoint, dequantize_block
from jax_mtp.sharding import make_mesh, shard_params
from tests.tolerances import TOLERANCE
from tests.hf_checkpoint import dequantize, hf_config_dict, quantize, write_checkpoint

CFG = jax_mtp.tiny(vocab_size=250)  # 250 rows: tp = 4 pads the vocab to 252
BLOCKS = [(128, 128), (16, 24)]  # the real block (q_b_proj [192, 32] has a partial one) and many partial ones
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def params():
  return jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))


@pytest.fixture(scope="module", params=BLOCKS, ids=lambda b: f"block{b[0]}x{b[1]}")
def written(request, params, tmp_path_factory):
  """(directory, block, reference target, reference mtp): a 3-shard FP8 checkpoint."""
  directory = str(tmp_path_factory.mktemp("hf"))
  ref_t, ref_m = write_checkpoint(directory, CFG, *params, block=request.param, num_files=3)
  return directory, request.param, ref_t, ref_m


def _copy(written, tmp_path) -> str:
  target = str(tmp_path / "ckpt")
  shutil.copytree(written[0], target)
  return target


def _assert_trees_equal(expected, got, padded_vocab=None):
  assert jax.tree.structure(expected) == jax.tree.structure(got)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(got)):
    b = np.asarray(b)
    if padded_vocab and b.shape[0] == padded_vocab and a.shape[0] != padded_vocab:
      assert not b[a.shape[0]:].any(), path  # padded rows are zero
      b = b[:a.shape[0]]
    assert a.shape == b.shape and np.array_equal(np.asarray(a, b.dtype), b), jax.tree_util.keystr(path)


# --- FP8 dequantisation -------------------------------------------------------------------------


@pytest.mark.parametrize("block", [(128, 128), (16, 24), (7, 5)])
@pytest.mark.parametrize("rows, cols", [(300, 200), (128, 256), (33, 7)])
def test_dequantize_block_matches_blockwise_reference_on_any_slice(block, rows, cols):
  w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
  q, scale = quantize(w, block)
  assert scale.shape == (-(-rows // block[0]), -(-cols // block[1]))
  reference = dequantize(q, scale, block)
  # e4m3: 3 mantissa bits, each value within half a step (2^-4 relative, the table's float8_e4m3fn rtol); its
  # subnormals step by 2^-9 (times the block scale)
  np.testing.assert_allclose(reference, w, rtol=TOLERANCE["float8_e4m3fn"]["rtol"], atol=scale.max() * 2.0**-9)
  for r0, r1, c0, c1 in [(0, rows, 0, cols), (rows // 3, rows - 1, cols // 2, cols), (rows - 1, rows, 1, 2)]:
    index = (slice(r0, r1), slice(c0, c1))
    np.testing.assert_array_equal(dequantize_block(q[index], scale, block, index), reference[index])


# --- loading ------------------------------------------------------------------------------------


def test_multi_shard_fp8_checkpoint_loads_the_numpy_dequantisation(written):
  directory, block, ref_t, ref_m = written
  index = json.load(open(os.path.join(directory, INDEX)))["weight_map"]
  assert len(set(index.values())) == 3
  assert "model.layers.2.mlp.experts.7.down_proj.weight_scale_inv" in index  # FP8 experts of the MTP layer
  cfg, target, mtp = load_hf_checkpoint(directory, cfg=CFG, progress=False)
  assert cfg == CFG
  _assert_trees_equal(ref_t, target)
  _assert_trees_equal(ref_m, mtp)
  assert mtp["embed_tokens"] is target["embed_tokens"] and mtp["lm_head"] is target["lm_head"]


def test_config_json_gives_the_config_and_dtype_overrides_param_dtype(written):
  cfg, target, _ = load_hf_checkpoint(written[0], progress=False)
  assert cfg == CFG.replace(dtype="bfloat16", param_dtype="bfloat16")
  assert target["norm"]["weight"].dtype == jax.numpy.bfloat16
  assert target["layers_1"]["mlp"]["gate"]["weight"].dtype == jax.numpy.float32  # router stays fp32
  cfg, target, _ = load_hf_checkpoint(written[0], dtype="float32", progress=False)
  assert cfg.param_dtype == "float32" and target["norm"]["weight"].dtype == jax.numpy.float32


def test_sharded_load_places_each_param_like_shard_params(written):
  directory, _, ref_t, ref_m = written
  mesh = make_mesh(4)
  _, target, mtp = load_hf_checkpoint(directory, cfg=CFG, mesh=mesh, progress=False)
  expected = shard_params(ref_t, CFG, mesh)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(target)):
    assert a.sharding == b.sharding and a.shape == b.shape
  _assert_trees_equal(ref_t, target, padded_vocab=252)
  _assert_trees_equal(ref_m, mtp, padded_vocab=252)


def test_sharded_load_reads_only_each_devices_shard(written, monkeypatch):
  """Each device's rows / columns / experts are read on their own; replicated tensors once."""
  reads = []
  read = SafetensorsCheckpoint.read

  def spy(self, name, index):
    reads.append((name, tuple((s.start, s.stop) for s in index)))
    return read(self, name, index)
  monkeypatch.setattr(SafetensorsCheckpoint, "read", spy)
  load_hf_checkpoint(written[0], cfg=CFG, mesh=make_mesh(4), progress=False)
  by_name = lambda name: sorted(index for n, index in reads if n == name)  # noqa: E731
  # lm_head [250, 64]: 252 padded rows, 63 per device; the last device's rows stop at the checkpoint's 250
  assert by_name("lm_head.weight") == [((0, 63), (0, 64)), ((63, 126), (0, 64)), ((126, 189), (0, 64)),
                                       ((189, 250), (0, 64))]
  # q_b_proj kernel [32, 192] is column-parallel: the checkpoint's [192, 32] is read in row blocks of 48
  assert by_name("model.layers.0.self_attn.q_b_proj.weight") == [((r, r + 48), (0, 32)) for r in (0, 48, 96, 144)]
  assert len(by_name("model.layers.2.mlp.experts.5.down_proj.weight")) == 1  # by the device holding expert 5
  assert by_name("model.norm.weight") == [((0, 64),)]  # replicated: read once, copied to the 4 devices


def test_loaded_checkpoint_drafts_like_its_reference_params(written):
  """Same greedy draft tokens and hidden states as the (dequantised) params it was written from."""
  directory, _, _, ref_m = written
  mesh = make_mesh(4)
  _, _, mtp = load_hf_checkpoint(directory, cfg=CFG, mesh=mesh, progress=False)
  sharded = ShardedMtp(CFG, mesh)
  _assert_same_drafts(sharded, mtp, sharded.shard(ref_m))


def _assert_same_drafts(sharded, params_a, params_b, steps: int = 3):
  rng = np.random.default_rng(0)
  ids = rng.integers(0, CFG.vocab_size, (2, 5)).astype(np.int32)
  positions = np.broadcast_to(np.arange(5, dtype=np.int32), (2, 5))
  hidden = rng.standard_normal((2, 5, CFG.hidden_size)).astype(np.float32)
  outs = []
  for params in (params_a, params_b):
    caches, tokens = jax_mtp.init_caches(CFG, 2, 16), []
    step = sharded(params, ids, positions, hidden, caches)
    tokens.append(np.asarray(step.tokens_BT))
    for i in range(1, steps):
      step = sharded(params, step.tokens_BT[:, -1:], positions[:, -1:] + i, step.hidden_BTD[:, -1:], step.caches)
      tokens.append(np.asarray(step.tokens_BT))
    outs.append(np.concatenate(tokens, axis=1))
  np.testing.assert_array_equal(outs[0], outs[1])


def test_load_mtp_only_reads_the_mtp_layers_and_the_shared_embed_and_head(written, tmp_path):
  directory = _copy(written, tmp_path)
  _, _, _, ref_m = written
  _drop_tensor(directory, "model.layers.0.self_attn.o_proj.weight")  # target layers are not read
  _, mtp = load_mtp_only(directory, cfg=CFG, progress=False)
  _assert_trees_equal(ref_m, mtp)
  with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight: missing"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_single_file_checkpoint_without_mtp_copies(params, tmp_path):
  ref_t, ref_m = write_checkpoint(str(tmp_path), CFG, *params, num_files=1, mtp_copies=False)
  assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
  _, target, mtp = load_hf_checkpoint(str(tmp_path), cfg=CFG, progress=False)
  _assert_trees_equal(ref_t, target)
  _assert_trees_equal(ref_m, mtp)


@pytest.mark.parametrize("overrides", [
    dict(model_type="deepseek_v3", index_n_heads=0, index_head_dim=0, index_topk=0),  # no DSA indexer
    dict(num_nextn_predict_layers=2, first_k_dense_replace=0),  # MTP layers 2 and 3; no dense layer
], ids=["deepseek_v3", "two_mtp_layers"])
def test_other_layouts_load(overrides, tmp_path):
  cfg = CFG.replace(**overrides)
  params = jax_mtp.init_target_params(cfg, jax.random.key(2)), jax_mtp.init_params(cfg, jax.random.key(3))
  ref_t, ref_m = write_checkpoint(str(tmp_path), cfg, *params, block=(16, 24))
  loaded_cfg, target, mtp = load_hf_checkpoint(str(tmp_path), dtype="float32", progress=False)
  assert loaded_cfg == cfg.replace(dtype="bfloat16")
  _assert_trees_equal(ref_t, target)
  _assert_trees_equal(ref_m, mtp)


# --- bad checkpoints: one clear error -------------------------------------------------------------


def _file_of(directory: str, name: str) -> str:
  return os.path.join(directory, json.load(open(os.path.join(directory, INDEX)))["weight_map"][name])


def _rewrite(directory: str, name: str, edit) -> None:
  """Rewrites the shard holding `name` with `edit(tensors)` applied (the index is left as it was)."""
  _rewrite_file(_file_of(directory, name), edit)


def _rewrite_file(path: str, edit) -> None:
  tensors = load_file_any(path)
  edit(tensors)
  save_file(tensors, path, metadata={"format": "pt"})


def _add_tensor(directory: str, name: str, value: np.ndarray) -> None:
  """A new tensor in the first shard, listed in the index."""
  index_path = os.path.join(directory, INDEX)
  index = json.load(open(index_path))
  file = sorted(set(index["weight_map"].values()))[0]
  _rewrite_file(os.path.join(directory, file), lambda t: t.update({name: value}))
  index["weight_map"][name] = file
  json.dump(index, open(index_path, "w"))


def load_file_any(path: str) -> dict:
  """safetensors' numpy loader cannot build F8_E4M3 arrays; read through our reader instead."""
  from jax_mtp.safetensors_io import _read_file, _memmap  # noqa: PLC0415 (test helper)
  return {name: np.array(_memmap(info)) for name, info in _read_file(path).items()}


def _drop_tensor(directory: str, name: str) -> None:
  _rewrite(directory, name, lambda t: t.pop(name))


def test_truncated_safetensors_file_is_named(written, tmp_path):
  directory = _copy(written, tmp_path)
  path = _file_of(directory, "lm_head.weight")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 100)
  with pytest.raises(CheckpointError, match=rf"safetensors file '.*{os.path.basename(path)}' is truncated or corrupt"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_missing_index_entry(written, tmp_path):
  directory = _copy(written, tmp_path)
  index_path = os.path.join(directory, INDEX)
  index = json.load(open(index_path))
  del index["weight_map"]["model.layers.2.hnorm.weight"]
  json.dump(index, open(index_path, "w"))
  with pytest.raises(CheckpointError, match=r"model\.layers\.2\.hnorm\.weight: missing \(expected shape \[64\]\); "
                                            r"in file model-\d+-of-00003"
                                            r"\.safetensors but model\.safetensors\.index\.json has no entry"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_index_naming_a_missing_file(written, tmp_path):
  directory = _copy(written, tmp_path)
  os.remove(_file_of(directory, "lm_head.weight"))
  with pytest.raises(CheckpointError, match=r"lists file 'model-\d+-of-00003\.safetensors', which is not in"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_every_problem_is_listed_in_one_error(written, tmp_path):
  """Missing MTP-layer tensor, wrong dtype, wrong shape, missing FP8 scale and an unexpected tensor."""
  directory = _copy(written, tmp_path)
  enorm, norm = "model.layers.2.enorm.weight", "model.layers.2.input_layernorm.weight"
  o_proj, gate = "model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.gate.weight"

  def edit(t):
    t.pop(enorm, None)
    if norm in t:
      t[norm] = t[norm].astype(np.int32)
    if gate in t:
      t[gate] = t[gate][:, :-1].copy()
    t.pop(o_proj + "_scale_inv", None)
  for file in {_file_of(directory, name) for name in (enorm, norm, gate, o_proj + "_scale_inv")}:
    _rewrite_file(file, edit)
  _add_tensor(directory, "model.layers.9.extra.weight", np.zeros(3, np.float32))
  with pytest.raises(CheckpointError) as info:
    load_hf_checkpoint(directory, cfg=CFG, progress=False)
  message = str(info.value)
  for expected in (rf"{enorm}: missing \(expected shape \[64\]\)",
                   rf"{norm}: dtype I32, expected one of \['F32', 'BF16', 'F16'\]",
                   rf"{gate}: shape \[8, 63\], expected \[8, 64\]",
                   rf"{o_proj}_scale_inv: missing \(FP8 {o_proj} needs its block scales",
                   r"model\.layers\.9\.extra\.weight: unexpected",
                   r"does not match the config \(model_type=deepseek_v32, num_hidden_layers=2"):
    assert re.search(expected, message), (expected, message.splitlines())


def test_fp8_on_a_norm_is_a_wrong_dtype(written, tmp_path):
  directory = _copy(written, tmp_path)
  name = "model.norm.weight"
  _rewrite(directory, name, lambda t: t.update({name: t[name].astype(ml_dtypes.float8_e4m3fn)}))
  with pytest.raises(CheckpointError, match=rf"{name}: dtype F8_E4M3, expected one of"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_config_json_disagreeing_with_the_tensors(written, tmp_path):
  directory = _copy(written, tmp_path)
  config_path = os.path.join(directory, "config.json")
  config = json.load(open(config_path))
  json.dump({**config, "num_hidden_layers": 3}, open(config_path, "w"))
  with pytest.raises(CheckpointError, match=r"names 3 layers \+ 1 MTP layer\(s\) \(model\.layers\.0\.\.3\), but the "
                     r"checkpoint's tensors name layers 0\.\.2: 1 missing, from model\.layers\.3"):
    load_hf_checkpoint(directory, progress=False)


def test_a_layer_count_typo_is_an_error_at_once(written, tmp_path, capsys):
  """num_hidden_layers = 10,000 over a 2-layer checkpoint (a typo such as 6100 for 61): one error from the tensor
  names, in seconds — planning and checking every missing layer's tensors took minutes and then gigabytes."""
  from jax_mtp import decode  # noqa: PLC0415
  directory = _copy(written, tmp_path)
  config_path = os.path.join(directory, "config.json")
  config = json.load(open(config_path))
  json.dump({**config, "num_hidden_layers": 10_000}, open(config_path, "w"))
  start = time.monotonic()
  assert decode.main(["--checkpoint", directory, "--max-new-tokens", "2"]) == 2
  assert time.monotonic() - start < 30
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "names 10000 layers + 1 MTP layer(s)" in err[0] and "9998 missing, from model.layers.3" \
      in err[0], err


def test_given_config_disagreeing_with_config_json(written):
  with pytest.raises(CheckpointError, match=r"hidden_size=128 \(config.json: 64\)"):
    load_hf_checkpoint(written[0], cfg=CFG.replace(hidden_size=128), progress=False)


def test_mtp_embed_copy_must_equal_the_targets(written, tmp_path):
  directory = _copy(written, tmp_path)
  name = "model.layers.2.embed_tokens.weight"
  _rewrite(directory, name, lambda t: t[name].__setitem__((3, 4), t[name][3, 4] + 1))
  with pytest.raises(CheckpointError, match=rf"{name} differs from model\.embed_tokens\.weight"):
    load_hf_checkpoint(directory, cfg=CFG, progress=False)


def test_directory_errors(tmp_path):
  with pytest.raises(CheckpointError, match="is not a directory"):
    load_hf_checkpoint(str(tmp_path / "nope"))
  with pytest.raises(ConfigError, match="config.json' does not exist"):
    load_hf_checkpoint(str(tmp_path))
  json.dump(hf_config_dict(CFG), open(tmp_path / "config.json", "w"))
  with pytest.raises(CheckpointError, match="has no \\*.safetensors file"):
    load_hf_checkpoint(str(tmp_path))
  (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
  with pytest.raises(CheckpointError, match="has shards .* but no model.safetensors.index.json"):
    load_hf_checkpoint(str(tmp_path))
  os.symlink(tmp_path / "gone.safetensors", tmp_path / "model.safetensors")  # a link to nothing: said as such
  with pytest.raises(CheckpointError, match=r"model.safetensors' is a link to .*gone.safetensors', which does not"):
    load_hf_checkpoint(str(tmp_path))
  os.remove(tmp_path / "model.safetensors")
  json.dump({**hf_config_dict(CFG), "quantization_config": {"weight_block_size": [128]}},
            open(tmp_path / "config.json", "w"))
  with pytest.raises(CheckpointError, match=r"weight_block_size=\[128\] must be two positive integers"):
    load_hf_checkpoint(str(tmp_path))


# --- orbax ----------------------------------------------------------------------------------------


def test_orbax_round_trip_restores_onto_tp4_with_identical_drafts(written, tmp_path):
  directory, _, ref_t, ref_m = written
  cfg, target, mtp = load_hf_checkpoint(directory, cfg=CFG, progress=False)  # unplaced, one device
  save_params(tmp_path / "orbax", cfg, target, mtp)
  assert is_orbax_checkpoint(tmp_path / "orbax") and not is_orbax_checkpoint(directory)
  mesh = make_mesh(4)
  cfg4, target4, mtp4 = restore_params(tmp_path / "orbax", mesh=mesh)
  assert cfg4 == CFG
  expected = shard_params(ref_t, CFG, mesh)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(target4)):
    assert a.sharding == b.sharding and a.shape == b.shape
  _assert_trees_equal(ref_t, target4, padded_vocab=252)
  _assert_trees_equal(ref_m, mtp4, padded_vocab=252)
  sharded = ShardedMtp(CFG, mesh)
  _assert_same_drafts(sharded, mtp4, sharded.shard(ref_m))
  save_params(tmp_path / "orbax4", cfg4, target4, mtp4)  # from the mesh: saved unpadded
  _, target1, _ = restore_params(tmp_path / "orbax4", CFG)
  _assert_trees_equal(ref_t, target1)


def test_save_refuses_an_existing_checkpoint_and_writes_nothing(params, tmp_path):
  target, mtp = params
  save_params(tmp_path, CFG, target, mtp)
  before = sorted(os.walk(tmp_path))
  with pytest.raises(CheckpointError, match=r"already holds checkpoint step 0; nothing written"):
    save_params(tmp_path, CFG, target, mtp)
  assert sorted(os.walk(tmp_path)) == before
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text("{}")
  with pytest.raises(CheckpointError, match=r"holds \['config.json'\], which are not orbax checkpoint steps"):
    save_params(hf, CFG, target, mtp)
  assert os.listdir(hf) == ["config.json"]


def test_restore_errors(params, tmp_path):
  with pytest.raises(CheckpointError, match="holds no complete jax_mtp orbax checkpoint"):
    restore_params(tmp_path)
  save_params(tmp_path, CFG, *params)
  with pytest.raises(CheckpointError, match=r"does not match the one saved in .* step 0: hidden_size=128 \(saved: 64"):
    restore_params(tmp_path, CFG.replace(hidden_size=128))
  assert restore_params(tmp_path, CFG.replace(moe_impl="gather", prefill_chunk=4))[0] == CFG  # run settings: free
  with pytest.raises(ValueError, match="tp=3 does not divide num_attention_heads=8"):
    restore_params(tmp_path, mesh=make_mesh(3))



@pytest.mark.parametrize("damage, item", [
    ("params_data_deleted", "params"), ("params_manifest_garbage", "params"), ("config_garbage", "config")])
def test_a_damaged_orbax_checkpoint_is_one_error_naming_the_item(params, tmp_path, capsys, damage, item):
  """Array files deleted, a manifest or the saved config overwritten: the CLI exits 2 with one line naming the
  directory, the step and the item orbax could not read — not orbax's traceback (exit 1) or its kilobytes of
  TensorStore spec, and not a bare JSON error naming no file."""
  directory = tmp_path / "orbax"
  save_params(directory, CFG, *params)
  step = directory / "0"
  if damage == "params_data_deleted":
    data = [path for path in (step / "params").rglob("*") if path.is_file() and path.parent.name == "d"]
    assert data
    for path in data:
      path.unlink()
  elif damage == "params_manifest_garbage":
    (step / "params" / "manifest.ocdbt").write_text("garbage")
  else:
    (step / "config" / "metadata").write_text("{bad")
  assert decode.main(["--checkpoint", str(directory), "--max-new-tokens", "2", "--json"]) == 2
  out, err = capsys.readouterr()
  lines = err.strip().splitlines()
  assert out == "" and len(lines) == 1 and len(lines[0]) < 600, err[:2000]
  assert lines[0].startswith(f"error: {str(directory)!r} step 0: its {item!r} item cannot be read"), lines[0]

_SAVE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax_mtp
    from jax_mtp.orbax_io import save_params
    if sys.argv[2] == "at_commit":  # hang where orbax renames the finished temporary directory into place
      from orbax.checkpoint._src.path import atomicity
      async def hang(*args, **kwargs):
        print("COMMITTING", flush=True)
        time.sleep(600)
      atomicity.async_path.rename = hang
    cfg = jax_mtp.tiny(vocab_size=250)
    params = jax_mtp.init_target_params(cfg, jax.random.key(5)), jax_mtp.init_params(cfg, jax.random.key(6))
    print("SAVING", flush=True)
    save_params(sys.argv[1], cfg, *params, step=1)
    print("SAVED", flush=True)
""")


@pytest.mark.parametrize("when", ["at_commit", "while_writing"])
def test_interrupted_save_leaves_the_previous_checkpoint_readable(params, tmp_path, when):
  """Kill a save subprocess midway: step 0 stays the latest readable step, then a new save works."""
  save_params(tmp_path, CFG, *params)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
  proc = subprocess.Popen([sys.executable, "-c", _SAVE_SCRIPT, str(tmp_path), when], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=env, text=True)
  try:
    marker = "COMMITTING" if when == "at_commit" else "SAVING"
    for line in proc.stdout:
      if line.strip() == marker:
        break
    if when == "while_writing":  # kill as soon as the temporary step directory appears
      deadline = time.monotonic() + 60
      while not any("tmp" in n for n in os.listdir(tmp_path)) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait()
  if when == "at_commit":
    assert any(n.startswith("1.") and "tmp" in n for n in os.listdir(tmp_path)), os.listdir(tmp_path)
    assert not os.path.exists(tmp_path / "1")
  # All of the old checkpoint or (if the kill came after the rename) all of the new one.
  expected = params
  if os.path.exists(tmp_path / "1"):
    expected = jax_mtp.init_target_params(CFG, jax.random.key(5)), jax_mtp.init_params(CFG, jax.random.key(6))
  cfg, target, mtp = restore_params(tmp_path)
  assert cfg == CFG
  _assert_trees_equal(expected[0], target)
  shared = {name: expected[0][name] for name in ("embed_tokens", "lm_head")}  # the target's are saved
  _assert_trees_equal({**expected[1], **shared}, mtp)
  save_params(tmp_path, CFG, *params, step=2)  # a leftover temporary directory does not block a new save
  _assert_trees_equal(params[0], restore_params(tmp_path)[1])


# --- CLI ------------------------------------------------------------------------------------------


def test_an_orbax_checkpoint_without_jax_mtps_config_is_one_clear_error(tmp_path, capsys):
  """Another tool's orbax checkpoint (no config item), or one whose config is not an MtpConfig's: the CLI's exit 2
  and one line naming the directory and what is missing (a KeyError's traceback before, found by a CLI audit)."""
  from jax_mtp import decode  # noqa: PLC0415
  cfg = jax_mtp.tiny(vocab_size=32)
  save_params(tmp_path / "saved", cfg, jax_mtp.init_target_params(cfg, jax.random.key(0)),
              jax_mtp.init_params(cfg, jax.random.key(1)))
  no_config, foreign = tmp_path / "no_config", tmp_path / "foreign"
  shutil.copytree(tmp_path / "saved", no_config)
  shutil.rmtree(no_config / "0" / "config")
  shutil.copytree(tmp_path / "saved", foreign)
  (foreign / "0" / "config" / "metadata").write_text(json.dumps({"vocab_size": 5}))
  for directory, named in [(no_config, "step 0 holds no jax_mtp config item"),
                           (foreign, "step 0 is not a jax_mtp config (no 'rope' section)")]:
    assert decode.main(["--checkpoint", str(directory), "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert out == "" and len(lines) == 1 and str(directory) in lines[0] and named in lines[0], err


def test_cli_decodes_from_a_hf_checkpoint_and_from_its_orbax_copy(params, tmp_path, capsys):
  """`--checkpoint` takes either directory kind; both give the same tokens, equal to plain decoding."""
  from jax_mtp import decode  # noqa: PLC0415
  hf = str(tmp_path / "hf")
  write_checkpoint(hf, CFG, *params, block=(16, 24))
  argv = ["--json", "--max-new-tokens", "6", "--prompt-ids", "1,2,3", "--prompt-ids", "7", "--tp", "2", "--check"]
  assert decode.main(["--checkpoint", hf, *argv]) == 0
  from_hf = json.loads(capsys.readouterr().out)
  assert from_hf["matches_target"] is True and len(from_hf["tokens"]) == 2
  cfg, target, mtp = load_hf_checkpoint(hf, progress=False)
  save_params(tmp_path / "orbax", cfg, target, mtp)
  assert decode.main(["--checkpoint", str(tmp_path / "orbax"), *argv]) == 0
  assert json.loads(capsys.readouterr().out)["tokens"] == from_hf["tokens"]
  # how the model runs may differ from the saved config, as for a HF checkpoint (a "config does not match" error
  # until an audit found it, 2026-12-04): the same tokens through another experts impl and prefill chunk
  assert decode.main(["--checkpoint", str(tmp_path / "orbax"), *argv, "--moe-impl", "gather",
                      "--prefill-chunk", "2"]) == 0
  assert json.loads(capsys.readouterr().out)["tokens"] == from_hf["tokens"]
  os.remove(os.path.join(hf, "config.json"))
  assert decode.main(["--checkpoint", hf, *argv]) == 2
  assert "is neither a HF checkpoint directory" in capsys.readouterr().err


def _write_tokenizer(directory: str, vocab: int, bos: bool) -> None:
  """A word-level tokenizer.json over `vocab` ids ("<bos>" = 0, "w1" ... ) and its config."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415
  words = {"<bos>": 0, **{f"w{i}": i for i in range(1, vocab)}}
  tok = Tokenizer(models.WordLevel(words, unk_token="<bos>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"add_bos_token": bos, "bos_token": {"content": "<bos>"}}, f)


def test_cli_text_prompts_go_through_the_checkpoints_tokenizer(params, tmp_path, capsys):
  """`--prompt TEXT` encodes with tokenizer.json (+ BOS when tokenizer_config asks), decodes the
  output, and gives the same tokens as the equivalent --prompt-ids; a missing tokenizer is exit 2."""
  from jax_mtp import decode  # noqa: PLC0415
  hf = str(tmp_path / "hf")
  write_checkpoint(hf, CFG, *params, block=(16, 24))
  argv = ["--checkpoint", hf, "--json", "--max-new-tokens", "4"]
  assert decode.main([*argv, "--prompt-ids", "1,2,3"]) == 0  # ids need no tokenizer
  capsys.readouterr()
  assert decode.main([*argv, "--prompt", "w5 w9"]) == 2
  assert re.search(r"--prompt needs a tokenizer, and '.*tokenizer.json' does not exist", capsys.readouterr().err)
  _write_tokenizer(hf, CFG.vocab_size, bos=True)
  assert decode.main([*argv, "--prompt", "w5 w9", "--prompt", "w7"]) == 0
  from_text = json.loads(capsys.readouterr().out)
  assert decode.main([*argv, "--prompt-ids", "0,5,9", "--prompt-ids", "0,7"]) == 0
  from_ids = json.loads(capsys.readouterr().out)
  assert from_text["tokens"] == from_ids["tokens"]
  assert from_text["text"] == [" ".join("<bos>" if t == 0 else f"w{t}" for t in row) for row in from_ids["tokens"]]
  _write_tokenizer(hf, CFG.vocab_size, bos=False)
  codec = decode.TextCodec(hf)
  assert codec.encode("w5 w9") == [5, 9] and codec.bos_id is None


# --- numbers and files the loader refuses (issue 16) -----------------------------------------------

FP8_NAME = "model.layers.0.self_attn.q_a_proj.weight"


def _set_first(name: str, value):
  def edit(tensors):
    tensors[name] = np.array(tensors[name])
    tensors[name][(0,) * tensors[name].ndim] = value
  return edit


@pytest.mark.parametrize("name, value, message", [
    ("model.layers.1.post_attention_layernorm.weight", np.nan,
     r"tensor model\.layers\.1\.post_attention_layernorm\.weight in .* holds 1 non-finite value\(s\)"),
    ("model.norm.weight", np.inf, r"tensor model\.norm\.weight in .* holds 1 non-finite value\(s\)"),
    (FP8_NAME, np.nan, rf"tensor {re.escape(FP8_NAME)} in .* holds \d+ non-finite"),  # e4m3's NaN code
    (FP8_NAME + "_scale_inv", np.inf, r"_scale_inv holds a scale that is not a finite number ≥ 0 \(inf\)"),
    (FP8_NAME + "_scale_inv", 0.0, r"has a zero scale for a block of .* whose codes are not all zero"),
], ids=["nan-bf16", "inf-norm", "nan-fp8-code", "inf-scale", "zero-scale"])
def test_non_finite_weights_and_bad_scales_are_refused_by_name(written, tmp_path, name, value, message):
  """A NaN or inf weight (stored, or an FP8 NaN code), a non-finite scale or a zero scale over
  non-zero codes is a load error naming the tensor: never weights that decode junk silently."""
  directory = _copy(written, tmp_path)
  _rewrite(directory, name, _set_first(name, value))
  with pytest.raises(CheckpointError, match=message):
    load_hf_checkpoint(directory, progress=False)


def test_a_file_that_vanishes_mid_load_is_exit_2_with_its_path(params, tmp_path, capsys, monkeypatch):
  """A shard deleted after its header was read (or unreadable): `decode` exits 2 naming the file."""
  from jax_mtp import decode, safetensors_io  # noqa: PLC0415
  hf = str(tmp_path / "hf")
  write_checkpoint(hf, CFG, *params, block=(16, 24))
  real_memmap = safetensors_io._memmap

  def vanishing(info):  # the file goes away just before its data is mapped
    if os.path.exists(info.file):
      os.remove(info.file)
    return real_memmap(info)

  monkeypatch.setattr(safetensors_io, "_memmap", vanishing)
  assert decode.main(["--checkpoint", hf, "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and re.fullmatch(r"error: cannot read '.*\.safetensors': No such file or directory\n", err), err
