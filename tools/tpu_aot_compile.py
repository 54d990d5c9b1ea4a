"""AOT-compile the sharded MTP draft step for a real TPU topology on a CPU-only machine.

Needs libtpu (`pip install "jax[tpu]"`), no TPU. Mosaic really compiles the Pallas kernels at
`.compile()`, so VMEM overflows and Mosaic lowering errors show up here as they would on a TPU.

    python tools/tpu_aot_compile.py --topology v5e:2x2 --preset tiny
    python tools/tpu_aot_compile.py --topology v5e:2x4 --preset deepseek_v32 --batch 64
    python tools/tpu_aot_compile.py --topology v5p:2x2x1 --preset deepseek_v32 --moe-impl tokamax_tpu
    python tools/tpu_aot_compile.py --topology v6e:2x4 --preset deepseek_v32 --weights fp8
    python tools/tpu_aot_compile.py --topology v5p:2x2x2 --program round --preset deepseek_v32 --layers 2

`--program round`: the whole speculative decode — the prefill and one round (k draft steps of the MTP
layer, the target's verification, acceptance) of `jax_mtp.speculative.Speculator` — for a topology of
one host or several (v5p 2x2x2: 8 chips on 2 hosts, tp spanning both), with a V3.2-width target cut
to `--layers` layers.

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

import jax_mtp  # noqa: E402
from jax_mtp import fp8  # noqa: E402
from jax_mtp.experts import resolve_expert_impl  # noqa: E402
from jax_mtp.kernels.fused_allreduce_rmsnorm_tpu import KERNEL_NAME  # noqa: E402
from jax_mtp.sharding import SHARED_WITH_TARGET  # noqa: E402
from jax_mtp.model import init_target_params  # noqa: E402
from jax_mtp import ShardedMtp  # noqa: E402
from jax_mtp.sharding import make_mesh, named_shardings, padded_vocab, param_specs, replicated  # noqa: E402
from jax_mtp.speculative import Speculator  # noqa: E402

PRESETS = {"tiny": jax_mtp.tiny, "deepseek_v32": jax_mtp.deepseek_v32, "glm5": jax_mtp.glm5}


def abstract_args(cfg, mesh, batch: int, capacity: int, weights: str = "bf16"):
  tp = mesh.shape["tp"]
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  if weights == "fp8":  # as `--weights fp8` loads a V3.2 checkpoint: codes + block scales (jax_mtp.fp8)
    params = fp8.as_checkpoint_fp8(params, cfg.fp8_block, fp8.abstract_fp8)
  vocab = padded_vocab(cfg, tp)
  params = dict(params, embed_tokens=jax.ShapeDtypeStruct((vocab, cfg.hidden_size), params["embed_tokens"].dtype),
                lm_head=jax.ShapeDtypeStruct((vocab, cfg.hidden_size), params["lm_head"].dtype))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, batch, capacity))
  ids = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  return (placed(params, mesh, param_specs(params)), placed(ids, mesh), placed(ids, mesh), placed(hidden, mesh),
          placed(caches, mesh))


def placed(tree, mesh, specs=None):
  """ShapeDtypeStructs of `tree` with their NamedShardings (replicated where `specs` is None; every
  layout comes from jax_mtp.sharding)."""
  specs = jax.tree.map(lambda _: replicated(), tree) if specs is None else specs
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree,
                      named_shardings(mesh, specs))


def round_args(cfg, mesh, batch: int, prompt: int, weights: str):
  """Abstract (target, drafter) params on the mesh and the prefill's other arguments."""
  tp = mesh.shape["tp"]
  target = jax.eval_shape(lambda key: init_target_params(cfg, key), jax.random.key(0))
  mtp = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  drafter = {name: value for name, value in mtp.items() if name not in SHARED_WITH_TARGET}
  if weights == "fp8":
    target, drafter = (fp8.as_checkpoint_fp8(tree, cfg.fp8_block, fp8.abstract_fp8) for tree in (target, drafter))
  vocab = padded_vocab(cfg, tp)
  target = dict(target, **{name: jax.ShapeDtypeStruct((vocab, cfg.hidden_size), target[name].dtype)
                           for name in SHARED_WITH_TARGET})
  params = (placed(target, mesh, param_specs(target)), placed(drafter, mesh, param_specs(drafter)))
  rest = (jax.ShapeDtypeStruct((batch, prompt), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32),
          jax.eval_shape(lambda: jax.random.key(0)), jax.ShapeDtypeStruct((), jnp.float32),
          jax.ShapeDtypeStruct((1,), jnp.int32))
  return params, placed(rest, mesh)


