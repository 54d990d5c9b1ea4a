# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Speculative decoding with the MTP drafter
#
# The target model emits one token per forward pass. Speculative decoding lets a cheap drafter (here
# the MTP layer, fed the target's own hidden states) guess the next k tokens, and then checks all k
# with **one** target forward over the window `[t1, d1 … dk]`. Each round (`jax_mtp.Speculator`):
#
# ```
# propose   the MTP layer catches up on the target hiddens committed last round, drafts d1 … dk
# verify    one target forward over [t1, d1 … dk] at positions length … length + k
# accept    greedy: the longest prefix with d(j+1) == the target's argmax at j, plus one bonus token
# commit    length += a + 1; the last emitted token is the next round's t1
# ```
#
# A round therefore emits between 1 and k + 1 tokens for one target forward. Rejected drafts are
# rolled back by the committed length alone: they sit at positions ≥ length, which the next round
# overwrites before anything reads them (the docstring of `jax_mtp/speculative.py` has the design).
#
# This notebook runs it end to end on the tiny config, on one CPU device, with random weights.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp

print(f"jax {jax.__version__} on {jax.devices()[0].platform}")

# %% [markdown]
# ## A target model and its MTP drafter
#
# The target is a DeepSeek-V3.2-shaped model with one decoder layer (MLA + DSA indexer + MLP; the real
# model has 61, and one keeps this notebook quick: nothing below depends on depth). The drafter is one
# MTP layer. Both have random weights, so the drafter was never trained to predict this target and
# most drafts are wrong. With the tiny config's 256-token vocab almost none would be accepted; a
# 16-token vocab (the tests use 8) lets some drafts be right by chance, so the acceptance metrics
# below have something to count.
#
# `Speculator(cfg, mesh, k)` builds the target and the drafter on a tp mesh (here tp = 1; notebook 02
# shows the mesh). `shard` places both parameter trees; the drafter uses the target's embedding and
# head (one copy, as vLLM shares them), so the MTP tree's own are dropped.

# %%
cfg = jax_mtp.tiny(vocab_size=16, num_hidden_layers=1)
target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
print("target:", sorted(target_params))
print("MTP:   ", sorted(mtp_params))

k = 3  # draft tokens per round
mesh = jax_mtp.make_mesh(1)
spec = jax_mtp.Speculator(cfg, mesh, num_speculative_tokens=k)
params = spec.shard(target_params, mtp_params)

# %% [markdown]
# ## A ragged batch, and the plain target as the reference
#
# Prompts of different lengths decode together. They are right-padded to the longest and prefilled at
# positions 0 … T−1; from then on each row has its own committed length, its own positions in every
# call, and advances by its own a + 1 per round (positions, not masks). A row that has its
# `max_new_tokens` freezes while the others go on.
#
# Greedy speculative decoding must give **exactly** the target's own greedy output: every emitted
# token is the target's argmax given the tokens before it, whether the draft guessed it or not.
# `TargetDecoder` decodes with the target alone, one token per forward; given the speculator's cache
# capacity, both run under identical cache shapes.

# %%
prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 4], [13]]
max_new = 24
capacity = max(map(len, prompts)) + max_new + k  # what Speculator.generate uses by default

result = spec.generate(params, prompts, max_new)
decoder = jax_mtp.TargetDecoder(cfg, mesh)
plain = decoder.generate(decoder.shard(target_params), prompts, max_new, capacity=capacity)

for prompt, tokens, reference in zip(prompts, result.tokens, plain):
  print(f"prompt {prompt}\n  speculative {tokens}\n  target only {reference}")
assert result.tokens == plain

# %% [markdown]
# The recurring fragments are the random weights over a 16-token vocab, not a table of the last token:
# every weight starts at normal(0.02), the embedding included (HF's `initializer_range`), so the layers
# (attention over the cache, the experts) decide each token, and the equality above tests them. With a
# far larger embedding the tokens would follow from the last one alone, whatever the layers computed.

# %% [markdown]
# What ran: `auto` picks each part's implementation by platform and call shape, and the speculator reads what its
# compiled prefill and round hold (the kernels' launch names, the model's named scopes). On a CPU: XLA's forms and
# gathered experts; on an H100 or H200 the Mosaic GPU kernels (`docs/kernels.md`). `python -m jax_mtp.decode`
# prints the same line after every run.

# %%
for program, parts in spec.kernels_ran().items():
  print(program, parts)

