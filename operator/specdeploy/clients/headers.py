"""HTTP headers for Prometheus and Alertmanager from a Secret's keys: checked first, never shown.

    headers = http_headers({"Authorization": b"Basic dXNlcjpwYXNz\\n"}, "Secret team-a/prometheus-auth")
    repr(headers)         # "Headers(names=['Authorization'])"

Each key is a header name and its value the header's value (`spec.analysis.prometheus.headersSecretRef`,
`spec.alerting.headersSecretRef`, or a Secret mounted as files for the operator's own URLs). Why check
here: httpx (h11) puts an illegal header value verbatim into its exception text ("Illegal header value
b'Basic …\\n'"), and that text would reach logs and `status`. So every value is checked before it is
used, and errors name the Secret and the key, never the value. Surrounding whitespace — the newline a
Secret made `--from-file` keeps — is stripped: RFC 9110 §5.5 excludes it from a field value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

HEADERS_SECRET_LABEL = "specdeploy.io/headers"
"""The label a Secret needs before the operator sends its keys as headers: naming a Secret in an SD is not
enough, so whoever may create SDs but not read Secrets cannot have any Secret sent to a URL of theirs."""

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")       # RFC 9110 §5.6.2 field-name
_VALUE = re.compile(r"^[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?$")   # visible ASCII, inner spaces and tabs


class InvalidHeaders(ValueError):
    """A key or value cannot be an HTTP header; the message names the source and the key only."""


class Headers(dict[str, str]):
    """Header name → value; its repr and str show the names only, so a log line cannot leak a value."""

    def __repr__(self) -> str:
        return f"Headers(names={sorted(self)!r})"

    __str__ = __repr__


def http_headers(data: Mapping[str, bytes | str], source: str) -> Headers:
    """`data` (a Secret's decoded keys) as headers; raises InvalidHeaders naming `source` and the key."""
    headers = Headers()
    for key, raw in data.items():
        if not _TOKEN.match(key):
            raise InvalidHeaders(f"{source}: key {key!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        try:
            value = (raw.decode() if isinstance(raw, bytes) else raw).strip(" \t\r\n")
        except UnicodeDecodeError:
            raise InvalidHeaders(f"{source}: the value of {key!r} is not UTF-8 text") from None
        if not _VALUE.match(value):
            raise InvalidHeaders(f"{source}: the value of {key!r} must be printable ASCII on one line (not shown)")
        headers[key] = value
    return headers


def directory_headers(directory: Path) -> Headers:
    """Headers from a directory with one file per header (a Secret mounted into the operator's pod: the
    operator's own credentials for its --prometheus-url and --alertmanager-url). Names starting with a dot
    (the kubelet's `..data` links) are skipped. Read at each use, so a rotated Secret takes effect."""
    source = f"the headers directory {directory}"
    try:
        data = {path.name: path.read_bytes() for path in sorted(directory.iterdir())
                if not path.name.startswith(".") and path.is_file()}
    except OSError as error:   # its text names the path, never a content
        raise InvalidHeaders(f"{source} cannot be read: {error.strerror}") from None
    return http_headers(data, source)
