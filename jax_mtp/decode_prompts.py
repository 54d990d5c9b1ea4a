"""The decode CLI's prompts as token ids: `--prompt-ids` parsed, or `--prompt` text through the checkpoint's
tokenizer, each text first rendered as a user turn of its chat format with `--chat` (jax_mtp.chat)."""

from __future__ import annotations

import re
from typing import NamedTuple

from jax_mtp import chat, loader
from jax_mtp.decode_flags import DEFAULT_PROMPT, DEFAULT_TEXT, BadInput
from jax_mtp.tokenizer import TextCodec


class ChatRequest(NamedTuple):
  """--chat's --system / --thinking, and the model type whose built-in format applies where the checkpoint has no
  template."""

  system: str | None
  thinking: bool
  model_type: str


def prompts_from(prompt: list[str] | None, prompt_ids: list[str] | None, source: loader.Source | None,
                 ids_by_default: bool, chat_request: ChatRequest | None = None,
                 ) -> tuple[list[str] | None, TextCodec | None, list[list[int]]]:
  """(texts, codec, token ids): the ids from --prompt-ids (DEFAULT_PROMPT's where `ids_by_default` and no
  prompt is given), or from --prompt through the model's tokenizer (the embedded default's: DEFAULT_TEXT); with
  `chat_request`, the texts are the chat format's renderings, which the output shows as the model read them."""
  if prompt is not None and prompt_ids is not None:
    raise BadInput("give --prompt or --prompt-ids, not both")
  if chat_request is not None and (prompt_ids is not None or source is None):
    raise BadInput("--chat renders --prompt text in the checkpoint's chat format; it takes no --prompt-ids and needs "
                   "a tokenizer (not --random-tiny)")
  if prompt is None and (prompt_ids is not None or ids_by_default):
    return None, None, [_parse_ids(text) for text in (prompt_ids or [DEFAULT_PROMPT])]
  if source is None:
    raise BadInput("--prompt needs a tokenizer, and --random-tiny has none; use --prompt-ids")
  texts = prompt or [DEFAULT_TEXT]
  codec = TextCodec(source.directory)
  if chat_request is None:
    return texts, codec, [codec.encode(text) for text in texts]
  rendered = [chat.render(source.directory, chat_request.model_type, text, codec.token_id,
                          system=chat_request.system, thinking=chat_request.thinking) for text in texts]
  return rendered, codec, [codec.encode_rendered(text) for text in rendered]


def _parse_ids(text: str) -> list[int]:
  if not text.strip():
    return []  # "prompt i is empty", said where the prompts are checked
  items = [item.strip() for item in text.split(",")]
  for i, item in enumerate(items):
    # "1,,2" and "1,2,": an id left out is not dropped silently. int() alone would read "1_0" as 10 and take
    # non-ASCII digits: a typo is refused, not decoded.
    if not re.fullmatch(r"[+-]?[0-9]+", item):
      what = f"{item!r} is not an integer (digits, optionally signed)" if item else "is empty"
      raise BadInput(f"--prompt-ids {text!r}: entry {i} of {len(items)} {what}")
  return [int(item) for item in items]
