"""The operator's log: what of kopf's own lines it keeps.

Apart from the handlers (controller/handlers.py) so that importing it registers nothing with kopf.
"""

from __future__ import annotations

import logging

WATCH_HANDLERS = ("sd_seen", "retry_speculation_asked", "child_changed", "speculative_pod_changed")


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's "Handler '…' succeeded." for the watch-event handlers: they only ask for a pass (and keep
    the operator's picture of the SDs), once per event — every status write of every SD — and the passes log
    what they do. Failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (record.levelno <= logging.INFO and message.endswith(" succeeded.")
                    and any(message == f"Handler {name!r} succeeded." for name in WATCH_HANDLERS))
