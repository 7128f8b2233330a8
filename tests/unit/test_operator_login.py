"""The operator's kopf login: found whenever kopf was first imported (the last CI lost every in-process
operator to "Ran out of valid credentials" because a unit test imported kopf before KUBECONFIG was set)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KUBECONFIG = textwrap.dedent("""\
    apiVersion: v1
    kind: Config
    current-context: dev
    clusters: [{name: dev, cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: Q0E=}}]
    users: [{name: admin, user: {token: secret-token}}]
    contexts: [{name: dev, context: {cluster: dev, user: admin, namespace: team}}]
""")


def test_an_operator_imported_before_its_kubeconfig_is_set_still_logs_in(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    script = textwrap.dedent(f"""
        import logging, os
        import kopf
        import specdeploy.controller.handlers as handlers
        os.environ["KUBECONFIG"] = {str(kubeconfig)!r}
        [login] = [h for h in kopf.get_default_registry()._activities.get_all_handlers()
                   if h.fn is handlers.login and not h._fallback]   # kopf ignores its fallbacks when it is there
        info = login.fn(settings=kopf.OperatorSettings(), logger=logging.getLogger())
        print(info.server, info.token, info.default_namespace)
    """)
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)   # no ~/.kube/config either
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["https://127.0.0.1:6443", "secret-token", "team"]


def test_without_a_kubeconfig_or_a_service_account_there_is_no_login(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import kopf

    from specdeploy.controller.handlers import login

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert login(settings=kopf.OperatorSettings(), logger=logging.getLogger()) is None
