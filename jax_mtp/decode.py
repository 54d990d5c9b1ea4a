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
included) with an `error: ...` message on stderr and nothing on stdout — and 2, with one such line, when
the run itself fails (a kernel refusing a shape, device memory exhausted) —, 1 when a row stopped because
the target's logits became non-finite (its tokens up to there are printed, JSON `finish_reasons`
"error" and `errors`; one `error: prompt i: ...` line on stderr per such row; the others go on), and
1 when `--check` finds the outputs differ (printed in full, then an `error: --check: ...` line).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import NamedTuple

import jax
from jax.sharding import Mesh

import jax_mtp
from jax_mtp import distributed
from jax_mtp.config import DTYPES, INDEX_SCORES_IMPLS, MOE_IMPLS, SPARSE_ATTENTION_IMPLS, from_hf_config
from jax_mtp.decode_output import Progress, TextStream, exit_code, print_result
from jax_mtp.generate import TargetDecoder
from jax_mtp.kernels.fused_allreduce_rmsnorm import IMPLS, gpu_kernels
from jax_mtp.model import init_target_params
from jax_mtp.request import (check_caches_fit, required_capacity, stop_id_array, validate_prompts,
                             validate_temperature)
from jax_mtp.sharding import SHARED_WITH_TARGET, make_mesh, validate_tp
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
  p.add_argument("--sparse-attention-impl", choices=SPARSE_ATTENTION_IMPLS, default="auto",
                 help="DSA's sparse MLA attention: xla, or the fused Pallas kernel (pallas_gpu); auto: the kernel on "
                      "GPUs where it takes the model, else xla")
  p.add_argument("--prefill-chunk", type=int, default=0, metavar="TOKENS",
                 help="prompt tokens per row per prefill call; 0 (default): sized to 4 GiB of per-query buffers "
                      "(jax_mtp.prefill)")
  p.add_argument("--ignore-eos", action="store_true",
                 help="do not stop a row at the checkpoint's EOS ids (benchmarks, as vLLM's flag)")
  p.add_argument("--check", action="store_true",
                 help="also decode with the target alone and compare; exit 1 if the outputs differ (2 is bad input)")
  p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
  distributed.add_arguments(p)
  return p


class Request(NamedTuple):
  """What validation settles, before any weight is read."""

  cfg: jax_mtp.MtpConfig  # the model's config with the flags' run settings (with_flags)
  prompts: list[list[int]]
  texts: list[str] | None  # the prompts as text, where `codec` encoded them (--prompt, the embedded default)
  codec: TextCodec | None
  stop_ids: tuple[int, ...]


class Built(NamedTuple):
  """What decoding runs on: the speculator and its placed params, and with --check the plain decoder."""

  cfg: jax_mtp.MtpConfig  # as the weights run (FP8 weights kept on the device carry their block size)
  spec: Speculator
  params: SpecParams
  plain: TargetDecoder | None


def main(argv: list[str] | None = None) -> int:
  """Parse, validate, build, run, print: exit 0, 1 when a row's logits became non-finite or --check found
  the outputs differ, 2 on bad input."""
  try:
    args = _parser().parse_args(argv)
    distributed.validate(args)  # the process flags' own consistency, before they configure JAX
    for name, value in jax_settings(args).items():  # the only JAX config the CLI sets, before JAX starts
      try:
        jax.config.update(name, value)
      except RuntimeError:  # JAX already running (tests, a notebook): keep the devices it has
        pass
    distributed.initialize(args)  # several processes: before JAX touches a device
    request = validate(args)
    built = build(args, request)
  except ValueError as e:  # bad flags, and bad checkpoints (CheckpointError lists every problem)
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a checkpoint file that cannot be read (permissions, vanished): its path and why
    print(f"error: cannot read {e.filename or 'a checkpoint file'!r}: {e.strerror or e}", file=sys.stderr)
    return 2
  try:
    result, streamed = run(args, request, built)
  except (ValueError, jax.errors.JaxRuntimeError) as e:  # a kernel refusing a shape, device memory: one line
    print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2
  if not distributed.is_primary():  # every process holds every replica's rows; process 0 prints them
    return exit_code(result)
  return print_result(result, as_json=args.json, model_line=_model_line(args, built.cfg), prompts=request.prompts,
                      texts=request.texts, codec=request.codec, streamed=streamed)


