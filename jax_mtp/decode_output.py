"""What `python -m jax_mtp.decode` shows: the progress bar and streamed text while it decodes, then the
result as text or as one JSON object on stdout (with what the compiled programs ran for each part the kernel flags
name: `jax_mtp.ran_kernels`), one `error: prompt i: ...` line on stderr per row
whose logits became non-finite, and one `error: --check: ...` line when the speculative output differs
from plain decoding; `exit_code` says how the run ended. Nothing here reads flags or touches the
model: the CLI passes in what it decided (jax_mtp.decode)."""

from __future__ import annotations

import json
import sys
import time
import typing

from jax_mtp.distributed import Gathered
from jax_mtp.ran_kernels import summary
from jax_mtp.tokenizer import TextCodec


class Progress:
  """A one-line progress bar on `stream`, shown only on a terminal (or with `force`), at most 10 Hz."""

  def __init__(self, stream=None, force: bool = False, enabled: bool = True):
    stream = sys.stderr if stream is None else stream  # looked up per call: sys.stderr may be swapped
    self.stream, self.enabled = stream, enabled and (force or stream.isatty())
    self.shown, self.last = False, 0.0

  def __call__(self, done: int, total: int) -> None:
    now = time.monotonic()
    if not self.enabled or (now - self.last < 0.1 and done < total):
      return
    self.last, self.shown = now, True
    filled = 30 * done // max(total, 1)
    self.stream.write(f"\rdecoding [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} tokens")
    self.stream.flush()

  def close(self) -> None:
    if self.shown:
      self.stream.write("\n")
      self.stream.flush()


class TextStream:
  """`on_tokens` for one row: prints the decoded text that is new since the last call. Text that
  ends inside a multi-byte character (a trailing U+FFFD) is held back until its bytes arrive."""

  def __init__(self, codec: TextCodec, out=None):
    self.codec, self.out, self.shown = codec, out, ""

  def __call__(self, tokens: list[list[int]]) -> None:
    text = self.codec.decode(tokens[0]).rstrip("\ufffd")
    if text.startswith(self.shown) and len(text) > len(self.shown):
      print(text[len(self.shown):], end="", flush=True, file=self.out or sys.stdout)
      self.shown = text


def print_result(result: Gathered, *, as_json: bool, model_line: str, prompts: list[list[int]],
                 texts: list[str] | None, codec: TextCodec | None, streamed: bool,
                 kernels: dict[str, dict[str, str]] | None = None, cache: CacheUse | None = None) -> int:
  """Prints every row's outcome (JSON or text), one stderr line per failed row and one for a failed
  --check; returns `exit_code(result)`. `texts`: the --prompt texts when `codec` encoded them. `kernels`: what
  the prefill and the round ran (`Speculator.kernels_ran`); `cache`: the compilation cache the run used."""
  if as_json:
    print(json.dumps({**_json_object(result, codec), **({"kernels": kernels} if kernels else {}),
                      **({"compilation_cache": cache._asdict()} if cache else {})}))
  else:
    _print_text(result, model_line, prompts, texts, codec, streamed, cache)
    if kernels:
      print(f"ran (read from the compiled programs): {summary(kernels)}")
  for i in result.failed_rows:
    print(f"error: prompt {i}: {failure(result, i)}", file=sys.stderr)
  for d in result.differences:  # a near-tie is a note; a difference where the target chose clearly, an error
    print(f"{'note' if d['near_tie'] else 'error'}: --check: {difference_line(d)}", file=sys.stderr)
  if result.matches is False:
    print("error: --check: the speculative output differs from plain greedy decoding with the target (they must "
          "match token for token, up to near-ties of the target's top two logits in a 16-bit model)", file=sys.stderr)
  return exit_code(result)


class CacheUse(typing.NamedTuple):
  """The persistent compilation cache a run used (jax_mtp.compile_cache): its folder (None: none) and how many
  programs were read from it instead of compiled."""
  folder: str | None
  programs_read: int