# %% [markdown]
# ## What the metrics count
#
# `result.metrics` (`SpecMetrics`) counts per (row, round), as vLLM does. A row takes part in a round
# while it still needs tokens; in each, it proposes k drafts and accepts a ∈ [0, k] of them.
#
# * `acceptance_length_mean` = 1 + accepted / rounds: tokens emitted per target forward, in [1, k + 1].
#   This is the ideal speed-up over plain decoding, before the drafter's cost and the wider
#   verification forward.
# * `acceptance_rate_per_position[i]`: the fraction of rounds in which draft i was accepted. Draft i
#   counts only if drafts 0 … i−1 were too, so the rates never increase with i.
# * `draft_tokens_proposed` = k · rounds, `draft_tokens_accepted` = Σ a.
# * `tokens_per_second` excludes compilation (the prefill and the round are compiled ahead of time);
#   `compile_seconds` is what this call spent compiling them (0 when a call of the same shapes did).

# %%
m = result.metrics
for name, value in m.as_dict().items():
  print(f"{name:>30} = {value}")
print(f"{'rounds':>30} = {m.rounds}  (over {len(prompts)} rows)")

assert m.acceptance_length_mean == 1 + m.draft_tokens_accepted / m.rounds
assert m.acceptance_rate_per_position == [n / m.rounds for n in m.accepted_per_position]
assert all(a >= b for a, b in zip(m.acceptance_rate_per_position, m.acceptance_rate_per_position[1:]))
assert m.draft_tokens_proposed == k * m.rounds

# %% [markdown]
# Per row: the first token comes from the prefill and every round emits a + 1 more (cut at
# `max_new_tokens`), so a row needs `max_new − 1` rounds if no draft is ever right, and fewer the more
# are. `result.state`, the final decode state kept for inspection, has each row's rounds. The batch
# runs until its slowest row is done (finished rows freeze and wait), so the target forwards a batch
# saves are those of that row.

# %%
rounds_B = np.asarray(result.state.stats.rounds_B)
for prompt, rounds in zip(prompts, rounds_B):
  print(f"prompt {str(prompt):<23} {rounds} rounds for the {max_new - 1} tokens after the first")
print(f"batched target forwards after the prefill: plain {max_new - 1}, speculative {rounds_B.max()}")
assert rounds_B.sum() == m.rounds and rounds_B.max() <= max_new - 1

# %% [markdown]
# ## The ceiling: drafts that are always right
#
# A perfect drafter has every draft accepted: k + 1 tokens per round, every per-position rate 1. The
# tests build one as a test double (an oracle that reads the target's known continuation); with the
# public API alone, the simplest way to get there is a target whose next token is trivially
# predictable. With a zero `lm_head` every logit is 0, the argmax ties go to the lowest id, and the
# target always says token 0; the drafter shares the head, so it always drafts 0 too. Not a useful
# model, but the metrics show their upper end. (The parameters are arguments of the compiled round, so
# nothing recompiles.)

