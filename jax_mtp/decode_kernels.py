"""What `python -m jax_mtp.decode` checks of the kernels its flags name, before any weight is read: an explicit kernel
must suit the model, the cache and this machine (its platform, and for the Mosaic GPU kernels a Hopper GPU); one
`BadInput` line naming the flag, not a failure inside a compiler."""

from __future__ import annotations

import jax

import jax_mtp
from jax_mtp.decode_flags import BadInput
from jax_mtp.experts import check_gpu_kernel_takes
from jax_mtp.kernels.fused_allreduce_rmsnorm import gpu_kernels
from jax_mtp.platform import NOT_HOPPER, lowering_gpu_is_hopper


KERNEL_PLATFORMS = {"mosaic_gpu": "gpu", "pallas_tpu": "tpu"}  # the DSA kernels' platforms
# The experts' kernels' platforms: tokamax's compile for their own only; our Mosaic GPU kernels (FP8, 16-bit) also
# run in Pallas's interpreter on a CPU
MOE_PLATFORMS = {"tokamax_gpu": ("gpu",), "tokamax_tpu": ("tpu",), "fp8_grouped_gpu": ("gpu", "cpu"),
                 "mosaic_gpu": ("gpu", "cpu")}


def check_kernel_impls(cfg: jax_mtp.MtpConfig, capacity: int) -> None:
  """Explicit kernels (the experts' tokamax ones, the DSA index scores, top-k and sparse attention) must suit the model,
  the cache and this machine."""
  from jax_mtp.indexer import resolve_index_scores_impl, selects_all  # noqa: PLC0415
  from jax_mtp.topk import resolve_topk_impl  # noqa: PLC0415
  from jax_mtp.mla import resolve_sparse_attention_impl  # noqa: PLC0415
  platform, hopper = jax.default_backend(), lowering_gpu_is_hopper()
  checks = (("--index-scores-impl", cfg.index_scores_impl,
             lambda: resolve_index_scores_impl(cfg, platform, capacity, hopper=hopper)),
            ("--sparse-attention-impl", cfg.sparse_attention_impl,
             lambda: resolve_sparse_attention_impl(cfg, platform, hopper=hopper)),
            ("--topk-impl", cfg.topk_impl, lambda: resolve_topk_impl(cfg, platform, capacity, hopper=hopper)))
  if cfg.fp8_matmul_impl != "auto" and platform != "gpu" and cfg.moe_impl != "fp8_grouped_gpu":
    raise BadInput(f"--fp8-matmul-impl={cfg.fp8_matmul_impl} picks the GPU kernel that multiplies FP8 weights' codes; "
                   f"this machine's JAX platform is {platform}, where only --moe-impl fp8_grouped_gpu runs it (in "
                   f"Pallas's interpreter)")
  if platform == "gpu" and not hopper and (cfg.fp8_matmul_impl != "auto" or cfg.moe_impl == "fp8_grouped_gpu"):
    flag = (f"--fp8-matmul-impl={cfg.fp8_matmul_impl}" if cfg.fp8_matmul_impl != "auto"
            else "--moe-impl=fp8_grouped_gpu")
    raise BadInput(f"{flag}: {NOT_HOPPER} (auto dequantises FP8 weights in the program there)")
  runs_on = MOE_PLATFORMS.get(cfg.moe_impl, (platform,))
  if platform not in runs_on:  # before building: tokamax fails inside its compiler elsewhere
    raise BadInput(f"--moe-impl={cfg.moe_impl} runs on {' or '.join(runs_on)}; this machine's JAX platform is "
                   f"{platform}")
  experts = jax.ShapeDtypeStruct((cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size),
                                 cfg.param_dtype)  # as the MoE multiplies them (FP8 codes dequantised to it)
  try:
    check_gpu_kernel_takes(cfg.moe_impl, experts)
  except ValueError as e:  # before any weight is read, not at the first trace
    raise BadInput(str(e)) from None
  named = [(flag, impl) for flag, impl, _ in checks if impl != "auto"]
  if named and not cfg.has_indexer:  # a dense-MLA model (V3) runs no DSA part at any length, XLA's included
    flag, impl = named[0]
    raise BadInput(f"{flag}={impl} names a DSA part's implementation, and this model ({cfg.model_type}) has no DSA "
                   f"indexer: nothing would run it")
  explicit = [(flag, impl, resolve) for flag, impl, resolve in checks if impl not in ("auto", "xla")]
  for flag, impl, _ in explicit:  # whatever the request's length: a short one would not reach the kernel
    if KERNEL_PLATFORMS[impl] != platform:
      raise BadInput(f"{flag}={impl} runs on {KERNEL_PLATFORMS[impl]}; this machine's JAX platform is {platform}")
  if selects_all(cfg, capacity):  # no indexer runs: every visible slot is attended (by the sparse kernel with DSA)
    explicit = [check for check in explicit if check[0] == "--sparse-attention-impl" and cfg.has_indexer]
  for _, _, resolve in explicit:
    resolve()  # ValueError naming what the kernel cannot take


def check_norm_impl(impl: str) -> None:
  """A Pallas kernel runs on its own platform only; say so instead of failing inside the compiler."""
  platform = jax.devices()[0].platform
  needed = {"pallas_tpu": "tpu", "pallas_gpu": "gpu"}.get(impl)
  if needed is not None and platform != needed:
    raise BadInput(f"--impl={impl} needs {needed.upper()} devices, found {platform}")
  if impl == "pallas_gpu":
    try:
      gpu_kernels()  # the kernels' JAX internals, imported only for this impl
    except ImportError as e:
      raise BadInput(f"--impl=pallas_gpu: {e}") from None
