"""`decode --check`: speculative greedy output against plain greedy decoding with the target alone, each row's first
difference judged by the target's margin there.

Greedy speculative decoding emits the target's own greedy tokens, so the outputs match — up to a near-tie. The
verification runs k + 1 tokens a call and a plain step one, and in a 16-bit model the two round differently: where the
target's two largest logits lie within NEAR_TIE of each other (relative to the largest), either form may pick either
token, and the rows' later tokens follow different prefixes. So a row's first difference counts against the check
unless, in a 16-bit model, the plain decoder's choice there was a near-tie (its margin measured by one prefill over
the prompt and the tokens before it, `TargetDecoder.top2_margins`; 0 where that form's greedy token is another: a tie
between forms). fp32 models round far below any tie: every difference counts.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mtp.config import MtpConfig
from jax_mtp.generate import TargetDecoder

# Two forms of one 16-bit model may pick either token where the target's top two logits lie within this of each
# other, relative to the largest: four bf16 steps (tests/tolerances.py's GREEDY_MIN_MARGIN is this value)
NEAR_TIE = 2**-6


def first_difference(speculative: list[int], plain: list[int]) -> int | None:
  """The index of the rows' first differing token (or where the shorter ends), None when they are equal."""
  index = next((i for i, (a, b) in enumerate(zip(speculative, plain)) if a != b), None)
  if index is None and len(speculative) != len(plain):
    return min(len(speculative), len(plain))
  return index


def compare(cfg: MtpConfig, decoder: TargetDecoder, params: dict, prompts: list[list[int]], rows: list[int],
            speculative: list[list[int]], plain: list[list[int]]) -> tuple[bool, list[dict]]:
  """(whether the outputs match up to near-ties, each row's first difference): a difference is {row (`rows`'
  number), index, speculative, plain (the tokens there, None past a row's end), margin (the plain choice's, None
  where a row ended), near_tie}."""
  found = [(i, first_difference(s, p)) for i, (s, p) in enumerate(zip(speculative, plain, strict=True))]
  found = [(i, index) for i, index in found if index is not None]
  judged = [(i, index) for i, index in found if index < len(plain[i])]  # a plain token was chosen there
  margins = decoder.top2_margins(params, [prompts[i] + plain[i][:index] for i, index in judged]) if judged else []
  margin_of = {i: (margin if token == plain[i][index] else 0.0) for (i, index), (token, margin) in zip(judged, margins)}
  sixteen_bit = jnp.dtype(cfg.dtype) != jnp.float32
  differences = []
  for i, index in found:
    margin = margin_of.get(i)
    differences.append({"row": rows[i], "index": index,
                        "speculative": speculative[i][index] if index < len(speculative[i]) else None,
                        "plain": plain[i][index] if index < len(plain[i]) else None, "margin": margin,
                        "near_tie": bool(sixteen_bit and margin is not None and margin < NEAR_TIE)})
  return all(d["near_tie"] for d in differences), differences
