"""The files beside a checkpoint's weights that a run reads, and their copy beside a converted checkpoint.

    copy_model_files("DeepSeek-V3.2/", "orbax_out/")   # -> ("tokenizer.json", "generation_config.json", ...)

A HF checkpoint keeps its tokenizer (`tokenizer.json`, `tokenizer_config.json`: `--prompt`, BOS), chat template
(`chat_template.jinja`: `--chat`) and generation settings (`generation_config.json`: the EOS ids a row stops at,
the sampling defaults) beside its weights. An orbax checkpoint written by `jax_mtp.orbax_io.save_params` keeps
only params and config in its steps; these files sit beside the steps in its root directory, where the CLI reads
them exactly as it reads a HF directory's (`loader.Source.directory`).

The EOS ids move with them: HF reads `generation_config.json`'s `eos_token_id`, else `config.json`'s
(`tokenizer.eos_token_ids`). An orbax root holds no config.json, so where only config.json names the ids they are
written into the copy's generation_config.json, and the copy stops rows where the source did.
"""

from __future__ import annotations

import json
import os
import uuid

from jax_mtp.tokenizer import eos_token_ids

GENERATION_CONFIG = "generation_config.json"
# Read beside the config when present: tokenizer.json (--prompt), tokenizer_config.json (BOS, the chat template's
# tokens), generation_config.json (EOS ids, sampling defaults), chat_template.jinja (--chat).
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", GENERATION_CONFIG, "chat_template.jinja")


def copy_model_files(source: str | os.PathLike, destination: str | os.PathLike) -> tuple[str, ...]:
  """Copies `source`'s MODEL_FILES that exist into `destination` (an existing directory), each written atomically
  (a temporary file renamed into place), and returns their names. The EOS ids `tokenizer.eos_token_ids` reads in
  `source` are the copy's too (see the module docstring). A malformed eos_token_id is a TokenizerError naming the
  file, raised before anything is written."""
  source, destination = os.fspath(source), os.fspath(destination)
  eos_ids = eos_token_ids(source)
  copied = []
  for name in MODEL_FILES:
    path = os.path.join(source, name)
    if name == GENERATION_CONFIG:
      data = _generation_config(path, eos_ids)
      if data is None:
        continue
      write_atomically(os.path.join(destination, name), json.dumps(data, indent=2) + "\n")
    elif os.path.isfile(path):
      with open(path, "rb") as f:
        write_atomically(os.path.join(destination, name), f.read())
    else:
      continue
    copied.append(name)
  return tuple(copied)


def _generation_config(path: str, eos_ids: tuple[int, ...]) -> dict | None:
  """The copy's generation_config.json: the source's as it is, given the ids where it names none (they came from
  config.json); None where there is neither a file nor an id to keep."""
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      data = json.load(f)  # eos_token_ids read it above: a JSON object
    if data.get("eos_token_id") is not None or not eos_ids:
      return data
  elif not eos_ids:
    return None
  else:
    data = {}
  return {**data, "eos_token_id": list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]}


def write_atomically(path: str, content: str | bytes) -> None:
  """`content` (text as UTF-8) at `path`, never half-written: a hidden temporary file in the same directory,
  renamed into place, so a reader sees the old file or the whole new one."""
  temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
  try:
    with open(temporary, "xb") as f:  # the umask's permissions, as a plain write's
      f.write(content.encode() if isinstance(content, str) else content)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise
