"""Bytes exchanged per MTP draft step by the two draft paths, read from compiled HLO.

For the full DeepSeek-V3.2 config (vocab 129280, D 7168) on a tp-device CPU mesh, AOT-lowers and
compiles (a) the whole tensor-parallel draft step (`jax_mtp.ShardedMtp.compiled_step`) and
(b) the head alone (h [T, D] bf16 replicated, lm_head [V, D] bf16 vocab-sharded → tokens or logits),
for path "top_tokens" (Opt-2: local argmax + all-gather of (value, index) pairs) and path "logits"
(all-gather of the fp32 logits), with abstract inputs only (`jax.ShapeDtypeStruct` + `NamedSharding`):
no parameter is materialised. Collective bytes are summed from the HLO by `benchmarks.hlo_collectives`
and printed beside the analytic numbers:

    logits path:     all-gather of T·V fp32        = T · V · 4 bytes
    top-tokens path: all-gather of tp·T·2 int32    = tp · T · 2 · 4 bytes

"bytes" = the size of each collective's result on one device; properties of the compiled program,
not timings. Usage (repo root):

    .venv/bin/python -m benchmarks.draft_collective_bytes [--tp 8] [--tokens 1 8 64 256] [--sweep-tp 2 4 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402

import jax_mtp  # noqa: E402
from benchmarks.hlo_collectives import Collective, collectives, total_bytes  # noqa: E402
from jax_mtp import ShardedMtp  # noqa: E402
from jax_mtp.sharding import SHARED_WITH_TARGET, make_mesh, named_shardings, padded_vocab, param_sharding, replicated  # noqa: E402

PATHS = ("top_tokens", "logits")
BATCH = 1
CACHE_CAPACITY = 4096  # > index_topk (2048): the DSA indexer's top-k runs, as in a long decode


def abstract_params(sharded: ShardedMtp):
  """ShapeDtypeStructs of the padded params, each with its NamedSharding (nothing allocated)."""
  cfg, mesh = sharded.cfg, sharded.mesh
  shapes = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  vp = padded_vocab(cfg, sharded.tp)

  def place(path, x):
    shape = (vp,) + x.shape[1:] if path[0].key in SHARED_WITH_TARGET else x.shape
    return jax.ShapeDtypeStruct(shape, x.dtype, sharding=param_sharding(mesh, tuple(k.key for k in path)))

  return jax.tree_util.tree_map_with_path(place, shapes)


def _replicated(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=named_shardings(mesh, replicated()))


def step_program(sharded: ShardedMtp, t: int, path: str):
  """The lowered whole draft step for T = t tokens."""
  cfg, mesh = sharded.cfg, sharded.mesh
  ids = _replicated(mesh, (BATCH, t), jnp.int32)
  hidden = _replicated(mesh, (BATCH, t, cfg.hidden_size), jnp.dtype(cfg.dtype))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, BATCH, CACHE_CAPACITY))
  caches = jax.tree.map(lambda x: _replicated(mesh, x.shape, x.dtype), caches)
  return sharded.compiled_step(0, None, path).lower(abstract_params(sharded), ids, ids, hidden, caches)


def head_program(sharded: ShardedMtp, t: int, path: str):
  """The lowered head alone: the model's own get_top_tokens / compute_logits on h [1, T, D] bf16."""
  cfg, mesh, model = sharded.cfg, sharded.mesh, sharded.model
  method = model.get_top_tokens if path == "top_tokens" else model.compute_logits

  def per_shard(params, h_BTD):
    return model.apply({"params": params}, h_BTD, method=method)

  fn = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(sharded._param_specs, replicated()),
                             out_specs=replicated(), check_vma=False))
  return fn.lower(abstract_params(sharded), _replicated(mesh, (BATCH, t, cfg.hidden_size), jnp.bfloat16))


def analytic_head_bytes(cfg, tp: int, t: int, path: str) -> int:
  if path == "logits":
    return BATCH * t * padded_vocab(cfg, tp) * 4
  return tp * BATCH * t * 2 * 4


