"""`python -m jax_mtp.decode`: speculative decoding with MTP drafts, end to end.

With no arguments it runs the embedded default — a 7M-parameter DeepSeek-V3.2-architecture target
(MLA, DSA indexer, MoE) and its MTP layer, trained on the Python standard library's sources
(`jax_mtp/default_model/`, README "The embedded default") — on a code prompt, streaming the text as
rounds commit, then the speculative-decoding metrics. `--prompt TEXT` gives your own prompt.
`--checkpoint DIR|REPO` runs a real model instead: a HF checkpoint directory (config.json + safetensors,
FP8 or not; jax_mtp.checkpoint; `--weights` keeps FP8 weights FP8 on the device, jax_mtp.fp8), an
orbax directory written by `jax_mtp.orbax_io.save_params`, or a Hugging Face repo id such as
`deepseek-ai/DeepSeek-V3.2-Exp` (jax_mtp.hub: only the files the run reads, through the HF cache),
placed straight onto the `--tp` mesh by jax_mtp.loader; `--prompt` is encoded by its `tokenizer.json`
(jax_mtp.tokenizer). `--random-tiny` runs a tiny model with random weights instead (token ids only;
any tp up to 8). Rows stop at the model's EOS ids unless `--ignore-eos`. `--check` also decodes with
the target alone and reports whether the outputs match token for token (they must: speculative
decoding never changes greedy output; in a 16-bit model up to near-ties, jax_mtp.greedy_check). Exit 0 on
success, 2 on bad input (a bad checkpoint included) with an `error: ...` message on stderr and nothing on stdout — and 2, with one such line, when
the run itself fails (a kernel refusing a shape, device memory exhausted) —, 1 when a row stopped because
the target's logits became non-finite (its tokens up to there are printed, JSON `finish_reasons`
"error" and `errors`; one `error: prompt i: ...` line on stderr per such row; the others go on), and
1 when `--check` finds the outputs differ where the target chose clearly (printed in full, then a line per
differing row and an `error: --check: ...` line).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from typing import NamedTuple

import jax

import jax_mtp
from jax_mtp import compile_cache, distributed, fp8, generation_defaults, greedy_check, loader
from jax_mtp.decode_flags import BadInput, parser
from jax_mtp.decode_kernels import check_kernel_impls, check_norm_impl
from jax_mtp.decode_prompts import ChatRequest, prompts_from
from jax_mtp.decode_output import CacheUse, Progress, TextStream, exit_code, print_result
from jax_mtp.errors import first_line
from jax_mtp.generate import TargetDecoder
from jax_mtp.request import (cache_bytes, check_caches_fit, required_capacity, stop_id_array, validate_prompts,
                             validate_seed, validate_temperature, validate_top_k, validate_top_p)
from jax_mtp.sharding import make_mesh, validate_tp
from jax_mtp.speculative import SpecParams, SpecResult, Speculator
from jax_mtp.tokenizer import TextCodec, eos_token_ids

class Settings(NamedTuple):
  """The flags decoding reads once the request is validated, as plain values."""

  checkpoint: str | None  # as given: a directory or a repo id; None: the embedded default or --random-tiny
  random_tiny: bool
  tp: int
  k: int  # --num-speculative-tokens
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  chat: bool
  system: str | None
  thinking: bool
  impl: str  # the fused all-reduce + RMSNorm's
  weights: str
  check: bool
  json: bool

  @classmethod
  def of(cls, args: argparse.Namespace) -> Settings:
    return cls(args.checkpoint, args.random_tiny, args.tp, args.num_speculative_tokens, args.max_new_tokens,
               args.temperature, args.top_k, args.top_p, args.seed, args.chat, args.system, args.thinking,
               args.impl, args.weights, args.check, args.json)


class Request(NamedTuple):
  """What validation settles, before any weight is read."""

  cfg: jax_mtp.MtpConfig  # the model's config with the flags' run settings (with_flags)
  prompts: list[list[int]]
  texts: list[str] | None  # the prompts as text, where `codec` encoded them (--prompt, the embedded default)
  codec: TextCodec | None
  stop_ids: tuple[int, ...]
  source: loader.Source | None  # where the weights are (loader.locate); None: --random-tiny's random weights
  settings: Settings
  notes: tuple[str, ...] = ()  # said on stderr once the weights are placed: a run that fails says its error alone


class Built(NamedTuple):
  """What decoding runs on: the speculator and its placed params, and with --check the plain decoder."""

  cfg: jax_mtp.MtpConfig  # as the weights run (FP8 weights kept on the device carry their block size)
  spec: Speculator
  params: SpecParams
  plain: TargetDecoder | None


def main(argv: list[str] | None = None) -> int:
  """Parse, validate, build, run, print: exit 0, 1 when a row's logits became non-finite or --check found
  the outputs differ or the output could not be written, 2 on bad input, 130 when interrupted (Ctrl-C)."""
  # A terminal whose encoding lacks a character the output holds (an ASCII or cp1252 console: '→', a token's text)
  # gets its backslash escape, as Python's own stderr does, not a UnicodeEncodeError after the rows were decoded.
  with contextlib.suppress(AttributeError, ValueError):  # no stdout (pythonw), or one that cannot be reconfigured
    sys.stdout.reconfigure(errors="backslashreplace")
  try:
    return _main(argv)
  except KeyboardInterrupt:  # one line, not a traceback from wherever the run was
    print("\nerror: interrupted", file=sys.stderr)
    return 130
  except BrokenPipeError:  # the reader went away (`| head`): stop as other command-line tools do, silently
    with contextlib.suppress(OSError, ValueError):  # stdout without a file descriptor (a test's): nothing to close
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    return 1
  except OSError as e:  # writing the output (a full disk, a closed terminal): the tokens are lost, say why
    print(f"error: cannot write the output: {e.strerror or e}", file=sys.stderr)
    return 1


def _main(argv: list[str] | None) -> int:
  try:
    args = parser().parse_args(argv)
    distributed.validate(args)  # the process flags' own consistency, before they configure JAX
    set_gpu_memory_fraction(args.gpu_memory_fraction)
    for name, value in jax_settings(args).items():  # the only JAX config the CLI sets, before JAX starts
      try:
        jax.config.update(name, value)
      except RuntimeError:  # JAX already running (tests, a notebook): keep the devices it has
        pass
    distributed.initialize(args)  # several processes: before JAX touches a device
    cache_folder, cache_note = compile_cache.configure(args.compilation_cache)
    if cache_note and distributed.is_primary():
      print(cache_note, file=sys.stderr)
    request = validate(args)
    built = build(request)
    for note in request.notes if distributed.is_primary() else ():
      print(note, file=sys.stderr)
  except ValueError as e:  # bad flags, and bad checkpoints (CheckpointError lists every problem)
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a checkpoint file that cannot be read (permissions, vanished): its path and why
    print(f"error: cannot read {e.filename or 'a checkpoint file'!r}: {e.strerror or e}", file=sys.stderr)
    return 2
  except jax.errors.JaxRuntimeError as e:  # placing the weights (device memory exhausted): XLA's first line
    print(f"error: {first_line(e)}", file=sys.stderr)
    return 2
  read_before = compile_cache.programs_read()
  try:
    result, streamed = run(request, built)
  except (ValueError, jax.errors.JaxRuntimeError) as e:  # a kernel refusing a shape, device memory: one line
    print(f"error: {first_line(e)}", file=sys.stderr)
    return 2
  if not distributed.is_primary():  # every process holds every replica's rows; process 0 prints them
    return exit_code(result)
  return print_result(result, as_json=request.settings.json, model_line=_model_line(request.settings, built.cfg),
                      prompts=request.prompts, texts=request.texts, codec=request.codec, streamed=streamed,
                      kernels=_kernels_ran(built.spec),
                      cache=CacheUse(cache_folder, compile_cache.programs_read() - read_before))


def _kernels_ran(spec: Speculator) -> dict[str, dict[str, str]] | None:
  """What the compiled programs ran (`Speculator.kernels_ran`); None, with a note on stderr, where a backend cannot
  print a compiled program's HLO: the decoded rows are printed either way."""
  try:
    return spec.kernels_ran()
  except Exception as e:  # a PJRT plugin's compiled program without HLO text: a report lost, not the output
    print(f"note: could not read what the compiled programs ran: {first_line(e)}", file=sys.stderr)
    return None