def jax_settings(args: argparse.Namespace) -> dict:
  """The JAX config the flags ask for: several processes' (jax_mtp.distributed), and on CPU this
  process's share of the `--tp` host devices unless the user set a count (JAX_NUM_CPU_DEVICES). With
  several processes tp spans whole processes, and more devices than tp form data-parallel replicas."""
  settings = distributed.jax_settings(args)
  processes = args.num_processes or 1
  if args.tp > 1 and args.tp % processes == 0 and jax.config.jax_num_cpu_devices < 0:
    settings["jax_num_cpu_devices"] = args.tp // processes
  return settings


def validate(args: argparse.Namespace) -> Request:
  """Every check that reads no weight, in the order their errors are reported (_BadInput / ValueError)."""
  if args.tp > len(jax.devices()):  # before reading a checkpoint's config
    raise _BadInput(f"--tp={args.tp} needs {args.tp} devices, {len(jax.devices())} available")
  distributed.replica_devices(args.tp)  # several processes: tp spans whole processes (ValueError naming the numbers)
  model_dir = _model_dir(args)
  cfg = with_flags(jax_mtp.tiny() if model_dir is None else checkpoint_config(model_dir), args)
  _check_run_flags(args)
  texts, codec, prompts = _prompts(args, model_dir)
  validate_prompts(cfg, prompts)
  capacity = required_capacity(cfg, prompts, args.max_new_tokens, args.num_speculative_tokens)
  validate_tp(cfg, args.tp)
  check_caches_fit(cfg, len(prompts), capacity, jax.devices())  # before any weight is read
  _check_impl(args.impl)
  _check_kernel_impls(cfg, capacity, args.tp)
  stop_ids = stop_ids_for(args, cfg, model_dir)
  flags = {name: value for name, value in vars(args).items() if name != "process_id"}  # differs by design
  distributed.check_agreement({"flags": flags, "prompts": prompts, "config": dataclasses.asdict(cfg),
                               "checkpoint": distributed.checkpoint_listing(args.checkpoint)})
  return Request(cfg, prompts, texts, codec, stop_ids)


def _model_dir(args: argparse.Namespace) -> str | None:
  """Where the model's config, tokenizer and EOS ids are read: --checkpoint, the embedded default, or
  None for --random-tiny."""
  if args.random_tiny and args.checkpoint is not None:
    raise _BadInput("give --checkpoint or --random-tiny, not both")
  if args.weights != "auto" and args.checkpoint is None:
    raise _BadInput(f"--weights {args.weights} is for --checkpoint's weights; the embedded models are not FP8")
  model_dir = args.checkpoint or (None if args.random_tiny else DEFAULT_MODEL)
  if model_dir == DEFAULT_MODEL and not os.path.isfile(os.path.join(DEFAULT_MODEL, "config.json")):
    raise _BadInput(f"the embedded default model is missing from this installation ({DEFAULT_MODEL}); "
                    f"reinstall jax_mtp, or use --checkpoint or --random-tiny")
  return model_dir


def _check_run_flags(args: argparse.Namespace) -> None:
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


def _parse_ids(text: str) -> list[int]:
  try:
    return [int(tok) for tok in text.split(",") if tok.strip()]
  except ValueError:
    raise _BadInput(f"--prompt-ids {text!r} is not a comma-separated list of integers") from None


def _prompts(args: argparse.Namespace, model_dir: str | None) -> tuple[list[str] | None, TextCodec | None,
                                                                         list[list[int]]]:
  """(texts, codec, token ids): the ids from --prompt-ids, or from --prompt through the model's
  tokenizer (the embedded default's prompt is DEFAULT_TEXT)."""
  if args.prompt is not None and args.prompt_ids is not None:
    raise _BadInput("give --prompt or --prompt-ids, not both")
  if args.prompt is None and (args.prompt_ids is not None or args.checkpoint is not None or args.random_tiny):
    return None, None, [_parse_ids(text) for text in (args.prompt_ids or [DEFAULT_PROMPT])]
  if model_dir is None:
    raise _BadInput("--prompt needs a tokenizer, and --random-tiny has none; use --prompt-ids")
  texts = args.prompt or [DEFAULT_TEXT]
  codec = TextCodec(model_dir)
  return texts, codec, [codec.encode(text) for text in texts]


