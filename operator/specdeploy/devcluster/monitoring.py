"""Prometheus and Alertmanager for the dev cluster: configs, command lines, scrape targets.

Why real servers: the operator's analysis loop speaks PromQL to Prometheus and posts alerts to
Alertmanager's v2 API; a fake would hide exactly the bugs the loop can have. Engine pods on kwok
nodes have no kubelet, so the pod runner runs their engines at their pod IPs (loopback addresses) and
registers them here as scrape targets through file-based service discovery (one JSON file per target,
picked up within a second), at the address a PodMonitor's target would have: podIP:containerPort.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS = Path("/usr/bin/prometheus")
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")
_TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class MonitoringPaths:
    """Files under ``<state>/monitoring``."""

    directory: Path

    @property
    def prometheus_config(self) -> Path:
        return self.directory / "prometheus.yml"

    @property
    def alertmanager_config(self) -> Path:
        return self.directory / "alertmanager.yml"

    @property
    def targets(self) -> Path:
        return self.directory / "targets"

    @property
    def rules(self) -> Path:
        return self.directory / "rules"

    @property
    def prometheus_data(self) -> Path:
        return self.directory / "prometheus-data"

    @property
    def alertmanager_data(self) -> Path:
        return self.directory / "alertmanager-data"


def prometheus_config(paths: MonitoringPaths, prometheus_port: int, alertmanager_port: int,
                      scrape_interval: str) -> dict[str, Any]:
    """Scrape itself and every file-SD target; send alerts to our Alertmanager; load our rule files."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "alerting": {"alertmanagers": [{"api_version": "v2",
                                        "static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "rule_files": [str(paths.rules / "*.yml")],
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]},
            {"job_name": "dev-cluster",
             "file_sd_configs": [{"files": [str(paths.targets / "*.json")], "refresh_interval": "1s"}]},
        ],
    }


def alertmanager_config() -> dict[str, Any]:
    """One receiver that keeps alerts (listed on the v2 API) and sends nothing anywhere."""
    return {
        "route": {"receiver": "dev-null", "group_by": ["alertname"], "group_wait": "1s",
                  "group_interval": "5s", "repeat_interval": "1h"},
        "receivers": [{"name": "dev-null"}],
    }


def write_configs(paths: MonitoringPaths, prometheus_port: int, alertmanager_port: int,
                  scrape_interval: str = "2s") -> None:
    for directory in (paths.targets, paths.rules, paths.prometheus_data, paths.alertmanager_data):
        directory.mkdir(parents=True, exist_ok=True)
    paths.prometheus_config.write_text(
        yaml.safe_dump(prometheus_config(paths, prometheus_port, alertmanager_port, scrape_interval), sort_keys=False))
    paths.alertmanager_config.write_text(yaml.safe_dump(alertmanager_config(), sort_keys=False))


def prometheus_argv(paths: MonitoringPaths, port: int) -> list[str]:
    return [
        str(PROMETHEUS),
        f"--config.file={paths.prometheus_config}",
        f"--storage.tsdb.path={paths.prometheus_data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=1d",
    ]


def alertmanager_argv(paths: MonitoringPaths, port: int) -> list[str]:
    return [
        str(ALERTMANAGER),
        f"--config.file={paths.alertmanager_config}",
        f"--storage.path={paths.alertmanager_data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip port: a single loopback instance
    ]


def _check_name(name: str) -> None:
    if not _TARGET_NAME.match(name):
        raise ValueError(f"scrape target name must be letters, digits, '.', '_' or '-' (at most 128), got {name!r}")


def write_target(paths: MonitoringPaths, name: str, address: str, labels: dict[str, str] | None = None,
                 metrics_path: str = "/metrics") -> Path:
    """Register `address` (host:port) as a scrape target; `labels` land on every scraped series."""
    _check_name(name)
    if ":" not in address or "/" in address:
        raise ValueError(f"scrape target address must be host:port, got {address!r}")
    group_labels = {"instance_name": name, **(labels or {}), "__metrics_path__": metrics_path}
    path = paths.targets / f"{name}.json"
    tmp = paths.targets / f".{name}.tmp"  # not *.json: Prometheus must never read half a file
    tmp.write_text(json.dumps([{"targets": [address], "labels": group_labels}], indent=2))
    tmp.replace(path)
    return path


def remove_target(paths: MonitoringPaths, name: str) -> bool:
    """Drop a scrape target; True when it existed."""
    _check_name(name)
    path = paths.targets / f"{name}.json"
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def list_targets(paths: MonitoringPaths) -> dict[str, list[dict[str, Any]]]:
    """Name -> target groups, as written."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(paths.targets.glob("*.json"))}


def write_rules(paths: MonitoringPaths, name: str, groups: list[dict[str, Any]]) -> Path:
    """A Prometheus rule file (``{"groups": groups}``); call `reload` on Prometheus afterwards."""
    _check_name(name)
    path = paths.rules / f"{name}.yml"
    tmp = paths.rules / f".{name}.tmp"
    tmp.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    tmp.replace(path)
    return path