def set_gpu_memory_fraction(fraction: float | None, environ=os.environ) -> None:
  """--gpu-memory-fraction: JAX reads XLA_PYTHON_CLIENT_MEM_FRACTION when it creates its GPU client, so this runs
  before anything touches a device (in a process where JAX already runs, e.g. a notebook, it changes nothing: set
  the variable before JAX starts there)."""
  if fraction is None:
    return
  if not 0 < fraction <= 1:  # also NaN
    raise BadInput(f"--gpu-memory-fraction={fraction} must be in (0, 1]")
  environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(fraction)


MAX_TP = 1024  # --tp's bound: tp divides the attention heads, and no supported model has more than 128


def jax_settings(args: argparse.Namespace) -> dict:
  """The JAX config the flags ask for: several processes' (jax_mtp.distributed), and on CPU this
  process's share of the `--tp` host devices unless the user set a count (JAX_NUM_CPU_DEVICES). With
  several processes tp spans whole processes, and more devices than tp form data-parallel replicas."""
  settings = distributed.jax_settings(args)
  if args.tp > MAX_TP:  # on CPU, before JAX would create that many host devices (10^5 of them hang)
    raise BadInput(f"--tp={args.tp} is more than {MAX_TP} devices; a V3 / V3.2 / GLM-5 model's attention heads "
                   f"(128 at most) split over at most that many")
  processes = args.num_processes or 1
  if args.tp > 1 and args.tp % processes == 0 and jax.config.jax_num_cpu_devices < 0:
    settings["jax_num_cpu_devices"] = args.tp // processes
  return settings


