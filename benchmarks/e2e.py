"""The user's path end to end on one device: the CLI's flags, capacity rule, kernel checks and compiled programs
(`Speculator.program`: the prefill and the round `python -m jax_mtp.decode` runs), on a reduced-depth, full-width
DeepSeek-V3.2 target + its MTP layer with random weights.

    python -m benchmarks.e2e --layers 2 --prompt 1024 8192 32768 --batch 1 8 64 -k 3 --weights bf16 fp8

Per (weights, prompt, batch): the prefill (the prompt through the target and the MTP catch-up, the first
token: time to first token) in seconds, tokens/s and MFU; the round (k draft steps + verification +
acceptance) beside its floor; the plain target step; tokens/s at the published acceptance lengths (random
weights accept no drafts, and a round does the same work whatever is accepted: DeepSeek-V3.2's mean
acceptance length 1.92 at k = 1, vLLM PR #25982; 2.96 at k = 3, SGLang PR #15307); and which implementation
each part ran, read from the compiled programs' HLO (the kernels' names), not from the config; and the seconds to
lower and compile the prefill and the round (what a first request waits before its prefill).

Counts (stated, per token, all multiply-adds × 2):
  prefill FLOPs  every matmul a token runs in each target layer and the MTP layer (q_a, q_b, kv_a, the
                 absorbed W_UK / W_UV products, o_proj; indexer wq_b, wk, weights_proj; router, routed experts ×
                 num_experts_per_tok, shared experts; dense MLP layers; eh_proj) + attention over
                 min(index_topk, p + 1) entries (q·[c; k_pe] and p·c) + the indexer's q·k over the p + 1 visible
                 slots, at each prompt position p; the head for the last token only. Work on masked slots
                 (the index-scores kernel scores the whole cache) is not counted: MFU counts useful work.
  peak           a bf16 8192³ matmul timed in the same run.
  round floor    bytes one round must read / the copy bandwidth measured in the same run: the target's
                 weights once (verification; routed experts scaled by the expected share touched by B·(k+1)·K
                 uniform picks), the MTP layer's k + 1 times (catch-up + k draft steps, each with its touched
                 share) and the head k + 1 times, plus per layer and call the indexer keys of every row's
                 context and the index_topk selected [latent; k_pe] entries per query. Embedding rows aside.
`--cli` passes the CLI's own flags (kernels, caches, and sampling: `--cli=--temperature --cli=0.6 --cli=--top-p
--cli=0.95` times the sampled programs, top-p's sort of the vocabulary included). `--prefill-chunk` takes several
values to time the prefill at each (0: the CLI's auto size); `--profile` adds a
per-part table of each prefill from a device trace. `--small` runs the
tiny preset's widths, to check the script on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mtp
from benchmarks import step_profile
from benchmarks.timing import bf16_peak, copy_bandwidth
from jax_mtp import decode, decode_flags, fp8, generation_defaults
from jax_mtp.acceptance import Sampling
from jax_mtp.sharding import SHARED_WITH_TARGET
from jax_mtp.generate import TargetDecoder
from jax_mtp.model import init_target_params
from jax_mtp.prefill import prefill_budget, prefill_plan
from jax_mtp.ran_kernels import parts_ran
from jax_mtp.request import check_caches_fit, pack_prompts, required_capacity, stop_id_array
from jax_mtp.sharding import tensor_parallel

ACCEPTANCE = {1: 1.92, 3: 2.96}  # DeepSeek-V3.2's published mean acceptance lengths (see the docstring)
_EXPERTS = ("w_gate_EDF", "w_up_EDF", "w_down_EFD")


def layer_flops(cfg: jax_mtp.MtpConfig, moe: bool, position: int) -> float:
  """FLOPs of one decoder layer for one token at `position` (the module docstring's count)."""
  d, n = cfg.hidden_size, cfg.num_attention_heads
  c, r, p, h = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
  macs = d * cfg.q_lora_rank + cfg.q_lora_rank * n * (p + r) + d * (c + r) + n * p * c + n * c * h + n * h * d
  entries = min(cfg.index_topk, position + 1) if cfg.has_indexer else position + 1
  macs += n * entries * (c + r) + n * entries * c
  if cfg.has_indexer:
    i, j = cfg.index_n_heads, cfg.index_head_dim
    macs += cfg.q_lora_rank * i * j + d * j + d * i + i * j * (position + 1)
  if moe:
    f = cfg.moe_intermediate_size
    macs += d * cfg.n_routed_experts + 3 * d * f * (cfg.num_experts_per_tok + cfg.n_shared_experts)
  else:
    macs += 3 * d * cfg.intermediate_size
  return 2.0 * macs


def prefill_flops(cfg: jax_mtp.MtpConfig, prompt: int) -> float:
  """FLOPs of one row's prefill: every target layer and the MTP layer at each position, the last head."""
  per_position = sum(layer_flops(cfg, cfg.is_moe_layer(i), 0) for i in range(cfg.num_hidden_layers))
  base = (per_position + layer_flops(cfg, True, 0) + 2 * 2 * cfg.hidden_size**2) * prompt
  growth = sum(layer_flops(cfg, cfg.is_moe_layer(i), prompt) - layer_flops(cfg, cfg.is_moe_layer(i), 0)
               for i in range(cfg.num_hidden_layers)) + layer_flops(cfg, True, prompt) - layer_flops(cfg, True, 0)
  return base + growth * prompt / 2 + 2 * cfg.hidden_size * cfg.vocab_size  # attention grows ~linearly in p


def touched_share(cfg: jax_mtp.MtpConfig, tokens: int) -> float:
  """Expected share of routed experts `tokens` tokens pick, num_experts_per_tok each, uniformly."""
  e = cfg.n_routed_experts
  return 1 - (1 - 1 / e) ** (tokens * cfg.num_experts_per_tok)


def weight_bytes(tree: dict, share: float) -> float:
  """Bytes of a params tree (one model's layers, no embedding or head) with routed experts scaled by `share`."""
  total = 0.0
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    names = [getattr(key, "key", "") for key in path]
    routed = any(name.startswith(_EXPERTS) for name in names)  # FP8 scales ("..._scale_inv") count with them
    total += x.nbytes * (share if routed else 1.0)
  return total


def round_floor_bytes(cfg, target: dict, drafter: dict, batch: int, k: int, context: int) -> float:
  """Bytes one round must read (the module docstring's count)."""
  w = k + 1
  body = {name: x for name, x in target.items() if name not in SHARED_WITH_TARGET}
  head = target["lm_head"].nbytes
  total = weight_bytes(body, touched_share(cfg, batch * w)) + head  # verification over B·(k+1) tokens
  total += weight_bytes(drafter, touched_share(cfg, batch * w)) + head  # catch-up over the window
  total += k * (weight_bytes(drafter, touched_share(cfg, batch)) + head)  # k draft steps
  if cfg.has_indexer and context > cfg.index_topk:
    key_dtype = jnp.dtype(cfg.index_key_dtype)
    key_bytes = cfg.index_head_dim * key_dtype.itemsize + (4 if key_dtype.itemsize == 1 else 0)  # + fp8 scale
    rope_bytes = cfg.qk_rope_head_dim * jnp.dtype(cfg.dtype).itemsize
    if cfg.kv_cache_dtype == "fp8":  # e4m3 codes, an fp32 scale a group, the rope key in the compute dtype (656 B)
      entry_bytes = cfg.kv_lora_rank + cfg.kv_lora_rank // cfg.kv_scale_group * 4 + rope_bytes
    else:
      entry_bytes = cfg.kv_lora_rank * jnp.dtype(cfg.mla_cache_dtype).itemsize + rope_bytes
    calls = cfg.num_hidden_layers + k + 1  # target layers once, the MTP layer k + 1 times: each reads the keys
    queries = cfg.num_hidden_layers * batch * w + batch * w + k * batch  # each reads index_topk entries
    total += calls * batch * context * key_bytes + queries * cfg.index_topk * entry_bytes
  return total


def _median_seconds(fn, repeats: int) -> float:
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    runs.append(time.perf_counter() - start)
  return statistics.median(runs)


def cli_flags(args, chunk: int = 0):
  """`--cli`'s flags (and k, the prefill chunk, --ignore-eos) as the CLI's own parser reads them."""
  argv = ["--num-speculative-tokens", str(args.k), "--prefill-chunk", str(chunk), "--ignore-eos", *args.cli]
  return decode_flags.parser().parse_args(argv)


def cli_config(args, chunk: int) -> jax_mtp.MtpConfig:
  """The model's config as the CLI sets it (decode.with_flags) from the CLI's own parser."""
  flags = cli_flags(args, chunk)
  base = jax_mtp.tiny() if args.small else jax_mtp.deepseek_v32()
  return decode.with_flags(base.replace(num_hidden_layers=args.layers, first_k_dense_replace=1), flags)


def random_weights(cfg: jax_mtp.MtpConfig, weights: str) -> tuple[jax_mtp.MtpConfig, dict, dict]:
  """(config, target params, MTP params): random bf16, or those quantised to FP8 codes + 128×128 block scales
  (as an FP8 checkpoint stores them and `--weights fp8` keeps them). FP8: each model is quantised before the next
  is drawn, so the device never holds both in bf16 (both and a quantiser's temporaries ran an 80 GB H100 out of
  memory, 2026-12-05)."""
  block = (128, 128)
  as_weights = (lambda p: p) if weights == "bf16" else (lambda p: fp8.as_checkpoint_fp8(p, block, fp8.quantize))
  target = as_weights(init_target_params(cfg, jax.random.key(0)))
  mtp = as_weights(jax_mtp.init_params(cfg, jax.random.key(1)))
  return (cfg if weights == "bf16" else cfg.replace(fp8_block=block)), target, mtp


def run_weights(args, weights: str, peak: float, bandwidth: float, out: list) -> None:
  cfg, target, mtp = random_weights(cli_config(args, args.prefill_chunk[0]), weights)
  mesh = jax_mtp.make_mesh(1)
  spec = jax_mtp.Speculator(cfg, mesh, args.k)
  params = spec.shard(target, mtp)
  del target, mtp
  rng = np.random.default_rng(0)
  for prompt_len, batch in [(p, b) for p in args.prompt for b in args.batch]:
    if prompt_len * batch > args.max_prefill_tokens:
      continue
    try:
      out.append(run_row(args, cfg, spec, params, prompt_len, batch, rng, peak, bandwidth))
    except Exception as e:  # e.g. device memory at the largest rows: a row, not the end of the run
      print(f"| {weights} | {prompt_len} | {batch} | failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} |",
            flush=True)


def run_row(args, cfg, spec, params, prompt_len: int, batch: int, rng, peak: float, bandwidth: float) -> dict:
  """One (prompt, batch) row of the table (see the module docstring)."""
  mesh, weights = spec.mesh, "fp8" if fp8.fp8_paths(params.target) else "bf16"
  # the CLI's sampling flags, as Speculator.generate passes them (greedy: the value is unused); random weights have
  # no generation_config.json: what a flag leaves unset is greedy's
  flags, max_new = cli_flags(args), np.int32(args.max_new)
  s, _ = generation_defaults.resolve(generation_defaults.flags_given(flags), None, flags.generation_config,
                                     check=False)
  sampled = s["temperature"] > 0
  sampling = Sampling.of(s["temperature"], s["top_k"], s["top_p"], cfg.vocab_size) if sampled else np.float32(0)
  prompts = [[int(t) for t in rng.integers(0, cfg.vocab_size, prompt_len)] for _ in range(batch)]
  capacity = required_capacity(cfg, prompts, args.max_new, args.k)  # the CLI's rule
  check_caches_fit(cfg, batch, capacity, mesh.devices.flat)
  decode.check_kernel_impls(cfg, capacity)
  budget = prefill_budget(cfg, batch, capacity, mesh.devices.flat)  # Speculator.generate's, as the CLI's
  prompt_BT, lengths_B = pack_prompts(prompts)
  stop_N = stop_id_array(cfg, [])
  row = {"weights": weights, "prompt": prompt_len, "batch": batch, "capacity": capacity, "k": args.k}
  prefills = {}
  for chunk in args.prefill_chunk:
    chunk_spec = spec if chunk == args.prefill_chunk[0] else jax_mtp.Speculator(
        cfg.replace(prefill_chunk=chunk), mesh, args.k)
    prefill_args = (*params, prompt_BT, lengths_B, jax.random.key(0), sampling, stop_N)
    start = time.perf_counter()
    lowered = chunk_spec.program("prefill", capacity, sampled, prefill_args, budget).lower(*prefill_args)
    prefill = lowered.compile()
    compile_s = time.perf_counter() - start
    state = prefill(*prefill_args)
    seconds = _median_seconds(lambda prefill=prefill, a=prefill_args: prefill(*a), args.repeats)
    used = prefill_plan(chunk_spec.cfg, batch, capacity, tensor_parallel(1), budget, tokens=prompt_len)[0]
    prefills[chunk] = {"chunk": used, "seconds": seconds, "compile_s": compile_s,
                       "tokens_per_s": batch * prompt_len / seconds,
                       "mfu": batch * prefill_flops(cfg, prompt_len) / seconds / peak,
                       "impls": parts_ran(prefill.as_text())}
    if args.profile:
      prefills[chunk]["profile"] = profile_prefill(lowered, prefill_args, seconds,
                                                   f"prefill, prompt {prompt_len}, B = {batch}, chunk {used}")
    del state
  row["prefill"] = prefills
  state = prefill(*prefill_args)
  round_args = (*params, state, max_new, sampling, stop_N)
  start = time.perf_counter()
  one_round = spec.program("round", capacity, sampled, round_args).lower(*round_args).compile()
  row["round_compile_s"] = time.perf_counter() - start  # lowering + XLA's compile: a first request waits for both
  row["round_impls"] = parts_ran(one_round.as_text())
  state, _ = one_round(*params, state, max_new, sampling, stop_N)
  runs = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.iters):
      state, owed = one_round(*params, state, max_new, sampling, stop_N)
    jax.block_until_ready(owed)
    runs.append((time.perf_counter() - start) / args.iters)
  row["round_s"] = statistics.median(runs)
  row["round_floor_s"] = round_floor_bytes(cfg, params.target, params.drafter, batch, args.k, prompt_len) / bandwidth
  row["plain_step_s"] = plain_step_seconds(cfg, mesh, params.target, state, args)
  row["tokens_per_s"] = {str(length): batch * length / row["round_s"] for length in _acceptance(args.k)}
  row["plain_tokens_per_s"] = batch / row["plain_step_s"]
  print_row(row, flush=True)
  return row


