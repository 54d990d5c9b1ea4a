"""The sparse-MLA op's inputs, float64 formula and model-level check that every implementation's tests use
(tests/test_sparse_mla_mgpu.py: the Mosaic GPU kernel; the Pallas Triton one that also used them was removed on
2026-12-04)."""

import flax
import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from jax_mtp.mla import MLAttention
from jax_mtp.request import required_capacity
from tests.greedy import greedy_margin
from tests.tolerances import GREEDY_MIN_MARGIN, assert_close


def dsa_kernel_cfg(**overrides) -> jax_mtp.MtpConfig:
  """The small bf16 DSA model the tests run the Mosaic GPU DSA kernels on: 16 attention and indexer heads (padded
  to the sparse-MLA kernel's 64), a 128-wide latent, 64-wide rope and indexer keys, top-16 of a longer cache."""
  return jax_mtp.tiny(**{"dtype": "bfloat16", "param_dtype": "bfloat16", "num_attention_heads": 16,
                         "qk_rope_head_dim": 64, "index_head_dim": 64, "kv_lora_rank": 128, "index_n_heads": 16,
                         "index_topk": 16, **overrides})


def problem(b, t, n, c, r, s, k, dtype, seed=0, padded=0.2):
  """Queries, a cache, and per query k distinct slots of which a `padded` share is not attended
  (slot −1, as the selection's padding); the first slot is always attended."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
  slots = np.stack([[rng.permutation(s)[:k] for _ in range(t)] for _ in range(b)]).astype(np.int32)
  valid = rng.random((b, t, k)) >= padded
  valid[..., 0] = True
  return (normal(b, t, n, c), normal(b, t, n, r), normal(b, s, c), normal(b, s, r), jnp.asarray(slots),
          jnp.asarray(valid))


def formula(q_lat, q_pe, latent, k_pe, slots, valid, scale):
  """float64 softmax attention over the attended slots, on the values the kernel reads."""
  f64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)  # noqa: E731
  q_lat, q_pe, latent, k_pe, slots, valid = map(np.asarray, (f64(q_lat), f64(q_pe), f64(latent), f64(k_pe),
                                                             slots, valid))
  rows = np.arange(latent.shape[0])[:, None, None]
  lat_g, pe_g = latent[rows, slots], k_pe[rows, slots]  # [B, T, K, ·]
  scores = (np.einsum("btnc,btkc->btnk", q_lat, lat_g) + np.einsum("btnr,btkr->btnk", q_pe, pe_g)) * scale
  scores = np.where(valid[:, :, None], scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("btnk,btkc->btnc", probs, lat_g)


def assert_models_attention_equals_xlas(cfg, impl: str, t: int, what: str) -> None:
  """The MTP layer's sparse attention heads (before o_proj) through `impl` and through XLA, to bf16's tolerance:
  a 64-slot cache (> top-16) prefilled with 40 tokens, then a T-token step of two rows at positions 40.. and 5..
  (row 1 sees fewer than top-16 slots: padded selections)."""
  params = jax_mtp.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(t)
  prefix_pos = jnp.broadcast_to(jnp.arange(40, dtype=jnp.int32), (2, 40))
  prefix = (jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 40)), jnp.int32), prefix_pos,
            jnp.asarray(rng.standard_normal((2, 40, cfg.hidden_size)), jnp.bfloat16))
  caches = jax.jit(lambda p, *a: jax_mtp.MtpPredictor(cfg).apply({"params": p}, *a).caches)(
      params, *prefix, jax_mtp.init_caches(cfg, 2, 64))
  step = (jnp.asarray(rng.integers(0, cfg.vocab_size, (2, t)), jnp.int32),
          jnp.asarray([[40 + i for i in range(t)], [5 + i for i in range(t)]], jnp.int32),
          jnp.asarray(rng.standard_normal((2, t, cfg.hidden_size)), jnp.bfloat16))

  def attention_out(impl):
    model = jax_mtp.MtpPredictor(cfg.replace(sparse_attention_impl=impl))
    _, found = jax.jit(lambda p, *a: model.apply({"params": p}, *a, absorb=True, capture_intermediates=lambda mdl, _:
                                                 isinstance(mdl, MLAttention)))(params, *step, caches)
    (calls,) = [v for path, v in flax.traverse_util.flatten_dict(found["intermediates"]).items()
                if path[-2:] == ("self_attn", "_absorbed_sparse")]
    return calls[0]  # the heads' outputs before o_proj, fp32 [B, T, N, H]

  xla = attention_out("xla")
  assert float(jnp.max(jnp.abs(xla))) > 0
  assert_close(attention_out(impl), xla, "bfloat16", what=what)


def assert_speculative_decoding_through_the_kernel_keeps_xlas_tokens() -> None:
  """A bf16 DSA model (caches longer than top-16) decoding speculatively (k = 2), target and drafter through the
  Mosaic GPU kernel or XLA: the same tokens, which are plain greedy decoding's, and the same drafts accepted; every
  call shape goes through the kernel (prefill chunks, verification T = 3, drafts T = 1)."""
  cfg = dsa_kernel_cfg(vocab_size=512)
  target_params = jax_mtp.init_target_params(cfg, jax.random.key(0))
  mtp_params = jax_mtp.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(6)  # no near-tie among the 10 tokens (seed 5's margin: 0.012, 2026-12-05)
  prompts = [[int(t) for t in rng.integers(0, 512, n)] for n in (21, 34)]
  capacity = required_capacity(cfg, prompts, 10, 2)
  decoder = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  plain = decoder.generate(decoder.shard(target_params), prompts, 10, capacity=capacity)
  margin = greedy_margin(cfg, target_params, prompts, plain, capacity=capacity)
  assert margin >= GREEDY_MIN_MARGIN, f"a near-tie ({margin:.2g}) among the prompts' greedy tokens: pick another seed"
  runs = {}
  for impl in ("xla", "mosaic_gpu"):
    spec = jax_mtp.Speculator(cfg.replace(sparse_attention_impl=impl), jax_mtp.make_mesh(1), 2)
    runs[impl] = spec.generate(spec.shard(target_params, mtp_params), prompts, 10, capacity=capacity)
  assert runs["mosaic_gpu"].tokens == runs["xla"].tokens == plain
  assert runs["mosaic_gpu"].metrics.accepted_per_position == runs["xla"].metrics.accepted_per_position
