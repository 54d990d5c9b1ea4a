"""Greedy decoding of one model twice, for the tests that speculative decoding equals plain decoding: the plain
`TargetDecoder` and the `Speculator`, on one device, over the same prompts and capacity."""

import jax_mtp


def plain_and_speculative(cfg, target_params, mtp_params, prompts, new: int, *, capacity: int, k: int = 3):
  """(plain greedy tokens, the speculator's SpecResult)."""
  decoder = jax_mtp.TargetDecoder(cfg, jax_mtp.make_mesh(1))
  plain = decoder.generate(decoder.shard(target_params), prompts, new, capacity=capacity)
  spec = jax_mtp.Speculator(cfg, jax_mtp.make_mesh(1), k)
  return plain, spec.generate(spec.shard(target_params, mtp_params), prompts, new, capacity=capacity)
