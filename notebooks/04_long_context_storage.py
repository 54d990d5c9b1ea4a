# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Long context: what a token costs to keep, and the FP8 caches
#
# At long context most of a decode step's bytes are no longer the weights but the caches. DeepSeek-V3.2
# keeps two per layer: the **MLA cache** (the 512-value latent `c` and the 64-value rope key `k_pe`, which
# every head reads) and the **indexer's keys** (one 128-value key a token, which the lightning indexer
# scores in full at every step to pick the `index_topk` = 2,048 entries the attention reads).
#
# Both can be stored in FP8, as vLLM and DeepSeek's own inference code serve V3.2:
#
# ```
# --kv-cache-dtype fp8        the latent in e4m3 + one fp32 scale per 128 values, k_pe in the compute dtype
# --index-cache-dtype fp8     the indexer's keys in e4m3 + one fp32 scale a token (its queries then rounded
#                             to e4m3 too, one scale a token and head, as in their FP8 indexer)
# ```
#
# This notebook counts what each storage costs at V3.2's widths, how many rows and how much context fit
# an H200 beside the weights, and checks on the tiny model that speculative decoding still equals plain
# greedy decoding with FP8 caches (both read the same quantised entries). It runs on a CPU.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp

print(f"jax {jax.__version__} on {jax.devices()[0].platform}")

# %% [markdown]
# ## Bytes per token, per layer
#
# `init_layer_cache(cfg, batch, capacity)` builds one layer's cache; under `jax.eval_shape` it allocates
# nothing, so the full-size V3.2 config costs no memory here. Each field's bytes per token are its
# trailing dimensions times its dtype's size.

# %%
def bytes_per_token(cfg: jax_mtp.MtpConfig) -> dict[str, int]:
  layer = jax.eval_shape(lambda: jax_mtp.init_layer_cache(cfg, 1, 1))
  sizes = {}
  for name in ("latent_BSC", "latent_scale_BSG", "k_pe_BSR", "index_k_BSJ", "index_k_scale_BS"):
    field = getattr(layer, name)
    if field is not None:
      sizes[name] = int(np.prod(field.shape[2:], dtype=int)) * jnp.dtype(field.dtype).itemsize
  return sizes


storages = {"bf16 / bf16": dict(kv_cache_dtype="bfloat16", index_cache_dtype="bfloat16"),
            "fp8 MLA / bf16 keys": dict(kv_cache_dtype="fp8", index_cache_dtype="bfloat16"),
            "fp8 / fp8 (vLLM's V3.2)": dict(kv_cache_dtype="fp8", index_cache_dtype="fp8")}
per_token = {}
for name, storage in storages.items():
  sizes = bytes_per_token(jax_mtp.deepseek_v32(**storage))
  mla = sum(v for k, v in sizes.items() if not k.startswith("index"))
  index = sum(v for k, v in sizes.items() if k.startswith("index"))
  per_token[name] = (mla, index)
  print(f"{name:26s} MLA {mla:5,d} B  indexer {index:3d} B  = {mla + index:5,d} B a token a layer   {sizes}")

assert per_token["bf16 / bf16"] == (1152, 256)  # (512 + 64) · 2, 128 · 2
assert per_token["fp8 / fp8 (vLLM's V3.2)"] == (656, 132)  # 512 + 4 · 4 + 64 · 2, 128 + 4

# %% [markdown]
# ## What fits an H200
#
# V3.2 has 61 decoder layers and one MTP layer, each with both caches. A row of context C holds
# 62 · C · (bytes a token a layer). The weights come first: the full model's FP8 weights do not fit one
# H200 (≈ 690 GB; tensor parallelism over 8 splits the heads, but DSA's caches hold all of them: the
# latent is shared by every head, MQA-style), so the table counts **one device's** cache memory in GB at
# each batch and context, against the ~50 GB an 8-way node leaves a device beside its share of FP8
# weights.

