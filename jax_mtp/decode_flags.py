"""`python -m jax_mtp.decode`'s command line: its flags (`parser`), their defaults and the one error type a bad flag
raises (`BadInput`: exit 2 with a one-line message). The flags map onto the config in `decode.with_flags`; what
each flag does is in its help, which `--help` prints."""

from __future__ import annotations

import argparse

from jax_mtp import distributed, generation_defaults, loader
from jax_mtp.config import (DTYPES, FP8_MATMUL_IMPLS, INDEX_SCORES_IMPLS, KV_CACHE_DTYPES, MOE_IMPLS,
                            SPARSE_ATTENTION_IMPLS, TOPK_IMPLS)
from jax_mtp.kernels.fused_allreduce_rmsnorm import IMPLS
from jax_mtp.prefill import PREFILL_CHUNK_BYTES

DESCRIPTION = "`python -m jax_mtp.decode`: speculative decoding with MTP drafts, end to end."  # decode.py's first line
INDEX_CACHE_FLAGS = ("auto", "bfloat16", "fp8")  # --index-cache-dtype's values: MtpConfig.index_cache_dtype's names
DEFAULT_PROMPT = "1,2,3,4,5,6,7,8"  # token ids, for --random-tiny and checkpoints
DEFAULT_TEXT = "def fibonacci(n):\n"  # the embedded default's prompt


class BadInput(ValueError):
  """Bad command-line input: exit 2 with this one-line message."""


class OneLineParser(argparse.ArgumentParser):
  """argparse whose errors raise `bad_input` (one line, exit 2) instead of printing its usage block; an unknown
  flag's points to --help. The train CLI's parser is one too, with its own error type."""
  bad_input: type[ValueError] = BadInput

  def error(self, message):
    hint = f" ({self.prog} --help lists the flags)" if message.startswith("unrecognized") else ""
    raise self.bad_input(message + hint)