def validate(args: argparse.Namespace) -> Request:
  """Every check that reads no weight, in the order their errors are reported (BadInput / ValueError)."""
  settings = Settings.of(args)
  notes = []
  if args.gpu_memory_fraction is not None and jax.default_backend() != "gpu":
    notes.append(f"note: --gpu-memory-fraction sizes JAX's GPU memory pool; this run's devices are "
                 f"{jax.default_backend()}'s: it changes nothing")
  if settings.tp < 1:  # first: the layouts below divide by it
    raise BadInput(f"--tp={settings.tp} must be ≥ 1")
  if settings.tp > len(jax.devices()):  # before reading a checkpoint's config
    raise BadInput(f"--tp={settings.tp} needs {settings.tp} devices, {len(jax.devices())} available")
  distributed.replica_devices(settings.tp)  # several processes: tp spans whole processes (ValueError naming them)
  source = _source(settings)
  cfg = with_flags(jax_mtp.tiny() if source is None else loader.checkpoint_config(source), args)
  settings, note = _with_generation_defaults(settings, source, args.generation_config)
  notes += [note] if note else []
  _check_run_flags(settings)
  ids_by_default = settings.checkpoint is not None or settings.random_tiny
  chat = ChatRequest(settings.system, settings.thinking, cfg.model_type) if settings.chat else None
  texts, codec, prompts = prompts_from(args.prompt, args.prompt_ids, source, ids_by_default, chat)
  validate_prompts(cfg, prompts)
  capacity = required_capacity(cfg, prompts, settings.max_new_tokens, settings.k)
  validate_tp(cfg, settings.tp)
  check_caches_fit(cfg, len(prompts), capacity, jax.devices())  # before any weight is read
  check_norm_impl(settings.impl)
  check_kernel_impls(cfg, capacity)
  stop_ids = stop_ids_for(cfg, source, ignore_eos=args.ignore_eos)
  if source is not None and not stop_ids and not args.ignore_eos:  # an orbax step saved bare: rows run on, unsaid
    notes.append(f"note: {source.directory} names no EOS id (no eos_token_id in a generation_config.json or "
                 f"config.json there): rows stop at --max-new-tokens only")
  flags = {name: value for name, value in vars(args).items() if name != "process_id"}  # differs by design
  distributed.check_agreement({"flags": flags, "prompts": prompts, "config": dataclasses.asdict(cfg),
                               "checkpoint": _identity(settings.checkpoint, source)})
  return Request(cfg, prompts, texts, codec, stop_ids, source, settings, tuple(notes))


def _with_generation_defaults(settings: Settings, source: loader.Source | None,
                              mode: str) -> tuple[Settings, str | None]:
  """The sampling flags not given filled from the checkpoint's generation_config.json (jax_mtp.generation_defaults),
  else greedy's values; and the note saying what came from the file (or what greedy decoding ignores)."""
  values, note = generation_defaults.resolve(generation_defaults.flags_given(settings),
                                             None if source is None else source.directory, mode, check=settings.check)
  return settings._replace(**values), note


