"""A decode request: checks of prompts and settings (errors name the value), packing, cache capacity.

Shared by the speculator and the plain target decoder; the CLI turns these ValueErrors into exit 2.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Sequence

import jax
import numpy as np

from jax_mtp.config import MtpConfig


def _integer(value):
  """`value` as a Python int where it is an integer (int, a numpy integer, a 0-d integer array: what a user computes
  a count with), else None; bools are not."""
  if isinstance(value, bool) or isinstance(value, np.bool_):
    return None
  try:
    return operator.index(value)  # int, np.integer, 0-d integer jax / numpy arrays
  except TypeError:
    return None


def validate_positive(name: str, value) -> None:
  number = _integer(value)
  if number is None or number < 1:
    raise ValueError(f"{name}={value!r} must be an integer ≥ 1")


# The smallest positive sampling temperature: fp32 logits divided by less can overflow to inf (and
# the probabilities to NaN); below it, greedy decoding (0) is what a user means.
MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = float(np.finfo(np.float32).max)


def _real(value) -> bool:
  """Whether `value` is a real number (a Python or numpy one, or a 0-d float array), not a bool."""
  real = isinstance(value, numbers.Real) or (np.ndim(value) == 0 and hasattr(value, "dtype")
                                             and np.issubdtype(value.dtype, np.floating))
  return real and not isinstance(value, (bool, np.bool_))


def validate_temperature(temperature) -> None:
  if not _real(temperature) or not math.isfinite(temperature) or temperature < 0:
    raise ValueError(f"temperature={temperature!r} must be a finite number ≥ 0")
  if temperature > MAX_TEMPERATURE:  # sampling divides float32 logits by it
    raise ValueError(f"temperature={temperature!r} is above {MAX_TEMPERATURE:.3g}, the largest float32")
  if 0 < temperature < MIN_TEMPERATURE:
    raise ValueError(f"temperature={temperature!r} is below {MIN_TEMPERATURE} (the logits would overflow); "
                     f"use 0 for greedy decoding")


def validate_top_k(top_k) -> None:
  """Sampling's top-k: an integer ≥ 0 (0: off; one at or above the vocabulary keeps every token)."""
  number = _integer(top_k)
  if number is None or number < 0:
    raise ValueError(f"top_k={top_k!r} must be an integer ≥ 0 (0: off)")


def validate_top_p(top_p) -> None:
  """Sampling's top-p: a number in (0, 1] (1: off)."""
  if not _real(top_p) or not 0 < top_p <= 1:  # NaN fails the comparison
    raise ValueError(f"top_p={top_p!r} must be a number in (0, 1] (1: off)")


def validate_seed(seed) -> None:
  """A sampling seed jax.random.key takes: an integer (as counts are: a numpy integer or a 0-d integer array too; not a
  bool) in int64's range."""
  number = _integer(seed)
  if number is None or not -2**63 <= number < 2**63:
    raise ValueError(f"seed={seed!r} must be an integer in [-2^63, 2^63) (jax.random.key takes 64 bits)")


def validate_prompts(cfg: MtpConfig, prompts: Sequence[Sequence[int]]) -> None:
  """At least one prompt; every prompt non-empty, of integer ids in [0, vocab_size)."""
  if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
    raise ValueError(f"prompts must be a list of prompts, each a list of token ids; got {type(prompts).__name__}")
  if len(prompts) == 0:
    raise ValueError("no prompts: give at least one")
  for i, prompt in enumerate(prompts):
    if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__iter__"):
      raise ValueError(f"prompt {i} is {prompt!r}, not a list of token ids: prompts is a list of prompts (one prompt "
                       f"is [[id, id, ...]])")
    huge = next((x for x in prompt if isinstance(x, int) and not -2**63 <= x < 2**63), None)
    if huge is not None:  # past int64: numpy would make an object array, reported as "not integers" below
      raise ValueError(f"prompt {i} holds token id {huge}, outside [0, {cfg.vocab_size}) (vocab_size={cfg.vocab_size})")
    ids = np.asarray(prompt)
    if ids.size == 0:
      raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"prompt {i} must be a flat list of integer token ids, got {list(prompt)[:8]!r}")
    bad = ids[(ids < 0) | (ids >= cfg.vocab_size)]
    if bad.size:
      raise ValueError(f"prompt {i} holds token id {int(bad[0])}, outside [0, {cfg.vocab_size}) "
                       f"(vocab_size={cfg.vocab_size})")


def required_capacity(cfg: MtpConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                      num_speculative_tokens: int, capacity: int | None = None) -> int:
  """Cache positions a decode needs: longest prompt + max_new_tokens + k (jax_mtp.speculative says
  why), rounded up to what the fused DSA kernels take (`indexer.kernel_capacity`) but not past
  max_position_embeddings; or `capacity` if given and large enough."""
  from jax_mtp.indexer import kernel_capacity  # noqa: PLC0415 (the indexer imports jax.numpy users of this module)
  longest = max(len(prompt) for prompt in prompts)
  needed = longest + max_new_tokens + num_speculative_tokens
  limit = cfg.max_position_embeddings
  if num_speculative_tokens + 2 > limit:  # no prompt fits: one token, k speculative positions and one new token
    raise ValueError(f"num_speculative_tokens={num_speculative_tokens} leaves no room in the cache: a round needs a "
                     f"prompt token, {num_speculative_tokens} speculative positions and a new token, more than "
                     f"max_position_embeddings={limit}")
  if longest + num_speculative_tokens + 1 > limit:
    raise ValueError(f"the longest prompt ({longest} tokens) leaves no room for a new token: a prompt may hold at "
                     f"most {limit - num_speculative_tokens - 1} tokens (max_position_embeddings={limit}, "
                     f"{num_speculative_tokens} speculative positions)")
  if needed > limit:
    raise ValueError(f"max_new_tokens={max_new_tokens} needs a cache of {needed} positions (longest prompt "
                     f"{longest} + {max_new_tokens} new + {num_speculative_tokens} speculative), more than "
                     f"max_position_embeddings={limit}; at most {limit - longest - num_speculative_tokens} new "
                     f"tokens fit after this prompt")
  if capacity is None:
    rounded = kernel_capacity(cfg, needed)
    return rounded if rounded <= limit else needed
  if _integer(capacity) is None or not needed <= capacity <= limit:
    raise ValueError(f"capacity={capacity!r} must be an integer in [{needed}, {limit}] (needed positions, "
                     f"max_position_embeddings)")
  return int(capacity)


