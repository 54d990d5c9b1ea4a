"""The reference-output format: one `.npz` per run of a reference engine on one prompt.

Any engine that can run a DeepSeek target with its MTP layer as the speculative decoder can write
it (`tools/vllm_reference.py` does, from vLLM); `tests/test_vllm_parity.py` replays it. Positions
are absolute token positions; D = hidden_size, V = vocab_size; float arrays are float32.

  meta                   0-d str: JSON, see META_KEYS (engine, versions, settings, checkpoint, semantics)
  prompt_ids      [P]    int32  the prompt
  output_ids      [N]    int32  the tokens the engine generated (greedy, with speculation)
  target_logprobs [P+N−1, V]    row p: log-softmax of the target's logits at position p (public API:
                                prompt logprobs, then each generated token's logprobs)

  The target's forward calls, in order (call c owns rows offsets[c]:offsets[c+1]):
  target_call_offsets [C+1] int32
  target_input_ids    [R]   int32   tokens fed
  target_positions    [R]   int32   their positions
  target_hidden       [R, D]        hidden after the final norm (what the head and the MTP layer read)
  target_logits       [L, V]        raw logits, for the rows the engine computed them on:
  target_logits_row   [L]   int32   ... the global row (into target_*) each logits row belongs to

  The MTP layer's forward calls, in order (prefill catch-up, then per round: catch-up, chained steps):
  mtp_call_offsets    [M+1] int32
  mtp_input_ids       [Rm]  int32   token embedded at each row (zeroed where the position is 0)
  mtp_positions       [Rm]  int32   the position of the hidden (the token's position − 1)
  mtp_prev_hidden     [Rm, D]       hidden fed in: the target's post-norm hidden, or in chained steps
                                    the previous step's `mtp_hidden_normed`
  mtp_hidden          [Rm, D]       the layer's output before shared_head.norm (what logits read)
  mtp_hidden_normed   [Rm, D]       after shared_head.norm (what the next chained step reads)
  mtp_logits          [Lm, V]       raw draft logits, for the rows the drafter sampled:
  mtp_logits_row      [Lm]  int32   ... the global row (into mtp_*) each belongs to
  draft_ids           [Q, k] int32  the drafts of each proposal, in order (the last may go unverified)

`save` writes members in a fixed order with fixed zip timestamps, so the same arrays give the same
bytes: a regenerated fixture can be checked for bit identity with `cmp`.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile

import numpy as np

FORMAT_VERSION = 1
META_KEYS = ("format_version", "engine", "settings", "checkpoint", "semantics", "num_speculative_tokens")
INT_ARRAYS = ("prompt_ids", "output_ids", "target_call_offsets", "target_input_ids", "target_positions",
              "target_logits_row", "mtp_call_offsets", "mtp_input_ids", "mtp_positions", "mtp_logits_row",
              "draft_ids")
FLOAT_ARRAYS = ("target_logprobs", "target_hidden", "target_logits", "mtp_prev_hidden", "mtp_hidden",
                "mtp_hidden_normed", "mtp_logits")
_ZIP_TIME = (2026, 1, 1, 0, 0, 0)


class FixtureError(ValueError):
  """A fixture that does not follow the format; the message names the file and the array."""


def save(path: str | os.PathLike, meta: dict, arrays: dict[str, np.ndarray]) -> None:
  """Validates, then writes atomically (a temp file in the same directory, then rename)."""
  path = os.fspath(path)
  arrays = {name: np.ascontiguousarray(value) for name, value in arrays.items()}
  validate(path, meta, arrays)
  members = {"meta": np.array(json.dumps(meta, sort_keys=True, indent=1)), **arrays}
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".npz.tmp")
  try:
    with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
      for name in sorted(members):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, members[name], allow_pickle=False)
        info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_TIME)
        info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        zf.writestr(info, buf.getvalue(), compresslevel=9)
    os.chmod(tmp, 0o644)  # mkstemp makes it private
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def load(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
  """(meta, arrays) of a fixture, checked against the format."""
  path = os.fspath(path)
  with np.load(path, allow_pickle=False) as data:
    arrays = {name: data[name] for name in data.files}
  if "meta" not in arrays:
    raise FixtureError(f"{path}: no 'meta' member")
  meta = json.loads(str(arrays.pop("meta")))
  validate(path, meta, arrays)
  return meta, arrays


def validate(path: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
  missing = [k for k in META_KEYS if k not in meta]
  if missing:
    raise FixtureError(f"{path}: meta lacks {missing}")
  if meta["format_version"] != FORMAT_VERSION:
    raise FixtureError(f"{path}: format_version {meta['format_version']!r}, this reader knows {FORMAT_VERSION}")
  expected = set(INT_ARRAYS) | set(FLOAT_ARRAYS)
  if set(arrays) != expected:
    raise FixtureError(f"{path}: arrays missing {sorted(expected - set(arrays))}, "
                       f"unexpected {sorted(set(arrays) - expected)}")
  for name in INT_ARRAYS:
    if arrays[name].dtype != np.int32:
      raise FixtureError(f"{path}: {name} has dtype {arrays[name].dtype}, expected int32")
  for name in FLOAT_ARRAYS:
    if arrays[name].dtype != np.float32:
      raise FixtureError(f"{path}: {name} has dtype {arrays[name].dtype}, expected float32")
  _check_shapes(path, meta, arrays)


def _check_shapes(path: str, meta: dict, a: dict[str, np.ndarray]) -> None:
  p, n = len(a["prompt_ids"]), len(a["output_ids"])
  v, d = a["target_logprobs"].shape[-1], a["target_hidden"].shape[-1]
  rules = {
      "target_logprobs": (p + n - 1, v), "target_hidden": (len(a["target_input_ids"]), d),
      "target_positions": a["target_input_ids"].shape, "target_logits": (len(a["target_logits_row"]), v),
      "mtp_positions": a["mtp_input_ids"].shape, "mtp_prev_hidden": (len(a["mtp_input_ids"]), d),
      "mtp_hidden": (len(a["mtp_input_ids"]), d), "mtp_hidden_normed": (len(a["mtp_input_ids"]), d),
      "mtp_logits": (len(a["mtp_logits_row"]), v), "draft_ids": (len(a["draft_ids"]), meta["num_speculative_tokens"]),
  }
  for name, shape in rules.items():
    if a[name].shape != tuple(shape):
      raise FixtureError(f"{path}: {name} has shape {a[name].shape}, expected {tuple(shape)}")
  for kind in ("target", "mtp"):
    offsets = a[f"{kind}_call_offsets"]
    if offsets[0] != 0 or offsets[-1] != len(a[f"{kind}_input_ids"]) or np.any(np.diff(offsets) <= 0):
      raise FixtureError(f"{path}: {kind}_call_offsets {offsets.tolist()} do not split "
                         f"{len(a[f'{kind}_input_ids'])} rows into non-empty calls")
    rows = a[f"{kind}_logits_row"]
    if rows.size and (rows.min() < 0 or rows.max() >= len(a[f"{kind}_input_ids"])):
      raise FixtureError(f"{path}: {kind}_logits_row out of range")
