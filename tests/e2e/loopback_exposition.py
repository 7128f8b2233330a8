"""Prometheus text expositions served on a loopback port, for a real Prometheus to scrape: one copy for the e2e
modules that play engine pods or exporters.

    with expositions_on_loopback({"/metrics": lambda: "up_probe 1\n"}) as address:   # "127.0.0.1:PORT"
        ...   # register `address` as a scrape target
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator, Mapping


@contextlib.contextmanager
def expositions_on_loopback(pages: Mapping[str, Callable[[], str]]) -> Iterator[str]:
    """Answer GET `path` with `pages[path]()` (a 404 for any other path) from a thread of its own; yields the
    server's host:port and stops it on exit."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            page = pages.get(self.path)
            if page is None:
                self.send_error(404)
                return
            body = page().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
