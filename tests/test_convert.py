"""`python -m jax_mtp.convert` (and `orbax_io.save_params(model_files_from=)`): a checkpoint's orbax copy holds the
arrays the loader gives for the source, bit for bit, in each `--weights` form; the CLI reads the source's tokenizer,
chat template, generation settings and EOS ids from the copy as from the source, and decodes the source's tokens;
a destination in the way, a bad flag or a malformed EOS id is one error before any weight is read, nothing written.
"""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

import jax_mtp
from jax_mtp import convert, decode, fp8, loader
from jax_mtp.decode_flags import DEFAULT_TEXT, parser
from jax_mtp.model_files import MODEL_FILES, copy_model_files
from jax_mtp.orbax_io import restore_params, save_params
from jax_mtp.safetensors_io import CheckpointError
from jax_mtp.sharding import SHARED_WITH_TARGET, make_mesh
from tests.devices import needs_devices
from tests.hf_checkpoint import write_checkpoint

CFG = jax_mtp.tiny(vocab_size=250)
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
  """A 3-shard FP8 HF checkpoint of CFG (tests/hf_checkpoint.py, partial edge blocks)."""
  directory = str(tmp_path_factory.mktemp("hf"))
  params = jax_mtp.init_target_params(CFG, jax.random.key(0)), jax_mtp.init_params(CFG, jax.random.key(1))
  write_checkpoint(directory, CFG, *params, block=(16, 24))
  return directory


def _convert(capsys, *argv) -> str:
  assert convert.main(list(argv)) == 0, capsys.readouterr().err
  out, err = capsys.readouterr()
  assert err == "" and out.count("\n") == 1, (out, err)
  return out


def _decoded(capsys, *argv) -> dict:
  assert decode.main(["--json", *argv]) == 0
  out, err = capsys.readouterr()
  assert "names no EOS id" not in err, err
  return json.loads(out)


def _assert_same_arrays(expected: loader.Loaded, got_target: dict, got_mtp: dict) -> None:
  for want, got in ((expected.target, got_target), (expected.mtp, got_mtp)):
    assert jax.tree.structure(want) == jax.tree.structure(got)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
      assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
      assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), jax.tree_util.keystr(path)


def test_the_embedded_defaults_copy_decodes_its_text(tmp_path, capsys):
  """The copy of a HF directory with a tokenizer and generation_config.json: `--prompt` text decodes to the
  source's tokens and text, and the rows stop at its EOS id (no note that none is named)."""
  out = tmp_path / "orbax"
  line = _convert(capsys, "--checkpoint", loader.DEFAULT_MODEL, "--out", str(out))
  assert line.startswith(f"wrote {out} step 0: ") and line.endswith(
      "0 FP8 weights kept as codes + block scales; beside it: tokenizer.json, generation_config.json\n"), line
  argv = ["--max-new-tokens", "12", "--prompt", DEFAULT_TEXT, "--prompt", "import os\n"]
  source = _decoded(capsys, *argv)
  copy = _decoded(capsys, "--checkpoint", str(out), *argv)
  assert copy["tokens"] == source["tokens"] and copy["text"] == source["text"]
  assert decode.stop_ids_for(CFG, loader.locate(str(out)), ignore_eos=False) == (0,)


