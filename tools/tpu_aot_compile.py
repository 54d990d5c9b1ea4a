"""AOT-compile the sharded MTP draft step for a real TPU topology on a CPU-only machine.

Needs libtpu (`pip install "jax[tpu]"`), no TPU. Mosaic really compiles the Pallas kernels at
`.compile()`, so VMEM overflows and Mosaic lowering errors show up here as they would on a TPU.

    python tools/tpu_aot_compile.py --topology v5e:2x2 --preset tiny
    python tools/tpu_aot_compile.py --topology v5e:2x4 --preset deepseek_v32 --batch 64
    python tools/tpu_aot_compile.py --topology v5p:2x2x1 --preset deepseek_v32 --moe-impl tokamax_tpu
    python tools/tpu_aot_compile.py --topology v6e:2x4 --preset deepseek_v32 --weights fp8

Prints, per norm impl, the compile time, per-device HBM (arguments / temporaries), the collectives
left in the optimised HLO, whether the named Mosaic kernel is in it, and the count of Mosaic kernels
(the routed experts' impl, `--moe-impl`, 'auto' resolved for TPU: tokamax_tpu adds 3 grouped matmuls).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu finds no chips; compile-only topologies still work

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_mtp  # noqa: E402
from jax_mtp import fp8  # noqa: E402
from jax_mtp.experts import resolve_expert_impl  # noqa: E402
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu import KERNEL_NAME  # noqa: E402
from jax_mtp.parallel import ShardedMtp  # noqa: E402
from jax_mtp.sharding import make_mesh, padded_vocab, param_specs  # noqa: E402

PRESETS = {"tiny": jax_mtp.tiny, "deepseek_v32": jax_mtp.deepseek_v32, "glm5": jax_mtp.glm5}


def abstract_args(cfg, mesh, batch: int, capacity: int, weights: str = "bf16"):
  tp = mesh.shape["tp"]
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  if weights == "fp8":  # as `--weights fp8` loads a V3.2 checkpoint: codes + block scales (jax_mtp.fp8)
    params = fp8.as_checkpoint_fp8(params, cfg.fp8_block, fp8.abstract_fp8)
  vocab = padded_vocab(cfg, tp)
  params = dict(params, embed_tokens=jax.ShapeDtypeStruct((vocab, cfg.hidden_size), params["embed_tokens"].dtype),
                lm_head=jax.ShapeDtypeStruct((vocab, cfg.hidden_size), params["lm_head"].dtype))

  def placed(tree, specs):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)),
                        tree, specs)

  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, batch, capacity))
  ids = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  rep = lambda tree: placed(tree, jax.tree.map(lambda _: P(), tree))  # noqa: E731
  return placed(params, param_specs(params)), rep(ids), rep(ids), rep(hidden), rep(caches)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v5e:2x2", help="e.g. v5e:2x2, v5e:2x4, v6e:2x4")
  parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  parser.add_argument("--batch", type=int, default=8, help="draft batch (tokens per step)")
  parser.add_argument("--capacity", type=int, default=4096, help="cache positions")
  parser.add_argument("--weights", default="bf16", choices=("bf16", "fp8"),
                      help="fp8: the weights a V3.2 checkpoint stores in FP8 kept as codes + block scales")
  parser.add_argument("--moe-impl", default="auto", choices=jax_mtp.config.MOE_IMPLS,
                      help="routed experts; 'auto' resolves for platform tpu (not this CPU host)")
  args = parser.parse_args(argv)
  topo = topologies.get_topology_desc(topology_name=args.topology, platform="tpu",
                                      chips_per_host_bounds=(2, 4, 1) if args.topology.endswith("2x4") else (2, 2, 1))
  devices = topo.devices
  cfg = PRESETS[args.preset]()
  local_gate = jax.ShapeDtypeStruct((cfg.n_routed_experts // len(devices), cfg.hidden_size, cfg.moe_intermediate_size),
                                    jnp.dtype(cfg.param_dtype))
  cfg = cfg.replace(moe_impl=resolve_expert_impl(args.moe_impl, "tpu", args.batch, cfg.num_experts_per_tok, local_gate,
                                                 fp8_codes=args.weights == "fp8"))
  mesh = make_mesh(len(devices), devices=devices)
  print(f"{args.topology}: {len(devices)} x {devices[0].device_kind}; {args.preset}; {args.weights} weights; "
        f"batch {args.batch}; "
        f"cache {args.capacity}; experts {cfg.moe_impl}; jax {jax.__version__}")
  for impl in ("xla", "pallas_tpu"):
    step_args = abstract_args(cfg, mesh, args.batch, args.capacity, args.weights)
    step = ShardedMtp(cfg, mesh, norm_impl=impl).compiled_step(0, None, "top_tokens",
                                                                jax.tree.structure(step_args[0]))
    start = time.perf_counter()
    # tokamax's TPU kernels read the chip generation from the mesh in context (no TPU in this process)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      lowered = step.lower(*step_args)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    hlo, mem = compiled.as_text(), compiled.memory_analysis()
    collectives = sorted(set(re.findall(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute)(?:-start)?\(", hlo)))
    counts = {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in collectives}
    print(f"  impl={impl:10s} compile {seconds:6.1f} s | args {mem.argument_size_in_bytes / 2**30:.2f} GiB "
          f"temp {mem.temp_size_in_bytes / 2**20:.1f} MiB | collectives {counts} | "
          f"mosaic kernels {hlo.count('tpu_custom_call')} | {KERNEL_NAME} present: {KERNEL_NAME in hlo}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