def pack_prompts(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded prompts int32 [B, T] (pad id 0, T = the longest) and their lengths int32 [B]."""
  lengths_B = np.array([len(prompt) for prompt in prompts], np.int32)
  prompt_BT = np.zeros((len(prompts), int(lengths_B.max())), np.int32)
  for b, prompt in enumerate(prompts):
    prompt_BT[b, :len(prompt)] = prompt
  return prompt_BT, lengths_B


def stop_id_array(cfg: MtpConfig, stop_ids: Sequence[int]) -> np.ndarray:
  """int32 [max(1, n)]: the stop ids, padded with −1 (no token); each must be a vocabulary id."""
  if isinstance(stop_ids, (str, bytes)) or not hasattr(stop_ids, "__iter__"):
    raise ValueError(f"stop_ids={stop_ids!r} must be a list of token ids (one stop id is [id]; none is [])")
  given = list(stop_ids)
  not_ids = [i for i in given if _integer(i) is None]
  if not_ids:
    raise ValueError(f"stop id {not_ids[0]!r} is not an integer token id")
  stop_ids = [_integer(i) for i in given]
  bad = [i for i in stop_ids if not 0 <= i < cfg.vocab_size]
  if bad:
    raise ValueError(f"stop id {bad[0]} is outside [0, {cfg.vocab_size}) (vocab_size={cfg.vocab_size})")
  return np.asarray(sorted(set(stop_ids)) or [-1], np.int32)


def cache_bytes(cfg: MtpConfig, batch: int, capacity: int) -> int:
  """Bytes of the decode caches one device holds (they are replicated over tp): every target and MTP
  layer's latent, rope key and indexer key (+ its scale) per row and position, and the output slots."""
  from jax_mtp.cache import init_layer_cache  # noqa: PLC0415 (cache imports jax.numpy users of this module)
  layer = jax.eval_shape(lambda: init_layer_cache(cfg, batch, capacity))
  per_layer = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(layer))
  return (cfg.num_hidden_layers + cfg.num_nextn_predict_layers) * per_layer + batch * capacity * 4


def device_free_bytes(device) -> int | None:
  """Memory `device` can still allocate: its allocator's limit less what is in use (GPU, TPU), or the
  host's available memory for a CPU device; None where neither is known."""
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  if device.platform == "cpu" and hasattr(os, "sysconf"):
    try:
      return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
      return None
  return None


def caches_against_free_memory(cfg: MtpConfig, batch: int, capacity: int, devices) -> tuple[object, int, int | None]:
  """(device, need, free): the first of `devices` this process drives (None where it drives none: another host's
  devices cannot be asked, jax.distributed), the caches' bytes per device, and its free bytes (None where there is no
  device or its allocator does not say)."""
  device = next((d for d in devices if d.process_index == jax.process_index()), None)
  return device, cache_bytes(cfg, batch, capacity), None if device is None else device_free_bytes(device)


def check_caches_fit(cfg: MtpConfig, batch: int, capacity: int, devices) -> None:
  """A clear error, before anything is allocated, when the caches alone cannot fit the memory of the
  first of `devices` this process drives (`caches_against_free_memory`)."""
  device, need, free = caches_against_free_memory(cfg, batch, capacity, devices)
  if free is not None and need > free:
    raise ValueError(f"the decode caches for {batch} row(s) × {capacity:,} positions need {need / 2**30:.2f} GiB "
                     f"per device ({cfg.num_hidden_layers} target + {cfg.num_nextn_predict_layers} MTP layers, "
                     f"replicated over tp), more than the {free / 2**30:.2f} GiB free on {device}; use fewer "
                     f"prompts, fewer new tokens, or a smaller capacity{gpu_pool_hint(device)}")


# JAX's GPU allocator takes this share of a device's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise
# (jax's GPU memory allocation docs).
JAX_GPU_POOL_DEFAULT = 0.75


def gpu_pool_hint(device, environ=os.environ) -> str:
  """On a GPU where the pool is JAX's default share: how to give JAX more of the device (on the H200 the 75 %
  default is 104 GiB of 139: a 4-layer V3.2 target's weights and B = 256 × 32K caches need ~112 GiB, and ran with
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95, benchmarks/RESULTS.md)."""
  if device.platform != "gpu" or "XLA_PYTHON_CLIENT_MEM_FRACTION" in environ \
      or environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "") == "platform":  # no pool: the driver's allocations
    return ""
  return (f"; or give JAX more of the GPU than its default {JAX_GPU_POOL_DEFAULT:.0%} (the CLI's "
          "--gpu-memory-fraction 0.95; elsewhere XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 before JAX starts)")
