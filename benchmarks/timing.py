"""Shared benchmark helpers: the copy-bandwidth and bf16-matmul ceilings measured in the same run, a step timer,
and the routed experts a call touches (for the floors)."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def copy_bandwidth(nbytes: int | None = None, iters: int = 20) -> float:
  """Device-to-device copy bandwidth in bytes/s (read + write) of `x + 1` over `nbytes`."""
  nbytes = nbytes or (2 * 2**30 if jax.devices()[0].platform == "gpu" else 2**26)
  x = jnp.ones((nbytes // 4,), jnp.float32)
  copy = jax.jit(lambda a: a + 1)
  copy(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(iters):
    x = copy(x)
  x.block_until_ready()
  return 2 * nbytes * iters / (time.perf_counter() - start)


def bf16_peak(n: int | None = None) -> float:
  """FLOP/s of a bf16 n³ matmul (fp32 accumulation), the median of 3 timings of 10 calls (n: 8192 on a GPU)."""
  n = n or (8192 if jax.devices()[0].platform == "gpu" else 256)
  a = jnp.ones((n, n), jnp.bfloat16)
  matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
  jax.block_until_ready(matmul(a, a))
  runs = []
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(10):
      out = matmul(a, a)
    jax.block_until_ready(out)
    runs.append((time.perf_counter() - start) / 10)
  return 2 * n**3 / statistics.median(runs)


def measured_ceilings(what: str) -> tuple[float, float]:
  """(copy bandwidth in bytes/s, bf16 GEMM FLOP/s), measured now, after printing the table's title line: `what` (the
  benchmark and its problem) on this device and jax, with both ceilings (the floors in a table divide by them)."""
  bandwidth, peak = copy_bandwidth(), bf16_peak()
  print(f"{what} on {jax.devices()[0].device_kind}, jax {jax.__version__}; copy bandwidth {bandwidth / 1e12:.2f} TB/s, "
        f"bf16 GEMM {peak / 1e12:.0f} TFLOP/s\n", flush=True)
  return bandwidth, peak


def time_call(fn, args, iters: int, repeats: int = 3) -> float:
  """Seconds per call: the median over `repeats` of `iters` back-to-back calls (queue kept full)."""
  jax.block_until_ready(fn(*args))
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    runs.append((time.perf_counter() - start) / iters)
  return statistics.median(runs)


def time_carrying(fn, args, iters: int, repeats: int = 3, *, copy_state: bool = True):
  """(seconds per call: the median of `repeats` runs of `iters` calls, last output, every run's seconds per call) of
  `fn(*args) -> (output, new_state)` whose last argument is a
  state (the caches) it updates: each call's new state is fed to the next and donated, as the decode
  loop does, so the caches are updated in place. Timing it without donation would time a copy of
  every cache per call (1.4 GB at B = 8 and 128K slots). Calls must be idempotent in their output
  (the same tokens written at the same positions). `copy_state=False` donates the caller's state
  itself (it is invalid afterwards): no second copy of caches that fill the device (47 GB at B = 256,
  32K slots, 4 layers)."""
  *fixed, state = args
  step = jax.jit(fn, donate_argnums=len(args) - 1)
  out, state = step(*fixed, jax.tree.map(jnp.copy, state) if copy_state else state)
  jax.block_until_ready(out)
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(iters):
      out, state = step(*fixed, state)
    jax.block_until_ready((out, state))
    runs.append((time.perf_counter() - start) / iters)
  return statistics.median(runs), out, runs


def time_in_loop(fn, args, iters: int, repeats: int = 3, *, whole_output: bool = False) -> float:
  """Seconds per call of `fn(*args)` run `iters` times inside one compiled loop, for calls too short
  to time from Python (dispatch would dominate). Each call's first argument is perturbed by the
  previous output (times 0, which XLA does not fold for floats), so no call can be hoisted.
  `whole_output`: the loop carries every output array (all of it stays live), not one element of the first, where
  XLA could otherwise drop a product whose output only the other leaves hold."""
  def loop(*args):  # the arrays are arguments: closed over, XLA would embed them as constants
    def body(_, carry):
      first = args[0] + (jax.tree.leaves(carry)[0].ravel()[0] * 0).astype(args[0].dtype)
      out = fn(first, *args[1:])
      return out if whole_output else jax.tree.leaves(out)[0].ravel()[0].astype(jnp.float32)
    init = (jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *args)) if whole_output
            else jnp.float32(0))
    return jax.lax.fori_loop(0, iters, body, init)

  loop = jax.jit(loop).lower(*args).compile()  # the timed calls below exclude compilation
  jax.block_until_ready(loop(*args))
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(loop(*args))
    runs.append((time.perf_counter() - start) / iters)
  return statistics.median(runs)


def experts_touched(model, params, *args, donate_state: bool = False, **static) -> list[int]:
  """Distinct routed experts each MoE layer's router picked in `model(*args, **static)`, in layer
  order (from the ids `jax_mtp.moe.MoE` sows; jitted, params and args passed as arguments, `static`
  keyword arguments such as absorb= fixed at trace time). Without `donate_state` only the ids leave the
  program (returning the updated caches would hold a second copy of every cache at once), and XLA writes each
  layer's cache update into a copy. `donate_state`: the last argument (the caches) is donated and the updated
  caches returned, aliasing it: the update is in place, no copy (a copy is 10 GiB a layer at B = 256 × 32K, out of
  memory beside a 4-layer target on the H200, 2026-12-03 10:15); the caller's caches are consumed."""
  def apply(p, *a):
    return model.apply({"params": p}, *a, mutable=["intermediates"], **static)
  if donate_state:
    _, state = jax.jit(apply, donate_argnums=len(args))(params, *args)
  else:
    state = jax.jit(lambda p, *a: apply(p, *a)[1])(params, *args)
  return [len(np.unique(np.asarray(ids))) for ids in jax.tree.leaves(state)]
