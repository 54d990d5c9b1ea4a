"""`decode --chat`: each prompt as one user turn (after a `--system` turn, where given) in the checkpoint's chat
format, ready for the assistant's reply —
what `transformers`' `apply_chat_template(messages, add_generation_prompt=True)` renders, or, for DeepSeek-V3.2, which
ships no Jinja template by design, what its own `encoding/encoding_dsv32.py` renders for one user message.

Where the format comes from, first found in the checkpoint's directory:
  chat_template.jinja, or tokenizer_config.json's `chat_template` (a string, or a list of named templates, of which
      "default"): rendered with Jinja2 in transformers' environment (sandboxed; trim_blocks, lstrip_blocks, loop
      controls; `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII) with `messages`,
      `add_generation_prompt`, `bos_token` / `eos_token` (tokenizer_config.json's), and the thinking switches templates
      read (`enable_thinking`, GLM's and Qwen's; `thinking`, DeepSeek-V3.1's).
  model_type deepseek_v32: BOS + system + "<｜User｜>" + text + "<｜Assistant｜>" + "</think>" (chat mode) or
      "<think>" (thinking mode) — encode_messages' output for an optional system message and one user message.
Neither: a ChatFormatError naming the directory. The rendered text carries its own special tokens (BOS included), so
it is tokenized without the tokenizer's post-processor (`TextCodec.encode_rendered`), as transformers does.
"""

from __future__ import annotations

import datetime
import json
import os

from jax_mtp.tokenizer import TokenizerError, json_object

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# DeepSeek-V3.2's markers (fullwidth bars, U+2581 spaces), as encoding_dsv32.py writes them
DSV32_BOS, DSV32_USER, DSV32_ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
DSV32_THINK, DSV32_NO_THINK = "<think>", "</think>"


class ChatFormatError(ValueError):
  """No chat format for this checkpoint, or one that cannot be read or rendered; the message names the file."""


def render(directory: str, model_type: str, text: str, token_id, *, system: str | None = None,
           thinking: bool = False) -> str:
  """`text` as one user turn (after a `system` turn, where given) followed by the assistant's turn opening, in the
  checkpoint's format (module docstring); `thinking`: the model's thinking mode where the format has one.
  `token_id(text) -> id | None`: the tokenizer's vocabulary, in which the built-in format's markers must be single
  tokens."""
  messages = ([] if system is None else [{"role": "system", "content": system}]) + [{"role": "user", "content": text}]
  config = _tokenizer_config(directory)  # read once: the template's source and its special tokens
  template = jinja_template(directory, config)
  if template is not None:
    return _render_jinja(directory, template, config, messages, thinking)
  if model_type == "deepseek_v32":
    close = DSV32_THINK if thinking else DSV32_NO_THINK
    missing = [m for m in (DSV32_BOS, DSV32_USER, DSV32_ASSISTANT, close) if token_id(m) is None]
    if missing:
      raise ChatFormatError(f"DeepSeek-V3.2's chat format marks turns with {', '.join(missing)}, which the tokenizer "
                            f"of {directory!r} does not hold as tokens; give the formatted text with --prompt")
    return DSV32_BOS + (system or "") + DSV32_USER + text + DSV32_ASSISTANT + close  # the system prompt after BOS
  raise ChatFormatError(f"--chat needs the checkpoint's chat format, and {directory!r} has none: no {TEMPLATE_FILE}, "
                        f"no chat_template in {TOKENIZER_CONFIG}, and model_type {model_type!r} has no built-in one "
                        f"(deepseek_v32's); give the formatted text with --prompt")


def jinja_template(directory: str, config: dict) -> str | None:
  """The checkpoint's Jinja chat template (chat_template.jinja, else `config`'s: its tokenizer_config.json), or
  None."""
  path = os.path.join(directory, TEMPLATE_FILE)
  if os.path.isfile(path):
    try:
      with open(path, encoding="utf-8") as f:
        return f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise ChatFormatError(f"cannot read {path!r}: {e}") from None
  template = config.get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}]: transformers' default is "default"
    named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
    template = named.get("default")
  if template is not None and not isinstance(template, str):
    raise ChatFormatError(f"{os.path.join(directory, TOKENIZER_CONFIG)!r}: chat_template is not a template string "
                          f"(nor a list holding one named 'default')")
  return template


def _render_jinja(directory: str, template: str, config: dict, messages: list[dict], thinking: bool) -> str:
  import jinja2  # noqa: PLC0415 — only --chat needs it
  from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

  def raise_exception(message):
    raise jinja2.TemplateError(message)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
  env.globals.update(raise_exception=raise_exception,
                     strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
  try:
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True,
        bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")),
        enable_thinking=thinking, thinking=thinking)
  except jinja2.TemplateError as e:
    raise ChatFormatError(f"the chat template of {directory!r} failed to render: {e}") from None
  except Exception as e:  # noqa: BLE001 — the template's own Python errors ('str' + 1, a missing key): said of it
    raise ChatFormatError(f"the chat template of {directory!r} failed to render: {type(e).__name__}: {e}") from None


def _tokenizer_config(directory: str) -> dict:
  """tokenizer_config.json as a dict ({} where there is none); a file that cannot be read, is not UTF-8 or holds no
  JSON object is an error naming it."""
  try:
    return json_object(os.path.join(directory, TOKENIZER_CONFIG)) or {}
  except TokenizerError as e:
    raise ChatFormatError(str(e)) from None


def _token_text(token) -> str:
  """A special token as tokenizer_config.json writes it: a string or {"content": ...}; "" when absent."""
  token = token.get("content") if isinstance(token, dict) else token
  return token if isinstance(token, str) else ""
