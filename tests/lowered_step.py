"""Programs exported for a platform (an abstract H200 mesh for CUDA), as MLIR text: the MTP draft step, and
the CLI's prefill and round, for the tests that prove a kernel is in the lowered program where its impl (or
`auto`, which follows the program's platform: jax_mtp.platform) asks for it."""

import functools
import re

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

import jax_mtp
from benchmarks.lowering_time import H200, export_programs
from jax_mtp.experts import resolve_expert_impl

V5E = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
DEVICES = {"cuda": H200, "tpu": V5E}  # the abstract device a program for each platform is traced on


def mtp_step_module(cfg: jax_mtp.MtpConfig, platform: str, batch: int, capacity: int, device=None) -> str:
  """The MTP draft step (T = 1) for `platform` on `device` (default: DEVICES[platform]), as MLIR text. `auto`
  experts stay `auto` where a Hopper's `auto` runs our 16-bit kernel at this batch; elsewhere they become ragged_dot,
  since tokamax's kernels read the local accelerator when traced."""
  if cfg.moe_impl == "auto":
    weights = jax.ShapeDtypeStruct((cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size),
                                   cfg.param_dtype)
    ours = platform == "cuda" and resolve_expert_impl("auto", "gpu", batch, cfg.num_experts_per_tok,
                                                      weights) == "mosaic_gpu"
    if not ours:
      cfg = cfg.replace(moe_impl="ragged_dot")
  params = jax.eval_shape(lambda key: jax_mtp.init_params(cfg, key), jax.random.key(0))
  caches = jax.eval_shape(lambda: jax_mtp.init_caches(cfg, batch, capacity))
  ids = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  step = jax.jit(lambda p, i, pos, h, c: jax_mtp.MtpPredictor(cfg).apply({"params": p}, i, pos, h, c).hidden_BTD)
  checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  mesh = AbstractMesh((1,), ("tp",), axis_types=(AxisType.Auto,), abstract_device=device or DEVICES[platform])
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(step, platforms=[platform], disabled_checks=checks)
    return exported(params, ids, ids, hidden, caches).mlir_module()


def speculator_modules(cfg: jax_mtp.MtpConfig, prompts, max_new_tokens: int, k: int) -> dict[str, str]:
  """The CLI's two programs — the prefill and the greedy round, at the capacity the CLI's request rule gives
  these prompts (`request.required_capacity`) — exported for an abstract H200 (`benchmarks.lowering_time`, which
  times the same export), as MLIR text by name. `cfg.moe_impl` must be explicit: tokamax's Mosaic GPU kernel (GPU
  `auto`) reads the local GPU when traced."""
  _, programs = export_programs(cfg, prompts, max_new_tokens, k)
  return {name: exported.mlir_module() for name, exported, *_ in programs}


def kernel_lowerings(module_text: str, kernel_name: str) -> int:
  """How many Mosaic GPU custom calls of the kernel named `kernel_name` a module's text holds (each is one line,
  holding its serialized kernel and so its name): one per distinct launch, however many sites call it."""
  return sum(kernel_name in line for line in module_text.splitlines() if "custom_call @mosaic_gpu" in line)


def kernel_calls(module_text: str, kernel_name: str) -> int:
  """How many times a lowered or exported module launches the Mosaic GPU kernel named `kernel_name`, counted by call
  site: a kernel's custom call (one line of the text, holding its serialized kernel and so its name) sits in the
  private function of its jitted entry point (`mosaic_gpu_common.lowered_once_per_launch`: the same launch lowered
  once, called from each layer), so each function's launches are weighted by the calls reaching it from `main`."""
  body: dict[str, list[str]] = {}
  name = None
  for line in module_text.splitlines():
    if found := re.search(r"func\.func (?:public |private )?@([^\s(]+)\(", line):
      name = found.group(1)
      body[name] = []
    elif name is not None:
      body[name].append(line)

  @functools.cache
  def launches(func: str) -> int:
    own = kernel_lowerings("\n".join(body[func]), kernel_name)
    callees = (callee for line in body[func] for callee in re.findall(r"(?<!custom_)call @([^\s(]+)\(", line))
    return own + sum(launches(callee) for callee in callees)
  return launches("main")