def _source(settings: Settings) -> loader.Source | None:
  """Where the model's config, tokenizer, EOS ids and weights are: --checkpoint's directory or repo, the
  embedded default, or None for --random-tiny."""
  if settings.random_tiny and settings.checkpoint is not None:
    raise BadInput("give --checkpoint or --random-tiny, not both")
  if settings.weights != "auto" and settings.checkpoint is None:
    raise BadInput(f"--weights {settings.weights} is for --checkpoint's weights; the embedded models are not FP8")
  return None if settings.random_tiny else loader.locate(settings.checkpoint)


def _identity(checkpoint: str | None, source: loader.Source | None) -> list | None:
  """What every process must agree on: a directory's listing, or a Hub repo's id and commit."""
  if source is not None and source.repo_id is not None:
    return [source.repo_id, source.revision]
  return distributed.checkpoint_listing(checkpoint)


def _check_run_flags(settings: Settings) -> None:
  for flag, value in (("max-new-tokens", settings.max_new_tokens), ("num-speculative-tokens", settings.k)):
    if value < 1:
      raise BadInput(f"--{flag}={value} must be ≥ 1")
  try:
    validate_seed(settings.seed)  # the API's check (jax.random.key takes a 64-bit integer), said of the flag
  except ValueError:
    raise BadInput(f"--seed={settings.seed} must fit in 64 bits (-2^63 .. 2^63 - 1)") from None
  for name, validate, value in (("temperature", validate_temperature, settings.temperature),
                                ("top_k", validate_top_k, settings.top_k), ("top_p", validate_top_p, settings.top_p)):
    try:
      validate(value)
    except ValueError as e:  # "top_k=… must …", said of the flag
      raise BadInput(f"--{name.replace('_', '-')}{str(e).removeprefix(name)}") from None
  if (settings.thinking or settings.system is not None) and not settings.chat:
    raise BadInput("--system and --thinking are parts of a chat prompt; they need --chat")
  if settings.check and settings.temperature > 0:
    raise BadInput(f"--check compares greedy outputs token for token; it needs --temperature 0, "
                    f"got {settings.temperature}")


def with_flags(cfg: jax_mtp.MtpConfig, args: argparse.Namespace) -> jax_mtp.MtpConfig:
  """The model's config with what --dtype (auto: the config's own), --moe-impl, --index-scores-impl,
  --sparse-attention-impl, --topk-impl, --kv-cache-dtype, --index-cache-dtype, --prefill-chunk and --fp8-matmul-impl
  set."""
  if args.dtype != "auto":
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
  if args.index_cache_dtype != "auto" and not cfg.has_indexer:
    raise BadInput(f"--index-cache-dtype={args.index_cache_dtype} is for DSA models (DeepSeek-V3.2, GLM-5); this "
                    f"model ({cfg.model_type}) has no indexer")
  return cfg.replace(moe_impl=args.moe_impl, index_scores_impl=args.index_scores_impl,
                     sparse_attention_impl=args.sparse_attention_impl, topk_impl=args.topk_impl,
                     kv_cache_dtype=args.kv_cache_dtype,
                     index_cache_dtype=args.index_cache_dtype, prefill_chunk=args.prefill_chunk,
                     fp8_matmul_impl=args.fp8_matmul_impl)


def stop_ids_for(cfg: jax_mtp.MtpConfig, source: loader.Source | None, *, ignore_eos: bool) -> tuple[int, ...]:
  """The ids a row stops at: the model's EOS ids (generation_config.json, else config.json), none
  with --ignore-eos or --random-tiny (random weights, no EOS)."""
  if ignore_eos or source is None:
    return ()
  ids = eos_token_ids(source.directory)
  try:
    stop_id_array(cfg, ids)  # each must be a vocabulary id
  except ValueError as e:  # said of the file the ids came from
    raise BadInput(f"{source.directory}'s eos_token_id (generation_config.json, else config.json): {e}") from None
  return ids


