"""Wait for a condition with a deadline: the only way the harness and the e2e tests wait.

Why: fixed sleeps are either too short (flaky) or too long (slow); a polled condition with a deadline
and a message naming what was awaited is neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The awaited condition did not hold before the deadline; the message says what and the last value."""


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2,
             describe: Callable[[], str] | None = None,
             fatal: tuple[type[BaseException], ...] = ()) -> T:
    """Call `condition` until it returns something truthy, and return that; raise WaitTimeout after `timeout` s.

    Exceptions from `condition` count as "not yet" (the last one is reported), except those in `fatal`,
    which propagate at once (a component that died will not become ready). `describe` adds current
    state to the timeout message, e.g. a log tail or the object's status.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - "not yet" for any probe failure
            value, last = None, exc
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{describe()}" if describe else ""
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){extra}")
        time.sleep(interval)