def test_the_copy_reads_the_sources_chat_template_sampling_settings_and_eos_ids(tmp_path, capsys):
  """Every model file travels: the chat template renders the same prompt ids, generation_config.json's sampling
  settings fill the same flags, and EOS ids named only in config.json (which an orbax root does not hold) are
  written into the copy's generation_config.json beside those settings."""
  source = tmp_path / "model"
  shutil.copytree(loader.DEFAULT_MODEL, source)
  (source / "chat_template.jinja").write_text(TEMPLATE)
  (source / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
  (source / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
  config = json.loads((source / "config.json").read_text())
  (source / "config.json").write_text(json.dumps({**config, "eos_token_id": [0, 5]}))
  out = tmp_path / "orbax"
  line = _convert(capsys, "--checkpoint", str(source), "--out", str(out))
  assert line.endswith(f"beside it: {', '.join(MODEL_FILES)}\n"), line
  assert json.loads((out / "generation_config.json").read_text()) == {
      "temperature": 0.6, "top_p": 0.95, "eos_token_id": [0, 5]}
  requests = [decode.validate(parser().parse_args(["--checkpoint", str(d), "--chat", "--prompt", "x = 1"]))
              for d in (source, out)]
  assert requests[0].stop_ids == requests[1].stop_ids == (0, 5)
  assert requests[0].prompts == requests[1].prompts
  assert requests[0].texts == requests[1].texts == ["<user>x = 1<assistant>"]  # the template rendered
  for name in ("temperature", "top_k", "top_p"):
    assert getattr(requests[0].settings, name) == getattr(requests[1].settings, name)
  assert requests[1].settings.temperature == 0.6


@pytest.mark.parametrize("weights", ["auto", "bf16"])
def test_an_fp8_checkpoints_copy_holds_the_loaders_arrays_bit_for_bit(fp8_checkpoint, tmp_path, capsys, weights):
  """`--weights auto` at tp = 1 keeps every stored FP8 weight as codes + block scales, `bf16` writes them
  dequantised: either way the copy restores exactly what `loader.load` gives for the source in that form."""
  out = tmp_path / "orbax"
  line = _convert(capsys, "--checkpoint", fp8_checkpoint, "--out", str(out), "--weights", weights)
  expected = loader.load(fp8_checkpoint, weights=weights)
  kept = len(fp8.fp8_paths({"target": expected.target,
                            "mtp": {k: v for k, v in expected.mtp.items() if k not in SHARED_WITH_TARGET}}))
  assert (kept > 0) == (weights == "auto")
  assert f", {kept} FP8 weights kept as codes + block scales; beside it: no tokenizer" in line, line
  _, target, mtp = restore_params(out)
  _assert_same_arrays(expected, target, mtp)


def test_an_fp8_copy_on_a_mesh_splitting_its_blocks_decodes_the_sources_tokens(fp8_checkpoint, tmp_path, capsys):
  """Converted on one device (every FP8 weight kept), restored on two, which split some blocks: `auto`
  dequantises them with the HF path's note and decodes the source's tokens; `--weights fp8` and a bare
  `restore_params` refuse, naming the tensor. (Until 2026-12-06 the split codes were restored as they were and
  the kernel paired them with the wrong block scales: other tokens, silently.)"""
  needs_devices(2)
  out = tmp_path / "orbax"
  _convert(capsys, "--checkpoint", fp8_checkpoint, "--out", str(out))
  argv = ["--max-new-tokens", "6", "--prompt-ids", "1,2,3", "--prompt-ids", "7", "--tp", "2", "--ignore-eos"]
  assert decode.main(["--json", "--checkpoint", str(out), *argv]) == 0
  copy, err = capsys.readouterr()
  assert err.startswith("note: FP8 weights dequantised on load: at tp=2 ") and "does not fall on its FP8 blocks" in err
  assert json.loads(copy)["tokens"] == _decoded(capsys, "--checkpoint", fp8_checkpoint, *argv)["tokens"]
  assert decode.main(["--checkpoint", str(out), *argv, "--weights", "fp8"]) == 2
  split = r"target/\S+: the slice \[\d+:\d+\] of its (in|out) dim of \d+ does not fall on its FP8 blocks of (16|24)"
  assert re.fullmatch(rf"error: {split}; keeping FP8 weights needs each device's share in whole blocks .*\n",
                      capsys.readouterr().err)
  with pytest.raises(CheckpointError, match=split):
    restore_params(out, mesh=make_mesh(2))
  _, target, _ = restore_params(out, mesh=make_mesh(2), dequantise_fp8=True)
  assert not fp8.fp8_paths(target)


def _in_the_way(out):
  """Destinations convert refuses, each with what its error names."""
  return {
      "holds step 0": (lambda: save_params(out, CFG, *loader.random_weights(CFG)), "already holds checkpoint step 0"),
      "holds other files": (lambda: (out.mkdir(), (out / "config.json").write_text("{}")),
                            r"holds ['config.json'], which are not orbax checkpoint steps"),
      "is a file": (lambda: out.write_text(""), "is a file, not a directory"),
  }


@pytest.mark.parametrize("case", ["holds step 0", "holds other files", "is a file"])
def test_a_destination_in_the_way_is_refused_before_any_weight_is_read(tmp_path, capsys, case):
  """A source whose weights cannot be read (its shard deleted): the destination's error comes first, one line,
  and the destination is left as it was."""
  source = tmp_path / "model"
  shutil.copytree(loader.DEFAULT_MODEL, source)
  os.remove(source / "model.safetensors")
  out = tmp_path / "orbax"
  make, named = _in_the_way(out)[case]
  make()
  before = sorted(os.walk(out)) if out.is_dir() else out.read_text()
  assert convert.main(["--checkpoint", str(source), "--out", str(out)]) == 2
  stdout, err = capsys.readouterr()
  assert stdout == "" and err.count("\n") == 1 and err.startswith(f"error: {str(out)!r} ") and named in err, err
  assert (sorted(os.walk(out)) if out.is_dir() else out.read_text()) == before


@pytest.mark.parametrize("argv, named", [
    ([], "the following arguments are required: --checkpoint, --out"),
    (["--checkpoint", "x", "--out", "y", "--dtype", "bf16"], "unrecognized arguments: --dtype bf16 "
                                                             "(python -m jax_mtp.convert --help lists the flags)"),
    (["--out", "{out}", "--checkpoint", "{default}", "--weights", "fp8"], "stores no FP8"),
    (["--out", "{out}", "--checkpoint", "{default}", "--tp", "3"], "tp=3"),
    (["--out", "{out}", "--checkpoint", "{default}", "--tp", "0"], "--tp=0 must be ≥ 1"),
    (["--out", "{out}", "--checkpoint", "{bad_eos}"], "eos_token_id='0' must be a token id or a list of them"),
], ids=["no-flags", "unknown-flag", "fp8-of-bf16", "tp-3", "tp-0", "bad-eos"])
def test_bad_input_is_one_error_and_nothing_is_written(tmp_path, capsys, argv, named):
  bad_eos = tmp_path / "bad_eos"
  shutil.copytree(loader.DEFAULT_MODEL, bad_eos)
  (bad_eos / "generation_config.json").write_text(json.dumps({"eos_token_id": "0"}))
  out = tmp_path / "orbax"
  argv = [a.format(out=out, default=loader.DEFAULT_MODEL, bad_eos=bad_eos) for a in argv]
  assert convert.main(argv) == 2
  stdout, err = capsys.readouterr()
  assert stdout == "" and err.count("\n") == 1 and err.startswith("error: ") and named in err, err
  assert not out.exists() or not any(name.isdigit() for name in os.listdir(out))


def test_model_files_are_copied_whole_and_a_later_step_saves_beside_them(tmp_path):
  """save_params(model_files_from=): the files beside the steps do not block step 1; a source with neither the
  files nor an EOS id copies nothing; a file's copy replaces an older one whole."""
  out = tmp_path / "orbax"
  weights = loader.random_weights(CFG)
  assert save_params(out, CFG, *weights, model_files_from=loader.DEFAULT_MODEL) == (
      "tokenizer.json", "generation_config.json")
  assert save_params(out, CFG, *weights, step=1, model_files_from=loader.DEFAULT_MODEL) == (
      "tokenizer.json", "generation_config.json")
  assert sorted(os.listdir(out)) == ["0", "1", "generation_config.json", "tokenizer.json"]  # no temporary left
  with open(os.path.join(loader.DEFAULT_MODEL, "tokenizer.json"), "rb") as f:
    assert (out / "tokenizer.json").read_bytes() == f.read()
  empty = tmp_path / "empty"
  empty.mkdir()
  assert copy_model_files(empty, out) == ()
  (empty / "tokenizer.json").write_text("{}")
  assert copy_model_files(empty, out) == ("tokenizer.json",) and (out / "tokenizer.json").read_text() == "{}"
