"""Training (jax_mtp.training, python -m jax_mtp.train): the losses against independent formulas,
the expert-load bias, distillation's frozen target, a short run whose loss falls and held-out draft
acceptance rises, resuming from orbax on the same curve, and the export read back by the loader."""

from __future__ import annotations

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mtp
from jax_mtp import corpus, training
from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.hf_config import from_hf_config
from jax_mtp.export import save_hf_checkpoint, to_hf_config
from jax_mtp.sharding import make_data_mesh
from jax_mtp.train import main as train_main
from tests.tolerances import assert_close

CFG = jax_mtp.tiny(vocab_size=64, index_topk=8)


def _params(cfg=CFG):
  return training.split_params(jax_mtp.init_target_params(cfg, jax.random.key(0)), jax_mtp.init_params(cfg, jax.random.key(1)))


def test_indexer_kl_matches_the_formula():
  rng = np.random.default_rng(0)
  attention = rng.random((2, 3, 5)).astype(np.float32)
  visible = rng.random((2, 3, 5)) < 0.7
  visible[..., 0] = True
  attention = np.where(visible, attention, 0)
  scores = rng.normal(size=(2, 3, 5)).astype(np.float32)
  sown = {"layer": {"attention_BTS": (attention,), "visible_BTS": (visible,), "indexer": {"scores_BTS": (scores,)}}}
  (kl,) = training.indexer_kls(sown)
  expected = []
  for b in range(2):
    for t in range(3):
      v = visible[b, t]
      p = attention[b, t][v] / attention[b, t][v].sum()
      q = np.exp(scores[b, t][v] - scores[b, t][v].max())
      q /= q.sum()
      expected.append(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / q), 0)))
  assert_close(kl, np.mean(expected), what="indexer KL")


def test_cross_entropy_hard_and_soft_labels():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 7)), jnp.float32)
  labels = jnp.asarray([[0, 6, 3], [1, 1, 2]])
  log_p = np.log(np.exp(np.asarray(logits, np.float64)) / np.exp(np.asarray(logits, np.float64)).sum(-1, keepdims=True))
  hard = -np.mean(np.take_along_axis(log_p, np.asarray(labels)[..., None], -1))
  assert_close(training.cross_entropy(logits, labels), hard, what="hard CE")
  assert_close(training.cross_entropy(logits, jax.nn.one_hot(labels, 7)), hard, what="soft CE of one-hot labels")


def test_expert_bias_moves_towards_balance():
  params = _params()
  path = ("target", "layers_1", "mlp", "gate")
  load = {path: jnp.asarray([5.0, 0, 0, 3, 0, 0, 0, 0])}  # mean 1: experts 0 and 3 over, the rest under
  out = training.balance_experts(params, load, training.Objective(bias_rate=0.01))
  bias = np.asarray(out["target"]["layers_1"]["mlp"]["gate"]["e_score_correction_bias"])
  np.testing.assert_array_equal(bias, np.float32([-0.01, 0.01, 0.01, -0.01, 0.01, 0.01, 0.01, 0.01]))
  frozen = training.balance_experts(params, load, training.Objective(mode="distill", bias_rate=0.01))
  assert not np.any(np.asarray(frozen["target"]["layers_1"]["mlp"]["gate"]["e_score_correction_bias"]))


@pytest.mark.parametrize("dense", [True, False], ids=["dense-warm-up", "sparse"])
def test_distill_step_trains_the_mtp_layer_only(dense):
  """A distillation step leaves every target param bit-identical and moves the MTP layer; the
  sparse step (index_topk 8 < L = 16) runs the indexer's selection and its loss."""
  params = _params()
  objective = training.Objective(mode="distill", dense=dense)
  opt = training.optimizer(1e-2, 10, 1)
  step = training.make_train_step(CFG, objective, opt, 16, make_data_mesh(jax.devices()[:1]))
  tokens = np.asarray(np.random.default_rng(2).integers(0, 64, (2, 16)), np.int32)
  before = jax.tree.map(np.asarray, params)
  after, _, metrics = step(jax.tree.map(jnp.asarray, params), opt.init(params["mtp"]), tokens)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(after["target"]), before["target"])
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), after["mtp"], before["mtp"]))
  assert sum(moved) > len(moved) // 2
  assert np.isfinite(float(metrics["loss"])) and 0 < float(metrics["indexer_kl"]) < np.inf  # the untrained indexer's
  # distribution is not the attention's: a KL of 0 would mean the loss never compared them


