"""Pallas kernels of jax_mtp, imported as `jax_mtp.kernels` (the folder is mapped by pyproject).

One vocabulary across the ops: each op's module holds `reference` (pure jnp, the spec), `check_operands` (a
ValueError naming the offending value), its kernel(s) with a frozen launch `Config` and `config_for` (the
heuristics) where they have launch choices, and a public wrapper with an explicit `impl=`; a kernel on another
backend lives beside it in `<op>_mgpu.py` (Mosaic GPU) and takes the same operands.
"""
