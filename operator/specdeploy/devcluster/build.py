"""Find or build the control-plane binaries: etcd, kube-*, kubectl, kwok and helm, from Go modules, and the
LeaderWorkerSet controller when a cluster asks for it.

Why from Go modules: this machine has no container engine and reaches only package registries, so
the only way to a real kube-apiserver is `go build` from the module proxy. Each group of binaries is
built inside a small generated wrapper module under ``<cache>/src/`` (etcd's and Kubernetes' own
go.mod files carry local `replace`s that only work inside their repositories), into
``<cache>/bin/<kubernetes-version>/``. A binary is rebuilt only when missing; prebuilt ones from
``$KUBEBUILDER_ASSETS`` or ``$PATH`` are used when their version matches.

Usage::

    binaries = ensure_binaries(progress=print)
    binaries["kube-apiserver"]  # -> Path
    ensure_binaries(names=LEADER_WORKER_SET)   # the LWS controller: five minutes more, only when asked
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specdeploy.devcluster import versions
from specdeploy.devcluster.errors import BuildError
from specdeploy.paths import cache_dir

Progress = Callable[[str], None]

_DEFAULT_GO = Path("/usr/local/go/bin/go")
_STAGING_REPLACE = re.compile(r"^\s*(?:replace\s+)?(k8s\.io/[\w.\-/]+)\s+=>\s+\./staging/", re.MULTILINE)
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Binary:
    """One program to build: `package` from `module`@`version`, inside wrapper module `group`."""

    name: str
    group: str
    module: str
    version: str
    package: str
    ldflags: tuple[str, ...]
    version_args: tuple[str, ...]   # empty: it cannot say its version, so only the manifest vouches for it


def _kubernetes_ldflags(version: str) -> tuple[str, ...]:
    """Version stamps so `kubectl version` and /version report the real release, not v0.0.0."""
    major, minor, _ = version.lstrip("v").split(".")
    flags: list[str] = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


def _catalog() -> tuple[Binary, ...]:
    k8s = versions.KUBERNETES
    kube = _kubernetes_ldflags(k8s)
    return (
        Binary("etcd", "etcd", "go.etcd.io/etcd/server/v3", versions.ETCD, "go.etcd.io/etcd/server/v3",
               (), ("--version",)),
        Binary("kube-apiserver", "kubernetes", "k8s.io/kubernetes", k8s, "k8s.io/kubernetes/cmd/kube-apiserver",
               kube, ("--version",)),
        Binary("kube-controller-manager", "kubernetes", "k8s.io/kubernetes", k8s,
               "k8s.io/kubernetes/cmd/kube-controller-manager", kube, ("--version",)),
        Binary("kube-scheduler", "kubernetes", "k8s.io/kubernetes", k8s, "k8s.io/kubernetes/cmd/kube-scheduler",
               kube, ("--version",)),
        Binary("kubectl", "kubernetes", "k8s.io/kubernetes", k8s, "k8s.io/kubernetes/cmd/kubectl",
               kube, ("version", "--client")),
        Binary("kwok", "kwok", "sigs.k8s.io/kwok", versions.KWOK, "sigs.k8s.io/kwok/cmd/kwok",
               (f"-X sigs.k8s.io/kwok/pkg/consts.Version={versions.KWOK}",), ("--version",)),
        Binary("helm", "helm", "helm.sh/helm/v3", versions.HELM, "helm.sh/helm/v3/cmd/helm",
               (f"-X helm.sh/helm/v3/internal/version.version={versions.HELM}",
                "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"), ("version", "--short")),
        Binary("lws-controller", "lws", "sigs.k8s.io/lws", versions.LWS, "sigs.k8s.io/lws/cmd",
               (f"-X sigs.k8s.io/lws/pkg/version.GitVersion={versions.LWS}",), ()),
    )


BINARIES: tuple[Binary, ...] = _catalog()
#: Only built for a cluster started with LeaderWorkerSets (`up --leader-worker-sets`).
LEADER_WORKER_SET: tuple[str, ...] = ("lws-controller",)
#: What every dev cluster runs: the default of `ensure_binaries`.
NAMES: tuple[str, ...] = tuple(b.name for b in BINARIES if b.name not in LEADER_WORKER_SET)


def bin_dir() -> Path:
    """Where built binaries live, keyed by the Kubernetes version."""
    return cache_dir() / "bin" / versions.KUBERNETES


def go_binary() -> Path:
    """The `go` command: $PATH first, then the usual /usr/local/go install."""
    found = shutil.which("go")
    if found:
        return Path(found)
    if _DEFAULT_GO.exists():
        return _DEFAULT_GO
    raise BuildError("`go` was not found on $PATH or at /usr/local/go/bin/go; install Go 1.26 or newer")


def probe_version(path: Path, binary: Binary) -> str | None:
    """The x.y.z a binary reports about itself, or None when it cannot say."""
    if not binary.version_args:
        return None
    try:
        out = subprocess.run([str(path), *binary.version_args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(out.stdout + out.stderr)
    return ".".join(match.groups()) if match else None


def _same_minor(found: str | None, wanted: str) -> bool:
    if found is None:
        return False
    return found.split(".")[:2] == wanted.lstrip("v").split(".")[:2]


class Binaries(dict[str, Path]):
    """Name -> path of every binary the dev cluster runs."""


class _Manifest:
    """``bin/<k8s>/manifest.json``: which module version each cached binary was built from."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "manifest.json"
        self.data: dict[str, str] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def key(self, binary: Binary) -> str:
        return f"{binary.module}@{binary.version}"

    def fresh(self, binary: Binary, path: Path) -> bool:
        return path.is_file() and os.access(path, os.X_OK) and self.data.get(binary.name) == self.key(binary)

    def record(self, binary: Binary) -> None:
        self.data[binary.name] = self.key(binary)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.path)


