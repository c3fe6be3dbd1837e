"""The bundled kernel files as the tests load them: by path, under a private module name, as
SGLang and the harness load them (they are not imported as `kerneldev.kernels` here, so a
test can load one file twice under different names)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def load_kernel_file(name: str, file: str):
    """Import `kernels/<file>` as the module `name` (registered in sys.modules first, as a
    dataclass or NamedTuple defined in the file needs)."""
    spec = importlib.util.spec_from_file_location(name, KERNELS / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
