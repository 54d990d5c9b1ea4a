"""`python -m jax_mtp.convert --checkpoint SRC --out DIR`: a checkpoint converted to an orbax checkpoint, once.

    python -m jax_mtp.convert --checkpoint deepseek-ai/DeepSeek-V3.2-Exp --out /ckpt/v32 --tp 8
    python -m jax_mtp.decode --checkpoint /ckpt/v32 --tp 8 --prompt "..."

SRC is anything `--checkpoint` takes (a HF directory, a Hugging Face repo id, an orbax directory). Its weights are
placed on a `--tp` mesh of this process's devices by `jax_mtp.loader` (each device reads its slices; no host holds a
whole sharded tensor) and written by `jax_mtp.orbax_io.save_params` as step 0 of DIR, with the tokenizer, chat
template and generation settings (the EOS ids) beside it (`jax_mtp.model_files`). The orbax copy restores straight
onto any tp's mesh, and decodes the tokens the source decodes.

`--weights`: as `decode`'s. `auto` keeps stored FP8 weights FP8 (codes + block scales) where the mesh splits whole
blocks; tp = 1 (the default) splits none, so every FP8 weight stays FP8. `bf16` writes them dequantised.

Every check that reads no weight runs first, DIR's included: a DIR that already holds step 0, or holds files that
are not an orbax checkpoint's, is refused before the weights are read. Exit 0 with one line on stdout saying what
was written; 2 on bad input or a failed read or write (one `error: ...` line on stderr; no step is left half
written: orbax renames a complete step into place); 130 when interrupted.

Several hosts: one process per host with the same flags, as `decode` runs (jax_mtp.distributed: the process flags,
or a SLURM / TPU pod launcher's). The mesh then spans every process's devices (`--tp` defaults to all of them), each
process reads and writes its own devices' shards (orbax's multi-process save), and process 0 writes the model files
and prints the line. DIR must be one directory every process sees (a shared filesystem; cloud storage paths such as
gs:// are not taken).
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from jax_mtp import compile_cache, distributed, fp8, loader
from jax_mtp.decode import jax_settings
from jax_mtp.decode_flags import BadInput, OneLineParser
from jax_mtp.errors import first_line
from jax_mtp.orbax_io import check_destination, save_params
from jax_mtp.sharding import SHARED_WITH_TARGET, make_mesh, validate_tp
from jax_mtp.tokenizer import eos_token_ids


def parser() -> argparse.ArgumentParser:
  p = OneLineParser(prog="python -m jax_mtp.convert", formatter_class=argparse.RawDescriptionHelpFormatter,
                    description="Writes a checkpoint (a HF directory, a Hugging Face repo id, an orbax directory) as "
                                "an orbax checkpoint,\nwith its tokenizer, chat template and generation settings "
                                "beside it, for decode to restore onto any tp.",
                    epilog="example:\n  python -m jax_mtp.convert --checkpoint deepseek-ai/DeepSeek-V3.2-Exp --out "
                           "/ckpt/v32 --tp 8\n  python -m jax_mtp.decode --checkpoint /ckpt/v32 --tp 8 --prompt "
                           "'def f(x):'")
  p.add_argument("--checkpoint", required=True, metavar="DIR|REPO",
                 help="the checkpoint to convert: a HF directory (config.json + *.safetensors), a Hugging Face repo "
                      "id (owner/name) or a jax_mtp orbax directory")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="the orbax checkpoint to write (step 0): a new or empty directory")
  p.add_argument("--tp", type=int, default=None,
                 help="devices the weights are placed on while converting (default 1; with several processes all of "
                      "them); the copy restores at any tp")
  p.add_argument("--weights", choices=loader.WEIGHTS, default="auto",
                 help="fp8: keep stored FP8 weights FP8 (an error if none are stored); bf16: write them dequantised "
                      "(to the checkpoint's dtype); auto (default): FP8 where --tp splits whole blocks")
  distributed.add_arguments(p)
  return p


def main(argv: list[str] | None = None) -> int:
  """Parse, check, load, save: exit 0, 2 on bad input or a failed read or write, 130 when interrupted."""
  try:
    return _main(argv)
  except KeyboardInterrupt:
    print("\nerror: interrupted (no step was left half written)", file=sys.stderr)
    return 130


def _main(argv: list[str] | None) -> int:
  try:
    args = parser().parse_args(argv)
    _start(args)
    out = check_destination(args.out)  # before any weight is read
    source = loader.locate(args.checkpoint)
    cfg = loader.checkpoint_config(source)
    eos_token_ids(source.directory)  # a malformed eos_token_id, named before the weights are read
    tp = _tp(args.tp)
    validate_tp(cfg, tp)
    flags = {name: value for name, value in vars(args).items() if name != "process_id"}  # differs by design
    distributed.check_agreement({"flags": flags, "checkpoint": distributed.checkpoint_listing(source.directory),
                                 "out": out})
    mesh = make_mesh(tp, devices=distributed.replica_devices(tp))
    loaded = loader.load(source, cfg=cfg, mesh=mesh, weights=args.weights)
    primary = distributed.is_primary()
    for line in loaded.dequantised if primary else ():
      print(f"note: dequantised (the mesh splits its blocks): {line}", file=sys.stderr)
    beside = save_params(out, loaded.cfg, loaded.target, loaded.mtp,
                         model_files_from=source.directory if primary else None)  # one writer
  except ValueError as e:  # bad flags, a bad checkpoint, a destination in the way (CheckpointError)
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a file that cannot be read or written: its path and why
    print(f"error: {e.filename or 'a checkpoint file'!r}: {e.strerror or e}", file=sys.stderr)
    return 2
  except jax.errors.JaxRuntimeError as e:  # placing the weights (device memory exhausted): XLA's first line
    print(f"error: {first_line(e)}", file=sys.stderr)
    return 2
  if primary:
    print(summary(out, loaded, beside))
  return 0


def _start(args: argparse.Namespace) -> None:
  """Several processes' start (as `decode`'s: the process flags checked, gloo on CPU, this process's share of the
  --tp CPU devices), before JAX touches a device."""
  distributed.validate(args)
  settings = jax_settings(argparse.Namespace(**{**vars(args), "tp": args.tp or 1}))
  for name, value in settings.items():
    try:
      jax.config.update(name, value)
    except RuntimeError:  # JAX already running (tests): keep the devices it has
      pass
  distributed.initialize(args)
  note = compile_cache.off_for_several_cpu_processes()  # JAX's own cache, where set: hangs there (compile_cache)
  if note and distributed.is_primary():
    print(note, file=sys.stderr)


def _tp(tp: int | None) -> int:
  """--tp as the mesh's size: default 1, or every device with several processes, whose mesh must span them all
  (each process writes its own devices' shards)."""
  if tp is not None and tp < 1:  # first: the layouts divide by it
    raise BadInput(f"--tp={tp} must be ≥ 1")
  if jax.process_count() == 1:
    return 1 if tp is None else tp
  if tp not in (None, jax.device_count()):
    raise BadInput(f"--tp={tp}: with {jax.process_count()} processes a conversion's mesh spans all "
                   f"{jax.device_count()} devices (leave --tp out)")
  return jax.device_count()


def summary(out: str, loaded: loader.Loaded, beside: tuple[str, ...]) -> str:
  """The line saying what was written: the step's arrays and bytes, the FP8 weights kept, the files beside it."""
  trees = {"target": loaded.target,
           "mtp": {k: v for k, v in loaded.mtp.items() if k not in SHARED_WITH_TARGET}}  # one copy of the shared
  leaves = jax.tree_util.tree_leaves(trees)
  gigabytes = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in leaves) / 1e9
  files = ", ".join(beside) if beside else "no tokenizer or generation settings (none beside the source's weights)"
  return (f"wrote {out} step 0: {len(leaves)} arrays, {gigabytes:.2f} GB, {len(fp8.fp8_paths(trees))} FP8 weights "
          f"kept as codes + block scales; beside it: {files}")


if __name__ == "__main__":
  sys.exit(main())