def build(request: Request) -> Built:
  """The `--tp` mesh (this replica's, with several processes), the weights placed on it (jax_mtp.loader),
  the speculator and, with --check, the plain decoder (which runs on the speculator's target params)."""
  s = request.settings
  mesh = make_mesh(s.tp, devices=distributed.replica_devices(s.tp))
  cfg = request.cfg
  if request.source is None:  # --random-tiny
    spec = Speculator(cfg, mesh, s.k, norm_impl=s.impl)
    params = spec.shard(*loader.random_weights(cfg))
  else:
    caches = cache_bytes(cfg, len(request.prompts), required_capacity(cfg, request.prompts, s.max_new_tokens, s.k))
    loaded = loader.load(request.source, cfg=cfg, mesh=mesh, weights=s.weights, reserve_bytes=caches)
    if loaded.dequantised:
      print(f"note: FP8 weights dequantised on load: at tp={s.tp} {len(loaded.dequantised)} tensor(s) split inside "
            f"their blocks (e.g. {loaded.dequantised[0]}); --weights bf16 says so explicitly", file=sys.stderr)
    cfg = loaded.cfg
    spec = Speculator(cfg, mesh, s.k, norm_impl=s.impl)
    params = SpecParams(loaded.target, spec.drafter.shard(loaded.mtp, mesh))
  if cfg.fp8_matmul_impl != "auto" and not any(fp8.fp8_paths(tree) for tree in params):
    raise BadInput(f"--fp8-matmul-impl={cfg.fp8_matmul_impl} picks the kernel that multiplies FP8 weights kept on "
                   f"the device; this run keeps none (an FP8 checkpoint with --weights auto or fp8 does)")
  plain = TargetDecoder(cfg, mesh, norm_impl=s.impl) if s.check else None
  return Built(cfg, spec, params, plain)


def run(request: Request, built: Built) -> tuple[distributed.Gathered, bool]:
  """Decodes this replica's share of the prompts (all of them, with one replica) and gathers every
  replica's rows. Returns (the rows in prompt order, whether the text was streamed as it came)."""
  s = request.settings
  rows = distributed.share(s.tp, len(request.prompts))
  mine = [request.prompts[i] for i in rows]
  result, check, streamed = None, None if not s.check else (True, []), False
  if mine:
    result, check, streamed = _decode(request, built, mine, rows)
  return distributed.gather(s.tp, rows, result, check, len(request.prompts), s.k), streamed


def _decode(request: Request, built: Built, prompts: list[list[int]],
            rows: list[int]) -> tuple[SpecResult, tuple[bool, list[dict]] | None, bool]:
  """Decodes `prompts` (the prompts' rows `rows`), each row stopping after a stop id; with --check also with the
  target alone. Returns (result, None or (outputs match up to near-ties, the differences: greedy_check), streamed)."""
  s = request.settings
  primary = distributed.is_primary()  # with several processes, process 0 prints
  one_prompt = len(request.texts or ()) == 1  # of all prompts (a replica decodes its share: `prompts`)
  streams = primary and request.codec is not None and one_prompt and not s.json
  stream = TextStream(request.codec) if streams else None
  progress = Progress(enabled=stream is None and primary)  # streamed text shows the progress itself
  try:
    if stream is not None:
      print(_model_line(s, built.cfg))
      print(request.texts[0], end="", flush=True)
    result = built.spec.generate(built.params, prompts, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                                 top_p=s.top_p, seed=s.seed, stop_ids=request.stop_ids, on_progress=progress,
                                 on_tokens=stream)
  finally:
    progress.close()
  if built.plain is None:
    return result, None, stream is not None
  capacity = required_capacity(built.cfg, prompts, s.max_new_tokens, s.k)  # the same shapes
  expected = built.plain.generate(built.params.target, prompts, s.max_new_tokens, capacity=capacity,
                                  stop_ids=request.stop_ids)
  return result, greedy_check.compare(built.cfg, built.plain, built.params.target, prompts, rows, result.tokens,
                                      expected), stream is not None


def _model_line(s: Settings, cfg: jax_mtp.MtpConfig) -> str:
  filters = (f", top-k {s.top_k}" if s.top_k else "") + (f", top-p {s.top_p}" if s.top_p < 1 else "")
  mode = "greedy" if s.temperature == 0 else f"temperature {s.temperature}{filters}, seed {s.seed}"
  if s.random_tiny:
    model = "tiny DeepSeek-V3.2 target + MTP layer (random weights)"
  elif s.checkpoint is None:
    model = "the embedded default (a 7M DeepSeek-V3.2-architecture target + MTP layer trained on Python's stdlib)"
  else:
    model = f"{s.checkpoint} ({cfg.model_type})"
  return f"{model} on {jax.devices()[0].platform}, tp={s.tp}, k={s.k}, {mode}"


if __name__ == "__main__":
  sys.exit(main())
