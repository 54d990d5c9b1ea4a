"""Host memory while a large FP8 checkpoint loads onto the accelerator (jax_mtp.checkpoint).

    python -m benchmarks.checkpoint_memory write DIR     # a random FP8 checkpoint (~6.8 GB), shard by shard
    python -m benchmarks.checkpoint_memory load DIR      # checkpoint size, params on device, peak host RSS

tests/test_checkpoint_memory.py checks the same property on CPU under a memory cap (RLIMIT_DATA).

The loader reads each device's slice of each tensor through a memmap and dequantises it; only one
param's slice is on the host at a time, so the peak host RSS above the baseline should be about the
largest param (stacked experts [E, D, F] in the param dtype), not the checkpoint's size. On CPU
devices the params themselves live in host memory, so run `load` on an accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import jax
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from jax_mtp.checkpoint import load_hf_checkpoint
from jax_mtp.checkpoint_names import EXPERTS, LINEAR, plan
from jax_mtp.config import tiny
from jax_mtp.export import to_hf_config
from jax_mtp.sharding import make_mesh

SHARD_BYTES = 2 << 30
# config.json's declaration of DeepSeek's FP8 weights (128 × 128 blocks), as the written tensors are
FP8_QUANTIZATION = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[128, 128])
CFG = tiny(vocab_size=32768, hidden_size=2048, intermediate_size=4096, moe_intermediate_size=1024,
           num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=16, q_lora_rank=512,
           kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=256,
           n_group=8, topk_group=4, num_experts_per_tok=8, index_n_heads=8, index_head_dim=64,
           dtype="bfloat16", param_dtype="bfloat16")


def _random_tensors(cfg, rng):
  """(name, array) for every tensor the loader expects: FP8 + scales for linears, BF16 otherwise."""
  for p in plan(cfg)[0]:
    shape = p.source_shape()
    for name in p.sources:
      if p.transform in (LINEAR, EXPERTS):
        bits = rng.integers(0, 0x70, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
        yield name, bits.view(ml_dtypes.float8_e4m3fn)
        scale_shape = tuple(-(-n // 128) for n in shape)
        yield name + "_scale_inv", rng.uniform(1e-4, 1e-3, scale_shape).astype(np.float32)
      else:
        yield name, rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)


def write(directory: str, cfg=CFG, shard_bytes: int = SHARD_BYTES) -> None:
  """A random FP8 checkpoint of `cfg`, in files of about `shard_bytes`, one file in memory at a time."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({**to_hf_config(cfg), "quantization_config": FP8_QUANTIZATION}, f)
  weight_map, shard, size, files = {}, {}, 0, 0
  for name, value in _random_tensors(cfg, np.random.default_rng(0)):
    shard[name], size = value, size + value.nbytes
    if size >= shard_bytes:
      files = _flush(directory, shard, files, weight_map)
      shard, size = {}, 0
  _flush(directory, shard, files, weight_map)
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": weight_map}, f)


def _flush(directory: str, shard: dict, files: int, weight_map: dict) -> int:
  file = f"model-{files + 1:05d}.safetensors"
  save_file(shard, os.path.join(directory, file))
  weight_map.update(dict.fromkeys(shard, file))
  return files + 1


def _peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def load(directory: str, tp: int) -> None:
  mesh = make_mesh(tp)
  jax.block_until_ready(jax.device_put(np.zeros(1)))  # backend up: baseline includes the runtime
  baseline, start = _peak_rss_gb(), time.perf_counter()
  _, target, mtp = load_hf_checkpoint(directory, mesh=mesh, progress=False)
  jax.block_until_ready((target, mtp))
  seconds, peak = time.perf_counter() - start, _peak_rss_gb()
  on_disk = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)) / 2**30
  leaves = {id(x): x for x in jax.tree.leaves((target, mtp))}.values()
  largest = max(x.nbytes for x in leaves) / 2**30
  print(f"devices: {jax.devices()[0].device_kind} x{tp}")
  print(f"checkpoint on disk {on_disk:.2f} GiB; params on device {sum(x.nbytes for x in leaves) / 2**30:.2f} GiB "
        f"(largest param {largest:.2f} GiB); loaded in {seconds:.1f} s")
  print(f"peak host RSS: {baseline:.2f} GiB before loading, {peak:.2f} GiB after (+{peak - baseline:.2f} GiB)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("action", choices=("write", "load"))
  parser.add_argument("directory")
  parser.add_argument("--tp", type=int, default=1)
  args = parser.parse_args()
  write(args.directory) if args.action == "write" else load(args.directory, args.tp)


if __name__ == "__main__":
  main()
