"""The sharded MTP draft step, with the Opt-1 Mosaic kernel, compiles for a real TPU topology
(v5e 2x2) on this CPU machine through libtpu (the `tpu` extra; CI installs it)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "tpu_aot_compile.py"


@pytest.mark.slow
def test_mtp_step_compiles_for_tpu_with_the_mosaic_kernel():
  assert importlib.util.find_spec("libtpu") is not None, "libtpu missing: install the `tpu` extra"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, str(TOOL), "--topology", "v5e:2x2", "--preset", "tiny"],
                       capture_output=True, text=True, env=env, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  lines = [line for line in run.stdout.splitlines() if "impl=" in line]
  assert len(lines) == 2, run.stdout
  xla, pallas = lines
  assert "fused_allreduce_rmsnorm_tpu present: False" in xla and "'all-reduce': 3" in xla
  assert "fused_allreduce_rmsnorm_tpu present: True" in pallas and "'all-reduce': 2" in pallas