# %%
zero_head = dict(target_params, lm_head=jnp.zeros_like(target_params["lm_head"]))
perfect = spec.generate(spec.shard(zero_head, mtp_params), prompts, max_new)
pm = perfect.metrics
print("tokens:", perfect.tokens[0][:8], "…")
print("acceptance_length_mean:", pm.acceptance_length_mean, "  per position:", pm.acceptance_rate_per_position)
print(f"rounds: {pm.rounds} = {len(prompts)} rows × ⌈(max_new − 1) / (k + 1)⌉")
assert pm.acceptance_length_mean == k + 1 and pm.acceptance_rate_per_position == [1.0] * k
assert pm.rounds == len(prompts) * -(-(max_new - 1) // (k + 1))

# %% [markdown]
# ## Sampling: temperature > 0 and rejection sampling
#
# At temperature τ > 0 the target samples from p = softmax(logits / τ). The drafts stay greedy (the
# draft distribution q is one-hot at the draft d, as vLLM runs MTP), and each draft is verified by
# rejection sampling (Leviathan et al. 2023; Chen et al. 2023):
#
# ```
# accept d(j+1) with probability min(1, p_j(d) / q_j(d)) = p_j(d(j+1))
# on the first rejection, at j = a:   sample from p_a with d(a+1) removed (renormalised)
# if all k are accepted:             sample the bonus token from p_k
# ```
#
# Every emitted token is then distributed exactly as the target's own sample: P(d) = p(d), and for
# x ≠ d, P(x) = (1 − p(d)) · p(x) / (1 − p(d)) = p(x). The output is not the plain decoder's token
# for token (different random draws), but it has the same distribution; the tests check that
# statistically. The `seed` makes a run reproducible.

# %%
sampled = spec.generate(params, prompts, max_new, temperature=0.8, seed=1)
again = spec.generate(params, prompts, max_new, temperature=0.8, seed=1)
for tokens in sampled.tokens:
  print(tokens)
print("acceptance_length_mean at τ = 0.8:", round(sampled.metrics.acceptance_length_mean, 3))
assert again.tokens == sampled.tokens

# %% [markdown]
# The temperature is a traced value of the compiled sampling round, so another τ compiles nothing. As
# τ → 0, p concentrates on the argmax: a draft the greedy target would accept has p(d) ≈ 1, and the
# sampled output becomes the greedy one.

# %%
cold = spec.generate(params, prompts, max_new, temperature=0.001, seed=1)
print("τ = 0.001 equals greedy:", cold.tokens == plain)
assert cold.tokens == plain

# %% [markdown]
# `top_k` and `top_p` restrict p before any of this, as vLLM's sampler does: the `top_k` most likely tokens,
# then the fewest of those, most likely first, whose probability reaches `top_p`, renormalised. Rejection
# sampling then keeps that filtered distribution exactly (a draft outside it has p(d) = 0 and is rejected).
# Restricted to one token, hot sampling is greedy decoding:

# %%
one_token = spec.generate(params, prompts, max_new, temperature=1.0, top_k=1, seed=1)
print("τ = 1 with top_k = 1 equals greedy:", one_token.tokens == plain)
assert one_token.tokens == plain

# %% [markdown]
# ## Checking against vLLM
#
# `tests/golden/` holds runs of vLLM 0.32.0 (CPU, fp32) with its MTP layer as the speculative decoder,
# in the format of `jax_mtp.reference.fixtures`: the prompt, vLLM's greedy output, its log-probs at
# every position, and every target and MTP call it made. The tiny DeepSeek-V3 checkpoint it ran is
# rebuilt here from a numpy seed (its digest is in the fixture) and loaded by our own HF loader. Our
# `Speculator` must then emit vLLM's tokens, and our target vLLM's log-probs.
# (`tests/test_vllm_parity.py` goes further: every hidden, logits row and draft of every call.)

# %%
import tempfile

from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.reference import fixtures, tiny_checkpoint

meta, ref = fixtures.load("../tests/golden/v3_k3.npz")
print(meta["engine"], "· k =", meta["num_speculative_tokens"])
ckpt_dir = tempfile.mkdtemp()
source = meta["checkpoint"]
assert tiny_checkpoint.write(ckpt_dir, tiny_checkpoint.config(source["config"]), source["seed"]) == source["weights_sha256"]
v3_cfg = jax_mtp.from_hf_config(ckpt_dir).replace(dtype="float32", param_dtype="float32")
v3_cfg, v3_target, v3_mtp = load_hf_checkpoint(ckpt_dir, cfg=v3_cfg)

v3_spec = jax_mtp.Speculator(v3_cfg, jax_mtp.make_mesh(1), meta["num_speculative_tokens"])
ours = v3_spec.generate(v3_spec.shard(v3_target, v3_mtp), [ref["prompt_ids"].tolist()], len(ref["output_ids"]))
print("vLLM:", ref["output_ids"].tolist())
print("ours:", ours.tokens[0], "· drafts accepted", ours.metrics.draft_tokens_accepted, "/", ours.metrics.draft_tokens_proposed)
assert ours.tokens[0] == ref["output_ids"].tolist()

# %%
tokens = np.concatenate([ref["prompt_ids"], ref["output_ids"][:-1]])
v3_model = jax_mtp.TargetModel(v3_cfg)
caches = jax_mtp.init_target_caches(v3_cfg, 1, len(tokens))
hidden = v3_model.apply({"params": v3_target}, tokens[None], np.arange(len(tokens))[None], caches).hidden_BTD
log_p = jax.nn.log_softmax(v3_model.apply({"params": v3_target}, hidden, method="compute_logits")[0], axis=-1)
err = float(jnp.max(jnp.abs(log_p - ref["target_logprobs"])))
print(f"max |log p (ours) − log p (vLLM)| over {len(tokens)} positions × {v3_cfg.vocab_size} tokens: {err:.1e}")
assert err < 1e-4

# %% [markdown]
# ## The trained default: real acceptance
#
# Random weights say nothing about how often drafts are right. The package ships a trained model
# (`jax_mtp/default_model/`, README "The embedded default"): a 7M-parameter DeepSeek-V3.2-architecture
# target of 4 layers and its MTP layer, trained jointly on the Python standard library's sources by
# `python -m jax_mtp.train`. It is an ordinary HF checkpoint directory, loaded by the same loader as a
# real one, with its `tokenizer.json`. Below: for k = 1 … 5, decode three code prompts (B = 1 each)
# speculatively and plainly, check the tokens agree, and time both after a compiling call.

# %%
import time

import matplotlib.pyplot as plt

d_cfg, d_target, d_mtp, _ = jax_mtp.load(jax_mtp.DEFAULT_MODEL)
codec = jax_mtp.TextCodec(jax_mtp.DEFAULT_MODEL)
texts = ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "import os\nimport sys\n\n\ndef main("]
d_prompts = [codec.encode(text) for text in texts]
new_tokens = 48


