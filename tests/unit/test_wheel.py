"""The operator's wheel, built as the Dockerfiles build it: no dev cluster, no demo, no `cryptography`, and every
command it has works without them (issue 31, point 5)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter with the unpacked wheel first on sys.path and the editable checkout's finder
# removed, so nothing outside the wheel (but the runtime dependencies) can be imported from specdeploy.
_IN_THE_WHEEL = """
import contextlib, importlib, io, json, sys
sys.path.insert(0, sys.argv[1])
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
from specdeploy.cli import main

def run(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(args, prog_name="specdeploy")
        except SystemExit as done:
            return {"code": done.code, "output": out.getvalue()}

print(json.dumps({
    "loaded_from": sys.modules["specdeploy"].__file__,
    "harness_loaded": sorted(m for m in sys.modules if m.startswith("specdeploy.devcluster") or m == "cryptography"),
    "help": run(["--help"]),
    "dev_cluster": run(["dev-cluster", "--help"]),   # only --help: where the dev cluster is, it must start nothing
    "demo": run(["demo", "--help"]),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps .` of the sources the Dockerfiles copy, in a fresh directory (no stale build/)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "operator" / "specdeploy", source / "operator" / "specdeploy", ignore=ignore)
    shutil.copytree(REPO / "engine-image" / "specdeploy_engine", source / "engine-image" / "specdeploy_engine",
                    ignore=ignore)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(root / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, f"the dev extra installs the build backend (setuptools>=77):\n{built.stderr}"
    (found,) = (root / "dist").glob("specdeploy-*.whl")
    return found


def test_the_wheel_has_the_operator_and_the_engine_images_code_but_not_the_dev_cluster(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("specdeploy/devcluster") or n.endswith("/demo.py")] == []
    assert {"specdeploy/cli.py", "specdeploy/controller/handlers.py", "specdeploy/api/kube_types.json",
            "specdeploy_engine/launch.py", "specdeploy_engine/preflight.py",
            "specdeploy_engine/sim/__main__.py"} <= set(names)


def test_cryptography_is_only_in_the_dev_cluster_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
    assert [r for r in requires if "extra ==" not in r and "cryptography" in r] == []
    assert any(r.startswith("cryptography") and 'extra == "devcluster"' in r for r in requires)


def test_every_module_of_the_wheel_imports_and_the_dev_cluster_commands_say_where_they_are(
        wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    modules = sorted(".".join(p.relative_to(site).with_suffix("").parts).removesuffix(".__init__")
                     for p in site.rglob("*.py") if p.name != "__main__.py")
    ran = subprocess.run([sys.executable, "-I", "-c", _IN_THE_WHEEL, str(site), json.dumps(modules)],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["loaded_from"].startswith(str(site))
    assert result["harness_loaded"] == []
    assert result["help"]["code"] == 0
    assert {"dev-cluster", "demo", "load", "sim-admin", "run", "plan"} <= set(result["help"]["output"].split())
    for command in ("dev_cluster", "demo"):
        assert result[command]["code"] == 2
        assert "not part of the installed operator package" in result[command]["output"]
        assert "pip install -e '.[dev]'" in result[command]["output"]
