"""The matrix products in a compiled program's HLO text, by their operands' element type: which dots run 16-bit on
the matrix units and which fp32 (an fp32 HIGHEST dot runs on a GPU's CUDA cores). A product is a `dot` (inside a
fusion too) or a cuBLAS GEMM custom call; its type is its first operand's, read from that operand's definition in
the text."""

from __future__ import annotations

import re
from collections import Counter

_DEFINITION = re.compile(r"%([\w.\-]+) = \(?(\w+)\[")
_PRODUCT = re.compile(r" (?:dot|custom-call)\(%([\w.\-]+)")


def dot_operand_types(hlo: str, scope: str | None = None) -> Counter:
  """{element type: products} over the program's products, or over those whose line names `scope` (a
  `jax.named_scope`, which the compiled text keeps in each instruction's op_name; a product XLA rewrote without its
  metadata names none: on a CPU, a batched dot of batch 1 simplified to a plain one)."""
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
