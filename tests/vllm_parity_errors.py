"""The max |ours − vLLM| table of benchmarks/RESULTS.md: every committed vLLM fixture replayed through
our target and MTP layer (the parity tests' own replay), V3 and V3.2-dense-equivalent. CPU, fp32.

    python -m tests.vllm_parity_errors
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import tests.conftest  # noqa: E402,F401  (8 CPU devices, as in the tests)
import numpy as np  # noqa: E402

from tests import test_vllm_parity as parity  # noqa: E402


def main() -> None:
  print("| fixture | model | target hidden | target logits | MTP hidden | MTP logits | max \\|logit\\| |")
  print("|---|---|---:|---:|---:|---:|---:|")
  with tempfile.TemporaryDirectory() as workdir:
    for name in parity.NAMES:
      for indexer in (False, True):
        _, a = parity._fixture(name)
        cfg, target, mtp = parity._model(name, indexer, workdir)
        hidden, logits = parity._replay_target(cfg, target, a)
        m_hidden, m_logits = parity._replay_mtp(cfg, mtp, a)
        errors = (np.abs(hidden - a["target_hidden"]).max(),
                  np.abs(logits[a["target_logits_row"]] - a["target_logits"]).max(),
                  np.abs(m_hidden - a["mtp_hidden_normed"]).max(),
                  np.abs(m_logits[a["mtp_logits_row"]] - a["mtp_logits"]).max())
        cells = " | ".join(f"{e:.2g}" for e in errors)
        print(f"| {name} | {'V3.2 (DSA)' if indexer else 'V3'} | {cells} | {np.abs(a['target_logits']).max():.3g} |")


if __name__ == "__main__":
  main()
