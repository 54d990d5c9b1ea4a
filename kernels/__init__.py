"""Pallas kernels of jax_mtp, imported as `jax_mtp.kernels` (the folder is mapped by pyproject).

Each kernel module holds `<op>_reference` (pure jnp, the spec), the kernel(s), `validate_inputs`
and a public wrapper with an explicit `impl=`. The kernels arrive with issues #3 (vocab argmax)
and #4 (fused all-reduce + RMSNorm).
"""
