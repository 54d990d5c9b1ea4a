"""The training corpus' held-out split (jax_mtp.corpus): a hash of each file's path relative to the corpus root
it was found under, so one tree is split the same way wherever it lies, and the standard library the same way
on every machine that has the same Python; and a model's record of the files it trained on
(corpus.unseen_files), read by relative name, so the same files count as unseen wherever the stdlib lies."""

import json
import os
import shutil
import sysconfig

import numpy as np
import pytest

from jax_mtp import corpus


def _tree(root) -> str:
  """40 small .py files in three directories (`root` / pkg / sub), the same names and text wherever made."""
  for i in range(40):
    path = os.path.join(root, *(["pkg", "sub"][:i % 3]), f"m{i}.py")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(f"x = {i}\n")
  return str(root)


def _held_out(files, fraction=0.25) -> list[str]:
  return [f.relative for f in files if corpus.is_held_out(f, fraction)]


def test_the_same_tree_under_another_root_is_split_the_same_way(tmp_path):
  """Short and long roots alike (the hash it replaced took the directory's last 40 characters: a short root
  fell inside them). The names are relative to the directory given, '/'-separated; the paths open as before."""
  near = corpus.corpus_files([_tree(tmp_path / "a")])
  far = corpus.corpus_files([_tree(tmp_path / "a much longer directory name" / "than the first" / "one")])
  held = _held_out(near)
  assert held == _held_out(far) and 0 < len(held) < 40
  assert [f.relative for f in near] == [f.relative for f in far]
  assert "pkg/sub/m2.py" in [f.relative for f in near]
  assert all(f == os.path.join(tmp_path, "a", f.relative) and open(f).read().startswith("x = ") for f in near)


def test_a_moved_tree_keeps_its_split_and_a_file_given_alone_is_named_by_its_base_name(tmp_path):
  files = corpus.corpus_files([_tree(tmp_path / "a")])
  shutil.move(tmp_path / "a", tmp_path / "b")
  assert _held_out(corpus.corpus_files([str(tmp_path / "b")])) == _held_out(files)
  (alone,) = corpus.corpus_files([str(tmp_path / "b" / "pkg" / "m1.py")])
  assert alone.relative == "m1.py" and alone == str(tmp_path / "b" / "pkg" / "m1.py")


def test_the_standard_library_is_named_relative_to_its_root():
  """A plain str is taken to be the relative name; the stdlib files' names hold no machine's prefix."""
  try:
    files = corpus.default_corpus()
  except corpus.CorpusError as e:
    pytest.skip(str(e))
  root = sysconfig.get_paths()["stdlib"]
  by_name = {f.relative: f for f in files}
  assert by_name["json/decoder.py"] == os.path.join(root, "json", "decoder.py")
  assert all(not os.path.isabs(name) and corpus.is_held_out(f, 0.05) == corpus.is_held_out(name, 0.05)
             for name, f in by_name.items())


def test_the_rule_is_pinned():
  """The hash itself, pinned on names of the standard library: a change would move documents across the split
  (and a model trained under it would have its held-out text measured on text it trained on)."""
  names = ["abc.py", "json/decoder.py", "operator.py", "importlib/util.py", "fractions.py", "encodings/cp737.py"]
  assert [n for n in names if corpus.is_held_out(n, corpus.HELD_OUT)] == [
      "abc.py", "operator.py", "importlib/util.py", "encodings/cp737.py"]
  assert all(corpus.is_held_out(n, 1.0) and not corpus.is_held_out(n, 0.0) for n in names)


def _stdlib_at(monkeypatch, root, names) -> None:
  """A stand-in standard library: `names` (relative, '/'-separated) under `root`, which default_corpus walks."""
  for name in names:
    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    with open(os.path.join(root, name), "w") as f:
      f.write(f"# {name}\n")
  monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(root)})


def _model_with_record(model_dir, **record) -> str:
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, corpus.TRAINING_RECORD), "w") as f:
    json.dump(record, f)
  return str(model_dir)


def test_unseen_files_are_the_records_held_out_files_here_wherever_the_stdlib_lies(tmp_path, monkeypatch):
  """Matched by relative name under any root: a file the record holds out (here or not), never one it trained on,
  nor one it does not name (a newer Python's new files may carry trained text under a new name)."""
  model = _model_with_record(tmp_path / "model", trained=["a.py", "pkg/b.py"],
                             held_out=["c.py", "pkg/d.py", "gone.py"])
  for root in (tmp_path / "lib", tmp_path / "a much longer root" / "lib" / "python3.99"):
    _stdlib_at(monkeypatch, root, ["a.py", "c.py", "new.py", "pkg/b.py", "pkg/d.py", "pkg/new.py"])
    files = corpus.unseen_files(model)
    assert [f.relative for f in files] == ["c.py", "pkg/d.py"]
    assert files[1] == os.path.join(root, "pkg", "d.py")


@pytest.mark.parametrize("record, match", [
    (None, "has no readable record of the files it trained on.*No such file"),
    ({"trained": ["a.py"]}, "has no readable record.*'held_out'"),
    ({"held_out": ["gone.py"]}, "none of the 1 stdlib files .* lists as held out is in this Python"),
])
def test_unseen_files_without_a_usable_record_is_one_error(tmp_path, monkeypatch, record, match):
  _stdlib_at(monkeypatch, tmp_path / "lib", ["a.py"])
  model = _model_with_record(tmp_path / "model", **record) if record else str(tmp_path)
  with pytest.raises(corpus.CorpusError, match=match):
    corpus.unseen_files(model)


def test_the_embedded_default_carries_its_record():
  """The default's record ships beside its weights: 494 trained + 23 held-out names, disjoint, relative."""
  from jax_mtp.loader import DEFAULT_MODEL  # noqa: PLC0415
  with open(os.path.join(DEFAULT_MODEL, corpus.TRAINING_RECORD)) as f:
    record = json.load(f)
  trained, held_out = set(record["trained"]), set(record["held_out"])
  assert (len(trained), len(held_out)) == (494, 23) and not trained & held_out
  assert not any(os.path.isabs(name) or "\\" in name for name in trained | held_out)


def test_a_record_of_data_files_names_them_from_their_common_directory_and_is_not_read_as_the_stdlibs(
    tmp_path, monkeypatch):
  """training_record of --data files (two directories with the same names): relative to their common directory,
  so the names stay distinct, each on the side its split put it; unseen_files refuses it (its names are not the
  stdlib's)."""
  files = corpus.corpus_files([_tree(tmp_path / "data" / "a"), _tree(tmp_path / "data" / "b")])
  held = [f for f in files if os.path.basename(f) == "m1.py"]
  data = corpus.TokenData(np.zeros(3, np.int32), np.zeros(2, np.int32), [f for f in files if f not in held], held)
  record = corpus.training_record(data, stdlib=False)
  assert record["corpus"] == "data" and record["root"] == str(tmp_path / "data")
  assert record["held_out"] == ["a/pkg/m1.py", "b/pkg/m1.py"] and len(record["trained"]) == 78
  assert (record["train_tokens"], record["held_out_tokens"]) == (3, 2)
  model = _model_with_record(tmp_path / "model", **record)
  _stdlib_at(monkeypatch, tmp_path / "lib", ["a/pkg/m1.py"])
  with pytest.raises(corpus.CorpusError, match="trained on --data files, not the stdlib"):
    corpus.unseen_files(model)
