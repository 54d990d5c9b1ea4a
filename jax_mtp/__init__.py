"""jax_mtp: the DeepSeek-V3.2 MTP speculative-decoding draft path in JAX/Flax.

Dimension letters used in tensor names (`x_BTD`) and einsum strings:

  B batch            T tokens in this call      S cache slots (positions)   D model (hidden_size)
  V vocab            N attention heads          P qk_nope_head_dim           R qk_rope_head_dim
  H v_head_dim       K experts per token        Q q_lora_rank                C kv_lora_rank
  E routed experts   F expert hidden            G expert groups; of an fp8 latent cache, its 128-value scale groups
  I indexer heads    J indexer head dim         A token-expert assignments (T·K)
  M draft tokens per round (k)   W verify window (k + 1)   O output-token slots
"""

from jax_mtp._source_kernels import map_source_kernels

map_source_kernels()  # before any module imports jax_mtp.kernels

from jax_mtp.cache import LayerCache, init_layer_cache  # noqa: E402
from jax_mtp.config import ConfigError, MtpConfig, RopeConfig, deepseek_v32, glm5, tiny
from jax_mtp.hf_config import from_hf_config
from jax_mtp.generate import TargetDecoder
from jax_mtp.loader import DEFAULT_MODEL, Loaded, load
from jax_mtp.metrics import SpecMetrics
from jax_mtp.model import TargetModel, TargetOutput, init_target_caches, init_target_params
from jax_mtp.moe import EXPERT_LOAD
from jax_mtp.mtp import MtpLayer, MtpOutput, MtpPredictor, init_caches, init_params, validate_inputs
from jax_mtp.draft_path import ShardedMtp
from jax_mtp.sharding import make_mesh
from jax_mtp.speculative import SpecParams, SpecResult, Speculator
from jax_mtp.tokenizer import TextCodec

__all__ = [
    "DEFAULT_MODEL", "EXPERT_LOAD", "ConfigError", "LayerCache", "Loaded", "MtpConfig", "MtpLayer", "MtpOutput",
    "MtpPredictor", "RopeConfig", "ShardedMtp", "SpecMetrics", "SpecParams", "SpecResult", "Speculator",
    "TargetDecoder", "TargetModel", "TargetOutput", "TextCodec", "deepseek_v32", "from_hf_config", "glm5",
    "init_caches", "init_layer_cache", "init_params", "init_target_caches", "init_target_params", "load",
    "make_mesh", "tiny", "validate_inputs",
]
