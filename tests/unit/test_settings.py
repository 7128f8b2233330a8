"""controller/settings: one default per setting; the environment, then the flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from specdeploy.controller.settings import OperatorSettings


def test_defaults_when_nothing_is_set() -> None:
    settings = OperatorSettings.from_environment({})
    assert (settings.namespaces, settings.lease_namespace, settings.resync_seconds, settings.metrics_port) == (
        (), "default", 30.0, 8081)
    assert settings.prometheus_url is None and not settings.hub_offline


def test_the_environment_then_the_flags() -> None:
    environ = {"SPECDEPLOY_NAMESPACES": "team-a,team-b", "SPECDEPLOY_RESYNC_SECONDS": "3",
               "SPECDEPLOY_PROMETHEUS_URL": "http://prometheus:9090", "SPECDEPLOY_METRICS_PORT": "0",
               "SPECDEPLOY_ALERTMANAGER_URL": "", "POD_NAMESPACE": "specdeploy-system",
               "HF_ENDPOINT": "http://mirror", "HF_TOKEN": "hf_secret", "HF_HUB_OFFLINE": "1",
               "SPECDEPLOY_PROMETHEUS_HEADERS_DIR": "/etc/headers"}
    settings = OperatorSettings.from_environment(environ, resync_seconds=10.0, prometheus_url=None)
    assert settings.namespaces == ("team-a", "team-b") and settings.resync_seconds == 10.0
    assert settings.prometheus_url == "http://prometheus:9090"     # a flag not given keeps the environment's
    assert settings.alertmanager_url is None                       # empty is unset
    assert settings.lease_namespace == "specdeploy-system" and settings.metrics_port == 0
    assert settings.hub_endpoint == "http://mirror" and settings.hub_offline
    assert settings.prometheus_headers_dir == Path("/etc/headers")
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_secret"
    assert "hf_secret" not in repr(settings) and "hf_secret" not in str(settings)


def test_a_bad_value_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="resync_seconds"):
        OperatorSettings.from_environment({"SPECDEPLOY_RESYNC_SECONDS": "soon"})
    with pytest.raises(ValidationError, match="metrics_port"):
        OperatorSettings.from_environment({}, metrics_port=70000)


def test_pod_monitors_can_be_switched_off_and_labelled() -> None:
    defaults = OperatorSettings.from_environment({})
    assert defaults.pod_monitors and defaults.pod_monitor_labels == {}
    settings = OperatorSettings.from_environment({"SPECDEPLOY_POD_MONITORS": "false",
                                                  "SPECDEPLOY_POD_MONITOR_LABELS": "release=prom, team=ml"})
    assert not settings.pod_monitors and settings.pod_monitor_labels == {"release": "prom", "team": "ml"}
    with pytest.raises(ValueError, match="a label must be key=value, got 'release'"):
        OperatorSettings.from_environment({"SPECDEPLOY_POD_MONITOR_LABELS": "release"})
