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
# # The DeepSeek-V3.2 MTP draft layer
#
# One multi-token-prediction (MTP, "NextN") step turns the target model's hidden state at position
# *p* and the token at *p + 1* into a guess for the token at *p + 2*:
#
# ```
# e = embed(token);  e = 0 at position 0
# x = eh_proj([enorm(e); hnorm(prev_hidden)])
# h = shared_head.norm(decoder_block(x))      post-norm hidden → head, and the next step's prev_hidden
# ```
#
# This notebook uses only the public API (`import jax_mtp`) on the tiny DeepSeek-V3.2-shaped config,
# on CPU in a few seconds. To look at the layer alone, random vectors stand in for the target
# model's hidden states (`jax_mtp.Speculator` runs it with the real target; see the README).

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp

print(f"jax {jax.__version__} on {jax.devices()[0].platform}")

# %% [markdown]
# ## The tiny config
#
# `jax_mtp.tiny()` has the DeepSeek-V3.2 structure (MLA with a latent KV cache, the DSA sparse-attention
# indexer, a noaux_tc MoE) at toy sizes, in fp32. `index_topk` is smaller than a short prompt, so even
# this notebook goes through the sparse-attention path.

# %%
cfg = jax_mtp.tiny()
for name in ("model_type", "vocab_size", "hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
             "index_n_heads", "index_topk", "num_nextn_predict_layers", "dtype"):
  print(f"{name:>26} = {getattr(cfg, name)}")

# %% [markdown]
# ## Parameters
#
# `init_params` creates every MTP layer, the shared embedding and the head. The checkpoint names
# (`enorm`, `hnorm`, `eh_proj`, `shared_head_norm`, ...) survive in the tree; the routed experts are
# stacked into `[E, ...]` arrays for the grouped matmul.

# %%
params = jax_mtp.init_params(cfg, jax.random.key(0))
for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
  print(f"{jax.tree_util.keystr(path, simple=True, separator='/'):<58} {str(leaf.shape):<12} {leaf.dtype}")
print(f"{len(jax.tree.leaves(params))} arrays, {sum(leaf.size for leaf in jax.tree.leaves(params)):,} parameters")

# %% [markdown]
# ## One MTP step over a prompt
#
# vLLM's convention: `input_ids[t]` is the token *after* the one whose hidden is `prev_hidden[t]`, and
# `positions[t]` is that hidden's position. For a prompt `t0 .. t5` the step therefore gets the
# hiddens `h(0..4)`, the tokens `t1..t5` and the positions `0..4`.

# %%
model = jax_mtp.MtpPredictor(cfg)
prompt = np.array([11, 22, 33, 44, 55, 66], np.int32)
n = len(prompt) - 1
input_ids_BT = jnp.asarray(prompt[None, 1:])
positions_BT = jnp.arange(n, dtype=jnp.int32)[None]
prev_hidden_BTD = jax.random.normal(jax.random.key(1), (1, n, cfg.hidden_size), jnp.float32)  # stand-in h(0..4)
caches = jax_mtp.init_caches(cfg, batch=1, capacity=16)

out = model.apply({"params": params}, input_ids_BT, positions_BT, prev_hidden_BTD, caches)
print("hidden_BTD:", out.hidden_BTD.shape, out.hidden_BTD.dtype)
print("the recycled hidden is the head's hidden:", out.next_prev_hidden_BTD is out.hidden_BTD)
print("cache:", {name: arr.shape for name, arr in out.caches[0]._asdict().items() if arr is not None})
print("RMS of each position's hidden (post-norm, so ~1):", np.round(np.sqrt((out.hidden_BTD**2).mean(-1))[0], 3))

# %% [markdown]
# ## Position 0 sees no token
#
# Nothing precedes position 0, so the layer zeroes the embedding there: whatever token id sits at
# position 0, the hidden comes out the same. (Every later position attends to position 0, so the whole
# output is unchanged.) A different token at position 1 does change the hidden there.


# %%
def mtp_hidden(input_ids_BT):
  return model.apply({"params": params}, input_ids_BT, positions_BT, prev_hidden_BTD, caches).hidden_BTD


other_token_at_0 = mtp_hidden(input_ids_BT.at[0, 0].set(200))
other_token_at_1 = mtp_hidden(input_ids_BT.at[0, 1].set(200))
print("max |Δh| with another token at position 0:", float(jnp.abs(other_token_at_0 - out.hidden_BTD).max()))
print("max |Δh(1)| with another token at position 1:",
      float(jnp.abs(other_token_at_1 - out.hidden_BTD)[0, 1].max()))
np.testing.assert_array_equal(other_token_at_0, out.hidden_BTD)
assert not np.allclose(other_token_at_1[0, 1], out.hidden_BTD[0, 1])

# %% [markdown]
# ## Three greedy draft steps
#
# The prompt's last token `t5` plays the target's freshly sampled token, so the last position's hidden
# gives the first draft `d1`. Each further step feeds the previous draft, one position on, with the
# previous step's **post-norm hidden** as `prev_hidden` (hidden recycling), and writes its key into the
# same cache. Step `i` uses MTP layer `i % num_nextn_predict_layers`.

