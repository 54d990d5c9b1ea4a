"""`python -m jax_mtp.decode`: run MTP draft steps on the embedded tiny model and print the drafts.

This is the foundation-stage entry point: it builds the tiny DeepSeek-V3.2-shaped MTP predictor
from a seed, feeds it a prompt's (stand-in) target hidden states, and runs k greedy draft steps
with post-norm hidden recycling. End-to-end speculative decoding with a target model replaces the
stand-in hidden states in the decode issue (#5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m jax_mtp.decode", description=__doc__.splitlines()[0])
  parser.add_argument("--prompt-ids", default="1,2,3,4,5,6,7,8", help="comma-separated token ids")
  parser.add_argument("--num-speculative-tokens", type=int, default=3, help="draft steps k (≥ 1)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
  return parser.parse_args(argv)


def _prompt(text: str, vocab_size: int) -> np.ndarray:
  try:
    ids = np.array([int(tok) for tok in text.split(",") if tok.strip()], np.int32)
  except ValueError:
    raise ValueError(f"--prompt-ids {text!r} is not a comma-separated list of integers") from None
  if ids.size < 2:
    raise ValueError(f"--prompt-ids {text!r} needs at least 2 tokens (one hidden state and the next token)")
  bad = ids[(ids < 0) | (ids >= vocab_size)]
  if bad.size:
    raise ValueError(f"--prompt-ids holds {int(bad[0])}, outside [0, {vocab_size}) (vocab_size)")
  return ids


def draft(cfg: jax_mtp.MtpConfig, params, prompt_T: np.ndarray, k: int, seed: int) -> list[int]:
  """Greedy drafts d1..dk after `prompt`, from stand-in target hidden states.

  The prompt's last token plays the target's sampled token t1; a random hidden stands in for the
  target's post-norm hidden of each earlier token.
  """
  model = jax_mtp.MtpPredictor(cfg)
  n = len(prompt_T) - 1  # hidden states h(0..n-1), paired with the tokens after them
  hidden_BND = jax.random.normal(jax.random.key(seed + 1), (1, n, cfg.hidden_size), jnp.float32)
  caches = jax_mtp.init_caches(cfg, 1, n + k)
  step = jax.jit(lambda p, *a: model.apply({"params": p}, *a))
  top = jax.jit(lambda p, h: model.apply({"params": p}, h, method=model.get_top_tokens))
  out = step(params, jnp.asarray(prompt_T[None, 1:]), jnp.arange(n, dtype=jnp.int32)[None], hidden_BND, caches)
  token, hidden, caches = top(params, out.hidden_BTD[:, -1:]), out.next_prev_hidden_BTD[:, -1:], out.caches
  drafts = [int(token[0, 0])]
  for i in range(1, k):
    position = jnp.full((1, 1), n - 1 + i, jnp.int32)
    out = model.apply({"params": params}, token, position, hidden, caches, spec_step_idx=i)
    token, hidden, caches = top(params, out.hidden_BTD), out.next_prev_hidden_BTD, out.caches
    drafts.append(int(token[0, 0]))
  return drafts


def main(argv: list[str] | None = None) -> int:
  args = _parse_args(argv)
  cfg = jax_mtp.tiny()
  try:
    prompt = _prompt(args.prompt_ids, cfg.vocab_size)
    if args.num_speculative_tokens < 1:
      raise ValueError(f"--num-speculative-tokens={args.num_speculative_tokens} must be ≥ 1")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  start = time.perf_counter()
  params = jax_mtp.init_params(cfg, jax.random.key(args.seed))
  drafts = draft(cfg, params, prompt, args.num_speculative_tokens, args.seed)
  seconds = time.perf_counter() - start
  if args.json:
    print(json.dumps({"prompt_ids": prompt.tolist(), "draft_tokens": drafts, "seconds": seconds}))
  else:
    print(f"tiny DeepSeek-V3.2 MTP layer on {jax.devices()[0].platform}: prompt {prompt.tolist()}")
    print(f"draft tokens ({args.num_speculative_tokens} greedy steps): {drafts}   [{seconds:.1f} s]")
  return 0


if __name__ == "__main__":
  sys.exit(main())
