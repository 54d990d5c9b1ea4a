"""Speculative vs plain greedy decoding of one checkpoint, B = 1, in one run: tokens/s per k, the
acceptance, and whether the tokens equal plain decoding's (they must).

    python -m benchmarks.spec_vs_plain --checkpoint jax_mtp/default_model --k 1 2 3 4 5

Prompts are held-out windows of the corpus the default was trained on (the Python stdlib's sources,
`jax_mtp.corpus`'s split) through the checkpoint's tokenizer; rows never stop at EOS (as vLLM's
--ignore-eos benchmarks), so every k decodes the same number of tokens. Each time is the best of
`--repeats` calls after one warm-up call (which compiles). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jax_mtp import corpus
from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.config import from_hf_config
from jax_mtp.generate import TargetDecoder
from jax_mtp.request import required_capacity
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import Speculator


def held_out_prompts(checkpoint: str, count: int, length: int) -> list[list[int]]:
  import tokenizers  # noqa: PLC0415
  tok = tokenizers.Tokenizer.from_file(f"{checkpoint}/tokenizer.json")
  data = corpus.TokenData.build(corpus.default_corpus(), tok)
  return [row.tolist() for row in data.held_out_batches(1, count, length)[0]]


def best_time(fn, repeats: int):
  fn()  # compiles
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return min(times), out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--checkpoint", default="jax_mtp/default_model")
  p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5])
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--max-new", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--dtype", default=None, help="compute dtype (default: the checkpoint's)")
  args = p.parse_args()
  cfg = from_hf_config(args.checkpoint)
  if args.dtype:
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
  cfg, target, mtp = load_hf_checkpoint(args.checkpoint, cfg=cfg, progress=False)
  prompts = held_out_prompts(args.checkpoint, args.prompts, args.prompt_len)
  mesh = make_mesh(1)
  capacity = required_capacity(cfg, prompts[:1], args.max_new, max(args.k))
  plain = TargetDecoder(cfg, mesh)
  plain_params = plain.shard(target)
  rows, plain_s, plain_tokens = [], 0.0, []
  for prompt in prompts:  # B = 1: one prompt per call
    seconds, tokens = best_time(lambda: plain.generate(plain_params, [prompt], args.max_new, capacity=capacity),
                                args.repeats)
    plain_s, plain_tokens = plain_s + seconds, plain_tokens + tokens
  new_tokens = args.max_new * len(prompts)
  print(f"{args.checkpoint} ({cfg.model_type}, {cfg.dtype}) on {jax.devices()[0].device_kind}; B = 1, "
        f"{len(prompts)} held-out prompts of {args.prompt_len} tokens, {args.max_new} new tokens each\n")
  print("| k | acceptance length | per position | tokens/s | plain tokens/s | speed-up | tokens == plain |")
  print("|---:|---:|---|---:|---:|---:|:---:|")
  for k in args.k:
    spec = Speculator(cfg, mesh, k)
    params = spec.shard(target, mtp)
    spec_s, tokens, accepted, proposed, rounds, per_position = 0.0, [], 0, 0, 0, np.zeros(k)
    for prompt in prompts:
      seconds, result = best_time(lambda: spec.generate(params, [prompt], args.max_new, capacity=capacity),
                                  args.repeats)
      m = result.metrics
      spec_s, tokens = spec_s + seconds, tokens + result.tokens
      accepted, proposed, rounds = accepted + m.draft_tokens_accepted, proposed + m.draft_tokens_proposed, rounds + m.rounds
      per_position += np.asarray(m.acceptance_rate_per_position) * m.rounds
    rows.append((k, 1 + accepted / rounds, per_position / rounds, new_tokens / spec_s, new_tokens / plain_s))
    print(f"| {k} | {1 + accepted / rounds:.2f} | {[round(float(x), 2) for x in per_position / rounds]} | "
          f"{new_tokens / spec_s:,.0f} | {new_tokens / plain_s:,.0f} | {plain_s / spec_s:.2f}× | "
          f"{'yes' if tokens == plain_tokens else 'NO'} |", flush=True)


if __name__ == "__main__":
  main()
