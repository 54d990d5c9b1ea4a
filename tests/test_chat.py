"""`decode --chat` (jax_mtp.chat): a prompt rendered as one user turn of the checkpoint's chat format — its Jinja
template equal to transformers' apply_chat_template's rendering, chat_template.jinja before tokenizer_config.json's,
DeepSeek-V3.2's built-in form (no Jinja template ships with it) with its markers as single tokens — and the errors a
checkpoint without a format, or a template that fails, gives."""

import json
import os
import shutil

import pytest
import tokenizers

import jax_mtp
from jax_mtp import chat, decode, loader
from jax_mtp.decode_flags import parser
from jax_mtp.decode_prompts import ChatRequest, prompts_from
from jax_mtp.tokenizer import TextCodec

DEFAULT = os.path.join(os.path.dirname(jax_mtp.__file__), "default_model")
# A template in the style HF checkpoints ship: a system turn folded in, loop controls, a namespace, tojson, an error
# for roles it does not know, whitespace controlled by trim_blocks / lstrip_blocks and by `-`
TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') %}
{%- for message in messages %}
  {%- if message['role'] == 'system' %}{% set ns.system = message['content'] %}{% continue %}{% endif %}
  {%- if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('unknown role ' ~ message['role']) }}{% endif %}
<|{{ message['role'] }}|>{{ ns.system }}{{ message['content'] }}{{ {'n': loop.index} | tojson }}
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>{% else %}</think>{% endif %}{% endif %}"""


def _checkpoint(tmp_path, tokenizer_config=None, template_file=None, extra_tokens=()):
  """The embedded default's files in a directory of their own, with a tokenizer_config.json / chat_template.jinja
  and extra special tokens as asked."""
  directory = tmp_path / "model"
  shutil.copytree(DEFAULT, directory)
  if tokenizer_config is not None:
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
  if template_file is not None:
    (directory / chat.TEMPLATE_FILE).write_text(template_file)
  if extra_tokens:
    tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.add_special_tokens(list(extra_tokens))
    tok.save(str(directory / "tokenizer.json"))
  return str(directory)


def _request(directory: str, *flags: str) -> decode.Request:
  return decode.validate(parser().parse_args(["--checkpoint", directory, *flags]))


@pytest.mark.parametrize("thinking", [False, True])
def test_a_jinja_template_renders_as_transformers_apply_chat_template_does(tmp_path, thinking):
  import transformers  # noqa: PLC0415 (the `reference` extra: tools/test.sh installs it)
  directory = _checkpoint(tmp_path, {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"})
  codec = TextCodec(directory)
  ours = chat.render(directory, "deepseek_v32", "def f(x):\n  return ü", codec.token_id, thinking=thinking)
  fast = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                              bos_token="<s>", eos_token="</s>", chat_template=TEMPLATE)
  theirs = fast.apply_chat_template([{"role": "user", "content": "def f(x):\n  return ü"}], tokenize=False,
                                    add_generation_prompt=True, enable_thinking=thinking)
  assert ours == theirs
  assert ours.endswith("<think>" if thinking else "</think>") and '{"n": 1}' in ours


def test_the_cli_tokenizes_the_rendered_turn_without_adding_special_tokens(tmp_path):
  """The default's one special token as BOS, which tokenizer_config.json also asks to add: the template's BOS
  stands, not a second one."""
  directory = _checkpoint(tmp_path, {"chat_template": "{{ bos_token }}[U]{{ messages[0]['content'] }}[A]",
                                     "bos_token": "<|endoftext|>", "add_bos_token": True})
  request = _request(directory, "--chat", "--prompt", "import os")
  codec = TextCodec(directory)
  assert request.texts == ["<|endoftext|>[U]import os[A]"]
  assert request.prompts == [codec.encode_rendered("<|endoftext|>[U]import os[A]")]
  assert request.prompts[0][0] == codec.token_id("<|endoftext|>") != request.prompts[0][1]  # the template's BOS, once


def test_chat_template_jinja_comes_before_tokenizer_configs_and_named_lists_take_default(tmp_path):
  named = [{"name": "tool_use", "template": "T{{ messages[0]['content'] }}"},
           {"name": "default", "template": "D{{ messages[0]['content'] }}"}]
  directory = _checkpoint(tmp_path, {"chat_template": named})
  assert chat.render(directory, "glm_moe_dsa", "x", lambda t: None) == "Dx"
  (tmp_path / "model" / chat.TEMPLATE_FILE).write_text("J{{ messages[0]['content'] }}")
  assert chat.render(directory, "glm_moe_dsa", "x", lambda t: None) == "Jx"


@pytest.mark.parametrize("thinking, close", [(False, "</think>"), (True, "<think>")])
def test_deepseek_v32s_own_format_one_user_turn(tmp_path, thinking, close):
  """encoding_dsv32.py's encode_messages for one user message: BOS, <｜User｜>, the text, <｜Assistant｜>, then
  </think> (chat mode) or <think> (thinking mode), each marker one token."""
  markers = [chat.DSV32_BOS, chat.DSV32_USER, chat.DSV32_ASSISTANT, chat.DSV32_THINK, chat.DSV32_NO_THINK]
  directory = _checkpoint(tmp_path, extra_tokens=markers)  # ids past the small model's vocabulary: no decode run
  texts, codec, prompts = prompts_from(["hi"], None, loader.locate(directory), True,
                                       ChatRequest(None, thinking, "deepseek_v32"))
  assert texts == ["<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>" + close]
  ids = prompts[0]
  assert ids[:2] == [codec.token_id(chat.DSV32_BOS), codec.token_id(chat.DSV32_USER)]
  assert ids[-2:] == [codec.token_id(chat.DSV32_ASSISTANT), codec.token_id(close)]
  assert codec.decode(ids[2:-2]) == "hi"


def test_a_system_turn_comes_first(tmp_path):
  """--system: the template gets [system, user] (here folded into the user turn, as TEMPLATE does), and
  DeepSeek-V3.2's form puts the system prompt right after BOS (encode_messages)."""
  import transformers  # noqa: PLC0415 (the `reference` extra: tools/test.sh installs it)
  directory = _checkpoint(tmp_path, {"chat_template": TEMPLATE})
  messages = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "hi"}]
  fast = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                              chat_template=TEMPLATE)
  assert (chat.render(directory, "glm_moe_dsa", "hi", lambda t: None, system="Be brief. ")
          == fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "<|user|>Be brief. hi"
          '{"n": 2}\n<|assistant|></think>')
  markers = [chat.DSV32_BOS, chat.DSV32_USER, chat.DSV32_ASSISTANT, chat.DSV32_NO_THINK]
  assert (chat.render(_checkpoint(tmp_path / "v32"), "deepseek_v32", "hi", {m: 1 for m in markers}.get,
                      system="Be brief.") == "<｜begin▁of▁sentence｜>Be brief.<｜User｜>hi<｜Assistant｜></think>")


