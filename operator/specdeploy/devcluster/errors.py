"""Errors of the dev-cluster harness; each says what failed, where its log is, and what to try.

    DevClusterError
    ├── BuildError          a `go` step failed or produced no usable binary
    ├── ProcessFailed       a component exited or never became ready (names its log, shows the tail)
    ├── ClusterNotRunning   `env`/`kubectl`/scrape targets asked of a state dir with no cluster
    └── KubectlError        a `kubectl` call exited non-zero (carries its stdout and stderr)
"""

from __future__ import annotations


class DevClusterError(Exception):
    """Base of every dev-cluster error."""


class BuildError(DevClusterError):
    """Building or locating a binary failed."""


class ProcessFailed(DevClusterError):
    """A component process died or did not become ready in time."""


class ClusterNotRunning(DevClusterError):
    """No running dev cluster in the given state directory."""


class KubectlError(DevClusterError):
    """`kubectl` exited non-zero; `stdout`, `stderr` and `returncode` say how."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip() or stdout.strip()}")
        self.args_ = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
