"""`python -m jax_mtp.train`: train a small target and its MTP layer, or distil an MTP layer for a target.

    # from scratch, DeepSeek-V3's joint objective, on the Python stdlib's sources (the embedded default):
    python -m jax_mtp.train --preset demo --steps 3000 --out runs/demo --export runs/demo/model
    # an MTP layer for an existing checkpoint's frozen target, on your text:
    python -m jax_mtp.train --mode distill --checkpoint CKPT --data notes/ --steps 500 --out runs/mtp

Data: `--data` files or directories (default: the Python standard library's sources), through the
checkpoint's tokenizer.json, or a byte-level BPE trained on the data (`--vocab-size`) when training
from scratch. Batches are split over all devices (data parallel). Every `--save-every` steps the
params, optimizer state and step go to an orbax checkpoint under `--out`; run the same command again
and it resumes from the latest one, reading the batches an uninterrupted run would (the same loss
curve). A line per `--log-every` steps reports the losses, tokens/s and, every `--eval-every`, the
held-out teacher-forced draft acceptance. `--export DIR` writes a HF checkpoint (config.json,
safetensors, tokenizer.json, generation_config.json) that `python -m jax_mtp.decode --checkpoint`
runs. Joint training records the files its split trains on and holds out (training_corpus.json,
`corpus.training_record`: the default corpus by path relative to the stdlib root, --data files relative to
their common directory) under `--out` when the run starts, and the export carries it (an `--export-only`
export too), where `corpus.unseen_files` and benchmarks/spec_vs_plain.py read it; a distilled export carries
none (its target read the checkpoint's training text, which the run does not know). Every flag, path and
the data are checked before any work is done or any file is written (a rejected command leaves `--out` as it
was). Exit 0 on success, 2 on bad input with an `error: ...` line.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import jax
import numpy as np

import jax_mtp
from jax_mtp import corpus, loader, training
from jax_mtp.config import PRESETS
from jax_mtp.decode_flags import OneLineParser
from jax_mtp.sharding import make_data_mesh
from jax_mtp.model_files import write_atomically

# Flags only one --mode reads, and the defaults of those that have one (recorded in run.json whatever the mode, as
# before these were checked, so that older runs resume).
MODE_FLAGS = {"preset": "joint", "vocab_size": "joint", "mtp_weight": "joint", "fresh_mtp": "distill",
              "distill_targets": "distill"}
MODE_DEFAULTS = {"preset": "demo", "vocab_size": 4096, "mtp_weight": 0.3, "distill_targets": "logits"}
RUN_KEYS = ("mode", "preset", "checkpoint", "data", "vocab_size", "seq_len", "batch", "seed", "steps", "lr", "warmup",
            "dense_steps", "mtp_weight", "distill_targets", "fresh_mtp")  # what a resumed run must repeat
BPE_MIN_VOCAB = 257  # a byte-level BPE's 256 bytes and EOS (corpus.train_bpe): its smallest vocabulary
RUN_FILES = ("run.json", "tokenizer.json", corpus.TRAINING_RECORD, "state", "log.jsonl")  # what a run writes under --out


class _BadInput(ValueError):
  pass


class _Parser(OneLineParser):
  bad_input = _BadInput


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m jax_mtp.train", description=__doc__.splitlines()[0])
  p.add_argument("--mode", choices=training.MODES, default="joint",
                 help="joint: target + MTP layer from scratch; distill: the MTP layer for --checkpoint's target")
  p.add_argument("--preset", choices=sorted(PRESETS), help=f"joint: the architecture (default {MODE_DEFAULTS['preset']})")
  p.add_argument("--checkpoint", metavar="DIR|REPO",
                 help="distill: the checkpoint whose target teaches: a HF or orbax directory, or a Hugging Face "
                      "repo id (owner/name)")
  p.add_argument("--fresh-mtp", action="store_true", help="distill: start the MTP layer from random weights")
  p.add_argument("--data", action="append", metavar="PATH", help="text files / directories (default: Python stdlib)")
  p.add_argument("--vocab-size", type=int,
                 help=f"joint: the BPE vocabulary trained from scratch (default {MODE_DEFAULTS['vocab_size']})")
  p.add_argument("--steps", type=int, default=3000)
  p.add_argument("--batch", type=int, default=64, help="sequences per step (all devices together)")
  p.add_argument("--seq-len", type=int, default=256)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--warmup", type=int, default=100)
  p.add_argument("--dense-steps", type=int, default=-1,
                 help="DSA warm-up steps with every slot kept (default: a quarter of --steps)")
  p.add_argument("--mtp-weight", type=float, help=f"joint: λ of the MTP loss (default {MODE_DEFAULTS['mtp_weight']})")
  p.add_argument("--distill-targets", choices=training.DISTILL_TARGETS,
                 help=f"distill: the teacher's soft logits or its greedy tokens (default {MODE_DEFAULTS['distill_targets']})")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True, metavar="DIR", help="run directory: orbax checkpoints, tokenizer, log")
  p.add_argument("--save-every", type=int, default=500)
  p.add_argument("--log-every", type=int, default=50)
  p.add_argument("--eval-every", type=int, default=250)
  p.add_argument("--eval-batches", type=int, default=4)
  p.add_argument("--export", metavar="DIR", help="write a HF checkpoint here at the end")
  p.add_argument("--stop-after", type=int, metavar="STEP",
                 help="stop (saved) after this step, the schedule still that of --steps (a run cut short, reproducibly)")
  p.add_argument("--export-only", action="store_true",
                 help="export the run's latest checkpoint without training (an interrupted run, say)")
  p.add_argument("--export-dtype", choices=("float32", "bfloat16"), default="float32")
  return p


def _validate(args: argparse.Namespace) -> None:
  for flag, mode in MODE_FLAGS.items():  # given to the other mode, it would be ignored
    if getattr(args, flag) not in (None, False) and args.mode != mode:
      raise _BadInput(f"--{flag.replace('_', '-')} is read by --mode {mode} only; this run is --mode {args.mode}")
  for flag, default in MODE_DEFAULTS.items():
    if getattr(args, flag) is None:
      setattr(args, flag, default)
  if not 0 <= args.seed < 2**63:  # it seeds jax.random.key (64 bits) and numpy's generator (non-negative)
    raise _BadInput(f"--seed={args.seed} must be in [0, 2^63 - 1]")
  for flag in ("steps", "batch", "seq_len", "save_every", "log_every", "eval_every", "eval_batches"):
    if getattr(args, flag) < 1:
      raise _BadInput(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be ≥ 1")
  if args.seq_len < 3:
    raise _BadInput(f"--seq-len={args.seq_len} must be ≥ 3 (the MTP loss predicts two tokens ahead)")
  if args.batch % jax.device_count():
    raise _BadInput(f"--batch={args.batch} must be a multiple of the {jax.device_count()} devices (data parallel)")
  if (args.mode == "distill") != (args.checkpoint is not None):
    raise _BadInput("--mode distill needs --checkpoint (the target), and only distill takes one")
  if args.stop_after is not None and not 1 <= args.stop_after <= args.steps:
    raise _BadInput(f"--stop-after={args.stop_after} must be in [1, --steps={args.steps}]")
  if not (math.isfinite(args.lr) and args.lr > 0):
    raise _BadInput(f"--lr={args.lr} must be a finite number > 0")
  if not (math.isfinite(args.mtp_weight) and args.mtp_weight >= 0):
    raise _BadInput(f"--mtp-weight={args.mtp_weight} must be a finite number ≥ 0")
  if args.warmup < 0:
    raise _BadInput(f"--warmup={args.warmup} must be ≥ 0 steps")
  if args.dense_steps < -1 or args.dense_steps > args.steps:
    raise _BadInput(f"--dense-steps={args.dense_steps} must be in [0, --steps={args.steps}] (or -1: a quarter)")
  if args.checkpoint is None and args.vocab_size < BPE_MIN_VOCAB:
    raise _BadInput(f"--vocab-size={args.vocab_size} must be ≥ {BPE_MIN_VOCAB} (a byte-level BPE holds the 256 "
                    f"bytes and EOS before any merge)")
  if args.dense_steps == -1:
    args.dense_steps = args.steps // 4


def _check_paths(args: argparse.Namespace) -> None:
  """--out, --export and --checkpoint, before anything is read or written: each can be used as the run
  will use it (the data's paths are corpus.corpus_files')."""
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise _BadInput(f"--out {args.out!r} is a file, not a directory")
  _check_creatable("--out", args.out)
  if args.export_only and not os.path.isfile(os.path.join(args.out, "run.json")):
    raise _BadInput(f"--export-only: --out {args.out!r} holds no run to export")
  if args.export:
    _check_export(args.export, args.out)
  if args.checkpoint is not None:
    source = loader.locate(args.checkpoint)  # a HF or orbax directory, or a Hugging Face repo id
    loader.checkpoint_config(source)  # whose config reads
    if not os.path.isfile(os.path.join(source.directory, "tokenizer.json")):
      raise _BadInput(f"--checkpoint {args.checkpoint!r} has no tokenizer.json to read --data with")


def _check_export(export: str, out: str) -> None:
  """--export names a new directory that the run's own files will not take (it may lie under --out)."""
  if os.path.exists(export):
    raise _BadInput(f"--export {export!r} exists; give a new directory")
  full, run = os.path.abspath(export), os.path.abspath(out)
  if os.path.commonpath([full, run]) == full:
    raise _BadInput(f"--export {export!r} would hold --out {out!r}; give a directory outside it")
  if os.path.commonpath([full, run]) == run and os.path.relpath(full, run).split(os.sep)[0] in RUN_FILES:
    raise _BadInput(f"--export {export!r} is where the run keeps its own files ({', '.join(RUN_FILES)} under --out)")
  _check_creatable("--export", export)