def test_export_reads_back_through_the_loader(tmp_path):
  cfg = CFG.replace(num_nextn_predict_layers=1)
  target, mtp = jax_mtp.init_target_params(cfg, jax.random.key(3)), jax_mtp.init_params(cfg, jax.random.key(4))
  save_hf_checkpoint(tmp_path / "fp32", cfg, target, mtp, eos_ids=(7,))
  assert from_hf_config(tmp_path / "fp32") == cfg
  loaded_cfg, loaded_target, loaded_mtp = load_hf_checkpoint(tmp_path / "fp32", progress=False)
  assert loaded_cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded_target), jax.device_get(target))
  shared = {k: target[k] for k in ("embed_tokens", "lm_head")}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded_mtp), jax.device_get({**mtp, **shared}))
  assert json.load(open(tmp_path / "fp32" / "generation_config.json"))["eos_token_id"] == 7
  save_hf_checkpoint(tmp_path / "bf16", cfg, target, mtp, storage_dtype="bfloat16")
  _, bf16_target, _ = load_hf_checkpoint(tmp_path / "bf16", progress=False)
  rounded = jax.tree.map(lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32)), target)
  rounded["layers_1"]["mlp"]["gate"] = target["layers_1"]["mlp"]["gate"]  # the router stays fp32
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(bf16_target), jax.device_get(rounded))
  with pytest.raises(FileExistsError, match=re.escape(f"{str(tmp_path / 'bf16')!r} exists; export writes a new")):
    save_hf_checkpoint(tmp_path / "bf16", cfg, target, mtp)
  assert to_hf_config(cfg)["torch_dtype"] == "float32"


def _corpus(directory) -> str:
  """A small corpus of regular code-like text (learnable in a few dozen steps)."""
  os.makedirs(directory, exist_ok=True)
  for f in range(12):
    lines = [f"x{i % 7} = y{(i * f) % 5} + {i % 3}\n" for i in range(300)]
    with open(os.path.join(directory, f"m{f}.py"), "w") as out:
      out.write("".join(lines))
  return str(directory)


def _log(out) -> dict[int, dict]:
  records = {}
  for line in open(os.path.join(out, "log.jsonl")):
    record = json.loads(line)
    records.setdefault(record["step"], {}).update(record)
  return records