# %%
k = 3
token_BT = model.apply({"params": params}, out.hidden_BTD[:, -1:], method=model.get_top_tokens)
hidden_BTD, step_caches = out.next_prev_hidden_BTD[:, -1:], out.caches
drafts = [int(token_BT[0, 0])]
for i in range(1, k):
  position_BT = jnp.full((1, 1), n - 1 + i, jnp.int32)
  step = model.apply({"params": params}, token_BT, position_BT, hidden_BTD, step_caches, spec_step_idx=i)
  token_BT = model.apply({"params": params}, step.hidden_BTD, spec_step_idx=i, method=model.get_top_tokens)
  hidden_BTD, step_caches = step.next_prev_hidden_BTD, step.caches
  drafts.append(int(token_BT[0, 0]))
print(f"prompt {prompt.tolist()} → drafts {drafts}")

# %% [markdown]
# ## The head: logits and greedy tokens
#
# `compute_logits` gives the full-vocab fp32 logits; `get_top_tokens` is their argmax (ties → lowest id),
# what the vocab-parallel argmax kernel (issue #3) will compute without gathering the logits.

# %%
logits_BTV = model.apply({"params": params}, out.hidden_BTD, method=model.compute_logits)
top_BT = model.apply({"params": params}, out.hidden_BTD, method=model.get_top_tokens)
print("logits:", logits_BTV.shape, logits_BTV.dtype)
print("argmax(logits):", np.asarray(jnp.argmax(logits_BTV, -1))[0].tolist())
print("get_top_tokens:", np.asarray(top_BT)[0].tolist())
np.testing.assert_array_equal(jnp.argmax(logits_BTV, axis=-1), top_BT)

# %% [markdown]
# ## A real prompt: what DSA selects and where the MoE routes
#
# The trained default (`jax_mtp/default_model/`, a 4-layer DeepSeek-V3.2-architecture target trained on
# Python's stdlib) reads a real snippet. Its DSA indexer keeps `index_topk` = 64 slots per query, so
# past 64 tokens each query attends to the 64 its indexer scores highest, not to everything before it.
# MLA sows each indexer call's selection into the `"dsa"` collection, and each router its tokens per
# expert into `jax_mtp.EXPERT_LOAD` (the counts training balances): asking for those collections
# as mutable returns them beside the output.

# %%
import matplotlib.pyplot as plt

default = jax_mtp.load(jax_mtp.DEFAULT_MODEL)  # any checkpoint: a directory or a Hugging Face repo id
d_cfg, d_target = default.cfg, default.target
codec = jax_mtp.TextCodec(jax_mtp.DEFAULT_MODEL)
snippet = '''def read_config(path):
    """Read a JSON config file and return it as a dict."""
    import json
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path!r} does not hold a JSON object")
    for key, value in data.items():
        if value is None:
            raise ValueError(f"{path!r}: {key} is null")
    return data


def write_config(path, data):
    """Write `data` as JSON to `path`."""
    import json
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
'''
ids = np.asarray(codec.encode(snippet))
t = len(ids)
target = jax_mtp.TargetModel(d_cfg)
positions = np.arange(t)[None]
out, sown = target.apply({"params": d_target}, ids[None], positions, jax_mtp.init_target_caches(d_cfg, 1, t),
                         mutable=["dsa", jax_mtp.EXPERT_LOAD])
print(f"{t} tokens; index_topk = {d_cfg.index_topk}")
assert t > d_cfg.index_topk

# %%
fig, axes = plt.subplots(1, d_cfg.num_hidden_layers, figsize=(3.2 * d_cfg.num_hidden_layers, 3.4))
for layer, ax in enumerate(axes):
  (selection,) = sown["dsa"][f"layers_{layer}"]["self_attn"]["selection"]
  chosen = np.zeros((t, t), bool)
  for q in range(t):
    slots = np.asarray(selection.slots_BTK)[0, q][np.asarray(selection.valid_BTK)[0, q]]
    chosen[q, slots] = True
  assert chosen.sum(axis=1).max() == d_cfg.index_topk and not np.triu(chosen, 1).any()  # ≤ 64, never the future
  ax.imshow(chosen, cmap="Greys", interpolation="nearest")
  ax.set(title=f"layer {layer}: slots attended", xlabel="key slot", ylabel="query" if layer == 0 else None)
plt.tight_layout()
plt.show()

# %% [markdown]
# Up to query 63 every earlier slot is kept (the triangle); from then on each row keeps 64 of them —
# typically the first tokens, the most recent ones, and scattered earlier ones its indexer chose.

# %%
moe_layers = [name for name in sorted(sown[jax_mtp.EXPERT_LOAD]) if "mlp" in sown[jax_mtp.EXPERT_LOAD][name]]
load = np.stack([np.asarray(sown[jax_mtp.EXPERT_LOAD][name]["mlp"]["gate"]["tokens_E"][0]) for name in moe_layers])
assert (load.sum(axis=1) == t * d_cfg.num_experts_per_tok).all()  # every token picks num_experts_per_tok experts
fig, ax = plt.subplots(figsize=(6, 2.4))
image = ax.imshow(load, cmap="viridis")
ax.set(xlabel="routed expert", yticks=range(len(moe_layers)), yticklabels=moe_layers,
       title=f"tokens per expert ({t} tokens × top-{d_cfg.num_experts_per_tok})")
fig.colorbar(image)
plt.show()
print(load.astype(int))