def parser() -> argparse.ArgumentParser:
  p = OneLineParser(prog="python -m jax_mtp.decode", description=DESCRIPTION)
  p.add_argument("--checkpoint", metavar="DIR|REPO",
                 help="HF checkpoint directory (config.json + *.safetensors), a jax_mtp orbax directory, or a "
                      "Hugging Face repo id (owner/name: only the files the run reads are fetched, into the HF cache)")
  p.add_argument("--random-tiny", action="store_true",
                 help="a tiny DeepSeek-V3.2-shaped model with random weights instead of the embedded default")
  p.add_argument("--prompt", action="append", metavar="TEXT",
                 help=f"text prompt, encoded with the model's tokenizer.json; repeat for a batch (default, for "
                      f"the embedded model: {DEFAULT_TEXT!r})")
  p.add_argument("--prompt-ids", action="append", metavar="IDS",
                 help=f"comma-separated token ids; repeat for a batch (default with --random-tiny or a "
                      f"checkpoint: {DEFAULT_PROMPT})")
  p.add_argument("--chat", action="store_true",
                 help="render each --prompt as a user turn of the checkpoint's chat format (its Jinja template, or "
                      "DeepSeek-V3.2's own) before tokenizing it")
  p.add_argument("--system", metavar="TEXT", help="with --chat: a system turn before each prompt")
  p.add_argument("--thinking", action="store_true", help="with --chat: the format's thinking mode (default: chat)")
  p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
  p.add_argument("--num-speculative-tokens", type=int, default=3, help="draft tokens k per round, ≥ 1 (default 3)")
  p.add_argument("--temperature", type=float,
                 help="0 = greedy; > 0 = rejection sampling (default: the checkpoint's generation_config.json, else 0)")
  p.add_argument("--top-k", type=int,
                 help="sample from the K most likely tokens only (0: all; greedy's token is always among them; "
                      "default: generation_config.json's, else 0)")
  p.add_argument("--top-p", type=float,
                 help="then from the smallest set of those, most likely first, whose probability reaches P (1: all; "
                      "default: generation_config.json's, else 1)")
  p.add_argument("--generation-config", choices=generation_defaults.MODES, default="auto",
                 help="auto (default): sampling flags not given take the checkpoint's generation_config.json values, "
                      "as vLLM's; none: greedy unless the flags say otherwise")
  p.add_argument("--seed", type=int, default=0, help="sampling seed (the weights' seed is fixed)")
  p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices (default 1)")
  p.add_argument("--impl", choices=IMPLS, default=IMPLS[0],
                 help="Opt-1, the tensor-parallel all-reduce fused with the residual add and RMSNorm: xla (default), "
                      "or a Pallas kernel (pallas_tpu, pallas_gpu; docs/kernels.md)")
  p.add_argument("--dtype", choices=("auto",) + DTYPES, default="auto",
                 help="compute and parameter dtype; auto (default): the checkpoint's torch_dtype, as vLLM")
  p.add_argument("--weights", choices=loader.WEIGHTS, default="auto",
                 help="FP8 checkpoints (HF or orbax): fp8 keeps the weights as stored (codes + block scales, "
                      "dequantised inside each matmul's program), bf16 dequantises them on load (to --dtype's); "
                      "auto (default): as the checkpoint stores them, FP8 where --tp splits whole blocks (else "
                      "dequantised, with a note)")
  p.add_argument("--moe-impl", choices=MOE_IMPLS, default="auto",
                 help="routed experts' implementation (jax_mtp.experts); auto: by platform and size")
  p.add_argument("--index-scores-impl", choices=INDEX_SCORES_IMPLS, default="auto",
                 help="DSA indexer scores: xla, or a fused Pallas kernel (mosaic_gpu: Mosaic GPU; pallas_tpu); "
                      "auto: mosaic_gpu on Hopper GPUs where it takes the model, else xla")
  p.add_argument("--sparse-attention-impl", choices=SPARSE_ATTENTION_IMPLS, default="auto",
                 help="DSA's sparse MLA attention: xla, or the fused Pallas kernel (mosaic_gpu: Mosaic GPU, Hopper "
                      "only; it also reads an fp8 cache); auto: mosaic_gpu on Hopper GPUs where it takes the model, "
                      "else xla")
  p.add_argument("--topk-impl", choices=TOPK_IMPLS, default="auto",
                 help="the DSA indexer's top-k: xla (a radix select), or mosaic_gpu (its k-th key in a Pallas Mosaic "
                      "GPU kernel, Hopper only, caches up to 48K slots; the compaction in XLA); auto: mosaic_gpu on "
                      "Hopper GPUs from 64 queries a call (B · T) over caches it takes, else xla")
  p.add_argument("--fp8-matmul-impl", choices=FP8_MATMUL_IMPLS, default="auto",
                 help="with FP8 weights on GPUs, the kernel multiplying the codes: mosaic_gpu (Pallas Mosaic GPU, "
                      "Hopper only); auto: mosaic_gpu on Hopper GPUs, the codes dequantised in the program elsewhere")
  p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                 help="the MLA cache: auto (default): the compute dtype; bfloat16; fp8: e4m3 latent + one fp32 scale "
                      "per 128 values + the rope key in the compute dtype (656 bytes a token at V3.2's widths against "
                      "1,152 in bf16; vLLM's fp8_ds_mla); on GPUs the Mosaic GPU sparse-MLA kernel reads it")
  p.add_argument("--index-cache-dtype", choices=INDEX_CACHE_FLAGS, default="auto",
                 help="the DSA indexer's key cache, read whole at every step: auto (default): the compute dtype; "
                      "bfloat16; fp8: e4m3 keys + one fp32 scale a token (132 bytes a token at V3.2's widths against "
                      "256 in bf16: half the indexer's bytes at long context; how vLLM and DeepSeek's inference code "
                      "keep them; the indexer's queries are then rounded to e4m3 too, as theirs are)")
  p.add_argument("--prefill-chunk", type=int, default=0, metavar="TOKENS",
                 help="prompt tokens per row per prefill call; 0 (default): sized to "
                      f"{PREFILL_CHUNK_BYTES // 2**30} GiB of per-query buffers, or on a GPU / TPU with less "
                      "left after the weights and caches to half of what is left (jax_mtp.prefill)")
  p.add_argument("--ignore-eos", action="store_true",
                 help="do not stop a row at the checkpoint's EOS ids (benchmarks, as vLLM's flag)")
  p.add_argument("--check", action="store_true",
                 help="also decode with the target alone and compare; exit 1 if the outputs differ (2 is bad input)")
  p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
  p.add_argument("--gpu-memory-fraction", type=float, default=None, metavar="F",
                 help="the share of each GPU's memory JAX may take, in (0, 1] (sets XLA_PYTHON_CLIENT_MEM_FRACTION "
                      "before JAX starts, as vLLM's --gpu-memory-utilization); default: JAX's own (0.75 unless that "
                      "variable is set). Long contexts at large batches need more: on an H200 a 4-layer V3.2 target "
                      "with B = 256 × 32K caches ran at 0.95")
  p.add_argument("--compilation-cache", metavar="DIR|off", default=None,
                 help="where XLA's compiled prefill and round are kept, so the next run of the same shapes skips "
                      "compiling them (JAX's persistent cache); default: JAX_COMPILATION_CACHE_DIR if set, else "
                      "$XDG_CACHE_HOME/jax_mtp/xla (~/.cache); `off`: none (jax_mtp.compile_cache)")
  distributed.add_arguments(p)
  return p
