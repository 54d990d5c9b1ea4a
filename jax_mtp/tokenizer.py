"""Text in and out for `python -m jax_mtp.decode --prompt`: the checkpoint's own HF tokenizer.

A HF checkpoint directory ships `tokenizer.json` (the `tokenizers` library's format) and usually
`tokenizer_config.json`. Encoding applies `tokenizer.json`'s own post-processor; if
`tokenizer_config.json` says `add_bos_token: true` and the ids do not already start with its
`bos_token`, that token is put in front — DeepSeek-V3/V3.2 and GLM-5 prompts start with BOS, as
`transformers`' tokenizer would give. `--prompt` is raw text; `--chat` renders it in the checkpoint's chat format
first (jax_mtp.chat), whose output carries its own special tokens (`encode_rendered`).
"""

from __future__ import annotations

import json
import os


class TokenizerError(ValueError):
  """A missing or unreadable tokenizer; the message names the file."""


class TextCodec:
  """encode(text) → ids; decode(ids) → text, with the checkpoint's tokenizer."""

  def __init__(self, directory: str):
    import tokenizers  # noqa: PLC0415 — only `--prompt` needs it

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
      raise TokenizerError(f"--prompt needs a tokenizer, and {path!r} does not exist; give token ids with "
                           f"--prompt-ids, or copy the model's tokenizer.json into the checkpoint directory")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the library raises its own Exception subclass for any bad file
      raise TokenizerError(f"{path!r} is not a valid tokenizer.json: {e}") from None
    self.bos_id = _bos_to_add(directory, self._tok)

  def encode(self, text: str) -> list[int]:
    ids = self._tok.encode(_utf8(text)).ids
    if self.bos_id is not None and ids[:1] != [self.bos_id]:
      ids = [self.bos_id, *ids]
    return ids

  def encode_rendered(self, text: str) -> list[int]:
    """A chat template's output, which holds its own special tokens (BOS included): no post-processor, no BOS added
    (transformers' apply_chat_template tokenizes so)."""
    return self._tok.encode(_utf8(text), add_special_tokens=False).ids

  def token_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def decode(self, ids: list[int]) -> str:
    return self._tok.decode(ids, skip_special_tokens=False)


def _utf8(text: str) -> str:
  try:  # argv holds bytes that are not UTF-8 as lone surrogates, which the tokenizer cannot take
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise TokenizerError(f"prompt {text!r} is not valid UTF-8 (characters {e.start}–{e.end - 1}); give UTF-8 "
                         f"text or --prompt-ids") from None
  return text


def _bos_to_add(directory: str, tok) -> int | None:
  """The BOS id when tokenizer_config.json asks for one, else None."""
  path = os.path.join(directory, "tokenizer_config.json")
  config = json_object(path)  # a file that is not a JSON object (or not UTF-8): an error naming it
  if config is None or not config.get("add_bos_token", False):
    return None
  bos = config.get("bos_token")
  bos = bos.get("content") if isinstance(bos, dict) else bos
  bos_id = tok.token_to_id(bos) if isinstance(bos, str) else None
  if bos_id is None:
    raise TokenizerError(f"{path!r} sets add_bos_token but its bos_token {bos!r} is not in tokenizer.json")
  return bos_id


def json_object(path: str) -> dict | None:
  """A checkpoint's JSON file (generation_config.json, config.json) as a dict; None where there is no such file. A
  file that cannot be read or holds no JSON object is an error naming it."""
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise TokenizerError(f"cannot read {path!r}: {e}") from e
  if not isinstance(data, dict):
    raise TokenizerError(f"{path!r} holds {json.dumps(data)[:40]}, expected a JSON object")
  return data


def eos_token_ids(directory: str) -> tuple[int, ...]:
  """The checkpoint's end-of-sequence ids: `generation_config.json`'s `eos_token_id` (an id or a
  list, as HF writes it), else `config.json`'s; () when neither names one (an orbax checkpoint keeps a
  generation_config.json only where it was saved with its source's model files: jax_mtp.model_files). A
  malformed value is an error naming the file."""
  for name in ("generation_config.json", "config.json"):
    path = os.path.join(directory, name)
    data = json_object(path)
    if data is None:
      continue
    value = data.get("eos_token_id")
    if value is None:
      continue
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
      raise TokenizerError(f"{path!r}: eos_token_id={value!r} must be a token id or a list of them")
    return tuple(ids)
  return ()
