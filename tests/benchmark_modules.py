"""benchmarks/ modules for the tests in tests/unit and tests/e2e: benchmarks/ is a folder of scripts, not a package.

Importable from both folders by name, as the helper modules beside their tests are: pytest puts tests/ on sys.path
for tests/conftest.py (no __init__.py, the default "prepend" import mode).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_virtual_prometheus() -> ModuleType:
    """benchmarks/virtual_prometheus.py, executed afresh and registered as `virtual_prometheus` in sys.modules
    (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location("virtual_prometheus", BENCHMARKS / "virtual_prometheus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["virtual_prometheus"] = module
    spec.loader.exec_module(module)
    return module
