"""The one tolerance table. Errors are measured relative to the reference's largest magnitude
(max|a − b| ≤ rtol · max|b| + atol), which stays meaningful where single elements are near zero.
Token ids, argmax indices and top-k sets are compared exactly, never through this table.
"""

import numpy as np

from jax_mtp.greedy_check import NEAR_TIE

TOLERANCE = {
    # fp32 end to end; differences are summation order (XLA vs torch) over ≤ a few hundred terms.
    "float32": dict(rtol=1e-5, atol=1e-6),
    # bf16 activations: ~3 significant digits, a block adds a handful of roundings.
    "bfloat16": dict(rtol=2e-2, atol=1e-3),
    # float8 e4m3 storage (the DSA indexer's keys): 3 mantissa bits, one rounding of at most 2^-4
    # relative per stored element; sums of such terms stay within it relative to the largest.
    "float8_e4m3fn": dict(rtol=2**-4, atol=1e-3),
    # Index scores with q and the keys both in e4m3 (the official FP8 indexer): each product q_j · k_j within
    # (1 + 2^-4)^2 − 1 < 2^-3 of its value, two roundings where the keys alone make one.
    "float8_e4m3fn_qk": dict(rtol=2**-3, atol=1e-3),
    # A float8 × float8 wgmma on Hopper against fp32 sums of the same products: the tensor cores keep ~14 bits of
    # the running sum (DeepSeek-V3 technical report, §3.3.2, measured on H800), so J products are within J · 2^-14
    # (2^-7 at the indexer's J = 128) of the largest term if every truncation fell the same way; random scores
    # measured 2.5e-4 (~2^-12) at J = 128 on the H200 (benchmarks/RESULTS.md, 2026-12-05). 2^-9: 8x that, 4x under
    # the worst case. Pallas's GPU interpreter sums in fp32: the "float32" row holds there.
    "float8_wgmma": dict(rtol=2**-9, atol=1e-6),
    # An fp32 operand as two 16-bit parts, hi + lo (`mla.split16`), beside exact bf16 values, fp32 sums: hi + lo keep
    # 16 of fp32's 24 significant bits (2^-17 relative each); a softmax over scores of magnitude up to ~8 turns that
    # into ≤ 2^-14 relative in the probabilities, which the output's convex combination keeps.
    "bfloat16_split": dict(rtol=2**-14, atol=1e-6),
    # Attention over an fp8 MLA cache (e4m3 latent, one fp32 scale per 128 values) against a bf16 one: e4m3's
    # step is 2^-3 relative, so each dequantised latent is within 2^-4 of its value (round to nearest; the values
    # far below their group's amax, subnormal in e4m3, within 2^-10 of amax). The output is a convex combination of
    # latents (≤ 2^-4 · max|c| from the values) under probabilities whose scores moved by as much relative to their
    # terms: one full step, 2^-3, bounds both relative to the output's largest; bf16's own 2^-9 is far below it.
    "fp8_mla_cache": dict(rtol=2**-3, atol=1e-3),
}


def assert_close(actual, expected, dtype: str = "float32", what: str = "") -> None:
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
  tol = TOLERANCE[dtype]
  err = np.max(np.abs(actual - expected))
  bound = tol["rtol"] * np.max(np.abs(expected)) + tol["atol"]
  assert err <= bound, f"{what}: max |diff| {err:.3g} > {bound:.3g} (scale {np.max(np.abs(expected)):.3g})"


# Greedy tokens compared across implementations (a kernel against XLA's form, both in bf16): their logits differ
# by roundings — bf16's step is 2^-8 relative, and a layer stack adds a few — so the tokens are theirs to agree on
# only where the target's top two logits are further apart (`tests.greedy.greedy_margin`). 2^-6: four bf16 steps.
# A test's prompts whose margin is below it have a near-tie, which says nothing about the kernel: pick others.
# `decode --check` judges a 16-bit model's differences by the same value (jax_mtp.greedy_check.NEAR_TIE).
GREEDY_MIN_MARGIN = NEAR_TIE

# Sampling tests: the smallest chi-square goodness-of-fit p-value accepted for sampled token counts
# against the distribution they should follow. The seeds are fixed, so a test is deterministic; the
# bound is the false-alarm rate should a seed or the sample size change.
SAMPLING_MIN_PVALUE = 1e-3
