"""`python -m jax_mtp.decode`: speculative decoding with MTP drafts, end to end.

With no arguments it runs the embedded default — a 7M-parameter DeepSeek-V3.2-architecture target
(MLA, DSA indexer, MoE) and its MTP layer, trained on the Python standard library's sources
(`jax_mtp/default_model/`, README "The embedded default") — on a code prompt, streaming the text as
rounds commit, then the speculative-decoding metrics. `--prompt TEXT` gives your own prompt.
`--checkpoint DIR` runs a real model instead: a HF checkpoint directory (config.json + safetensors,
FP8 or not; jax_mtp.checkpoint; `--weights` keeps FP8 weights FP8 on the device, jax_mtp.fp8) or an
orbax directory written by `jax_mtp.orbax_io.save_params`,
placed straight onto the `--tp` mesh; `--prompt` is encoded by its `tokenizer.json`
(jax_mtp.tokenizer). `--random-tiny` runs a tiny model with random weights instead (token ids only;
any tp up to 8). Rows stop at the model's EOS ids unless `--ignore-eos`. `--check` also decodes with
the target alone and reports whether the outputs match token for token (they must: speculative
decoding never changes greedy output). Exit 0 on success, 2 on bad input (a bad checkpoint
included) with an `error: ...` message on stderr and nothing on stdout, 1 when a row stopped because
the target's logits became non-finite (its tokens up to there are printed, JSON `finish_reasons`
"error" and `errors`; one `error: prompt i: ...` line on stderr per such row; the others go on).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import NamedTuple

import jax

import jax_mtp
from jax_mtp import distributed
from jax_mtp.config import DTYPES, INDEX_SCORES_IMPLS, MOE_IMPLS, from_hf_config
from jax_mtp.generate import TargetDecoder
from jax_mtp.kernels.fused_allreduce_rmsnorm import IMPLS, gpu_kernels
from jax_mtp.model import init_target_params
from jax_mtp.request import (check_caches_fit, required_capacity, stop_id_array, validate_prompts,
                             validate_temperature)
from jax_mtp.sharding import make_mesh, validate_tp
from jax_mtp.speculative import SpecParams, SpecResult, Speculator
from jax_mtp.tokenizer import TextCodec, eos_token_ids

DEFAULT_PROMPT = "1,2,3,4,5,6,7,8"  # token ids, for --random-tiny and checkpoints
DEFAULT_TEXT = "def fibonacci(n):\n"  # the embedded default's prompt
DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model")
WEIGHT_SEED = 0  # --random-tiny's weights; --seed only drives sampling


class _BadInput(ValueError):
  """Bad command-line input: exit 2 with this one-line message."""


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line instead of argparse's usage block
    raise _BadInput(message)


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m jax_mtp.decode", description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", metavar="DIR",
                 help="HF checkpoint directory (config.json + *.safetensors) or a jax_mtp orbax directory")
  p.add_argument("--random-tiny", action="store_true",
                 help="a tiny DeepSeek-V3.2-shaped model with random weights instead of the embedded default")
  p.add_argument("--prompt", action="append", metavar="TEXT",
                 help=f"text prompt, encoded with the model's tokenizer.json; repeat for a batch (default, for "
                      f"the embedded model: {DEFAULT_TEXT!r})")
  p.add_argument("--prompt-ids", action="append", metavar="IDS",
                 help=f"comma-separated token ids; repeat for a batch (default with --random-tiny or a "
                      f"checkpoint: {DEFAULT_PROMPT})")
  p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
  p.add_argument("--num-speculative-tokens", type=int, default=3, help="draft tokens k per round, ≥ 1 (default 3)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 = rejection sampling")
  p.add_argument("--seed", type=int, default=0, help="sampling seed (the weights' seed is fixed)")
  p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices (default 1)")
  p.add_argument("--impl", choices=IMPLS, default=IMPLS[0], help="fused all-reduce + RMSNorm implementation")
  p.add_argument("--dtype", choices=("auto",) + DTYPES, default="auto",
                 help="compute and parameter dtype; auto (default): the checkpoint's torch_dtype, as vLLM")
  p.add_argument("--weights", choices=("auto", "fp8", "bf16"), default="auto",
                 help="FP8 checkpoints (HF or orbax): fp8 keeps the weights as stored (codes + block scales, "
                      "dequantised inside each matmul's program), bf16 dequantises them on load (to --dtype's); "
                      "auto (default): as the checkpoint stores them, FP8 where --tp splits whole blocks (else "
                      "dequantised, with a note)")
  p.add_argument("--moe-impl", choices=MOE_IMPLS, default="auto",
                 help="routed experts' implementation (jax_mtp.experts); auto: by platform and size")
  p.add_argument("--index-scores-impl", choices=INDEX_SCORES_IMPLS, default="auto",
                 help="DSA indexer scores: xla, or the fused Pallas kernel (pallas_gpu / pallas_tpu); auto: "
                      "the kernel on GPUs where it takes the model, else xla")
  p.add_argument("--prefill-chunk", type=int, default=0, metavar="TOKENS",
                 help="prompt tokens per row per prefill call; 0 (default): sized to 1 GiB of attention buffers")
  p.add_argument("--ignore-eos", action="store_true",
                 help="do not stop a row at the checkpoint's EOS ids (benchmarks, as vLLM's flag)")
  p.add_argument("--check", action="store_true", help="also decode with the target alone and compare")
  p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
  distributed.add_arguments(p)
  p.set_defaults(codec=None, model_dir=None, streamed=False)  # set by main and run
  return p


def _parse_ids(text: str) -> list[int]:
  try:
    return [int(tok) for tok in text.split(",") if tok.strip()]
  except ValueError:
    raise _BadInput(f"--prompt-ids {text!r} is not a comma-separated list of integers") from None


def _validate(args: argparse.Namespace, cfg: jax_mtp.MtpConfig) -> list[list[int]]:
  """Every check that needs no compute; returns the prompts."""
  for flag in ("max_new_tokens", "num_speculative_tokens", "tp"):
    if getattr(args, flag) < 1:
      raise _BadInput(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be ≥ 1")
  try:
    validate_temperature(args.temperature)
  except ValueError as e:  # "temperature=… must …", said of the flag
    raise _BadInput(f"--{e}") from None
  if args.check and args.temperature > 0:
    raise _BadInput(f"--check compares greedy outputs token for token; it needs --temperature 0, "
                    f"got {args.temperature}")
  prompts = _prompts(args)
  validate_prompts(cfg, prompts)
  capacity = required_capacity(cfg, prompts, args.max_new_tokens, args.num_speculative_tokens)
  validate_tp(cfg, args.tp)  # the devices themselves: `_ensure_devices`, before the config was read
  check_caches_fit(cfg, len(prompts), capacity, jax.devices())  # before any weight is read
  _check_impl(args.impl)
  _check_index_scores_impl(cfg, capacity)
  return prompts


def _check_index_scores_impl(cfg: jax_mtp.MtpConfig, capacity: int) -> None:
  """An explicit fused index-scores kernel must suit the model, the cache and this machine."""
  from jax_mtp.indexer import resolve_index_scores_impl, selects_all  # noqa: PLC0415
  if cfg.index_scores_impl in ("auto", "xla") or selects_all(cfg, capacity):
    return
  platform = jax.default_backend()
  if cfg.index_scores_impl != f"pallas_{platform}":
    raise _BadInput(f"--index-scores-impl={cfg.index_scores_impl} runs on {cfg.index_scores_impl.removeprefix('pallas_')}; this "
                    f"machine's JAX platform is {platform}")
  resolve_index_scores_impl(cfg, platform, capacity)


def _prompts(args: argparse.Namespace) -> list[list[int]]:
  """Token ids from --prompt-ids, or from --prompt through the model's tokenizer (the embedded
  default's prompt is DEFAULT_TEXT)."""
  if args.prompt is not None and args.prompt_ids is not None:
    raise _BadInput("give --prompt or --prompt-ids, not both")
  if args.prompt is None and (args.prompt_ids is not None or args.checkpoint is not None or args.random_tiny):
    return [_parse_ids(text) for text in (args.prompt_ids or [DEFAULT_PROMPT])]
  if args.model_dir is None:
    raise _BadInput("--prompt needs a tokenizer, and --random-tiny has none; use --prompt-ids")
  args.prompt = args.prompt or [DEFAULT_TEXT]
  args.codec = TextCodec(args.model_dir)
  return [args.codec.encode(text) for text in args.prompt]