def _check_creatable(flag: str, path: str) -> None:
  """`path` exists as a writable directory, or its nearest existing ancestor is one (it can be created)."""
  ancestor = os.path.abspath(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise _BadInput(f"{flag} {path!r} cannot be created: {ancestor!r} is a file, not a directory")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise _BadInput(f"{flag} {path!r} cannot be written: {ancestor!r} is not writable")


def _model(args: argparse.Namespace, tok_vocab: int):
  """(cfg, params {"target", "mtp"}) to start from: a preset at random, or the checkpoint's."""
  if args.checkpoint is None:
    cfg = PRESETS[args.preset](vocab_size=tok_vocab)
    key = jax.random.key(args.seed)
    return cfg, training.split_params(jax_mtp.init_target_params(cfg, jax.random.fold_in(key, 0)),
                                      jax_mtp.init_params(cfg, jax.random.fold_in(key, 1)))
  cfg = loader.checkpoint_config(args.checkpoint).replace(dtype="float32", param_dtype="float32")
  _, target, mtp, _ = loader.load(args.checkpoint, cfg=cfg, weights="bf16")  # FP8 weights dequantised, to fp32
  if args.fresh_mtp:
    mtp = jax_mtp.init_params(cfg, jax.random.key(args.seed))
  return cfg, training.split_params(target, mtp)


def _tokenizer(args: argparse.Namespace, files: list[str]):
  """The checkpoint's tokenizer.json, the run's saved one (resume), or a new BPE (_start_run saves it)."""
  import tokenizers  # noqa: PLC0415
  saved = os.path.join(args.out, "tokenizer.json")
  source = os.path.join(loader.locate(args.checkpoint).directory, "tokenizer.json") if args.checkpoint else saved
  if os.path.isfile(source):
    return tokenizers.Tokenizer.from_file(source)
  return corpus.train_bpe(files, args.vocab_size)


def _identity(args: argparse.Namespace) -> dict:
  """What identifies a run (run.json): its flags, and --data as absolute paths (None: the default corpus)."""
  run = {k: getattr(args, k) for k in RUN_KEYS}
  run["data"] = None if args.data is None else [os.path.abspath(p) for p in args.data]
  return run


def _check_same_run(args: argparse.Namespace, run: dict) -> None:
  """A run directory remembers its identity; resuming with a different one would mix two runs. A key
  that the run's run.json lacks (written before the key was recorded) is not compared."""
  path = os.path.join(args.out, "run.json")
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      try:
        saved = json.load(f)
      except json.JSONDecodeError as e:
        raise _BadInput(f"{path!r} is not JSON ({e}); it records the run's flags: fix it or give a new --out"
                        ) from None
    if not isinstance(saved, dict):
      raise _BadInput(f"{path!r} holds {type(saved).__name__}, not the run's flags: fix it or give a new --out")
    diff = [f"--{k.replace('_', '-')}={run[k]!r} (the run has {saved[k]!r})" for k in RUN_KEYS
            if k in saved and saved[k] != run[k]]
    if diff:
      raise _BadInput(f"--out {args.out!r} holds another run: {', '.join(diff)}; give a new --out")


def _start_run(args: argparse.Namespace, run: dict, tok, data: corpus.TokenData) -> None:
  """The run's first files, once every check has passed: run.json, the tokenizer it trained and, training a
  target (joint), the record of the files it trains on and holds out."""
  os.makedirs(args.out, exist_ok=True)
  if not os.path.isfile(os.path.join(args.out, "run.json")):
    write_atomically(os.path.join(args.out, "run.json"), json.dumps(run, indent=2) + "\n")
  if args.checkpoint is None and not os.path.isfile(os.path.join(args.out, "tokenizer.json")):
    write_atomically(os.path.join(args.out, "tokenizer.json"), tok.to_str())
  if args.mode == "joint" and not os.path.isfile(os.path.join(args.out, corpus.TRAINING_RECORD)):
    record = corpus.training_record(data, stdlib=args.data is None)
    write_atomically(os.path.join(args.out, corpus.TRAINING_RECORD), json.dumps(record, indent=1) + "\n")


def _export(args: argparse.Namespace, cfg, params: dict, tok) -> None:
  """The HF checkpoint, with the run's training record beside it (joint: the target trained here)."""
  from jax_mtp.export import save_hf_checkpoint  # noqa: PLC0415
  extra = {}
  if args.mode == "joint":
    with open(os.path.join(args.out, corpus.TRAINING_RECORD), encoding="utf-8") as f:
      extra[corpus.TRAINING_RECORD] = f.read()
  save_hf_checkpoint(args.export, cfg, params["target"], training.mtp_with_shared(params), tokenizer=tok,
                     eos_ids=(tok.token_to_id(corpus.EOS),), storage_dtype=args.export_dtype, extra_files=extra)
  print(f"exported {args.export}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
  try:
    args = _parser().parse_args(argv)
    _validate(args)
    _check_paths(args)
    run = _identity(args)
    _check_same_run(args, run)
    files = corpus.default_corpus() if args.data is None else corpus.corpus_files(args.data)
    tok = _tokenizer(args, files)
    data = corpus.TokenData.build(files, tok)
    data.check_windows(args.seq_len)
    cfg, params = _model(args, tok.get_vocab_size())
    _start_run(args, run, tok, data)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # an unwritable --out, an unreadable --data file: its path and why
    print(f"error: cannot use {e.filename or 'a file'!r}: {e.strerror or e}", file=sys.stderr)
    return 2
  corpus.print_stats(data, tok)
  try:
    params = _run(args, cfg, params, data)
  except _BadInput as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.export:
    _export(args, cfg, params, tok)
  return 0


def _run(args: argparse.Namespace, cfg, params: dict, data: corpus.TokenData) -> dict:
  """The training loop: resume, steps, logs, evals, saves. Returns the final params."""
  from jax_mtp.train_state import DamagedState, StateCheckpoints  # noqa: PLC0415
  mesh = make_data_mesh()
  opt, steps, evaluate = _compiled(cfg, args.mode, args.mtp_weight, args.distill_targets, args.lr, args.steps,
                                   args.warmup, args.seq_len, mesh)
  opt_state = opt.init(training.trainable(training.Objective(args.mode), params))
  saves = StateCheckpoints(os.path.join(args.out, "state"))
  try:
    start, params, opt_state = saves.restore_latest(params, opt_state)
  except DamagedState as e:
    raise _BadInput(str(e)) from e
  if args.export_only:
    if not start:
      raise _BadInput(f"--export-only: {args.out!r} holds no checkpoint to export")
    print(f"exporting step {start}", file=sys.stderr)
    return params
  if start:
    print(f"resuming from step {start}", file=sys.stderr)
  held_out = data.held_out_batches(args.eval_batches, args.batch, args.seq_len)
  log = open(os.path.join(args.out, "log.jsonl"), "a", encoding="utf-8")
  def held_out_scores(step: int) -> dict:
    scores = [training.scalars(evaluate(params, b)) for b in held_out]
    return {"step": step} | {f"held_out_{k}": float(np.mean([s[k] for s in scores])) for k in scores[0]}

  if start == 0:  # the untrained baseline
    _report(held_out_scores(0), args.steps, log)
  t0, tokens_since = time.perf_counter(), 0
  for step in range(start, min(args.steps, args.stop_after or args.steps)):
    batch = data.train_batch(step, args.batch, args.seq_len, args.seed)
    params, opt_state, metrics = steps[step < args.dense_steps](params, opt_state, batch)
    tokens_since += batch.size
    done = step + 1
    record = None
    if done % args.log_every == 0 or done == args.steps:
      record = {"step": done, **training.scalars(metrics)}
      record["tokens_per_s"] = tokens_since / (time.perf_counter() - t0)
      t0, tokens_since = time.perf_counter(), 0
    if done % args.eval_every == 0 or done in (args.steps, args.stop_after):
      record = (record or {}) | held_out_scores(done)
    if record is not None:
      _report(record, args.steps, log)
    if done % args.save_every == 0 or done in (args.steps, args.stop_after):
      saves.save(done, params, opt_state)
  log.close()
  return params


@functools.cache
def _compiled(cfg, mode: str, mtp_weight: float, distill_targets: str, lr: float, steps: int, warmup: int, length: int,
              mesh):
  """(optimizer, {dense?: train step}, eval) for a run's settings; cached, so a run resumed in the same
  process (a notebook, the tests) reuses the compiled programs."""
  opt = training.optimizer(lr, steps, warmup)
  step_fns = {dense: training.make_train_step(cfg, training.Objective(mode, mtp_weight, distill_targets=distill_targets,
                                                                      dense=dense), opt, length, mesh)
              for dense in (True, False)}
  return opt, step_fns, training.make_eval(cfg, length, mesh)


def _report(record: dict, total: int, log) -> None:
  log.write(json.dumps(record) + "\n")
  log.flush()
  filled = 20 * record["step"] // max(total, 1)
  parts = [f"[{'#' * filled}{'.' * (20 - filled)}] step {record['step']}/{total}"]
  if "loss" in record:
    parts.append(f"loss {record['loss']:.3f} (lm {record['lm_loss']:.3f}, mtp {record['mtp_loss']:.3f}, "
                 f"indexer {record['indexer_kl']:.3f}) · {record['tokens_per_s']:,.0f} tokens/s")
  if "held_out_acceptance" in record:
    parts.append(f"held-out lm {record['held_out_lm_loss']:.3f} · draft acceptance {record['held_out_acceptance']:.3f}")
  print(" · ".join(parts), file=sys.stderr, flush=True)


if __name__ == "__main__":
  sys.exit(main())
