"""The training corpus' held-out split (jax_mtp.corpus): a hash of each file's path relative to the corpus root
it was found under, so one tree is split the same way wherever it lies, and the standard library the same way
on every machine that has the same Python."""

import os
import shutil
import sysconfig

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
  (and the reasoning of test_default_model's held-out files with them)."""
  names = ["abc.py", "json/decoder.py", "operator.py", "importlib/util.py", "fractions.py", "encodings/cp737.py"]
  assert [n for n in names if corpus.is_held_out(n, corpus.HELD_OUT)] == [
      "abc.py", "operator.py", "importlib/util.py", "encodings/cp737.py"]
  assert all(corpus.is_held_out(n, 1.0) and not corpus.is_held_out(n, 0.0) for n in names)
