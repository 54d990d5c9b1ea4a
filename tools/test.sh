#!/usr/bin/env bash
# The test suite as CI runs it: makes .venv with the extras the tests need (tools/bootstrap.sh), then pytest.
#
#   tools/test.sh                        the whole suite in four pytest processes, split by file name
#   tools/test.sh -k fibonacci -x        the same four processes, the arguments passed to each
#   tools/test.sh tests/test_mtp.py -q   paths among the arguments: one process over just those
#   JAX_MTP_FULL_TESTS=1 tools/test.sh   the full form (docs/testing.md)
#
# Four processes because XLA's CPU compiler can abort late in a process that holds many tests' compiled programs
# (docs/testing.md); each process holds a quarter of the files. All four run whatever the earlier ones gave; at the end
# a table gives each process's counts (from its JUnit report) and wall time, and the exit status is non-zero when any
# process failed (pytest's 5, "nothing selected", counts as a pass when arguments narrowed the selection).
set -uo pipefail
cd "$(dirname "$0")/.."
trap 'echo "tools/test.sh: interrupted" >&2; exit 130' INT TERM

start=$SECONDS
tools/bootstrap.sh test,reference,notebooks,tpu || { echo "tools/test.sh: tools/bootstrap.sh failed" >&2; exit 2; }
bootstrap_s=$((SECONDS - start))

# A path among the arguments (a file, folder or node id; not the value of an option that takes a path) means the
# caller chose the tests: one process, the arguments as given.
takes_path=" --deselect --ignore --ignore-glob --rootdir --basetemp --junitxml --junit-xml -c --confcutdir "
named_paths=0
prev=""
for arg in "$@"; do
  if [[ "$arg" != -* && "$takes_path" != *" $prev "* && -e "${arg%%::*}" ]]; then named_paths=1; fi
  prev="$arg"
done

shopt -s nullglob
if (( named_paths )); then
  groups=("")
else
  groups=("a-e" "f-o" "p-s" "t-z")
fi

reports="$(mktemp -d)"
labels=() statuses=() walls=()
for i in "${!groups[@]}"; do
  q="${groups[$i]}"
  if [[ -n "$q" ]]; then
    files=(tests/test_[$q]*.py)
    label="tests/test_[$q]*.py"
  else
    files=()
    label="named tests"
  fi
  echo "=== tools/test.sh: $label"
  t0=$SECONDS
  .venv/bin/python -m pytest -q --junitxml="$reports/$i.xml" "$@" "${files[@]}"
  status=$?
  labels+=("$label") statuses+=("$status") walls+=($((SECONDS - t0)))
done

# One row per process: passed / failed / errors / skipped from its JUnit report (xfails count as skipped there).
.venv/bin/python - "$reports" "$bootstrap_s" "$((SECONDS - start))" "$#" "${labels[@]}" "${statuses[@]}" \
  "${walls[@]}" <<'EOF'
import sys
import xml.etree.ElementTree as ET

reports, bootstrap_s, total_s, narrowed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] != "0"
rest = sys.argv[5:]
n = len(rest) // 3
labels, statuses, walls = rest[:n], [int(s) for s in rest[n:2 * n]], [int(s) for s in rest[2 * n:]]


def mmss(s: int) -> str:
  return f"{s // 60}:{s % 60:02d}"


def counts(path: str) -> tuple[int, int, int, int] | None:
  try:
    suites = ET.parse(path).getroot()
  except (OSError, ET.ParseError):
    return None
  suites = [suites] if suites.tag == "testsuite" else list(suites)

  def total(key: str) -> int:
    return sum(int(s.get(key, 0)) for s in suites)

  failed, errors, skipped = total("failures"), total("errors"), total("skipped")
  return total("tests") - failed - errors - skipped, failed, errors, skipped


print(f"\n=== tools/test.sh summary\n{'process':<24}{'passed':>8}{'failed':>8}{'errors':>8}{'skipped':>9}"
      f"{'wall':>8}  result")
sums = [0, 0, 0, 0]
for i, (label, status, wall) in enumerate(zip(labels, statuses, walls)):
  found = counts(f"{reports}/{i}.xml")
  if found is None:
    cells, result = " " * 33, f"no report: pytest exited {status}" + (" (a signal: crashed)" if status > 128 else "")
  else:
    sums = [a + b for a, b in zip(sums, found)]
    cells = f"{found[0]:>8}{found[1]:>8}{found[2]:>8}{found[3]:>9}"
    result = {0: "ok", 5: "nothing selected" + (" (ok)" if narrowed else "")}.get(status, f"FAILED (exit {status})")
  print(f"{label:<24}{cells}{mmss(wall):>8}  {result}")
print(f"{'bootstrap':<24}{'':33}{mmss(bootstrap_s):>8}")
print(f"{'total':<24}{sums[0]:>8}{sums[1]:>8}{sums[2]:>8}{sums[3]:>9}{mmss(total_s):>8}")
EOF

rm -rf "$reports"
for status in "${statuses[@]}"; do
  if (( status != 0 )) && ! (( status == 5 && $# > 0 )); then exit 1; fi
done
exit 0
