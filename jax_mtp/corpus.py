"""Training text: files → a byte-level BPE (the `tokenizers` library) → one token stream → batches.

    files = corpus_files(["notes/", "book.txt"])         # or default_corpus(): the Python stdlib's sources
    tok = train_bpe(files, vocab_size=4096)             # or the checkpoint's own tokenizer.json
    data = TokenData.build(files, tok, held_out=0.05)   # documents joined with the EOS token
    batch = data.train_batch(step, batch=32, length=256, seed=0)    # int32 [32, 256], a pure function of step

Documents are split into train and held-out by a hash of their path relative to the corpus root they were
found under (`CorpusFile.relative`: the stdlib root, or the --data directory), so the split does not move
when files are added, nor between machines that keep the same files under different roots. A batch is
`batch` windows at offsets drawn from (seed, step) alone: a resumed run reads exactly the batches an
uninterrupted one would.

A trained model's directory may carry `training_corpus.json`, the record of the files it trained on and held
out (paths relative to the stdlib root); `unseen_files(model_dir)` is its held-out files as this Python has them:
text to measure it on that it never read, on any machine. `training_record(data, stdlib)` is that record for a
TokenData (python -m jax_mtp.train writes it into the run's directory and the export).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import sysconfig

import numpy as np

EOS = "<|endoftext|>"  # separates documents; the trained model's end-of-sequence id
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")
HELD_OUT = 0.05  # the share of documents held out (TokenData.build's default)
TRAINING_RECORD = "training_corpus.json"  # in a model's directory: the stdlib files it trained on and held out


class CorpusError(ValueError):
  """A corpus path that holds no text, or an unreadable file; the message names it."""


class CorpusFile(str):
  """A corpus file's path — a str, so open() and os.path take it as before — that also knows its name
  relative to the corpus root it was found under (`relative`, '/'-separated): the name the held-out split
  hashes."""

  relative: str

  def __new__(cls, root: str, relative: str) -> "CorpusFile":
    self = super().__new__(cls, os.path.join(root, relative))
    self.relative = relative.replace(os.sep, "/")
    return self


def default_corpus() -> list[CorpusFile]:
  """The Python standard library's own source files (every machine with Python has them), without
  its test suites and vendored packages; sorted, so a run is reproducible on one Python version."""
  root = sysconfig.get_paths()["stdlib"]
  skip = ("test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3")
  files = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in skip)
    files += [CorpusFile(root, os.path.relpath(os.path.join(directory, n), root)) for n in sorted(names)
              if n.endswith(".py")]
  if not files:
    raise CorpusError(f"no Python sources under {root!r} (this Python ships without its standard library's "
                      f"sources); give --data")
  return files


def corpus_files(paths: list[str]) -> list[CorpusFile]:
  """Text files named by `paths`: files as given (named by their base name), directories walked for
  TEXT_SUFFIXES (sorted; named relative to the directory given)."""
  files = []
  for path in paths:
    if os.path.isfile(path):
      files.append(CorpusFile(os.path.dirname(path), os.path.basename(path)))
    elif os.path.isdir(path):
      found = sorted(CorpusFile(path, os.path.relpath(os.path.join(d, n), path)) for d, _, names in os.walk(path)
                     for n in names if n.endswith(TEXT_SUFFIXES))
      if not found:
        raise CorpusError(f"--data {path!r} holds no {'/'.join(TEXT_SUFFIXES)} files")
      files += found
    else:
      raise CorpusError(f"--data {path!r} is neither a file nor a directory")
  return files


def read_text(path: str) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read()
  except OSError as e:
    raise CorpusError(f"cannot read {path!r}: {e}") from None


def train_bpe(files: list[str], vocab_size: int):
  """A byte-level BPE over `files` with EOS as its one special token (id 0). Deterministic for the
  same files."""
  import tokenizers  # noqa: PLC0415
  from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator((read_text(f) for f in files), trainer=trainer)
  return tok


def is_held_out(path: str, fraction: float) -> bool:
  """Whether `path`'s document is held out: a hash of its name relative to its corpus root (a CorpusFile's
  `relative`; a plain str is taken to be that name), the same on every run and machine. (The hash it
  replaced, of the base name and the absolute directory's last 40 characters, moved files across the split
  with the root: all of /usr/lib/python3.12/json, say, is within those 40 characters.)"""
  name = path.relative if isinstance(path, CorpusFile) else path
  digest = hashlib.sha256(name.encode()).digest()
  return int.from_bytes(digest[:4], "little") / 2**32 < fraction


def unseen_files(model_dir: str) -> list[CorpusFile]:
  """This Python's default-corpus files that the model in `model_dir` never trained on: those its training record
  (`model_dir`/training_corpus.json) lists as "held_out", matched by the path relative to the stdlib root, so the
  same names on every machine whatever the root. A file the record names on neither side (absent from the
  training machine's Python) is left out too, though the model never read it: a newer Python's new files carry
  trained text under new names (3.13's pathlib/_local.py and sysconfig/__init__.py are most of 3.12's pathlib.py
  and sysconfig.py, which it trained on). Not filtered by `is_held_out`: the record, not today's split rule, says
  what the model read (on its training image no file the rule holds out is unseen)."""
  path = os.path.join(model_dir, TRAINING_RECORD)
  try:
    with open(path) as f:
      record = json.load(f)
    held_out = set(record["held_out"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise CorpusError(f"{model_dir!r} has no readable record of the files it trained on: {path!r} must hold a "
                      f"\"held_out\" list of paths relative to the stdlib root ({e})") from None
  if record.get("corpus", "stdlib") != "stdlib":  # the embedded default's record predates the key
    raise CorpusError(f"{model_dir!r} trained on --data files, not the stdlib ({path!r} names them relative to "
                      f"{record.get('root')!r}): measure it on its own held-out files")
  files = [f for f in default_corpus() if f.relative in held_out]
  if not files:
    raise CorpusError(f"none of the {len(held_out)} stdlib files {path!r} lists as held out is in this Python's "
                      f"standard library ({sysconfig.get_paths()['stdlib']!r})")
  return files


class TokenData:
  """Train and held-out token streams (documents joined by EOS)."""

  def __init__(self, train: np.ndarray, held_out: np.ndarray, trained_files: list[str] = (),
               held_out_files: list[str] = ()):
    self.train, self.held_out = train, held_out
    self.trained_files, self.held_out_files = list(trained_files), list(held_out_files)  # the files of each split

  @classmethod
  def build(cls, files: list[str], tok, held_out: float = HELD_OUT) -> "TokenData":
    eos = tok.token_to_id(EOS)
    if eos is None:
      raise CorpusError(f"the tokenizer has no {EOS!r} token to separate documents")
    streams: dict[bool, list[int]] = {True: [], False: []}
    split: dict[bool, list[str]] = {True: [], False: []}
    texts = [read_text(f) for f in files]
    for path, encoding in zip(files, tok.encode_batch(texts)):
      side = is_held_out(path, held_out)
      streams[side] += encoding.ids + [eos]
      split[side].append(path)
    train, test = (np.asarray(streams[k], np.int32) for k in (False, True))
    if not test.size:  # a one-file corpus: hold out its tail (the file is trained on: no held-out file)
      cut = int(len(train) * (1 - held_out))
      train, test = train[:cut], train[cut:]
    return cls(train, test, split[False], split[True])

  def check_windows(self, length: int) -> None:
    """Both splits hold a window of `length` tokens (else a CorpusError naming the shortfall)."""
    for stream in (self.train, self.held_out):
      _windows(stream, np.random.default_rng(0), 1, length)

  def train_batch(self, step: int, batch: int, length: int, seed: int) -> np.ndarray:
    """int32 [batch, length] windows of the train stream, drawn from (seed, step) only."""
    return _windows(self.train, np.random.default_rng([seed, step]), batch, length)

  def held_out_batches(self, count: int, batch: int, length: int) -> list[np.ndarray]:
    """`count` fixed held-out batches (the same every call)."""
    rng = np.random.default_rng(12345)
    return [_windows(self.held_out, rng, batch, length) for _ in range(count)]


def training_record(data: TokenData, stdlib: bool) -> dict:
  """TRAINING_RECORD's contents for a model trained on `data`'s train split: the files of each split by name
  relative to "root", and the two splits' token counts. `stdlib`: `data` is default_corpus()'s, its files named
  relative to the stdlib root (`CorpusFile.relative`, what unseen_files matches). Otherwise (--data) they are
  named relative to their common directory, so that files of two --data directories keep distinct names, and
  the record says "corpus": "data" (unseen_files, which looks its names up in the stdlib, refuses it)."""
  files = data.trained_files + data.held_out_files
  if stdlib:
    root = sysconfig.get_paths()["stdlib"]
    names = {f: f.relative for f in files}
  else:
    root = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files]) if files else ""
    names = {f: os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files}
  python = platform.python_version()
  where = "the stdlib" if stdlib else "the --data files' common directory"
  what = (f"The files this model trained on (`trained`) and held out (`held_out`) as python -m jax_mtp.train split "
          f"them on Python {python}, relative to `root` ({where}); the token counts are the two splits'.")
  if not data.held_out_files:
    what += " No file is held out: the held-out tokens are the tail of the one file it trained on."
  return {"what": what, "corpus": "stdlib" if stdlib else "data", "root": root, "python": python,
          "train_tokens": int(data.train.size), "held_out_tokens": int(data.held_out.size),
          "held_out": [names[f] for f in data.held_out_files], "trained": [names[f] for f in data.trained_files]}


def _windows(stream: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
  if len(stream) <= length:
    raise CorpusError(f"the corpus split has {len(stream)} tokens, fewer than one window of {length + 1}; "
                      f"give more text or a shorter --seq-len")
  starts = rng.integers(0, len(stream) - length, batch)
  return np.stack([stream[s:s + length] for s in starts])


def print_stats(data: TokenData, tok, stream=sys.stderr) -> None:
  print(f"corpus: {len(data.train):,} train + {len(data.held_out):,} held-out tokens, vocab "
        f"{tok.get_vocab_size():,}", file=stream)