def profile_prefill(lowered, prefill_args, seconds: float, label: str) -> dict:
  """The prefill's kernels summed per model part, from a device trace of one call of it compiled without command
  buffers (step_profile's: each kernel then names its instruction, cuBLAS's GEMMs too)."""
  prefill = lowered.compile(compiler_options=step_profile.UNGRAPHED)
  jax.block_until_ready(prefill(*prefill_args))  # its first call outside the trace
  trace_dir = tempfile.mkdtemp(prefix="e2e_prefill_")
  with jax.profiler.trace(trace_dir):
    jax.block_until_ready(prefill(*prefill_args))
  return step_profile.summarize(step_profile.device_events(trace_dir), step_profile.op_names(prefill.as_text()), 1,
                                seconds * 1e6, label)


def plain_step_seconds(cfg, mesh, target_params, state, args) -> float:
  """One step of the CLI's plain decoder (`TargetDecoder`, what --check runs) over the speculator's target
  caches after its prefill, donated step to step as its loop does."""
  plain = TargetDecoder(cfg, mesh)
  step = plain._step(jax.tree.structure(target_params))  # noqa: SLF001 (the decoder's own compiled step)
  b = state.length_B.shape[0]
  carry = [state.length_B, state.next_token_B, jax.tree.map(jnp.copy, state.target_caches), state.tokens_BO,
           jnp.full((b,), state.tokens_BO.shape[1], jnp.int32)]
  def call(i):
    carry[3], carry[0], carry[1], carry[2], carry[4] = step(target_params, np.int32(i), carry[0], carry[1], carry[2],
                                                            carry[3], carry[4])
    return carry[1]
  jax.block_until_ready(call(1))
  jax.block_until_ready(call(2))  # the step's outputs are placed as its inputs will be from now: a second compile
  runs, i = [], 3
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.iters):
      out, i = call(i), i + 1
    jax.block_until_ready(out)
    runs.append((time.perf_counter() - start) / args.iters)
  return statistics.median(runs)