def best_seconds(fn):
  fn()  # the first call compiles
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


plain_decoder = jax_mtp.TargetDecoder(d_cfg, mesh)
plain_params = plain_decoder.shard(d_target)
capacity = max(map(len, d_prompts)) + new_tokens + 5  # one cache shape for every k and for plain decoding
plain_s, plain_out = 0.0, []
for prompt in d_prompts:
  seconds, out = best_seconds(lambda: plain_decoder.generate(plain_params, [prompt], new_tokens, capacity=capacity))
  plain_s, plain_out = plain_s + seconds, plain_out + out
print(texts[0] + codec.decode(plain_out[0]))

# %%
runs = {}
for k_ in range(1, 6):
  s = jax_mtp.Speculator(d_cfg, mesh, k_)
  p = s.shard(d_target, d_mtp)
  seconds, results = 0.0, []
  for prompt in d_prompts:
    t, r = best_seconds(lambda: s.generate(p, [prompt], new_tokens, capacity=capacity))
    seconds, results = seconds + t, results + [r]
  assert [r.tokens[0] for r in results] == plain_out  # speculative == plain greedy, every k
  rounds = sum(r.metrics.rounds for r in results)
  per_position = np.sum([np.asarray(r.metrics.accepted_per_position) for r in results], axis=0) / rounds
  runs[k_] = dict(acceptance_length=1 + per_position.sum(), per_position=per_position,
                  tokens_per_s=len(d_prompts) * new_tokens / seconds)
  print(f"k = {k_}: acceptance length {runs[k_]['acceptance_length']:.2f}, per position {np.round(per_position, 2)}, "
        f"{runs[k_]['tokens_per_s']:.0f} tokens/s (plain {len(d_prompts) * new_tokens / plain_s:.0f})")
assert runs[3]["acceptance_length"] > 1.5  # a trained drafter: most rounds emit more than one token

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
for k_, run in runs.items():
  left.plot(range(1, k_ + 1), run["per_position"], marker="o", label=f"k = {k_}")
left.set(xlabel="draft position", ylabel="acceptance rate", title="Drafts accepted, by position", ylim=(0, 1))
left.legend()
ks = list(runs)
right.plot(ks, [runs[k_]["tokens_per_s"] for k_ in ks], marker="o", label="speculative")
right.axhline(len(d_prompts) * new_tokens / plain_s, color="gray", linestyle="--", label="plain greedy")
right.set(xlabel="k (draft tokens per round)", ylabel="tokens / s", title=f"B = 1 on {jax.devices()[0].platform}")
right.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Acceptance falls with the draft position (draft i counts only if drafts before it were right), so
# the acceptance length grows ever more slowly with k. The tokens/s panel is honest about this model:
# a 4-layer, 7M-parameter target is not bound by reading its weights. On a CPU a step is compute-bound,
# verifying k + 1 tokens costs several plain steps, and speculative decoding does not pay; on an H200
# a step costs a fixed ~1.5 ms per call, a round (queued ahead of the host) ~1.25 plain steps, and
# k = 3 runs 1.56× plain decoding (median of 3 runs; README, "The embedded default"). On a model whose step reads
# gigabytes of weights, the same acceptance buys its speed-up everywhere.