def _ensure_devices(tp: int, processes: int) -> None:
  """On CPU, ask for this process's share of `tp` host devices if JAX has not started yet and the user
  set no count (JAX_NUM_CPU_DEVICES); then check there are enough. Several processes: tp spans whole
  processes, and more devices than tp form data-parallel replicas (jax_mtp.distributed)."""
  if tp > 1 and tp % processes == 0 and jax.config.jax_num_cpu_devices < 0:
    try:
      jax.config.update("jax_num_cpu_devices", tp // processes)
    except RuntimeError:  # JAX already running: keep the devices it has
      pass
  if tp > len(jax.devices()):
    raise _BadInput(f"--tp={tp} needs {tp} devices, {len(jax.devices())} available")
  distributed.replica_devices(tp)  # several processes: tp spans whole processes (ValueError naming the numbers)


def _mesh(tp: int):
  """The tp mesh this process decodes on: the first tp devices, or with several processes its replica's."""
  return make_mesh(tp, devices=distributed.replica_devices(tp))


def _check_impl(impl: str) -> None:
  """A Pallas kernel runs on its own platform only; say so instead of failing inside the compiler."""
  platform = jax.devices()[0].platform
  needed = {"pallas_tpu": "tpu", "pallas_gpu": "gpu"}.get(impl)
  if needed is not None and platform != needed:
    raise _BadInput(f"--impl={impl} needs {needed.upper()} devices, found {platform}")
  if impl == "pallas_gpu":
    try:
      gpu_kernels()  # the kernels' JAX internals, imported only for this impl
    except ImportError as e:
      raise _BadInput(f"--impl=pallas_gpu: {e}") from None


class Progress:
  """A one-line progress bar on `stream`, shown only on a terminal (or with `force`), at most 10 Hz."""

  def __init__(self, stream=None, force: bool = False, enabled: bool = True):
    stream = sys.stderr if stream is None else stream  # looked up per call: sys.stderr may be swapped
    self.stream, self.enabled = stream, enabled and (force or stream.isatty())
    self.shown, self.last = False, 0.0

  def __call__(self, done: int, total: int) -> None:
    now = time.monotonic()
    if not self.enabled or (now - self.last < 0.1 and done < total):
      return
    self.last, self.shown = now, True
    filled = 30 * done // max(total, 1)
    self.stream.write(f"\rdecoding [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} tokens")
    self.stream.flush()

  def close(self) -> None:
    if self.shown:
      self.stream.write("\n")
      self.stream.flush()


# The embedded model, its speculators and plain decoders are built once per process (and per
# setting), so repeated `main` calls — tests, a notebook — reuse the compiled functions.


@functools.cache
def _embedded_weights(cfg: jax_mtp.MtpConfig, random_tiny: bool) -> tuple[dict, dict]:
  """(target, MTP) params of the embedded model: the trained default's, or --random-tiny's."""
  if random_tiny:
    return (init_target_params(cfg, jax.random.key(WEIGHT_SEED)),
            jax_mtp.init_params(cfg, jax.random.key(WEIGHT_SEED + 1)))
  from jax_mtp.checkpoint import load_hf_checkpoint  # noqa: PLC0415 (see below)
  _, target, mtp = load_hf_checkpoint(DEFAULT_MODEL, cfg=cfg, progress=False)
  return target, mtp


@functools.cache
def _speculator(cfg: jax_mtp.MtpConfig, tp: int, k: int, impl: str, random_tiny: bool):
  spec = Speculator(cfg, _mesh(tp), k, norm_impl=impl)
  return spec, spec.shard(*_embedded_weights(cfg, random_tiny))


@functools.cache
def _plain_decoder(cfg: jax_mtp.MtpConfig, tp: int, impl: str, random_tiny: bool):
  decoder = TargetDecoder(cfg, _mesh(tp), norm_impl=impl)
  return decoder, decoder.shard(_embedded_weights(cfg, random_tiny)[0])


class Loaded(NamedTuple):
  """A checkpoint's params, placed on the `--tp` mesh (vocab padded, as `shard_params` leaves them)."""

  target: dict
  mtp: dict


# The checkpoint modules are imported where used: the embedded model runs without safetensors, orbax
# and tqdm installed (the lent GPU machines' images lack them and cannot install them).


def checkpoint_config(directory: str) -> jax_mtp.MtpConfig:
  """The config of a HF or orbax checkpoint directory (read before any weight)."""
  from jax_mtp.orbax_io import is_orbax_checkpoint, read_config  # noqa: PLC0415 (see above)
  if is_orbax_checkpoint(directory):
    return read_config(directory)
  if os.path.isfile(os.path.join(directory, "config.json")):
    return from_hf_config(directory)
  raise _BadInput(f"--checkpoint {directory!r} is neither a HF checkpoint directory (config.json + "
                  f"*.safetensors) nor an orbax checkpoint written by jax_mtp.orbax_io.save_params")


def with_flags(cfg: jax_mtp.MtpConfig, args: argparse.Namespace) -> jax_mtp.MtpConfig:
  """The model's config with what --dtype (auto: the config's own), --moe-impl, --index-scores-impl and
  --prefill-chunk set."""
  if args.dtype != "auto":
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
  return cfg.replace(moe_impl=args.moe_impl, index_scores_impl=args.index_scores_impl,
                     prefill_chunk=args.prefill_chunk)


def stop_ids_for(args: argparse.Namespace, cfg: jax_mtp.MtpConfig) -> tuple[int, ...]:
  """The ids a row stops at: the model's EOS ids (generation_config.json, else config.json), none
  with --ignore-eos or --random-tiny (random weights, no EOS)."""
  if args.ignore_eos or args.model_dir is None:
    return ()
  ids = eos_token_ids(args.model_dir)
  stop_id_array(cfg, ids)  # each must be a vocabulary id
  return ids


def load(args: argparse.Namespace, cfg: jax_mtp.MtpConfig) -> tuple[jax_mtp.MtpConfig, Loaded]:
  """The checkpoint's weights on the --tp mesh, and the config they run with (FP8 weights kept on the
  device carry their block size in it)."""
  from jax_mtp import fp8  # noqa: PLC0415
  from jax_mtp.checkpoint import fp8_split_problems, load_hf_checkpoint, quantization  # noqa: PLC0415
  from jax_mtp.orbax_io import is_orbax_checkpoint, restore_params  # noqa: PLC0415
  mesh = _mesh(args.tp)
  if is_orbax_checkpoint(args.checkpoint):
    saved, target, mtp = restore_params(args.checkpoint, cfg, mesh)  # as saved: FP8 weights stay FP8
    cfg = cfg.replace(fp8_block=saved.fp8_block)
    stored_fp8 = bool(fp8.fp8_paths(target) or fp8.fp8_paths(mtp))
    if args.weights == "fp8" and not stored_fp8:
      raise _BadInput(f"--weights fp8: the orbax checkpoint {args.checkpoint!r} stores no FP8 weights")
    if args.weights == "bf16" and stored_fp8:
      target, mtp = (fp8.dequantize_params(tree, cfg.param_dtype, cfg.fp8_block) for tree in (target, mtp))
      mtp.update({name: target[name] for name in ("embed_tokens", "lm_head")})  # one shared copy
  else:
    fp8_weights = args.weights == "fp8"
    if args.weights == "auto" and quantization(args.checkpoint):  # FP8 stored: kept, where tp splits its blocks
      problems = fp8_split_problems(args.checkpoint, mesh)
      fp8_weights = not problems
      if problems:
        print(f"note: FP8 weights dequantised on load: at tp={args.tp} {len(problems)} tensor(s) split inside "
              f"their blocks (e.g. {problems[0]}); --weights bf16 says so explicitly", file=sys.stderr)
    cfg, target, mtp = load_hf_checkpoint(args.checkpoint, cfg=cfg, mesh=mesh, fp8_weights=fp8_weights)
  return cfg, Loaded(target, mtp)


def _from_checkpoint(args: argparse.Namespace, cfg: jax_mtp.MtpConfig, loaded: Loaded):
  spec = Speculator(cfg, _mesh(args.tp), args.num_speculative_tokens, norm_impl=args.impl)
  return spec, SpecParams(loaded.target, spec.drafter.shard(loaded.mtp, spec.mesh))


def run(args: argparse.Namespace, cfg: jax_mtp.MtpConfig, prompts: list[list[int]],
        loaded: Loaded | None = None, stop_ids: tuple[int, ...] = ()) -> tuple[SpecResult, bool | None]:
  """Decodes the prompts, each row stopping after a stop id; with --check also with the target
  alone. Returns (result, outputs match)."""
  if loaded is None:
    spec, params = _speculator(cfg, args.tp, args.num_speculative_tokens, args.impl, args.random_tiny)
  else:
    spec, params = _from_checkpoint(args, cfg, loaded)
  primary = distributed.is_primary()  # with several processes, process 0 prints
  one_prompt = len(args.prompt or ()) == 1  # of all prompts (a replica decodes its share: `prompts`)
  stream = TextStream(args.codec) if primary and args.codec is not None and one_prompt and not args.json else None
  progress = Progress(enabled=stream is None and primary)  # streamed text shows the progress itself
  try:
    if stream is not None:
      print(_model_line(args, cfg))
      print(args.prompt[0], end="", flush=True)
    result = spec.generate(params, prompts, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                           stop_ids=stop_ids, on_progress=progress, on_tokens=stream)
  finally:
    progress.close()
  args.streamed = stream is not None
  if not args.check:
    return result, None
  if loaded is None:
    plain, target_params = _plain_decoder(cfg, args.tp, args.impl, args.random_tiny)
  else:
    plain, target_params = TargetDecoder(cfg, spec.mesh, norm_impl=args.impl), loaded.target
  capacity = required_capacity(cfg, prompts, args.max_new_tokens, args.num_speculative_tokens)  # same shapes
  expected = plain.generate(target_params, prompts, args.max_new_tokens, capacity=capacity, stop_ids=stop_ids)
  return result, expected == result.tokens


class TextStream:
  """`on_tokens` for one row: prints the decoded text that is new since the last call. Text that
  ends inside a multi-byte character (a trailing U+FFFD) is held back until its bytes arrive."""

  def __init__(self, codec: TextCodec, out=None):
    self.codec, self.out, self.shown = codec, out, ""

  def __call__(self, tokens: list[list[int]]) -> None:
    text = self.codec.decode(tokens[0]).rstrip("\ufffd")
    if text.startswith(self.shown) and len(text) > len(self.shown):
      print(text[len(self.shown):], end="", flush=True, file=self.out or sys.stdout)
      self.shown = text


def _model_line(args: argparse.Namespace, cfg: jax_mtp.MtpConfig) -> str:
  mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seed {args.seed}"
  if args.random_tiny:
    model = "tiny DeepSeek-V3.2 target + MTP layer (random weights)"
  elif args.checkpoint is None:
    model = "the embedded default (a 7M DeepSeek-V3.2-architecture target + MTP layer trained on Python's stdlib)"
  else:
    model = f"{args.checkpoint} ({cfg.model_type})"
  return f"{model} on {jax.devices()[0].platform}, tp={args.tp}, k={args.num_speculative_tokens}, {mode}"


def _print_text(args: argparse.Namespace, cfg: jax_mtp.MtpConfig, prompts: list[list[int]],
                result: distributed.Gathered, matches: bool | None):
  m = result.metrics
  if args.streamed:
    print("\n" + "─" * 40)
  else:
    print(_model_line(args, cfg))
  codec = args.codec
  for i, (prompt, tokens) in enumerate(zip(prompts, result.tokens)):
    stop = " (stopped at EOS)" if result.stopped_rows[i] and i not in result.failed_rows else ""
    print(f"prompt {i} {prompt} → {tokens}{stop}")
    if codec is not None and not args.streamed:
      print(f"  {args.prompt[i]!r} → {codec.decode(tokens)!r}")
  if m.rounds:
    print(f"acceptance length {m.acceptance_length_mean:.2f} · per position "
          f"{[round(r, 2) for r in m.acceptance_rate_per_position]} · drafts accepted "
          f"{m.draft_tokens_accepted}/{m.draft_tokens_proposed}")
    print(f"{m.tokens_per_second:.1f} tokens/s, {m.tokens_per_second_per_acceptance_length:.1f} tokens/s per "
          f"acceptance length")
  if matches is not None:
    print(f"check: the output {'matches' if matches else 'DIFFERS FROM'} plain greedy decoding with the target")


def main(argv: list[str] | None = None) -> int:
  try:
    args = _parser().parse_args(argv)
    distributed.initialize(args)  # several processes: before JAX touches a device
    _ensure_devices(args.tp, args.num_processes or 1)  # before reading a checkpoint starts JAX
    args.model_dir = args.checkpoint or (None if args.random_tiny else DEFAULT_MODEL)
    if args.random_tiny and args.checkpoint is not None:
      raise _BadInput("give --checkpoint or --random-tiny, not both")
    if args.weights != "auto" and args.checkpoint is None:
      raise _BadInput(f"--weights {args.weights} is for --checkpoint's weights; the embedded models are not FP8")
    if args.model_dir == DEFAULT_MODEL and not os.path.isfile(os.path.join(DEFAULT_MODEL, "config.json")):
      raise _BadInput(f"the embedded default model is missing from this installation ({DEFAULT_MODEL}); "
                      f"reinstall jax_mtp, or use --checkpoint or --random-tiny")
    cfg = with_flags(jax_mtp.tiny() if args.model_dir is None else checkpoint_config(args.model_dir), args)
    prompts = _validate(args, cfg)
    stop_ids = stop_ids_for(args, cfg)
    distributed.check_agreement({"flags": _flags(argv), "prompts": prompts, "config": dataclasses.asdict(cfg),
                                 "checkpoint": distributed.checkpoint_listing(args.checkpoint)})
    loaded = None
    if args.checkpoint is not None:
      cfg, loaded = load(args, cfg)
  except ValueError as e:  # bad flags, and bad checkpoints (CheckpointError lists every problem)
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a checkpoint file that cannot be read (permissions, vanished): its path and why
    print(f"error: cannot read {e.filename or 'a checkpoint file'!r}: {e.strerror or e}", file=sys.stderr)
    return 2
  rows = distributed.share(args.tp, len(prompts))  # this replica's prompts (all, with one replica)
  mine = [prompts[i] for i in rows]
  result, matches = run(args, cfg, mine, loaded, stop_ids) if mine else (None, None if not args.check else True)
  result = distributed.gather(args.tp, rows, result, matches, len(prompts), args.num_speculative_tokens)
  matches, failed = result.matches, result.failed_rows
  if not distributed.is_primary():  # every process holds every replica's rows; process 0 prints them
    return 1 if failed else 0
  if args.json:
    stopped = result.stopped_rows
    reasons = ["error" if i in failed else "stop" if s else "length" for i, s in enumerate(stopped)]
    out = {"tokens": result.tokens, "finish_reasons": reasons, **result.metrics.as_dict()}
    if failed:
      out["errors"] = {str(i): _failure(result, i) for i in failed}
    if args.codec is not None:
      out["text"] = [args.codec.decode(tokens) for tokens in result.tokens]
    if matches is not None:
      out["matches_target"] = matches
    print(json.dumps(out))
  else:
    _print_text(args, cfg, prompts, result, matches)
  for i in failed:
    print(f"error: prompt {i}: {_failure(result, i)}", file=sys.stderr)
  return 1 if failed else 0


def _flags(argv: list[str] | None) -> dict:
  """The flags as parsed, less those that differ between processes by design (--process-id)."""
  flags = vars(_parser().parse_args(argv))
  flags.pop("process_id")
  return flags


def _failure(result: distributed.Gathered, row: int) -> str:
  return (f"the target's logits became non-finite (NaN or inf) after {len(result.tokens[row])} token(s); the row "
          f"stopped there, the other rows went on")


if __name__ == "__main__":
  sys.exit(main())
