"""Container status the way a kubelet writes it when an engine container dies and comes back.

    message = termination_message(log_bytes_of_this_run)
    patch = crashed_status(pod, "engine", Termination(1, "Error", message, started, finished), back_off=2.0)
    patch = running_status(pod, "engine", started_at=now, ready=True)

Each returns `{"containerStatuses": […], "conditions": […]}` for the pods/status subresource: the whole
lists (a JSON merge patch replaces lists), every other container and condition kept as it was.

Facts, from kubernetes/kubernetes:
- FallbackToLogsOnError uses the log only when the exit code is not 0, and then at most the last 80 lines
  and the last 2048 bytes of them (`kubecontainer.MaxContainerTerminationMessageLogLines` = 80,
  `MaxContainerTerminationMessageLogLength` = 1024 * 2 in pkg/kubelet/container/runtime.go;
  `fallbackToLogs := … && cStatus.ExitCode != 0` and `readLastStringFromContainerLogs` in
  pkg/kubelet/kuberuntime/kuberuntime_container.go, which keeps the tail in a circular buffer).
- The runtime's reason is "OOMKilled" only for a kernel (cgroup) OOM kill, "Completed" for exit 0 and
  "Error" otherwise; a CUDA out-of-memory error is a Python exception, so an ordinary "Error".
- A container in back-off waits with reason "CrashLoopBackOff" and the message
  "back-off <duration> restarting failed container=<name> pod=<name>_<namespace>(<uid>)"
  (`doBackOff` in kuberuntime_manager.go; `format.Pod`).
- A pod with an unready container has Ready and ContainersReady False with reason ContainersNotReady and
  message "containers with unready status: [<names>]" (pkg/kubelet/status/generate.go).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MAX_LOG_LINES = 80
MAX_LOG_BYTES = 2048
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
CONTAINERS_NOT_READY = "ContainersNotReady"


def rfc3339(moment: datetime) -> str:
    """Kubernetes' metav1.Time text: UTC, whole seconds, `Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def termination_message(log: bytes) -> str:
    """The last 80 lines of `log`, then at most their last 2048 bytes, as text."""
    lines = log.splitlines(keepends=True)[-MAX_LOG_LINES:]
    tail = b"".join(lines)[-MAX_LOG_BYTES:]
    return tail.decode("utf-8", errors="replace")


def exit_code_of(returncode: int) -> int:
    """A process's exit status as a container runtime reports it: killed by signal N → 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def termination_reason(exit_code: int, oom_killed: bool = False) -> str:
    if oom_killed:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


def go_duration(seconds: float) -> str:
    """A back-off as Go's time.Duration prints it: 1s, 2.5s, 1m0s."""
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s"