@pytest.mark.parametrize("argv, named", [
    (["--chat"], "DeepSeek-V3.2's chat format marks turns with <｜begin▁of▁sentence｜>"),  # the default: no markers
    (["--thinking"], "--system and --thinking are parts of a chat prompt; they need --chat"),
    (["--system", "be brief"], "--system and --thinking are parts of a chat prompt; they need --chat"),
    (["--chat", "--random-tiny"], "--chat renders --prompt text in the checkpoint's chat format"),
    (["--chat", "--prompt-ids", "1,2"], "it takes no --prompt-ids"),
])
def test_chat_errors_are_one_line(capsys, argv, named):
  assert decode.main([*argv, "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and named in err, err


def test_a_checkpoint_without_a_format_and_a_failing_template_are_named(tmp_path, capsys):
  directory = _checkpoint(tmp_path)
  with pytest.raises(chat.ChatFormatError, match="has none: no chat_template.jinja, no chat_template in "
                                                 "tokenizer_config.json, and model_type 'glm_moe_dsa'"):
    chat.render(directory, "glm_moe_dsa", "x", lambda t: None)
  (tmp_path / "model" / chat.TEMPLATE_FILE).write_text("{{ raise_exception('system turns only') }}")
  assert decode.main(["--checkpoint", directory, "--chat", "--prompt", "x", "--max-new-tokens", "2"]) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [f"error: the chat template of {directory!r} failed to render: system turns only"]


@pytest.mark.parametrize("template, named", [
    ("{{ messages[0]['content'] + 1 }}", "failed to render: TypeError: can only concatenate str"),
    ("{{ 1 / 0 }}", "failed to render: ZeroDivisionError"),
])
def test_a_templates_own_python_error_is_one_line_naming_the_checkpoint(tmp_path, capsys, template, named):
  directory = _checkpoint(tmp_path, template_file=template)
  assert decode.main(["--checkpoint", directory, "--chat", "--prompt", "x", "--max-new-tokens", "2"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and f"the chat template of {directory!r} {named}" in err, err


@pytest.mark.parametrize("file, content, named", [
    ("tokenizer_config.json", b"[]", "holds [], expected a JSON object"),
    ("tokenizer_config.json", b'{"add_bos_token": true, "bos_token": "\xff"}', "cannot read"),
    (chat.TEMPLATE_FILE, b"{{ '\xff' }}", "cannot read"),
])
def test_a_chat_file_that_is_no_object_or_not_utf8_is_named(tmp_path, capsys, file, content, named):
  """The file's path is in the one line, with or without --chat (the BOS rule reads tokenizer_config.json too)."""
  directory = _checkpoint(tmp_path)
  (tmp_path / "model" / file).write_bytes(content)
  for chat_flag in (["--chat"], []) if file != chat.TEMPLATE_FILE else (["--chat"],):
    assert decode.main(["--checkpoint", directory, *chat_flag, "--prompt", "x", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    path = str(tmp_path / "model" / file)
    assert out == "" and len(err.splitlines()) == 1 and repr(path) in err and named in err, err
