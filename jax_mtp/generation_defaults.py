"""The sampling a checkpoint asks for: `generation_config.json`'s `temperature`, `top_k` and `top_p`, which
`python -m jax_mtp.decode` applies where its flags leave them unset (`--generation-config auto`, the default, as
vLLM's `--generation-config auto`: a model released with recommended sampling settings is decoded with them unless
the command line says otherwise). `--generation-config none`: greedy unless the flags say otherwise.

Rules: a flag given always wins; `do_sample: false` in the file means greedy (transformers' meaning of the key), so
its other keys are not applied; without `do_sample` the keys apply (vLLM's reading); `--check` compares greedy
outputs, so the file is not applied there. A value the sampler cannot take is an error naming the file and key."""

from __future__ import annotations

import os

from jax_mtp.request import validate_temperature, validate_top_k, validate_top_p
from jax_mtp.tokenizer import json_object

FILE = "generation_config.json"
MODES = ("auto", "none")
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}  # what each flag means when neither it nor the file sets it
VALIDATORS = {"temperature": validate_temperature, "top_k": validate_top_k, "top_p": validate_top_p}


def from_file(directory: str) -> dict:
  """The sampling settings `directory`'s generation_config.json sets ({} without the file, or with do_sample false);
  a ValueError naming the file for a malformed file or value."""
  path = os.path.join(directory, FILE)
  data = json_object(path)
  if data is None or data.get("do_sample") is False:
    return {}
  found = {name: data[name] for name in GREEDY if data.get(name) is not None}
  for name, value in found.items():
    try:
      VALIDATORS[name](value)
    except ValueError as e:
      raise ValueError(f"{path!r}: {e}") from None
  return found


def flags_given(flags) -> dict:
  """The sampling flags of `flags` (parsed arguments, or anything with their attributes) as `resolve` takes them."""
  return {name: getattr(flags, name) for name in GREEDY}


def resolve(given: dict, directory: str | None, mode: str, *, check: bool) -> tuple[dict, str | None]:
  """The temperature, top_k and top_p a run uses, from the flags `given` (None: not given), the checkpoint
  `directory`'s file (None: no checkpoint files, e.g. random weights) under `mode`, and greedy's values; and a note
  naming what came from the file (None when nothing did)."""
  if mode not in MODES:
    raise ValueError(f"--generation-config={mode!r} is not one of {MODES}")
  given = {name: value for name, value in given.items() if value is not None}
  applied = {}
  if mode == "auto" and directory is not None and not check:
    applied = {name: value for name, value in from_file(directory).items() if name not in given}
  values = {**GREEDY, **applied, **given}
  if values["temperature"] == 0:  # greedy: the file's filters would change nothing, and no note claims they do;
    # a filter given on the command line does nothing either, and is said to
    filters = [f"--{name.replace('_', '-')}" for name in ("top_k", "top_p") if name in given]
    verb = "filter" if len(filters) > 1 else "filters"
    return {**GREEDY, **given}, (f"note: {' and '.join(filters)} {verb} what sampling draws from; greedy decoding "
                                 f"(temperature 0) does not use {'them' if len(filters) > 1 else 'it'}: give "
                                 f"--temperature to sample" if filters else None)
  if not applied:
    return values, None
  settings = ", ".join(f"{name.replace('_', '-')} {value}" for name, value in applied.items())
  return values, (f"note: sampling with {settings} from {os.path.join(directory, FILE)} (the flags override it; "
                  f"--generation-config none: greedy)")
