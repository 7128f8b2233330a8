"""The dev cluster's process helpers: the ports its components listen on."""

from __future__ import annotations

import socket

from specdeploy.devcluster import processes


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = processes.free_ports(50)
    assert len(set(ports)) == 50
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
