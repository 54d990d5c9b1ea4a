"""Model configuration: one frozen dataclass, built from a Hugging Face `config.json` or a preset.

`MtpConfig` holds every number the model reads; no module keeps model constants of its own.
`jax_mtp.hf_config.from_hf_config` reads the three checkpoint families that carry a DeepSeek MTP layer:

  deepseek_v3   MLA + noaux_tc MoE, dense attention (no DSA indexer)
  deepseek_v32  + DSA lightning indexer (NeoX RoPE in the indexer, interleaved in MLA)
  glm_moe_dsa   GLM-5: the same blocks with other sizes, plain RoPE, interleaved indexer RoPE

Presets: `tiny()` (CPU tests and the demo) and `deepseek_v32()` / `glm5()` (full size, for shapes).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
# How the routed experts run: "auto" picks per platform and token count (jax_mtp.experts).
MOE_IMPLS = ("auto", "gather", "ragged_dot", "tokamax_gpu", "tokamax_tpu", "fp8_grouped_gpu", "mosaic_gpu")
DTYPES = ("float32", "bfloat16", "float16")  # compute (`dtype`) and parameter (`param_dtype`) dtypes
INDEX_CACHE_DTYPES = ("auto", *DTYPES, "fp8")  # fp8: e4m3 keys + one fp32 scale a token, as kv_cache_dtype names it
INDEX_SCORES_IMPLS = ("auto", "xla", "mosaic_gpu", "pallas_tpu")
SPARSE_ATTENTION_IMPLS = ("auto", "xla", "mosaic_gpu")
TOPK_IMPLS = ("auto", "xla", "mosaic_gpu")  # the DSA indexer's top-k: its k-th key (jax_mtp.topk.resolve_topk_impl)
# Removed impls, and what to ask for instead: a config or command line that names one gets that in its error
REMOVED_SPARSE_ATTENTION_IMPLS = {"pallas_gpu": "the Pallas Triton sparse-MLA kernel was removed on 2026-12-04 "
                                                "(Pallas's Triton backend is deprecated); use 'mosaic_gpu' or 'auto'"}
# FP8 weights' matmuls straight from the codes on GPUs (kernels/fp8_grouped_matmul_mgpu.py: "mosaic_gpu", what
# "auto" runs there; elsewhere the codes are dequantised in the program)
FP8_MATMUL_IMPLS = ("auto", "mosaic_gpu")
REMOVED_FP8_MATMUL_IMPLS = {"triton": "the Pallas Triton FP8 kernel was removed on 2026-12-05 (Pallas's Triton "
                                      "backend is deprecated); use 'mosaic_gpu' or 'auto'"}
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8")  # the MLA cache's (`kv_cache_dtype`)
# Latent values per fp32 scale in an fp8 MLA cache: FlashMLA's / vLLM's fp8_ds_mla tiles (4 scales for V3.2's 512).
KV_FP8_GROUP = 128


class ConfigError(ValueError):
  """A config value is missing, of the wrong kind, or inconsistent with another."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """RoPE frequencies. `factor == 1` means plain RoPE; `factor > 1` means YaRN."""

  theta: float = 10000.0
  factor: float = 1.0
  original_max_position_embeddings: int = 4096
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  mscale: float = 1.0
  mscale_all_dim: float = 0.0

  @property
  def is_yarn(self) -> bool:
    return self.factor > 1.0


def yarn_mscale(factor: float, mscale: float) -> float:
  """YaRN attention temperature `0.1·mscale·ln(factor) + 1` (1 when not scaling)."""
  return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True)
class MtpConfig:
  """Every size and switch of a DeepSeek-V3.2-family model and its MTP layers.

  Field names follow the HF `config.json` keys; the glossary letter is in each comment.
  """

  model_type: str
  vocab_size: int  # V
  hidden_size: int  # D
  intermediate_size: int  # dense-MLP hidden (first_k_dense_replace layers)
  moe_intermediate_size: int  # F
  num_hidden_layers: int  # target layers; the MTP layers follow them in the checkpoint
  first_k_dense_replace: int
  num_attention_heads: int  # N
  q_lora_rank: int  # Q
  kv_lora_rank: int  # C
  qk_nope_head_dim: int  # P
  qk_rope_head_dim: int  # R
  v_head_dim: int  # H
  n_routed_experts: int  # E
  n_shared_experts: int
  num_experts_per_tok: int  # K
  n_group: int  # G
  topk_group: int
  routed_scaling_factor: float
  norm_topk_prob: bool
  rms_norm_eps: float
  max_position_embeddings: int
  rope: RopeConfig
  rope_interleave: bool = True  # MLA q_pe / k_pe pairs (2i, 2i+1)
  index_n_heads: int = 0  # I; 0 = no DSA indexer (deepseek_v3)
  index_head_dim: int = 0  # J
  index_topk: int = 0
  indexer_rope_interleave: bool = False  # V3.2: NeoX; GLM-5: interleaved
  indexer_norm_eps: float = 1e-6
  # q_a_layernorm / kv_a_layernorm: 1e-6 in the official DeepSeek code and in HF for every family
  # (GLM-5's rms_norm_eps is 1e-5, but HF GlmMoeDsa still hard-codes 1e-6 here).
  latent_norm_eps: float = 1e-6
  num_nextn_predict_layers: int = 1
  # Draft steps after the first reuse step 0's DSA top-k (GLM-5.2's config sets it; vLLM honours it):
  # jax_mtp.drafter. Needs one MTP layer.
  index_share_for_mtp_iteration: bool = False
  # The blocks of FP8 weights kept on the device (B0 rows of the [out, in] weight, B1 columns): the
  # checkpoint's quantization_config.weight_block_size, set by `load_hf_checkpoint(fp8_weights=True)`.
  fp8_block: tuple[int, int] = (128, 128)
  dtype: str = "bfloat16"  # activations
  param_dtype: str = "bfloat16"
  moe_impl: str = "auto"  # routed experts' implementation, one of MOE_IMPLS (jax_mtp.experts)
  # The DSA indexer's key cache: "auto" = `dtype`; a float dtype; "fp8" stores float8_e4m3fn keys with one fp32
  # scale per token, as vLLM does (a quarter of fp32's bytes; the keys are read whole every step). "fp8" as
  # kv_cache_dtype names the MLA cache's fp8 layout.
  index_cache_dtype: str = "auto"
  # Prompt tokens per row per prefill call (jax_mtp.prefill); 0 = sized to PREFILL_CHUNK_BYTES.
  prefill_chunk: int = 0
  # The DSA indexer's scores: XLA, or a fused Pallas kernel (Mosaic GPU: kernels/index_scores_mgpu.py, `auto` on
  # GPUs; TPU: kernels/index_scores.py); see jax_mtp.indexer.resolve_index_scores_impl.
  index_scores_impl: str = "auto"
  # DSA's sparse MLA attention over the selected slots (decode, verification, sparse prefill): XLA, or
  # the fused Pallas Mosaic GPU kernel (kernels/sparse_mla_mgpu.py); see jax_mtp.mla.resolve_sparse_attention_impl.
  sparse_attention_impl: str = "auto"
  # The DSA indexer's top-k: XLA's radix select, or its k-th key in the Pallas Mosaic GPU kernel
  # (kernels/topk_mgpu.py) and XLA's compaction; see jax_mtp.topk.resolve_topk_impl.
  topk_impl: str = "auto"
  # The MLA cache: "auto" = `dtype`; "bfloat16"; "fp8" = float8_e4m3fn latent codes with one fp32 scale per
  # `kv_scale_group` values and the rope key in `dtype` (vLLM's fp8_ds_mla: 656 bytes a token at V3.2's widths
  # against 1,152 in bf16). No checkpoint config names it (a serving flag, as vLLM's --kv-cache-dtype).
  kv_cache_dtype: str = "auto"
  # Which kernel multiplies FP8 weights' codes on GPUs (the experts under moe_impl "fp8_grouped_gpu", the dense FP8
  # linears): one of FP8_MATMUL_IMPLS
  fp8_matmul_impl: str = "auto"
  # The fields above from `dtype` on say how the model runs, not what it is (RUN_SETTINGS): a
  # checkpoint's config.json may differ from the running config in these only.

  RUN_SETTINGS = ("dtype", "param_dtype", "moe_impl", "index_cache_dtype", "prefill_chunk", "index_scores_impl",
                  "sparse_attention_impl", "topk_impl", "kv_cache_dtype", "fp8_matmul_impl")

  def __post_init__(self):
    _validate(self)

  def model_differences(self, other: MtpConfig, label: str) -> list[str]:
    """`name=mine (label: other's)` for each field in which `other` describes another model: the run settings may
    differ (RUN_SETTINGS), and so may `fp8_block` (the stored weights' blocks, which a checkpoint decides)."""
    ignore = set(self.RUN_SETTINGS) | {"fp8_block"}
    return [f"{f.name}={getattr(self, f.name)!r} ({label}: {getattr(other, f.name)!r})"
            for f in dataclasses.fields(self) if f.name not in ignore and getattr(self, f.name) != getattr(other, f.name)]

  @property
  def qk_head_dim(self) -> int:
    return self.qk_nope_head_dim + self.qk_rope_head_dim

  @property
  def has_indexer(self) -> bool:
    return self.index_n_heads > 0

  @property
  def index_key_dtype(self) -> str:
    """The indexer key cache's storage dtype (`index_cache_dtype`: "auto" the compute dtype, "fp8" float8_e4m3fn)."""
    return {"auto": self.dtype, "fp8": "float8_e4m3fn"}.get(self.index_cache_dtype, self.index_cache_dtype)

  @property
  def mla_cache_dtype(self) -> str:
    """The MLA latent cache's storage dtype (`kv_cache_dtype`, "auto" resolved; "fp8" is float8_e4m3fn)."""
    return {"auto": self.dtype, "fp8": "float8_e4m3fn"}.get(self.kv_cache_dtype, self.kv_cache_dtype)

  @property
  def kv_scale_group(self) -> int:
    """Latent values per fp32 scale in an fp8 MLA cache: KV_FP8_GROUP (128), or the whole latent where it is
    narrower (the small test and demo models; one scale per token then)."""
    return min(KV_FP8_GROUP, self.kv_lora_rank)

  @property
  def softmax_scale(self) -> float:
    """MLA scale: qk_head_dim^-0.5, times mscale² under YaRN (DeepSeek puts it here, not in cos/sin)."""
    scale = self.qk_head_dim**-0.5
    if self.rope.is_yarn and self.rope.mscale_all_dim:
      scale *= yarn_mscale(self.rope.factor, self.rope.mscale_all_dim) ** 2
    return scale

  def is_moe_layer(self, layer_idx: int) -> bool:
    """MoE from layer `first_k_dense_replace` on; the MTP layers (idx ≥ num_hidden_layers) too."""
    return layer_idx >= self.first_k_dense_replace

  def replace(self, **changes: Any) -> MtpConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_config(cls, source: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> MtpConfig:
    """Builds a config from a HF `config.json` (a path to it or its directory) or its dict."""
    from jax_mtp.hf_config import from_hf_config  # noqa: PLC0415 (it imports this module)
    return from_hf_config(source, **overrides)


INT32_LIMIT = 2**31  # every integer size must index an int32 array


def _validate(cfg: MtpConfig) -> None:
  if cfg.model_type not in SUPPORTED_MODEL_TYPES:
    raise ConfigError(f"model_type={cfg.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}")
  positive = (
      "vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers num_attention_heads "
      "q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim n_routed_experts "
      "num_experts_per_tok n_group topk_group max_position_embeddings num_nextn_predict_layers"
  ).split()
  for name in positive:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ConfigError(f"{name}={value!r} must be a positive integer")
  counts = ("first_k_dense_replace", "n_shared_experts", "index_n_heads", "index_head_dim", "index_topk")
  for name in counts:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ConfigError(f"{name}={value!r} must be a non-negative integer")
  for name in (*positive, *counts):
    # token ids, positions, slots and sizes are int32 on the device: a damaged config.json's vocab_size of 2**31
    # was an OverflowError inside JAX's trace (found by tests/test_fuzz.py)
    if getattr(cfg, name) >= INT32_LIMIT:
      raise ConfigError(f"{name}={getattr(cfg, name)} must be below 2**31 (ids, positions and sizes are int32)")
  if cfg.qk_rope_head_dim % 2:
    raise ConfigError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} must be even (RoPE rotates pairs)")
  if cfg.n_routed_experts % cfg.n_group:
    raise ConfigError(f"n_routed_experts={cfg.n_routed_experts} is not divisible by n_group={cfg.n_group}")
  if cfg.topk_group > cfg.n_group:
    raise ConfigError(f"topk_group={cfg.topk_group} exceeds n_group={cfg.n_group}")
  experts_in_kept_groups = cfg.topk_group * (cfg.n_routed_experts // cfg.n_group)
  if cfg.num_experts_per_tok > experts_in_kept_groups:
    raise ConfigError(
        f"num_experts_per_tok={cfg.num_experts_per_tok} exceeds the {experts_in_kept_groups} experts "
        f"in topk_group={cfg.topk_group} groups")
  if cfg.n_routed_experts // cfg.n_group < 2:
    raise ConfigError(f"each of n_group={cfg.n_group} groups needs ≥ 2 experts (group score = top-2 sum)")
  if cfg.first_k_dense_replace > cfg.num_hidden_layers:
    raise ConfigError(
        f"first_k_dense_replace={cfg.first_k_dense_replace} exceeds num_hidden_layers={cfg.num_hidden_layers}")
  for name in ("rms_norm_eps", "indexer_norm_eps", "latent_norm_eps", "routed_scaling_factor"):
    value = getattr(cfg, name)
    if not is_number(value) or not 0 < value < math.inf:
      raise ConfigError(f"{name}={value!r} must be > 0 and finite")
  for name in ("norm_topk_prob", "rope_interleave", "indexer_rope_interleave"):
    if not isinstance(getattr(cfg, name), bool):
      raise ConfigError(f"{name}={getattr(cfg, name)!r} must be true or false")
  _validate_rope(cfg.rope)
  _validate_indexer(cfg)
  block = cfg.fp8_block
  if not (isinstance(block, tuple) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
    raise ConfigError(f"fp8_block={block!r} (quantization_config.weight_block_size) must be two positive integers")
  if not isinstance(cfg.index_share_for_mtp_iteration, bool):
    raise ConfigError(f"index_share_for_mtp_iteration={cfg.index_share_for_mtp_iteration!r} must be true or false")
  if cfg.index_share_for_mtp_iteration and cfg.num_nextn_predict_layers != 1:
    raise ConfigError(f"index_share_for_mtp_iteration needs num_nextn_predict_layers=1, got "
                      f"{cfg.num_nextn_predict_layers} (each MTP layer has its own indexer)")
  if cfg.index_cache_dtype not in INDEX_CACHE_DTYPES:
    raise ConfigError(f"index_cache_dtype={cfg.index_cache_dtype!r} is not one of {INDEX_CACHE_DTYPES}")
  if cfg.kv_cache_dtype not in KV_CACHE_DTYPES:
    raise ConfigError(f"kv_cache_dtype={cfg.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
  if cfg.kv_cache_dtype == "fp8" and cfg.kv_lora_rank % cfg.kv_scale_group:
    raise ConfigError(f"kv_cache_dtype='fp8' stores one scale per {KV_FP8_GROUP} latent values; kv_lora_rank="
                      f"{cfg.kv_lora_rank} is not a multiple of {KV_FP8_GROUP} (use kv_cache_dtype='auto' or 'bfloat16')")
  if cfg.fp8_matmul_impl in REMOVED_FP8_MATMUL_IMPLS:
    raise ConfigError(f"fp8_matmul_impl={cfg.fp8_matmul_impl!r}: {REMOVED_FP8_MATMUL_IMPLS[cfg.fp8_matmul_impl]}")
  if cfg.fp8_matmul_impl not in FP8_MATMUL_IMPLS:
    raise ConfigError(f"fp8_matmul_impl={cfg.fp8_matmul_impl!r} is not one of {FP8_MATMUL_IMPLS}")
  if cfg.moe_impl not in MOE_IMPLS:
    raise ConfigError(f"moe_impl={cfg.moe_impl!r} is not one of {MOE_IMPLS}")
  if cfg.index_scores_impl not in INDEX_SCORES_IMPLS:
    raise ConfigError(f"index_scores_impl={cfg.index_scores_impl!r} is not one of {INDEX_SCORES_IMPLS}")
  if cfg.sparse_attention_impl in REMOVED_SPARSE_ATTENTION_IMPLS:
    raise ConfigError(f"sparse_attention_impl={cfg.sparse_attention_impl!r}: "
                      f"{REMOVED_SPARSE_ATTENTION_IMPLS[cfg.sparse_attention_impl]}")
  if cfg.sparse_attention_impl not in SPARSE_ATTENTION_IMPLS:
    raise ConfigError(f"sparse_attention_impl={cfg.sparse_attention_impl!r} is not one of {SPARSE_ATTENTION_IMPLS}")
  if cfg.topk_impl not in TOPK_IMPLS:
    raise ConfigError(f"topk_impl={cfg.topk_impl!r} is not one of {TOPK_IMPLS}")
  if not isinstance(cfg.prefill_chunk, int) or isinstance(cfg.prefill_chunk, bool) or cfg.prefill_chunk < 0:
    raise ConfigError(f"prefill_chunk={cfg.prefill_chunk!r} must be a whole number of tokens ≥ 1 (0 = auto)")
  for name in ("dtype", "param_dtype"):
    if getattr(cfg, name) not in DTYPES:
      raise ConfigError(f"{name}={getattr(cfg, name)!r} must be float32, bfloat16 or float16")


def is_number(value: Any) -> bool:
  """A real number (bool excluded), as config values are checked."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate_rope(rope: RopeConfig) -> None:
  if not isinstance(rope, RopeConfig):
    raise ConfigError(f"rope={rope!r} must be a RopeConfig (its theta, scaling type and YaRN factors)")
  numbers = {name: getattr(rope, name) for name in ("theta", "factor", "beta_fast", "beta_slow", "mscale",
                                                      "mscale_all_dim")}
  for name, value in numbers.items():
    if not is_number(value) or not math.isfinite(value):
      raise ConfigError(f"rope {name}={value!r} must be a finite number")
  # theta is the rotary frequencies' base: YaRN's correction range divides by log(theta), and at 1 every frequency
  # is 1 (a damaged config's rope_theta=1 was a ZeroDivisionError, found by tests/test_fuzz.py)
  if rope.factor < 1.0 or rope.theta <= 1:
    raise ConfigError(f"rope factor={rope.factor} must be ≥ 1 and theta={rope.theta} > 1")
  if rope.is_yarn and (rope.beta_fast <= 0 or rope.beta_slow <= 0):  # YaRN takes log(L / (2π · beta))
    raise ConfigError(f"rope beta_fast={rope.beta_fast} and beta_slow={rope.beta_slow} must be > 0 (YaRN)")
  value = rope.original_max_position_embeddings
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise ConfigError(f"rope original_max_position_embeddings={value!r} must be a positive integer")


def _validate_indexer(cfg: MtpConfig) -> None:
  fields = (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk)
  if cfg.model_type == "deepseek_v3":
    if any(fields):
      raise ConfigError(f"model_type='deepseek_v3' has no DSA indexer, got index_n_heads/head_dim/topk={fields}")
    return
  if not all(fields):
    raise ConfigError(f"model_type={cfg.model_type!r} needs index_n_heads, index_head_dim and index_topk > 0, "
                      f"got {fields}")
  if cfg.index_head_dim < cfg.qk_rope_head_dim:
    raise ConfigError(f"index_head_dim={cfg.index_head_dim} is smaller than qk_rope_head_dim="
                      f"{cfg.qk_rope_head_dim} (the indexer rotates its first R dims)")


# --- presets -----------------------------------------------------------------------------------


def tiny(**overrides: Any) -> MtpConfig:
  """A DeepSeek-V3.2-shaped model small enough for CPU tests and the demo (fp32).

  `index_topk` (4) is smaller than a test sequence so the sparse path is exercised; the YaRN
  factor makes mscale² matter.
  """
  fields = dict(
      model_type="deepseek_v32", vocab_size=256, hidden_size=64, intermediate_size=96,
      moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=8,
      q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
      n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
      routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=640,
      rope=RopeConfig(theta=10000.0, factor=40.0, original_max_position_embeddings=16, mscale=1.0,
                      mscale_all_dim=1.0),
      index_n_heads=4, index_head_dim=16, index_topk=4, dtype="float32", param_dtype="float32",
  )
  fields.update(overrides)
  return MtpConfig(**fields)


def deepseek_v32(**overrides: Any) -> MtpConfig:
  """DeepSeek-V3.2 (671B) as in its HF config.json."""
  fields = dict(
      model_type="deepseek_v32", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
      moe_intermediate_size=2048, num_hidden_layers=61, first_k_dense_replace=3, num_attention_heads=128,
      q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
      n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
      routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=163840,
      rope=RopeConfig(theta=10000.0, factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0,
                      beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
      index_n_heads=64, index_head_dim=128, index_topk=2048,
  )
  fields.update(overrides)
  return MtpConfig(**fields)


def glm5(**overrides: Any) -> MtpConfig:
  """GLM-5 (zai-org/GLM-5, model_type glm_moe_dsa)."""
  fields = dict(
      model_type="glm_moe_dsa", vocab_size=154880, hidden_size=6144, intermediate_size=12288,
      moe_intermediate_size=2048, num_hidden_layers=78, first_k_dense_replace=3, num_attention_heads=64,
      q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
      n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
      routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-5, max_position_embeddings=202752,
      rope=RopeConfig(theta=1000000.0), index_n_heads=32, index_head_dim=128, index_topk=2048,
      indexer_rope_interleave=True,
  )
  fields.update(overrides)
  return MtpConfig(**fields)


def demo(**overrides: Any) -> MtpConfig:
  """The embedded default's architecture (`python -m jax_mtp.train --preset demo`): DeepSeek-V3.2's
  (MLA, a DSA indexer that selects 64 of a longer context, noaux_tc MoE after one dense layer, one
  MTP layer) at ~7M parameters, 14 MB in bf16; fp32 compute for laptop CPUs."""
  fields = dict(
      model_type="deepseek_v32", vocab_size=4096, hidden_size=256, intermediate_size=768,
      moe_intermediate_size=128, num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4,
      q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
      n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
      routed_scaling_factor=1.0, norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=2048,
      rope=RopeConfig(theta=10000.0), index_n_heads=4, index_head_dim=32, index_topk=64,
      dtype="float32", param_dtype="float32",
  )
  fields.update(overrides)
  return MtpConfig(**fields)


PRESETS = {"demo": demo, "tiny": tiny}  # the small architectures `python -m jax_mtp.train --preset` builds
