"""Makes `jax_mtp.kernels` importable from a plain source checkout (`PYTHONPATH=.`, no install).

The kernels live in the top-level folder `kernels/` and are installed as `jax_mtp.kernels`
(pyproject `package-dir`; a top-level `kernels` would clash with PyPI's `kernels` package). An
installed wheel or editable install resolves the name itself; only when nothing does, this maps
`jax_mtp.kernels` to the checkout's `kernels/` folder, under that name alone.
"""

import importlib.util
import pathlib
import sys

_NAME = "jax_mtp.kernels"


def map_source_kernels() -> None:
  source = pathlib.Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
  if _NAME in sys.modules or importlib.util.find_spec(_NAME) is not None or not source.is_file():
    return
  spec = importlib.util.spec_from_file_location(_NAME, source, submodule_search_locations=[str(source.parent)])
  module = importlib.util.module_from_spec(spec)
  sys.modules[_NAME] = module
  spec.loader.exec_module(module)
  sys.modules["jax_mtp"].kernels = module  # what the import system does for a found submodule
