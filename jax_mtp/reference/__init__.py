"""Reference outputs from other engines, and what both sides need to reproduce them.

This subpackage imports numpy and safetensors only — never jax — so the vLLM generator
(`tools/vllm_reference.py`, run in vLLM's own Python 3.11 venv) loads these modules by file path:

  tiny_checkpoint  tiny DeepSeek-V3 / V3.2 checkpoints rebuilt bit for bit from a frozen numpy RNG
  fixtures         the `.npz` reference-output format: what each array holds, a deterministic writer,
                   a validating reader

The committed fixtures live in `tests/golden/`; `tests/test_vllm_parity.py` compares against them.
"""
