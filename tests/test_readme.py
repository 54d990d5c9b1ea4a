"""The front door stays true: the README opens with the two commands (demo; tests), CI runs the README's test
command, `tools/test.sh`'s four processes hold every test file, the flags the README names exist in the CLIs,
and every relative link in the README and the pages it sends readers to reaches a file and, where it names one,
a heading (GitHub's anchors: the numbers in the status table link to benchmarks/RESULTS.md's sections)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/status.md", "docs/testing.md", "docs/kernels.md", "docs/mosaic_gpu_notes.md",
         "benchmarks/README.md"]
DEMO = ".venv/bin/python -m jax_mtp.decode"
TEST_COMMAND = "tools/test.sh"
# Flags in the README that belong to other programs than the two CLIs (gcloud's, SLURM's srun, jupyter's).
OTHER_PROGRAMS_FLAGS = {"--worker", "--command", "--ntasks-per-node", "--inplace"}


def _first_code_block(text: str) -> tuple[int, list[str]]:
  """(line number of the opening fence, the block's lines)."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("```"))
  end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
  return start, lines[start + 1:end]


def test_the_readme_opens_with_the_demo_and_the_test_command():
  start, block = _first_code_block((REPO / "README.md").read_text())
  commands = [line.split("#")[0].strip() for line in block]
  assert start <= 3, f"the README's first code block starts at line {start + 1}, expected the top"
  assert commands == [f"tools/bootstrap.sh && {DEMO}", TEST_COMMAND], commands


def test_ci_runs_the_readme_test_command_and_the_readme_names_no_other():
  ci = (REPO / ".ci/run").read_text().splitlines()
  assert TEST_COMMAND in [line.split("#")[0].strip() for line in ci], ".ci/run does not call tools/test.sh"
  readme = (REPO / "README.md").read_text()
  assert "-m pytest" not in readme, "the README names a pytest command besides tools/test.sh"


def test_the_four_processes_hold_every_test_file():
  script = (REPO / "tools/test.sh").read_text()
  groups = re.search(r'groups=\(("[a-z]-[a-z]"(?: "[a-z]-[a-z]")*)\)', script)
  assert groups, "tools/test.sh's groups=(...) line not found"
  ranges = [g.strip('"') for g in groups.group(1).split()]
  letters = [chr(c) for lo, hi in (r.split("-") for r in ranges) for c in range(ord(lo), ord(hi) + 1)]
  assert sorted(letters) == [chr(c) for c in range(ord("a"), ord("z") + 1)], ranges
  outside = [p.name for p in (REPO / "tests").glob("test_*.py") if p.name[len("test_")] not in letters]
  assert not outside, f"test files no process of tools/test.sh runs: {outside}"


def _flags(program: str) -> set[str]:
  help_text = subprocess.run([sys.executable, "-m", program, "--help"], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=120).stdout
  return set(re.findall(r"--[a-z][a-z0-9-]*", help_text))


def test_the_flags_the_readme_names_exist():
  known = _flags("jax_mtp.decode") | _flags("jax_mtp.train") | OTHER_PROGRAMS_FLAGS | {"--help"}
  for page in ("README.md", "docs/kernels.md"):
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", (REPO / page).read_text()))
    assert not named - known, f"{page} names flags neither CLI has: {sorted(named - known)}"


def _anchors(markdown: str) -> set[str]:
  """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
  seen: dict[str, int] = {}
  in_code = False
  for line in markdown.splitlines():
    in_code ^= line.startswith("```")
    if in_code or not re.match(r"#{1,6} ", line):
      continue
    slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
    seen[slug] = seen.get(slug, -1) + 1
    yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


@pytest.mark.parametrize("page", PAGES)
def test_links_reach_their_files_and_headings(page):
  text = (REPO / page).read_text()
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    file = (REPO / page).parent / path if path else REPO / page
    if not file.exists():
      broken.append(f"{target}: no such file")
    elif anchor and anchor not in set(_anchors(file.read_text())):
      broken.append(f"{target}: no such heading in {file.relative_to(REPO)}")
  assert not broken, f"{page}: " + "; ".join(broken)


def test_the_library_snippet_runs():
  """The README's library example is whole: run as written, it drafts one token a position."""
  block = re.search(r"### The library\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
  scope = {}
  exec(block, scope)  # noqa: S102 (the README's own code)
  assert scope["drafts_BT"].shape == scope["input_ids_BT"].shape
  assert scope["out"].hidden_BTD.shape == (*scope["input_ids_BT"].shape, scope["cfg"].hidden_size)
