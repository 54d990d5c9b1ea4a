"""What the two TPU Opt-1 kernels share: the one-shot (`fused_allreduce_rmsnorm_tpu.py`) and the
two-shot (`fused_allreduce_rmsnorm_tpu_two_shot.py`) forms differ in how partials travel; their
VMEM budget, their per-block barrier and the norm expression (so both give the same new_residual
bit for bit) are here.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

VMEM_BUDGET = 24 * 2**20  # a block's receive buffers + double-buffered in/out blocks
VMEM_LIMIT = 48 * 2**20  # scoped VMEM limit requested from Mosaic (v5e/v6e have 128 MiB)


def barrier(me, n: int, axis: str) -> None:
  """Signal every peer on the kernel's barrier semaphore and wait for n−1 signals: every peer is
  inside this block, so it has finished reading its receive buffer for the previous block. Counting
  semaphores keep it exact: a peer already in the next block signals only after every peer
  signalled this one."""
  sem = pltpu.get_barrier_semaphore()
  for k in range(1, n):
    pl.semaphore_signal(sem, 1, device_id={axis: lax.rem(me + k, n)})
  pl.semaphore_wait(sem, n - 1)


def rmsnorm(h, w_ref, eps: float):
  """rmsnorm(h)·weight in fp32 (h fp32 [rows, D], weight [1, D]): the one expression both forms use."""
  return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps) * w_ref[...].astype(jnp.float32)
