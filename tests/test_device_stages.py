"""The device session scripts (benchmarks/h200_*.sh) name each stage once: bash's `case` runs the first label that
matches, so a new stage named like an old one silently runs the old one (2026-12-06: a new `compact` stage spent 440
s of device time running an FP8 stage of that name)."""

import collections
import pathlib
import re

import pytest

SCRIPTS = sorted(pathlib.Path(__file__).parent.parent.glob("benchmarks/h200_*.sh"))


def _stage_labels(script: pathlib.Path) -> list[str]:
  """The labels of the script's top-level `case` arms (two-space indented `name)` or `a|b)` lines)."""
  return [label for line in script.read_text().splitlines()
          if (arm := re.match(r"^  ([A-Za-z0-9_|-]+)\)", line)) for label in arm.group(1).split("|")]


def test_the_scripts_have_stages():
  assert any(_stage_labels(script) for script in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.name)
def test_each_stage_is_named_once(script):
  repeated = [label for label, n in collections.Counter(_stage_labels(script)).items() if n > 1]
  assert not repeated, f"{script.name}: stages named more than once: {repeated}"