@dataclass(frozen=True)
class Termination:
    """One finished run of a container."""

    exit_code: int
    reason: str
    message: str
    started_at: datetime
    finished_at: datetime

    def as_state(self, container_id: str = "") -> dict[str, Any]:
        state: dict[str, Any] = {"exitCode": self.exit_code, "reason": self.reason,
                                 "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.finished_at)}
        if self.message:
            state["message"] = self.message
        if container_id:
            state["containerID"] = container_id
        return state


def termination(returncode: int, log: bytes, started_at: datetime, finished_at: datetime,
                policy: str = "FallbackToLogsOnError") -> Termination:
    """What the kubelet records for a run that ended with `returncode` after writing `log`."""
    code = exit_code_of(returncode)
    message = termination_message(log) if policy == "FallbackToLogsOnError" and code != 0 else ""
    return Termination(code, termination_reason(code), message, started_at, finished_at)


_SPEC_LISTS = {"containerStatuses": "containers", "initContainerStatuses": "initContainers"}


def _container_status(pod: dict[str, Any], container: str, key: str = "containerStatuses") -> dict[str, Any]:
    for status in (pod.get("status") or {}).get(key) or []:
        if status.get("name") == container:
            return copy.deepcopy(status)
    image = next((c.get("image", "") for c in (pod.get("spec") or {}).get(_SPEC_LISTS[key]) or []
                  if c.get("name") == container), "")
    return {"name": container, "image": image, "imageID": "", "ready": False, "restartCount": 0, "state": {}}


def _with_container(pod: dict[str, Any], status: dict[str, Any], key: str = "containerStatuses") -> list[dict[str, Any]]:
    statuses = [copy.deepcopy(s) for s in (pod.get("status") or {}).get(key) or []]
    for index, existing in enumerate(statuses):
        if existing.get("name") == status["name"]:
            statuses[index] = status
            return statuses
    return [*statuses, status]


def _conditions(pod: dict[str, Any], statuses: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Ready and ContainersReady from the containers' readiness; other conditions untouched."""
    unready = sorted(s["name"] for s in statuses if not s.get("ready"))
    wanted: dict[str, Any] = ({"status": "True"} if not unready else {
        "status": "False", "reason": CONTAINERS_NOT_READY,
        "message": f"containers with unready status: [{' '.join(unready)}]"})
    conditions = [copy.deepcopy(c) for c in (pod.get("status") or {}).get("conditions") or []]
    for kind in ("ContainersReady", "Ready"):
        current = next((c for c in conditions if c.get("type") == kind), None)
        if current is None:
            current = {"type": kind}
            conditions.append(current)
        if current.get("status") != wanted["status"]:
            current["lastTransitionTime"] = rfc3339(now)
        current.pop("reason", None)
        current.pop("message", None)
        current.update(wanted)
    return conditions


def crashed_status(pod: dict[str, Any], container: str, ended: Termination, back_off: float,
                   container_id: str = "", now: datetime | None = None) -> dict[str, Any]:
    """The container died: one more restart, its end in lastState, waiting in CrashLoopBackOff, not ready."""
    meta = pod.get("metadata") or {}
    status = _container_status(pod, container)
    status["restartCount"] = int(status.get("restartCount") or 0) + 1
    status["lastState"] = {"terminated": ended.as_state(container_id)}
    pod_name = f"{meta.get('name')}_{meta.get('namespace')}({meta.get('uid')})"
    status["state"] = {"waiting": {
        "reason": CRASH_LOOP_BACK_OFF,
        "message": f"back-off {go_duration(back_off)} restarting failed container={container} pod={pod_name}"}}
    status["ready"] = False
    status["started"] = False
    statuses = _with_container(pod, status)
    return {"containerStatuses": statuses, "conditions": _conditions(pod, statuses, now or ended.finished_at)}


def running_status(pod: dict[str, Any], container: str, started_at: datetime, ready: bool,
                   container_id: str = "", now: datetime | None = None) -> dict[str, Any]:
    """The container runs again (lastState and restartCount kept); ready once its probe answers."""
    status = _container_status(pod, container)
    status["state"] = {"running": {"startedAt": rfc3339(started_at)}}
    status["ready"] = ready
    status["started"] = True
    if container_id:
        status["containerID"] = container_id
    statuses = _with_container(pod, status)
    return {"containerStatuses": statuses, "conditions": _conditions(pod, statuses, now or started_at)}


def init_crashed_status(pod: dict[str, Any], container: str, app_container: str, ended: Termination,
                        back_off: float, now: datetime | None = None) -> dict[str, Any]:
    """An init container died: its restart and end as `crashed_status` writes an app container's, the pod not
    Initialized, and the app container waiting (PodInitializing), not ready (pkg/kubelet/status/generate.go)."""
    meta = pod.get("metadata") or {}
    status = _container_status(pod, container, "initContainerStatuses")
    status["restartCount"] = int(status.get("restartCount") or 0) + 1
    status["lastState"] = {"terminated": ended.as_state()}
    pod_name = f"{meta.get('name')}_{meta.get('namespace')}({meta.get('uid')})"
    status["state"] = {"waiting": {
        "reason": CRASH_LOOP_BACK_OFF,
        "message": f"back-off {go_duration(back_off)} restarting failed container={container} pod={pod_name}"}}
    status["ready"] = False
    app = _container_status(pod, app_container)
    app.update(ready=False, started=False, state={"waiting": {"reason": "PodInitializing"}})
    statuses = _with_container(pod, app)
    conditions = _conditions(pod, statuses, now or ended.finished_at)
    initialized = next((c for c in conditions if c.get("type") == "Initialized"), None)
    if initialized is None:
        initialized = {"type": "Initialized"}
        conditions.append(initialized)
    if initialized.get("status") != "False":
        initialized["lastTransitionTime"] = rfc3339(now or ended.finished_at)
    initialized.update(status="False", reason="ContainersNotInitialized",
                       message=f"containers with incomplete status: [{container}]")
    return {"initContainerStatuses": _with_container(pod, status, "initContainerStatuses"),
            "containerStatuses": statuses, "conditions": conditions}


def init_completed_status(pod: dict[str, Any], container: str, ended: Termination) -> dict[str, Any]:
    """An init container that failed before has now exited 0: terminated Completed, the pod Initialized."""
    status = _container_status(pod, container, "initContainerStatuses")
    status["state"] = {"terminated": ended.as_state()}
    status["ready"] = True
    conditions = [copy.deepcopy(c) for c in (pod.get("status") or {}).get("conditions") or []]
    for condition in conditions:
        if condition.get("type") == "Initialized" and condition.get("status") != "True":
            condition.update(status="True", lastTransitionTime=rfc3339(ended.finished_at))
            condition.pop("reason", None)
            condition.pop("message", None)
    return {"initContainerStatuses": _with_container(pod, status, "initContainerStatuses"), "conditions": conditions}

