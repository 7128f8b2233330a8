"""The layout keeps pure and I/O apart (docs/architecture.md): the pure core — the resource, planning,
rendering, the judgment and the reconcile decision — loads no client of anything and none of the shell; and the
judgment reads the plan through its view, loading nothing of planning."""

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "specdeploy"
PURE_PACKAGES = ("api", "planning", "engines", "judgment", "reconcile")
EDGE = ("httpx", "httpx2", "lightkube", "kopf", "aiohttp", "huggingface_hub", "specdeploy.clients",
        "specdeploy.controller", "specdeploy.devcluster")


def _modules(package: str) -> list[str]:
    return [f"specdeploy.{package}.{path.stem}" for path in sorted((PACKAGE / package).glob("*.py"))
            if path.stem != "__init__"]


def test_the_pure_core_imports_no_client_and_none_of_the_shell() -> None:
    modules = [m for package in PURE_PACKAGES for m in _modules(package)]
    assert "specdeploy.judgment.verdict" in modules and "specdeploy.reconcile.decide" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(e for e in {EDGE!r} if e in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_judgment_loads_nothing_of_planning() -> None:
    """The Plan holds every number derived from the models; the judgment asks it through judgment/plan_view.py and
    can neither rebuild a cost model nor resolve a model again. Checked on what importing every judgment module loads,
    so an import through another package counts too."""
    modules = _modules("judgment")
    assert "specdeploy.judgment.speculation" in modules and "specdeploy.judgment.plan_view" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'specdeploy.planning' or m.startswith('specdeploy.planning.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_every_module_of_the_operator_is_in_a_package_that_says_what_it_is() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py")
                   if p.stem not in ("__init__", "cli", "report", "paths", "yamltext"))
    assert loose == []
    assert not (PACKAGE / "analysis").exists()


def test_test_modules_have_unique_names() -> None:
    """pytest imports test files by their basename (no packages under tests/): two of one name cannot both run."""
    names = [p.name for p in (PACKAGE.parents[1] / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
