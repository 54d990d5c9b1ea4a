"""The collectives of a compiled XLA program, read from its HLO text (`compiled.as_text()`).

`collectives(hlo_text)` returns one `Collective(op, dtype, shape, bytes)` per output buffer of every
all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all (also ragged-all-to-all and
collective-broadcast), synchronous or in the async `-start` form; `-done` halves are not counted
again. Ops are recognised by the opcode after the result type, never by instruction names (XLA
names a psum `%psum.3` and an all-gather `%all_gather.7`) or metadata, and never by replica-group
syntax, which differs between XLA versions.

`bytes` is the size of the op's result on one device (for an all-gather, the gathered array; for an
all-reduce, the reduced array): what each device receives or keeps, the number analytic estimates
("all-gather of T·V fp32") describe. It is a property of the compiled program, not a timing.

Result types of the async forms: `all-reduce-start` returns its outputs; `all-gather-start` and
`collective-permute-start` return (operands, outputs[, u32[] contexts]) — the outputs are the second
half after dropping rank-0 u32/s32 context scalars.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
                  "ragged-all-to-all", "collective-broadcast")

# Bits per element of HLO primitive types (sub-byte types are rounded up per buffer).
_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
    "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "tf32": 32,
}

# `[ROOT] %name = <type> <opcode>(` — the type may be a (nested) tuple with spaces; the opcode is the
# first lower-case word directly followed by "(" after whitespace.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[^\s=]+\s*=\s*(?P<type>.+?)\s+(?P<op>[a-z][a-z0-9\-]*)\(")
_ARRAY = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")


class Collective(NamedTuple):
  op: str  # opcode as written, e.g. "all-gather" or "all-gather-start"
  dtype: str  # HLO primitive type, e.g. "f32", "bf16", "s32"
  shape: tuple[int, ...]
  bytes: int  # result bytes on one device


def element_bits(dtype: str) -> int:
  """Bits per element of an HLO primitive type; fp8 variants (f8e4m3fn, …) are 8 bits."""
  if dtype in _BITS:
    return _BITS[dtype]
  if dtype.startswith("f8"):
    return 8
  if dtype.startswith("f4") or dtype.startswith("f6"):
    return int(dtype[1])
  raise ValueError(f"unknown HLO element type {dtype!r}")


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """Flattened (dtype, shape) leaves of an HLO result type, in order; `<=N` dynamic dims count N."""
  leaves = []
  for m in _ARRAY.finditer(type_text):
    dims = m["dims"].strip()
    shape = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",")) if dims else ()
    leaves.append((m["dtype"], shape))
  return leaves


def _outputs(op: str, leaves: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
  if not op.endswith("-start") or op == "all-reduce-start":
    return leaves
  data = [leaf for leaf in leaves if not (leaf[1] == () and leaf[0] in ("u32", "s32"))]
  return data[len(data) // 2:]


def _base(op: str) -> str:
  return op.removesuffix("-start")


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective output buffer in `hlo_text`, in program text order."""
  found = []
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m is None or _base(m["op"]) not in COLLECTIVE_OPS:
      continue
    for dtype, shape in _outputs(m["op"], _arrays(m["type"])):
      nbytes = -(-math.prod(shape) * element_bits(dtype) // 8)
      found.append(Collective(m["op"], dtype, shape, nbytes))
  return found


def total_bytes(found: Iterable[Collective]) -> int:
  return sum(c.bytes for c in found)


def describe(found: Iterable[Collective]) -> str:
  """One line: `all-gather f32[1,64,129280] (33.1 MB) + …`."""
  parts = [f"{c.op} {c.dtype}[{','.join(map(str, c.shape))}] ({format_bytes(c.bytes)})" for c in found]
  return " + ".join(parts) if parts else "(none)"


def format_bytes(n: int) -> str:
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= size:
      return f"{n / size:.3g} {unit}"
  return f"{n} B"
