"""Which Prometheus and Alertmanager URLs the operator sends requests to: an operator-wide allow-list.

    allowed = AllowedEndpoints.of(settings.allowed_endpoints, settings.prometheus_url, settings.alertmanager_url)
    allowed.refusal("http://10.0.0.7:8080", "spec.analysis.prometheus.url")   # why not, or None

Whoever may write an SD names these URLs, and the operator sends its requests from its own network position: a
URL to an endpoint only the operator reaches is a read (blind: no answer's body is repeated) of the cluster's
inside for someone who cannot reach it (docs/security.md "Fetching what a user names"). Each entry is a host glob,
optionally with `:port` (`*.svc`, `prometheus.monitoring.svc:9090`, `127.0.0.1`); the URLs the operator itself
was given are always allowed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

DEFAULT_ALLOWED = ("*.svc", "*.svc.cluster.local", "localhost", "127.0.0.1", "::1")
"""In-cluster Services by their DNS names (where a Prometheus or Alertmanager runs in a cluster), and loopback: in a
pod that is the operator's own pod, on the dev cluster the host that runs every component
(docs/decisions.md "Which URLs the operator fetches")."""

FIX = ("add its host to the chart value `allowedEndpoints` (the operator's SPECDEPLOY_ALLOWED_ENDPOINTS), "
       "or name an allowed one")


def _host_port(url: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    return host.lower(), str(port or (443 if parts.scheme == "https" else 80))


@dataclass(frozen=True)
class AllowedEndpoints:
    """Host globs (each optionally `:port`) and the operator's own URLs, which are always allowed."""

    patterns: tuple[str, ...] = DEFAULT_ALLOWED
    own: frozenset[str] = frozenset()

    @classmethod
    def of(cls, patterns: Iterable[str] | None, *own_urls: str | None) -> AllowedEndpoints:
        """`patterns` (None: DEFAULT_ALLOWED) and the operator's own URLs (None ones skipped)."""
        given = DEFAULT_ALLOWED if patterns is None else tuple(p.strip().lower() for p in patterns if p.strip())
        return cls(given, frozenset(url.rstrip("/") for url in own_urls if url))

    def allows(self, url: str) -> bool:
        if url.rstrip("/") in self.own:
            return True
        found = _host_port(url)
        if found is None:
            return False
        host, port = found
        return any(fnmatchcase(f"{host}:{port}" if ":" in pattern and not _is_ipv6(pattern) else host, pattern)
                   for pattern in self.patterns)

    def refusal(self, url: str, setting: str) -> str | None:
        """Why `url` (from `setting`) is not asked, with the fix; None when it is allowed."""
        if self.allows(url):
            return None
        return (f"{shown(url)} (`{setting}`) is not in the operator's allow-list of endpoints "
                f"({', '.join(self.patterns) or 'empty'}, and its own URLs): no request was sent; {FIX}")


def shown(url: str) -> str:
    """`url` without user, password, query or fragment: a URL may carry credentials."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def _is_ipv6(pattern: str) -> bool:
    return pattern.count(":") > 1
