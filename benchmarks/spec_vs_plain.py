"""Speculative vs plain greedy decoding of one checkpoint, B = 1: tokens/s per k, the acceptance, and whether the
tokens equal plain decoding's (they must); the speed-up as the median of `--runs` runs with its spread.

    python -m benchmarks.spec_vs_plain --checkpoint jax_mtp/default_model --k 1 3 --prompts 4 --max-new 128 --runs 3

Prompts are windows of text the checkpoint never trained on: the stdlib files it held out when it trained, as its
record names them relative to the stdlib root (`jax_mtp.corpus.unseen_files`: the checkpoint's
training_corpus.json; the same files on every machine with that Python), through its tokenizer. The windows are
the same in every run. Rows never stop at EOS (as vLLM's --ignore-eos benchmarks), so every k decodes the same
number of tokens. A run times plain decoding and then each k, each prompt's time the best of `--repeats` calls
after one warm-up call (the first run's compiles); its speed-up is its plain time over its speculative time. Prints
a markdown table per run, then per k the median speed-up with its min–max over the runs, the median acceptance
length (greedy: the same every run) and whether the tokens equalled plain decoding's in every run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from jax_mtp import corpus
from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.hf_config import from_hf_config
from jax_mtp.generate import TargetDecoder
from jax_mtp.request import required_capacity
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator


def unseen_prompts(checkpoint: str, count: int, length: int) -> list[list[int]]:
  """`count` windows of `length` tokens of the files `checkpoint` never trained on (a CorpusError without its
  training record)."""
  import tokenizers  # noqa: PLC0415
  tok = tokenizers.Tokenizer.from_file(f"{checkpoint}/tokenizer.json")
  data = corpus.TokenData.build(corpus.unseen_files(checkpoint), tok, held_out=1.0)  # every file held out
  return [row.tolist() for row in data.held_out_batches(1, count, length)[0]]


def best_time(fn, repeats: int):
  fn()  # warm-up (compiles on the first run)
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return min(times), out


def time_plain(plain, params, prompts, args, capacity) -> tuple[float, list]:
  """Seconds (the sum over prompts of each one's best) and the tokens of plain greedy decoding, B = 1."""
  seconds, tokens = 0.0, []
  for prompt in prompts:
    s, out = best_time(lambda: plain.generate(params, [prompt], args.max_new, capacity=capacity), args.repeats)
    seconds, tokens = seconds + s, tokens + out
  return seconds, tokens


def time_spec(spec, params, prompts, args, capacity) -> dict:
  """One k: seconds, tokens, and the acceptance length and per-position rates over all prompts' rounds."""
  seconds, tokens, accepted, rounds, per_position = 0.0, [], 0, 0, np.zeros(spec.k)
  for prompt in prompts:
    s, result = best_time(lambda: spec.generate(params, [prompt], args.max_new, capacity=capacity), args.repeats)
    m = result.metrics
    seconds, tokens = seconds + s, tokens + result.tokens
    accepted, rounds = accepted + m.draft_tokens_accepted, rounds + m.rounds
    per_position += np.asarray(m.acceptance_rate_per_position) * m.rounds
  return dict(seconds=seconds, tokens=tokens, acceptance=1 + accepted / rounds, per_position=per_position / rounds)


def one_run(plain, specs, weights, prompts, args, capacity) -> list[dict]:
  """One run: plain, then every k; a row per k with its speed-up over this run's plain time. `weights` is
  (target, mtp); each k's sharded copy lives only while that k is timed."""
  plain_s, plain_tokens = time_plain(plain, plain.shard(weights[0]), prompts, args, capacity)
  new_tokens = args.max_new * len(prompts)
  rows = []
  for k, spec in specs.items():
    r = time_spec(spec, spec.shard(*weights), prompts, args, capacity)
    rows.append(dict(k=k, acceptance=r["acceptance"], per_position=r["per_position"],
                     spec_tps=new_tokens / r["seconds"], plain_tps=new_tokens / plain_s,
                     speedup=plain_s / r["seconds"], equal=r["tokens"] == plain_tokens))
  return rows


def print_run(index: int, count: int, rows: list[dict]) -> None:
  print(f"\nrun {index + 1} of {count}\n")
  print("| k | acceptance length | per position | tokens/s | plain tokens/s | speed-up | tokens == plain |")
  print("|---:|---:|---|---:|---:|---:|:---:|")
  for r in rows:
    print(f"| {r['k']} | {r['acceptance']:.2f} | {[round(float(x), 2) for x in r['per_position']]} | "
          f"{r['spec_tps']:,.0f} | {r['plain_tps']:,.0f} | {r['speedup']:.2f}× | {'yes' if r['equal'] else 'NO'} |",
          flush=True)


def print_summary(runs: list[list[dict]]) -> None:
  """Per k over the runs: the median speed-up and its min–max, the median acceptance length and tokens/s."""
  print(f"\nover {len(runs)} runs: median (min–max)\n")
  print("| k | speed-up | acceptance length | tokens/s | plain tokens/s | tokens == plain in every run |")
  print("|---:|---:|---:|---:|---:|:---:|")
  for i, k in enumerate(r["k"] for r in runs[0]):
    per_k = [run[i] for run in runs]
    speedups = [r["speedup"] for r in per_k]
    median = {key: statistics.median(r[key] for r in per_k) for key in ("acceptance", "spec_tps", "plain_tps")}
    print(f"| {k} | {statistics.median(speedups):.2f}× ({min(speedups):.2f}–{max(speedups):.2f}) | "
          f"{median['acceptance']:.2f} | {median['spec_tps']:,.0f} | {median['plain_tps']:,.0f} | "
          f"{'yes' if all(r['equal'] for r in per_k) else 'NO'} |")


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--checkpoint", default="jax_mtp/default_model")
  p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5])
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--max-new", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--runs", type=int, default=3, help="independent runs; speed-ups are reported as their median")
  p.add_argument("--dtype", default=None, help="compute dtype (default: the checkpoint's)")
  args = p.parse_args()
  if min(args.runs, args.repeats, args.prompts) < 1:
    p.error("--runs, --repeats and --prompts must be ≥ 1")
  cfg = from_hf_config(args.checkpoint)
  if args.dtype:
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
  cfg, target, mtp = load_hf_checkpoint(args.checkpoint, cfg=cfg, progress=False)
  prompts = unseen_prompts(args.checkpoint, args.prompts, args.prompt_len)
  mesh = make_mesh(1)
  capacity = required_capacity(cfg, prompts[:1], args.max_new, max(args.k))
  plain = TargetDecoder(cfg, mesh)
  specs = {k: Speculator(cfg, mesh, k) for k in args.k}  # kept across runs: each compiles once
  print(f"{args.checkpoint} ({cfg.model_type}, {cfg.dtype}) on {jax.devices()[0].device_kind}; B = 1, "
        f"{len(prompts)} prompts of {args.prompt_len} tokens the model never trained on, {args.max_new} new tokens "
        f"each; {args.runs} runs, each time the best of {args.repeats} calls")
  runs = []
  for i in range(args.runs):
    runs.append(one_run(plain, specs, (target, mtp), prompts, args, capacity))
    print_run(i, args.runs, runs[-1])
  print_summary(runs)


if __name__ == "__main__":
  main()