def _acceptance(k: int) -> list[float]:
  return [ACCEPTANCE[k]] if k in ACCEPTANCE else [1.0]


def print_header(args) -> None:
  lengths = ", ".join(f"{length}" for length in _acceptance(args.k))
  print("| weights | prompt | B | capacity | prefill chunk | prefill s (TTFT) | prefill tok/s | MFU | round ms | "
        f"round floor ms | floor / round | plain step ms | tok/s at L = {lengths} | plain tok/s | compile s "
        "(prefill + round) | "
        "prefill: index scores / top-k / sparse attn / dense attn / experts | round: index scores / top-k / sparse attn "
        "/ dense attn / experts |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")


def print_row(row: dict, flush: bool = False) -> None:
  r_impls = " / ".join(row["round_impls"].values())
  for prefill in row["prefill"].values():
    p_impls = " / ".join(prefill["impls"].values())
    tps = ", ".join(f"{v:,.0f}" for v in row["tokens_per_s"].values())
    print(f"| {row['weights']} | {row['prompt']} | {row['batch']} | {row['capacity']} | {prefill['chunk']} | "
          f"{prefill['seconds']:.3f} | {prefill['tokens_per_s']:,.0f} | {prefill['mfu']:.1%} | "
          f"{row['round_s'] * 1e3:.2f} | {row['round_floor_s'] * 1e3:.2f} | "
          f"{row['round_floor_s'] / row['round_s']:.2f} | "
          f"{row['plain_step_s'] * 1e3:.2f} | {tps} | {row['plain_tokens_per_s']:,.0f} | "
          f"{prefill['compile_s']:.1f} + {row['round_compile_s']:.1f} | {p_impls} | {r_impls} |",
          flush=flush)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=2, help="target layers (the first dense, the rest MoE)")
  parser.add_argument("--prompt", type=int, nargs="+", default=[1024, 8192, 32768])
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
  parser.add_argument("-k", type=int, default=3)
  parser.add_argument("--weights", nargs="+", default=["bf16"], choices=["bf16", "fp8"])
  parser.add_argument("--prefill-chunk", type=int, nargs="+", default=[0], help="0: the CLI's auto size")
  parser.add_argument("--max-new", type=int, default=256, help="the request's max_new_tokens (sets the capacity)")
  parser.add_argument("--max-prefill-tokens", type=int, default=2**19, help="skip rows of more prompt tokens")
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cli", action="append", default=[], help="further `python -m jax_mtp.decode` flags, e.g. "
                      "--moe-impl ragged_dot (given as --cli=--moe-impl --cli=ragged_dot)")
  parser.add_argument("--small", action="store_true", help="the tiny preset's widths, to check the script")
  parser.add_argument("--profile", action="store_true", help="also trace one call of each prefill and print its "
                      "kernels' time per model part (indexer scores / top-k, sparse attention, experts, ...)")
  parser.add_argument("--out", help="also write the rows as JSON to this file")
  args = parser.parse_args(argv)
  # --cli=--gpu-memory-fraction: JAX reads it when its GPU client starts, which the measurements below do
  decode.set_gpu_memory_fraction(cli_flags(args).gpu_memory_fraction)
  device = jax.devices()[0]
  peak = bf16_peak(256 if args.small else 8192)
  bandwidth = copy_bandwidth()
  caches = cli_config(args, 0)
  print(f"e2e: {args.layers}-layer {'tiny' if args.small else 'full-width V3.2'} target + MTP layer, k = {args.k}, "
        f"on {device.device_kind}, jax {jax.__version__}; bf16 peak {peak / 1e12:.0f} TFLOP/s, copy bandwidth "
        f"{bandwidth / 1e12:.2f} TB/s (both measured now); MLA cache {caches.mla_cache_dtype}, indexer keys "
        f"{caches.index_key_dtype}; CLI flags {' '.join(args.cli) or 'none'}\n", flush=True)
  print_header(args)
  rows = []
  for weights in args.weights:
    run_weights(args, weights, peak, bandwidth, rows)
  if args.out:
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
      json.dump({"peak_flops": peak, "bandwidth": bandwidth, "device": device.device_kind, "rows": rows}, f, indent=1)
    os.replace(tmp, args.out)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