def _cache_words(cache: CacheUse | None) -> str:
  if cache is None:
    return ""
  if cache.folder is None:
    return "; no compilation cache"
  return f"; {cache.programs_read} program(s) read from the compilation cache {cache.folder}"


def difference_line(d: dict) -> str:
  """One row's first difference from plain greedy decoding, with the target's margin there (jax_mtp.greedy_check)."""
  where = f"prompt {d['row']} first differs from plain greedy decoding at token {d['index']}"
  if d["speculative"] is None or d["plain"] is None:
    return f"{where}: one output ends there"
  margin = f"the target's top two logits there are {d['margin']:.2g} apart (relative)"
  verdict = ("a near-tie, which a 16-bit model's verification and plain steps may break either way" if d["near_tie"]
             else "no near-tie")
  return f"{where} ({d['speculative']} for plain's {d['plain']}): {margin}, {verdict}"


def exit_code(result: Gathered) -> int:
  """1 when a row's logits became non-finite or --check found the outputs differ, else 0."""
  return 1 if result.failed_rows or result.matches is False else 0


def _json_object(result: Gathered, codec: TextCodec | None) -> dict:
  failed = result.failed_rows
  reasons = ["error" if i in failed else "stop" if s else "length" for i, s in enumerate(result.stopped_rows)]
  out = {"tokens": result.tokens, "finish_reasons": reasons, **result.metrics.as_dict()}
  if failed:
    out["errors"] = {str(i): failure(result, i) for i in failed}
  if codec is not None:
    out["text"] = [codec.decode(tokens) for tokens in result.tokens]
  if result.matches is not None:
    out["matches_target"] = result.matches
    out["check_differences"] = list(result.differences)
  return out


def _print_text(result: Gathered, model_line: str, prompts: list[list[int]], texts: list[str] | None,
                codec: TextCodec | None, streamed: bool, cache: CacheUse | None) -> None:
  m = result.metrics
  if streamed:  # the model line and the prompt were printed before the streamed text
    print("\n" + "─" * 40)
  else:
    print(model_line)
  for i, (prompt, tokens) in enumerate(zip(prompts, result.tokens)):
    stop = " (stopped at EOS)" if result.stopped_rows[i] and i not in result.failed_rows else ""
    if codec is not None and streamed:  # the text was shown as it came: its token counts, not the ids again
      print(f"prompt {i}: {len(prompt)} tokens in, {len(tokens)} out{stop} (--json gives the ids)")
    else:
      print(f"prompt {i} {prompt} → {tokens}{stop}")
    if codec is not None and not streamed:
      print(f"  {texts[i]!r} → {codec.decode(tokens)!r}")
  if m.rounds:
    k = len(m.acceptance_rate_per_position)
    print(f"acceptance length {m.acceptance_length_mean:.2f} · per position "
          f"{[round(r, 2) for r in m.acceptance_rate_per_position]} · drafts accepted "
          f"{m.draft_tokens_accepted}/{m.draft_tokens_proposed} (acceptance length: the tokens a round commits, "
          f"1 to k + 1 = {k + 1}; per position: how often the j-th draft was accepted)")
    print(f"{m.tokens_per_second:.1f} tokens/s = {m.tokens_per_second_per_acceptance_length:.1f} rounds/s (summed "
          f"over rows) × acceptance length {m.acceptance_length_mean:.2f}")
  if m.compile_seconds:
    print(f"compiling the prefill and the round took {m.compile_seconds:.1f} s before the prefill (not in "
          f"tokens/s{_cache_words(cache)})")
  if result.matches is not None:
    ties = " up to near-ties (below)" if result.matches and result.differences else ""
    print(f"check: the output {'matches' if result.matches else 'DIFFERS FROM'} plain greedy decoding with the "
          f"target{ties}")


def failure(result: Gathered, row: int) -> str:
  return (f"the target's logits became non-finite (NaN or inf) after {len(result.tokens[row])} token(s); the row "
          f"stopped there, the other rows went on")