def _check_kernel_impls(cfg: jax_mtp.MtpConfig, capacity: int, tp: int) -> None:
  """Explicit DSA kernels (index scores, sparse attention) must suit the model, the cache and this machine."""
  from jax_mtp.indexer import resolve_index_scores_impl, selects_all  # noqa: PLC0415
  from jax_mtp.mla import resolve_sparse_attention_impl  # noqa: PLC0415
  platform = jax.default_backend()
  checks = (("--index-scores-impl", cfg.index_scores_impl, lambda: resolve_index_scores_impl(cfg, platform, capacity)),
            ("--sparse-attention-impl", cfg.sparse_attention_impl,
             lambda: resolve_sparse_attention_impl(cfg, platform, cfg.num_attention_heads // tp)))
  if selects_all(cfg, capacity):  # neither kernel runs: every visible slot is attended
    return
  for flag, impl, resolve in checks:
    if impl in ("auto", "xla"):
      continue
    if impl != f"pallas_{platform}":
      raise _BadInput(f"{flag}={impl} runs on {impl.removeprefix('pallas_')}; this machine's JAX platform is "
                      f"{platform}")
    resolve()  # ValueError naming what the kernel cannot take


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
  """The model's config with what --dtype (auto: the config's own), --moe-impl, --index-scores-impl,
  --sparse-attention-impl and --prefill-chunk set."""
  if args.dtype != "auto":
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
  return cfg.replace(moe_impl=args.moe_impl, index_scores_impl=args.index_scores_impl,
                     sparse_attention_impl=args.sparse_attention_impl,
                     prefill_chunk=args.prefill_chunk)


def stop_ids_for(args: argparse.Namespace, cfg: jax_mtp.MtpConfig, model_dir: str | None) -> tuple[int, ...]:
  """The ids a row stops at: the model's EOS ids (generation_config.json, else config.json), none
  with --ignore-eos or --random-tiny (random weights, no EOS)."""
  if args.ignore_eos or model_dir is None:
    return ()
  ids = eos_token_ids(model_dir)
  stop_id_array(cfg, ids)  # each must be a vocabulary id
  return ids


def build(args: argparse.Namespace, request: Request) -> Built:
  """The `--tp` mesh (this replica's, with several processes), the weights placed on it, the speculator
  and, with --check, the plain decoder (which runs on the speculator's target params)."""
  mesh = make_mesh(args.tp, devices=distributed.replica_devices(args.tp))
  cfg, k = request.cfg, args.num_speculative_tokens
  if args.checkpoint is None:
    spec = Speculator(cfg, mesh, k, norm_impl=args.impl)
    params = spec.shard(*_embedded_weights(cfg, args.random_tiny))
  else:
    cfg, loaded = load(args, cfg, mesh)
    spec = Speculator(cfg, mesh, k, norm_impl=args.impl)
    params = SpecParams(loaded.target, spec.drafter.shard(loaded.mtp, mesh))
  plain = TargetDecoder(cfg, mesh, norm_impl=args.impl) if args.check else None
  return Built(cfg, spec, params, plain)


def _embedded_weights(cfg: jax_mtp.MtpConfig, random_tiny: bool) -> tuple[dict, dict]:
  """(target, MTP) params of the embedded model: the trained default's, or --random-tiny's."""
  if random_tiny:
    return (init_target_params(cfg, jax.random.key(WEIGHT_SEED)),
            jax_mtp.init_params(cfg, jax.random.key(WEIGHT_SEED + 1)))
  from jax_mtp.checkpoint import load_hf_checkpoint  # noqa: PLC0415 (see above)
  _, target, mtp = load_hf_checkpoint(DEFAULT_MODEL, cfg=cfg, progress=False)
  return target, mtp


class Loaded(NamedTuple):
  """A checkpoint's params, placed on the `--tp` mesh (vocab padded, as `shard_params` leaves them)."""

  target: dict
  mtp: dict


def load(args: argparse.Namespace, cfg: jax_mtp.MtpConfig, mesh: Mesh) -> tuple[jax_mtp.MtpConfig, Loaded]:
  """The checkpoint's weights on `mesh`, and the config they run with (FP8 weights kept on the
  device carry their block size in it)."""
  from jax_mtp import fp8  # noqa: PLC0415
  from jax_mtp.checkpoint import fp8_split_problems, load_opened, open_hf_checkpoint, quantization  # noqa: PLC0415
  from jax_mtp.orbax_io import is_orbax_checkpoint, restore_params  # noqa: PLC0415
  if is_orbax_checkpoint(args.checkpoint):
    saved, target, mtp = restore_params(args.checkpoint, cfg, mesh)  # as saved: FP8 weights stay FP8
    cfg = cfg.replace(fp8_block=saved.fp8_block)
    stored_fp8 = bool(fp8.fp8_paths(target) or fp8.fp8_paths(mtp))
    if args.weights == "fp8" and not stored_fp8:
      raise _BadInput(f"--weights fp8: the orbax checkpoint {args.checkpoint!r} stores no FP8 weights")
    if args.weights == "bf16" and stored_fp8:
      target, mtp = (fp8.dequantize_params(tree, cfg.param_dtype, cfg.fp8_block) for tree in (target, mtp))
      mtp.update({name: target[name] for name in SHARED_WITH_TARGET})  # one shared copy
  else:
    opened = open_hf_checkpoint(args.checkpoint, cfg=cfg, mesh=mesh)  # headers read and checked once
    fp8_weights = args.weights == "fp8"
    if args.weights == "auto" and quantization(args.checkpoint):  # FP8 stored: kept, where tp splits its blocks
      problems = fp8_split_problems(opened)
      fp8_weights = not problems
      if problems:
        print(f"note: FP8 weights dequantised on load: at tp={args.tp} {len(problems)} tensor(s) split inside "
              f"their blocks (e.g. {problems[0]}); --weights bf16 says so explicitly", file=sys.stderr)
    cfg, target, mtp = load_opened(opened, fp8_weights=fp8_weights)
  return cfg, Loaded(target, mtp)


def run(args: argparse.Namespace, request: Request, built: Built) -> tuple[distributed.Gathered, bool]:
  """Decodes this replica's share of the prompts (all of them, with one replica) and gathers every
  replica's rows. Returns (the rows in prompt order, whether the text was streamed as it came)."""
  rows = distributed.share(args.tp, len(request.prompts))
  mine = [request.prompts[i] for i in rows]
  result, matches, streamed = None, None if not args.check else True, False
  if mine:
    result, matches, streamed = _decode(args, request, built, mine)
  return distributed.gather(args.tp, rows, result, matches, len(request.prompts), args.num_speculative_tokens), streamed


def _decode(args: argparse.Namespace, request: Request, built: Built,
            prompts: list[list[int]]) -> tuple[SpecResult, bool | None, bool]:
  """Decodes `prompts`, each row stopping after a stop id; with --check also with the target alone.
  Returns (result, outputs match or None, streamed)."""
  primary = distributed.is_primary()  # with several processes, process 0 prints
  one_prompt = len(request.texts or ()) == 1  # of all prompts (a replica decodes its share: `prompts`)
  streams = primary and request.codec is not None and one_prompt and not args.json
  stream = TextStream(request.codec) if streams else None
  progress = Progress(enabled=stream is None and primary)  # streamed text shows the progress itself
  try:
    if stream is not None:
      print(_model_line(args, built.cfg))
      print(request.texts[0], end="", flush=True)
    result = built.spec.generate(built.params, prompts, args.max_new_tokens, temperature=args.temperature,
                                 seed=args.seed, stop_ids=request.stop_ids, on_progress=progress, on_tokens=stream)
  finally:
    progress.close()
  if built.plain is None:
    return result, None, stream is not None
  capacity = required_capacity(built.cfg, prompts, args.max_new_tokens, args.num_speculative_tokens)  # same shapes
  expected = built.plain.generate(built.params.target, prompts, args.max_new_tokens, capacity=capacity,
                                  stop_ids=request.stop_ids)
  return result, expected == result.tokens, stream is not None


def _model_line(args: argparse.Namespace, cfg: jax_mtp.MtpConfig) -> str:
  mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seed {args.seed}"
  if args.random_tiny:
    model = "tiny DeepSeek-V3.2 target + MTP layer (random weights)"
  elif args.checkpoint is None:
    model = "the embedded default (a 7M DeepSeek-V3.2-architecture target + MTP layer trained on Python's stdlib)"
  else:
    model = f"{args.checkpoint} ({cfg.model_type})"
  return f"{model} on {jax.devices()[0].platform}, tp={args.tp}, k={args.num_speculative_tokens}, {mode}"


if __name__ == "__main__":
  sys.exit(main())
