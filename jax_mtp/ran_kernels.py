"""What a compiled program ran for each part the kernel flags name (the routed experts, the DSA index scores, the
top-k, the sparse attention, the dense absorbed attention), read from its HLO text, not from the config: `auto` resolves per
platform and call shape, and this is what the programs hold.

Our Mosaic GPU kernels are found by their launch names (`KERNEL_NAME`s, the sparse MLA's with its form's suffix),
tokamax's by a Mosaic GPU custom call that is none of ours, the dense attention's products by their operands'
element type (16-bit dots on the matrix units, or fp32 ones, which a GPU runs on its CUDA cores), the routed
experts' XLA forms by the impl their scope names (`routed_experts_<impl>`: XLA decomposes `lax.ragged_dot` on a CPU
into ops that do not say so). A part whose kernel is not there ran in XLA if the program holds the part at all (its
named scope, `index_scores`, `topk`, `sparse_attention` or `dense_attention`, kept in the instructions' op_name metadata),
else it is not in the program (`NOT_IN_PROGRAM`: a short request's dense cache runs no indexer).
`python -m jax_mtp.decode` prints it (`Speculator.kernels_ran`), and so does `benchmarks.e2e`."""

from __future__ import annotations

import re
from collections import Counter

from jax_mtp.kernels.fp8_grouped_matmul_mgpu import KERNEL_NAME as FP8_MGPU_KERNEL
from jax_mtp.kernels.grouped_matmul_mgpu import KERNEL_NAME as GROUPED_MGPU_KERNEL
from jax_mtp.kernels.index_scores_mgpu import FLOAT8_DOT_SUFFIX, KERNEL_NAME as INDEX_SCORES_MGPU_KERNEL
from jax_mtp.kernels.sparse_mla_mgpu import FORM_SUFFIXES as SPARSE_MLA_FORMS
from jax_mtp.kernels.sparse_mla_mgpu import KERNEL_NAME as SPARSE_MLA_MGPU_KERNEL
from jax_mtp.kernels.topk_mgpu import KERNEL_NAME as TOPK_MGPU_KERNEL

PARTS = ("index scores", "top-k", "sparse attention", "dense attention", "experts")
NOT_IN_PROGRAM = "—"  # a part the program does not hold (no dense cache, say)
# The routed experts' impls (jax_mtp.experts) as the summary names them where no kernel name is found
EXPERT_FORMS = {"gather": "gather (XLA)", "ragged_dot": "lax.ragged_dot", "tokamax_tpu": "tokamax (Mosaic TPU)",
                "tokamax_gpu": "tokamax (Mosaic GPU)", "fp8_grouped_gpu": "FP8 grouped matmul (Pallas interpreter)",
                "mosaic_gpu": "16-bit grouped matmul (Pallas interpreter)"}
_EXPERTS_SCOPE = re.compile(r"routed_experts_(\w+?)/")
_DEFINITION = re.compile(r"%([\w.\-]+) = \(?(\w+)\[")
_PRODUCT = re.compile(r" (?:dot|custom-call)\(%([\w.\-]+)")


def parts_ran(hlo: str) -> dict[str, str]:
  """{part: what ran} over a compiled program's HLO text (one instruction a line)."""
  ours = (INDEX_SCORES_MGPU_KERNEL, FP8_MGPU_KERNEL, GROUPED_MGPU_KERNEL, SPARSE_MLA_MGPU_KERNEL, TOPK_MGPU_KERNEL)
  # a Mosaic GPU call that is none of ours (tokamax's); not the text's file names (the kernels' modules)
  tokamax = any("custom-call" in line and "mosaic" in line.lower() and not any(name in line for name in ours)
                for line in hlo.splitlines())
  xla = lambda scope: "XLA" if scope + "/" in hlo else NOT_IN_PROGRAM  # noqa: E731
  traced = [EXPERT_FORMS.get(impl, impl) for impl in dict.fromkeys(_EXPERTS_SCOPE.findall(hlo))]
  experts = ("FP8 grouped matmul (Pallas Mosaic GPU)" if FP8_MGPU_KERNEL in hlo else
             "16-bit grouped matmul (Pallas Mosaic GPU)" if GROUPED_MGPU_KERNEL in hlo else
             EXPERT_FORMS["tokamax_gpu"] if tokamax else " + ".join(traced) or NOT_IN_PROGRAM)
  forms = [form for form, suffix in SPARSE_MLA_FORMS.items()
           if SPARSE_MLA_MGPU_KERNEL + suffix in hlo]  # a round holds two: one query a draft step, B · 4 verifying
  sparse = (f"Pallas Mosaic GPU kernel ({' + '.join(forms)})" if SPARSE_MLA_MGPU_KERNEL in hlo
            else xla("sparse_attention"))
  scores = ("Pallas Mosaic GPU kernel (float8 × float8)" if INDEX_SCORES_MGPU_KERNEL + FLOAT8_DOT_SUFFIX in hlo
            else "Pallas Mosaic GPU kernel" if INDEX_SCORES_MGPU_KERNEL in hlo else xla("index_scores"))
  topk = "Pallas Mosaic GPU kernel (k-th key)" if TOPK_MGPU_KERNEL in hlo else xla("topk")
  dense = dot_operand_types(hlo, "dense_attention")  # mla.dense_latent_attention's named scope
  dense_form = (NOT_IN_PROGRAM if not dense else "XLA, 16-bit dots" if set(dense) <= {"bf16", "f16"} else
                "XLA, fp32 dots" if "f32" in dense else f"XLA, {describe(dense)}")
  return {"index scores": scores, "top-k": topk, "sparse attention": sparse, "dense attention": dense_form,
          "experts": experts}


def summary(programs: dict[str, dict[str, str]]) -> str:
  """One line: each program's parts (those it holds), programs that ran the same shown once."""
  groups: dict[tuple, list[str]] = {}
  for name, parts in programs.items():
    groups.setdefault(tuple(sorted(parts.items())), []).append(name)
  shown = []
  for parts, names in groups.items():
    held = ", ".join(f"{part} {what}" for part, what in sorted(parts, key=lambda p: PARTS.index(p[0]))
                     if what != NOT_IN_PROGRAM)
    shown.append(f"{' and '.join(names)}: {held or 'none of the named parts'}")
  return "; ".join(shown)


def dot_operand_types(hlo: str, scope: str | None = None) -> Counter:
  """{element type: products} over the program's products (a `dot`, inside a fusion too, or a cuBLAS GEMM custom
  call; its type is its first operand's, read from that operand's definition in the text), or over those whose line
  names `scope` (a `jax.named_scope`, which the compiled text keeps in each instruction's op_name; a product XLA
  rewrote without its metadata names none: on a CPU, a batched dot of batch 1 simplified to a plain one)."""
  types = dict(_DEFINITION.findall(hlo))
  found = Counter()
  for line in hlo.splitlines():
    if scope is not None and scope not in line:
      continue
    product = _PRODUCT.search(line)
    if product and (" dot(" in line or "gemm" in line):
      found[types.get(product.group(1), "?")] += 1
  return found


def describe(found: Counter) -> str:
  """"2 × bf16, 1 × f32", or "none found"."""
  return ", ".join(f"{n} × {dtype}" for dtype, n in sorted(found.items())) or "none found"
