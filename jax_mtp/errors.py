"""Helpers for turning an exception into the one line a user reads (the CLI's `error:` line, a wrapping error)."""

from __future__ import annotations


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message, or its class name where the message is empty.

  Orbax, TensorStore, XLA and the Hugging Face client put kilobytes of detail below a first line that says what went
  wrong; the class name stands in for a bare `raise SomeError()`, which would otherwise print as nothing.
  """
  message = str(error)
  return message.splitlines()[0] if message else type(error).__name__