def test_training_learns_resumes_on_the_same_curve_and_exports(tmp_path, capsys):
  """joint training of the tiny preset for 24 steps (8 dense, then sparse): the loss falls and
  held-out draft acceptance rises; a run resumed from its step-16 checkpoint logs the same
  numbers at steps 20 and 24 as the uninterrupted run; distilling a fresh MTP layer for the
  exported target raises its acceptance and leaves the target bit-identical; the export decodes
  through the CLI."""
  data, out = _corpus(tmp_path / "data"), tmp_path / "run"
  argv = ["--preset", "tiny", "--data", data, "--vocab-size", "300", "--steps", "24", "--batch", "8", "--seq-len", "32",
          "--lr", "1e-2", "--warmup", "4", "--dense-steps", "8", "--log-every", "4", "--eval-every", "8",
          "--save-every", "8", "--out", str(out)]
  assert train_main([*argv, "--export", str(tmp_path / "model")]) == 0
  first = _log(out)
  assert first[24]["loss"] < 0.6 * first[4]["loss"]
  assert first[24]["held_out_acceptance"] > first[0]["held_out_acceptance"] + 0.3  # 0: before any step
  assert first[24]["held_out_lm_loss"] < 0.5 * first[0]["held_out_lm_loss"]

  shutil.rmtree(out / "state" / "24")  # as if killed after step 16's save
  os.remove(out / "log.jsonl")
  assert train_main(argv) == 0
  assert "resuming from step 16" in capsys.readouterr().err
  resumed = _log(out)
  assert min(resumed) == 20
  for step in (20, 24):
    assert {"loss", "lm_loss", "mtp_loss"} <= first[step].keys(), first[step]  # the curve is compared, not skipped
    for key in ("loss", "lm_loss", "mtp_loss", "held_out_acceptance"):
      assert (key in resumed[step]) == (key in first[step]), (step, key)
      if key in first[step]:
        assert resumed[step][key] == first[step][key], (step, key)

  # distillation: a fresh MTP layer for the exported target, which stays as it is
  distill = ["--mode", "distill", "--checkpoint", str(tmp_path / "model"), "--fresh-mtp", "--data", data, "--steps", "8",
             "--batch", "8", "--seq-len", "32", "--lr", "1e-2", "--warmup", "2", "--dense-steps", "0", "--log-every", "4",
             "--eval-every", "8", "--out", str(tmp_path / "distill"), "--export", str(tmp_path / "distilled")]
  assert train_main(distill) == 0
  log = _log(tmp_path / "distill")
  assert log[8]["held_out_acceptance"] > log[0]["held_out_acceptance"] + 0.2, log
  _, teacher, _ = load_hf_checkpoint(tmp_path / "model", progress=False)
  _, student_target, _ = load_hf_checkpoint(tmp_path / "distilled", progress=False)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(student_target), jax.device_get(teacher))

  from jax_mtp.decode import main as decode_main  # noqa: PLC0415
  assert decode_main(["--checkpoint", str(tmp_path / "model"), "--prompt", "x1 = y", "--max-new-tokens", "6",
                      "--check", "--json"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["matches_target"]
  assert re.match(r"\d \+ \d\n", result["text"][0]), result["text"]  # "x1 = y" continues as the corpus's lines do


def test_bad_input_is_refused(tmp_path, capsys):
  def refused(*argv, out="run"):
    assert train_main([*argv, "--out", str(tmp_path / out)]) == 2
    return capsys.readouterr().err

  assert "--mode distill needs --checkpoint" in refused("--mode", "distill")
  assert "unrecognized arguments: --stepz 3 (python -m jax_mtp.train --help lists the flags)" in refused("--stepz", "3")
  assert "is neither a file nor a directory" in refused("--data", str(tmp_path / "missing"), out="a")
  assert "--seq-len=2 must be ≥ 3" in refused("--seq-len", "2")
  assert "--batch=4 must be a multiple of the 8 devices" in refused("--batch", "4")
  for flag, value, named in [("--lr", "nan", "--lr=nan must be a finite number > 0"),
                             ("--lr", "0", "--lr=0.0 must be a finite number > 0"),
                             ("--lr", "inf", "--lr=inf must be"), ("--mtp-weight", "-1", "--mtp-weight=-1.0 must be"),
                             ("--mtp-weight", "nan", "--mtp-weight=nan must be"), ("--warmup", "-3", "--warmup=-3"),
                             ("--dense-steps", "-2", "--dense-steps=-2 must be in [0, --steps=3000]"),
                             ("--dense-steps", "3001", "--dense-steps=3001"),
                             ("--vocab-size", "3", "--vocab-size=3 must be ≥ 257")]:
    assert named in refused(flag, value), (flag, value)  # each once trained on NaNs or silently otherwise
  for seed in ("-1", str(2**63)):  # (tracebacks: numpy's generator takes no negative seed, jax.random.key 64 bits)
    assert f"--seed={seed} must be in [0, 2^63 - 1]" in refused("--seed", seed)
  # a flag the run's mode does not read, once ignored in silence
  for argv, named in [(("--fresh-mtp",), "--fresh-mtp is read by --mode distill only; this run is --mode joint"),
                      (("--distill-targets", "greedy"), "--distill-targets is read by --mode distill only"),
                      (("--mode", "distill", "--checkpoint", "x/y", "--preset", "demo"),
                       "--preset is read by --mode joint only; this run is --mode distill"),
                      (("--mode", "distill", "--checkpoint", "x/y", "--vocab-size", "300"), "--vocab-size is read by"),
                      (("--mode", "distill", "--checkpoint", "x/y", "--mtp-weight", "0.5"), "--mtp-weight is read by")]:
    assert named in refused(*argv), argv
  assert "fewer than one window" in refused("--preset", "tiny", "--data", _corpus(tmp_path / "d"), "--vocab-size",
                                            "300", "--steps", "1", "--batch", "8", "--seq-len", "100000", out="b")
  assert not any(os.path.exists(tmp_path / out) for out in ("run", "a", "b"))  # a refused run writes nothing


def test_bad_paths_are_refused_before_any_work(tmp_path, capsys):
  """--out, --export and --checkpoint that the run could not use are refused (exit 2, naming the path)
  before the data is read or anything is written; --export under --out is fine unless it is one of
  the run's own files."""
  def refused(*argv, out="run"):
    preset = [] if "distill" in argv else ["--preset", "tiny"]  # (only joint training reads --preset)
    assert train_main([*preset, "--data", str(tmp_path / "missing"), *argv, "--out", str(out)]) == 2
    return capsys.readouterr().err

  a_file = tmp_path / "file"
  a_file.write_text("not a directory")
  out = tmp_path / "run"
  assert f"--export {str(a_file / 'model')!r} cannot be created: {str(a_file)!r} is a file" in refused(
      "--export", str(a_file / "model"), out=out)
  assert f"--out {str(a_file)!r} is a file, not a directory" in refused(out=a_file)
  assert f"--out {str(a_file / 'run')!r} cannot be created" in refused(out=a_file / "run")
  assert f"--export {str(a_file)!r} exists" in refused("--export", str(a_file), out=out)
  assert "where the run keeps its own files" in refused("--export", str(out / "state"), out=out)
  nested = tmp_path / "new" / "run"
  assert f"--export {str(tmp_path / 'new')!r} would hold --out" in refused("--export", str(tmp_path / "new"),
                                                                           out=nested)
  assert not (tmp_path / "new").exists()
  assert "is neither a HF checkpoint directory" in refused("--mode", "distill", "--checkpoint", str(tmp_path),
                                                            out=out)
  assert f"--export-only: --out {str(out)!r} holds no run to export" in refused("--export-only", out=out)
  assert not out.exists()
  # the same flags with a usable --export get as far as the data
  assert "is neither a file nor a directory" in refused("--export", str(out / "model"), out=out)


def test_a_refused_run_leaves_out_free_and_other_data_is_another_run(tmp_path, capsys):
  """A first attempt refused for its --seq-len leaves --out untouched, so the corrected command runs;
  the run remembers its --data: resuming it with other data is refused, naming both."""
  data, out = _corpus(tmp_path / "d"), tmp_path / "run"
  argv = ["--preset", "tiny", "--vocab-size", "300", "--steps", "1", "--batch", "8", "--eval-batches", "1",
          "--out", str(out)]
  assert train_main([*argv, "--data", data, "--seq-len", "100000"]) == 2
  assert "fewer than one window" in capsys.readouterr().err
  assert not out.exists()
  assert train_main([*argv, "--data", data, "--seq-len", "16"]) == 0
  assert json.loads((out / "run.json").read_text())["data"] == [os.path.abspath(data)]
  capsys.readouterr()
  other = _corpus(tmp_path / "e")
  assert train_main([*argv, "--data", other, "--seq-len", "16"]) == 2
  err = capsys.readouterr().err
  assert f"holds another run: --data={[os.path.abspath(other)]!r} (the run has {[os.path.abspath(data)]!r})" in err



def test_a_damaged_run_json_or_newest_state_step_is_one_error_naming_it(tmp_path, capsys):
  """Resuming a run whose run.json is not JSON, or whose newest saved step lost its array files: exit 2 with one
  line naming the file or the step (and the step it could resume from) — not a JSON error naming no file, or
  orbax's traceback (exit 1)."""
  data, out = _corpus(tmp_path / "d"), tmp_path / "run"
  argv = ["--preset", "tiny", "--vocab-size", "300", "--batch", "8", "--eval-batches", "1", "--seq-len", "16",
          "--data", data, "--out", str(out), "--save-every", "1"]
  assert train_main([*argv, "--steps", "2"]) == 0
  capsys.readouterr()
  run_json = out / "run.json"
  saved = run_json.read_text()
  run_json.write_text("{bad")
  assert train_main([*argv, "--steps", "2"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(f"error: {str(run_json)!r} is not JSON"), err
  run_json.write_text(saved)
  newest = max((out / "state").iterdir(), key=lambda path: int(path.name) if path.name.isdigit() else -1)
  assert newest.name == "2"
  for path in [path for path in newest.rglob("*") if path.is_file() and path.parent.name == "d"]:
    path.unlink()
  assert train_main([*argv, "--steps", "2"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: step 2 in ") and err[-1].endswith("move it aside to resume from step 1"), err

def test_a_run_and_its_export_record_the_files_it_trained_on_and_held_out(tmp_path, monkeypatch, capsys):
  """Joint training on the default corpus (here a stand-in standard library) writes training_corpus.json under
  --out when it starts, and an --export-only of the run (as benchmarks/h200_train_default.sh exports a run cut
  short) puts it in the export: the files the run's split put on each side, by name relative to the stdlib root,
  which corpus.unseen_files reads back as the files the model never read. A distilled export carries none."""
  held = ["abc.py", "operator.py", "importlib/util.py", "encodings/cp737.py", "pkg/m7.py"]  # by is_held_out's hash
  trained = ["fractions.py", "json/decoder.py"] + [f"pkg/m{i}.py" for i in range(7)]
  root = tmp_path / "lib" / "python3.99"
  for i, name in enumerate(held + trained):
    os.makedirs(os.path.dirname(root / name), exist_ok=True)
    (root / name).write_text("".join(f"x{j % 7} = y{(j * i) % 5} + {j % 3}\n" for j in range(100)))
  monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(root)})
  files = corpus.default_corpus()
  split = corpus.TokenData.build(files, corpus.train_bpe(files, 300))
  assert sorted(f.relative for f in split.held_out_files) == sorted(held)

  out, model = tmp_path / "run", tmp_path / "model"
  argv = ["--preset", "tiny", "--vocab-size", "300", "--steps", "2", "--batch", "8", "--seq-len", "16",
          "--eval-batches", "1", "--save-every", "2", "--out", str(out)]
  assert train_main(argv) == 0
  record = json.loads((out / corpus.TRAINING_RECORD).read_text())
  assert record["corpus"] == "stdlib" and record["root"] == str(root)
  assert record["trained"] == [f.relative for f in split.trained_files]
  assert record["held_out"] == [f.relative for f in split.held_out_files]
  assert (record["train_tokens"], record["held_out_tokens"]) == (split.train.size, split.held_out.size)
  assert train_main([*argv, "--export-only", "--export", str(model)]) == 0
  assert json.loads((model / corpus.TRAINING_RECORD).read_text()) == record
  assert corpus.unseen_files(str(model)) == split.held_out_files

  distill = ["--mode", "distill", "--checkpoint", str(model), "--steps", "1", "--batch", "8", "--seq-len", "16",
             "--eval-batches", "1", "--out", str(tmp_path / "distill"), "--export", str(tmp_path / "distilled")]
  assert train_main(distill) == 0
  assert not (tmp_path / "distill" / corpus.TRAINING_RECORD).exists()
  assert not (tmp_path / "distilled" / corpus.TRAINING_RECORD).exists()


def test_corpus_split_and_batches_are_deterministic(tmp_path):
  files = corpus.corpus_files([_corpus(tmp_path / "c")])
  assert files == sorted(files) and len(files) == 12
  tok = corpus.train_bpe(files, 300)
  assert tok.token_to_id(corpus.EOS) == 0 and tok.decode(tok.encode("x1 = y2 + 0\n").ids) == "x1 = y2 + 0\n"
  data = corpus.TokenData.build(files, tok, held_out=0.25)
  again = corpus.TokenData.build(files, tok, held_out=0.25)
  np.testing.assert_array_equal(data.train, again.train)
  np.testing.assert_array_equal(data.train_batch(5, 3, 16, 0), again.train_batch(5, 3, 16, 0))
  assert not np.array_equal(data.train_batch(5, 3, 16, 0), data.train_batch(6, 3, 16, 0))
  assert data.held_out.size and data.train.size
  held = [f for f in files if corpus.is_held_out(f, 0.25)]
  assert 0 < len(held) < len(files)