def _external(binary: Binary) -> Path | None:
    """A matching prebuilt binary from $KUBEBUILDER_ASSETS or $PATH (same major.minor), if any."""
    candidates: list[Path] = []
    if assets := os.environ.get("KUBEBUILDER_ASSETS"):
        candidates.append(Path(assets) / binary.name)
    if found := shutil.which(binary.name):
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and _same_minor(probe_version(path, binary), binary.version):
            return path
    return None


def find_binaries(names: Iterable[str] = NAMES) -> tuple[Binaries, list[Binary]]:
    """Resolve what is already there; returns (found, missing)."""
    directory = bin_dir()
    manifest = _Manifest(directory)
    found = Binaries()
    missing: list[Binary] = []
    for binary in BINARIES:
        if binary.name not in names:
            continue
        cached = directory / binary.name
        if manifest.fresh(binary, cached):
            found[binary.name] = cached
        elif cached.is_file() and probe_version(cached, binary) == binary.version.lstrip("v"):
            manifest.record(binary)  # built by an earlier run that did not get to write the manifest
            found[binary.name] = cached
        elif external := _external(binary):
            found[binary.name] = external
        else:
            missing.append(binary)
    return found, missing


def ensure_binaries(progress: Progress | None = None, names: Iterable[str] = NAMES) -> Binaries:
    """Every binary in `names`, building the missing ones (minutes per group on a cold cache)."""
    say = progress or (lambda _msg: None)
    wanted = tuple(names)
    found, missing = find_binaries(wanted)
    for name, path in found.items():
        say(f"  {name:<24} {path}")
    if not missing:
        return found
    go = go_binary()
    manifest = _Manifest(bin_dir())
    prepared: set[str] = set()
    for index, binary in enumerate(missing, start=1):
        if binary.group not in prepared:
            say(f"  preparing wrapper module for {binary.module}@{binary.version} (go get)")
            _prepare_wrapper(go, binary, [b for b in missing if b.group == binary.group], say)
            prepared.add(binary.group)
        say(f"[{index}/{len(missing)}] building {binary.name} ({binary.module}@{binary.version}) ...")
        started = time.monotonic()
        found[binary.name] = _build(go, binary, say)
        manifest.record(binary)
        say(f"  {binary.name:<24} built in {time.monotonic() - started:.0f}s -> {found[binary.name]}")
    return found


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def _run_go(go: Path, args: list[str], cwd: Path, log: Path, what: str, say: Progress | None = None) -> str:
    """Run `go args` in `cwd`, stderr to `log`; return stdout. With `say`, report every minute it runs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("a") as handle:
        handle.write(f"$ go {' '.join(args)}  (in {cwd})\n")
        handle.flush()
        proc = subprocess.Popen([str(go), *args], cwd=cwd, env=_go_env(), stdout=subprocess.PIPE,
                                stderr=handle, text=True)
        while True:
            try:
                stdout, _ = proc.communicate(timeout=60)
                break
            except subprocess.TimeoutExpired:
                if say:
                    say(f"    ... {what}: {time.monotonic() - started:.0f}s so far (log: {log})")
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"{what} failed (exit {proc.returncode}); full log: {log}\n{tail}")
    return stdout


def _staging_replaces(go: Path, kubernetes: str, cwd: Path, log: Path) -> list[str]:
    """`replace k8s.io/x => k8s.io/x v0.N.P` for every staging module k8s.io/kubernetes replaces locally."""
    info = json.loads(_run_go(go, ["mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes}"], cwd, log,
                              f"go mod download k8s.io/kubernetes@{kubernetes}"))
    modules = sorted(set(_STAGING_REPLACE.findall(Path(info["GoMod"]).read_text())))
    if not modules:
        raise BuildError(f"found no staging replaces in {info['GoMod']}; is {kubernetes} a real release?")
    staging = versions.staging_version(kubernetes)
    return [f"\t{module} => {module} {staging}" for module in modules]


def _prepare_wrapper(go: Path, binary: Binary, members: list[Binary], say: Progress) -> None:
    """Write the wrapper go.mod and resolve it (`go get`), unless an identical one is resolved already."""
    src = cache_dir() / "src" / f"{binary.group}-{binary.version}"
    src.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "logs" / f"{binary.group}-{binary.version}.log"
    lines = [f"module specdeploy.local/{binary.group}", "", f"go {versions.GO_LANGUAGE}", ""]
    if binary.module == "k8s.io/kubernetes":
        lines += ["replace (", *_staging_replaces(go, binary.version, src, log), ")", ""]
    wanted = "\n".join(lines)
    stamp = src / ".resolved"
    digest = hashlib.sha256((wanted + " ".join(sorted(b.package for b in members))).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and (src / "go.sum").exists():
        return
    (src / "go.mod").write_text(wanted)
    (src / "go.sum").unlink(missing_ok=True)
    packages = sorted({f"{b.package}@{b.version}" for b in BINARIES if b.group == binary.group})
    _run_go(go, ["get", *packages], src, log, f"go get {' '.join(packages)}", say)
    stamp.write_text(digest)


def _build(go: Path, binary: Binary, say: Progress) -> Path:
    src = cache_dir() / "src" / f"{binary.group}-{binary.version}"
    out = bin_dir() / binary.name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{binary.name}.partial")
    log = cache_dir() / "logs" / f"build-{binary.name}.log"
    ldflags = " ".join(("-s", "-w", *binary.ldflags))
    _run_go(go, ["build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), binary.package], src, log,
            f"go build {binary.package}@{binary.version}", say)
    tmp.replace(out)
    return out


def module_dir(module: str, version: str) -> Path:
    """Where `module`@`version`'s source lies in the Go module cache, downloading it if needed: for the files a
    module publishes beside its code (kwok's stages, LeaderWorkerSet's CRD and webhook manifests)."""
    go = go_binary()
    log = cache_dir() / "logs" / f"{module.rsplit('/', 1)[-1]}-{version}.log"
    workdir = cache_dir() / "src"
    workdir.mkdir(parents=True, exist_ok=True)
    info = json.loads(_run_go(go, ["mod", "download", "-json", f"{module}@{version}"], workdir, log,
                              f"go mod download {module}@{version}"))
    return Path(info["Dir"])


def kwok_stage_dir() -> Path:
    """kwok's published stage files (``kustomize/stage``) in the Go module cache, downloading if needed."""
    stage = module_dir("sigs.k8s.io/kwok", versions.KWOK) / "kustomize" / "stage"
    if not stage.is_dir():
        raise BuildError(f"kwok {versions.KWOK} has no stage directory at {stage}")
    return stage