def measure(cfg, tp: int, t: int) -> dict:
  """Collectives of the compiled (and, for the step, the as-lowered) programs of both paths."""
  sharded = ShardedMtp(cfg, make_mesh(tp))
  out = {}
  for path in PATHS:
    start = time.perf_counter()
    step = step_program(sharded, t, path)
    step_compiled = collectives(step.compile().as_text())
    step_lowered = collectives(step.compiler_ir("hlo").as_hlo_text())
    head_compiled = collectives(head_program(sharded, t, path).compile().as_text())
    out[path] = dict(step=step_compiled, step_lowered=step_lowered, head=head_compiled,
                     analytic=analytic_head_bytes(cfg, tp, t, path), seconds=time.perf_counter() - start)
  return out


def _ops(found: list[Collective]) -> str:
  return " + ".join(f"{c.op} {c.dtype}[{','.join(map(str, c.shape))}]" for c in found) or "(none)"


def _n(x: int) -> str:
  return f"{x:,}"


def table(cfg, rows: list[tuple[int, int, dict]]) -> str:
  lines = [
      "| tp | T | path | head collective (compiled HLO) | head bytes (HLO) | head bytes (analytic) "
      "| whole-step bytes (compiled, CPU) | whole-step bytes (as lowered) |",
      "|---:|---:|---|---|---:|---:|---:|---:|",
  ]
  for tp, t, m in rows:
    for path in PATHS:
      r = m[path]
      lines.append(f"| {tp} | {t} | {path} | {_ops(r['head'])} | {_n(total_bytes(r['head']))} | {_n(r['analytic'])} "
                   f"| {_n(total_bytes(r['step']))} | {_n(total_bytes(r['step_lowered']))} |")
    top, full = m["top_tokens"], m["logits"]
    lines.append(f"| {tp} | {t} | **ratio logits / top_tokens** | | "
                 f"**{total_bytes(full['head']) / total_bytes(top['head']):,.0f}×** "
                 f"| {full['analytic'] / top['analytic']:,.0f}× "
                 f"| {total_bytes(full['step']) / total_bytes(top['step']):.2f}× "
                 f"| {total_bytes(full['step_lowered']) / total_bytes(top['step_lowered']):.2f}× |")
  return "\n".join(lines)


def check(cfg, tp: int, t: int, m: dict) -> None:
  """The head's collectives appear in the whole step, and HLO bytes equal the analytic bytes."""
  for path in PATHS:
    r = m[path]
    assert total_bytes(r["head"]) == r["analytic"], (path, r["head"], r["analytic"])
    for c in r["head"]:
      assert c in r["step"], (path, c, r["step"])
  shared_top = [c for c in m["top_tokens"]["step"] if c not in m["top_tokens"]["head"]]
  shared_full = [c for c in m["logits"]["step"] if c not in m["logits"]["head"]]
  assert shared_top == shared_full, (shared_top, shared_full)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tp", type=int, default=8)
  parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
  parser.add_argument("--sweep-tp", type=int, nargs="*", default=[2, 4], help="extra tp values at T=64")
  args = parser.parse_args(argv)
  cfg = jax_mtp.deepseek_v32()
  rows, seconds = [], []
  for tp, t in [(args.tp, t) for t in args.tokens] + [(tp, 64) for tp in args.sweep_tp]:
    m = measure(cfg, tp, t)
    check(cfg, tp, t, m)
    rows.append((tp, t, m))
    seconds += [m[p]["seconds"] for p in PATHS]
  first = rows[0][2]["top_tokens"]
  shared = [c for c in first["step"] if c not in first["head"]]
  shared_lowered = [c for c in first["step_lowered"] if c.dtype != "s32"]
  peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
  print(f"DeepSeek-V3.2 MTP draft step (vocab {cfg.vocab_size}, D {cfg.hidden_size}, {cfg.dtype} activations), "
        f"batch {BATCH}, cache capacity {CACHE_CAPACITY}; full layer + head compiled on {jax.device_count()} CPU "
        f"devices from abstract inputs (no params materialised).")
  print(f"Compile: ≤ {max(seconds):.1f} s per path (step + head programs), peak RSS {peak_gb:.2f} GB.\n")
  print(table(cfg, rows))
  print(f"\nShared by both paths (tp={rows[0][0]}, T={rows[0][1]}): compiled for CPU: {_ops(shared)}; "
        f"as lowered: {_ops(shared_lowered)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