def report(name: str, compiled, seconds: float) -> None:
  hlo, mem = compiled.as_text(), compiled.memory_analysis()
  collectives = sorted(set(re.findall(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute)(?:-start)?\(", hlo)))
  counts = {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in collectives}
  print(f"  {name:24s} compile {seconds:6.1f} s | args {mem.argument_size_in_bytes / 2**30:.2f} GiB "
        f"temp {mem.temp_size_in_bytes / 2**20:.1f} MiB | collectives {counts} | "
        f"mosaic kernels {hlo.count('tpu_custom_call')} | {KERNEL_NAME} present: {KERNEL_NAME in hlo}", flush=True)


def compile_round(cfg, mesh, args) -> None:
  """The Speculator's prefill and round, lowered with abstract arguments and compiled for the topology."""
  params, (prompt_BT, lengths_B, key, temperature, stop_N) = round_args(cfg, mesh, args.batch, args.prompt,
                                                                        args.weights)
  for impl in ("xla", "pallas_tpu"):
    spec = Speculator(cfg, mesh, args.k, norm_impl=impl)
    prefill_args = (*params, prompt_BT, lengths_B, key, temperature, stop_N)
    start = time.perf_counter()
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      prefill = spec.program("prefill", args.capacity, False, prefill_args).lower(*prefill_args).compile()
    report(f"impl={impl} prefill", prefill, time.perf_counter() - start)
    max_new = placed(jax.ShapeDtypeStruct((), jnp.int32), mesh)
    round_args_ = (*params, prefill.out_info, max_new, temperature, stop_N)
    start = time.perf_counter()
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      one_round = spec.program("round", args.capacity, False, round_args_).lower(*round_args_).compile()
    report(f"impl={impl} round (k={args.k})", one_round, time.perf_counter() - start)


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
  parser.add_argument("--program", default="step", choices=("step", "round"),
                      help="step: the MTP draft step; round: the speculator's prefill and round (target + MTP)")
  parser.add_argument("--layers", type=int, default=2, help="round: target layers (the first dense, the rest MoE)")
  parser.add_argument("--prompt", type=int, default=128, help="round: prompt tokens per row")
  parser.add_argument("-k", type=int, default=3, help="round: draft tokens per round")
  args = parser.parse_args(argv)
  topo = topologies.get_topology_desc(topology_name=args.topology, platform="tpu",
                                      chips_per_host_bounds=(2, 4, 1) if args.topology.endswith("2x4") else (2, 2, 1))
  devices = topo.devices
  cfg = PRESETS[args.preset]()
  if args.program == "round":
    cfg = cfg.replace(num_hidden_layers=args.layers, first_k_dense_replace=min(1, args.layers - 1))
  local_gate = jax.ShapeDtypeStruct((cfg.n_routed_experts // len(devices), cfg.hidden_size, cfg.moe_intermediate_size),
                                    jnp.dtype(cfg.param_dtype))
  cfg = cfg.replace(moe_impl=resolve_expert_impl(args.moe_impl, "tpu", args.batch, cfg.num_experts_per_tok, local_gate,
                                                 fp8_codes=args.weights == "fp8"))
  mesh = make_mesh(len(devices), devices=devices)
  hosts = len({d.process_index for d in devices})
  print(f"{args.topology}: {len(devices)} x {devices[0].device_kind} on {hosts} host(s); {args.preset}"
        f"{f' ({args.layers} target layers)' if args.program == 'round' else ''}; {args.weights} weights; "
        f"batch {args.batch}; cache {args.capacity}; experts {cfg.moe_impl}; jax {jax.__version__}", flush=True)
  if args.program == "round":
    compile_round(cfg, mesh, args)
    return 0
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