# %%
LAYERS = 61 + 1
contexts = [4096, 32768, 131072]
print("GB of caches a device holds" + "".join(f"{c // 1024:>10d}K" for c in contexts))
for name, (mla, index) in per_token.items():
  for batch in (8, 64):
    row = [LAYERS * batch * c * (mla + index) / 1e9 for c in contexts]
    print(f"{name:26s} B = {batch:3d}" + "".join(f"{gb:11.1f}" for gb in row))

# %% [markdown]
# In ~50 GB, bf16 caches hold 8 rows of 32K (23 GB) but not 8 of 128K (92 GB); FP8 caches hold 8 of 128K
# at the edge (51 GB). 64 rows of 32K need 183 GB in bf16 and 103 GB in FP8, beyond one device either way,
# which is why serving stacks split the batch over data-parallel attention. The ratio is what FP8 buys:
# **the same memory holds 1.8× the tokens**, and every step reads fewer bytes. The indexer's keys are read
# whole each step (the 2,048 entries attended are picked from scores over all C), so at 128K their bytes
# set a floor under the step: 131,072 × 256 B = 34 MB a row a layer in bf16, about half that in FP8.

# %%
index_mb = {name: 131072 * index / 1e6 for name, (_, index) in per_token.items()}
print({name: round(mb, 1) for name, mb in index_mb.items()})
assert index_mb["fp8 / fp8 (vLLM's V3.2)"] < 0.6 * index_mb["bf16 / bf16"]

# %% [markdown]
# ## FP8 caches in a speculative run
#
# The tiny model with an `index_topk` of 4 (so the indexer really selects) decodes a ragged batch with
# both caches in FP8. Speculative decoding must equal the target's plain greedy decoding **with the same
# storage** token for token: the verification reads exactly the entries plain decoding would. Against
# the bf16 caches the tokens differ where two logits are within FP8's rounding (here, with random weights
# over a 32-token vocab, rows part after a few tokens, and one row not at all): that is the storage's effect
# on the model, not an error of the speculator.

# %%
def decode(cfg, prompts, max_new=16, k=3):
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  mesh = jax_mtp.make_mesh(1)
  spec = jax_mtp.Speculator(cfg, mesh, num_speculative_tokens=k)
  capacity = max(map(len, prompts)) + max_new + k
  result = spec.generate(spec.shard(target_params, mtp_params), prompts, max_new, capacity=capacity)
  plain_decoder = jax_mtp.TargetDecoder(cfg, mesh)
  plain = plain_decoder.generate(plain_decoder.shard(target_params), prompts, max_new, capacity=capacity)
  return result.tokens, plain


base = jax_mtp.tiny(vocab_size=32, dtype="bfloat16", param_dtype="bfloat16")
assert base.index_topk == 4
prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8], [1, 6]]
fp8_tokens, fp8_plain = decode(base.replace(kv_cache_dtype="fp8", index_cache_dtype="fp8"), prompts)
bf16_tokens, bf16_plain = decode(base, prompts)
assert fp8_tokens == fp8_plain and bf16_tokens == bf16_plain  # speculative == plain, each storage
same = np.mean([a == b for row_a, row_b in zip(fp8_tokens, bf16_tokens, strict=True)
                for a, b in zip(row_a, row_b, strict=True)])
print(f"speculative == plain greedy with fp8 caches and with bf16 caches; "
      f"fp8 and bf16 storage agree on {same:.0%} of the tokens")

# %% [markdown]
# ## On the command line
#
# ```bash
# python -m jax_mtp.decode --checkpoint deepseek-ai/DeepSeek-V3.2-Exp --kv-cache-dtype fp8 --index-cache-dtype fp8
# ```
#
# `auto` (the default of both) keeps the caches in the compute dtype: no checkpoint config names a cache
# dtype, and FP8 changes the numbers against the Hugging Face reference the parity tests use. On Hopper GPUs
# `auto` runs the sparse attention over an FP8 MLA cache in the Mosaic GPU kernel, which dequantises the
# gathered codes in shared memory (elsewhere XLA's sparse form does it), and the indexer's scores read FP8 keys
# in the Mosaic GPU kernel.
# Which kernels run, and how fast: `docs/kernels.md` and `benchmarks/RESULTS.md`.
