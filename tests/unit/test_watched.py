"""`Watched`: a watched copy stands in for a read once the watch has delivered what the operator last read
or wrote; a held status stands in for the written one only on the version it was decided on."""

from __future__ import annotations

from typing import Any

from lightkube import ALL_NS

from specdeploy.controller.watched import DEPLOYMENT, SD, Watched


def _body(name: str, version: str, namespace: str = "prod") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


def test_a_copy_stands_in_for_a_read_once_the_watch_delivered_the_operators_own_last_version() -> None:
    watched = Watched()
    assert watched.current(SD, "prod", "a") is None                # never delivered: read it
    watched.seen(SD, _body("a", "10"))
    assert watched.current(SD, "prod", "a") == _body("a", "10")    # the watch's latest is a get's answer
    watched.confirm(SD, "prod", "a", "11")                         # the operator's status write returned 11
    assert watched.current(SD, "prod", "a") is None                # the watch has not delivered it yet
    watched.seen(SD, _body("a", "11"))
    assert watched.current(SD, "prod", "a") == _body("a", "11")
    watched.seen(SD, _body("a", "12"))                             # someone else's change, delivered
    assert watched.current(SD, "prod", "a") == _body("a", "12")


def test_a_relist_that_skips_the_awaited_version_is_settled_by_a_read() -> None:
    watched = Watched()
    watched.seen(DEPLOYMENT, _body("a", "5"))
    watched.confirm(DEPLOYMENT, "prod", "a", "6")
    watched.seen(DEPLOYMENT, _body("a", "8"))                       # a re-list after 410: 6 never comes
    assert watched.current(DEPLOYMENT, "prod", "a") is None
    watched.confirm(DEPLOYMENT, "prod", "a", "8")                   # the next read returns what the watch holds
    assert watched.current(DEPLOYMENT, "prod", "a") == _body("a", "8")


def test_kinds_and_namespaces_are_kept_apart() -> None:
    watched = Watched()
    watched.seen(SD, _body("a", "1"))
    watched.seen(DEPLOYMENT, _body("a", "2"))
    watched.seen(SD, _body("b", "3", namespace="dev"))
    watched.confirm(SD, "prod", "a", "4")
    assert watched.current(SD, "prod", "a") is None
    assert watched.current(DEPLOYMENT, "prod", "a") == _body("a", "2")
    assert [b["metadata"]["name"] for b in watched.bodies(SD, ["prod"])] == ["a"]
    assert sorted(b["metadata"]["name"] for b in watched.bodies(SD, [ALL_NS])) == ["a", "b"]
    assert watched.bodies(DEPLOYMENT, ["dev"]) == []


def test_a_read_that_finds_nothing_is_believed_over_a_watch_that_still_holds_the_object() -> None:
    watched = Watched()
    watched.seen(DEPLOYMENT, _body("a", "5"))
    watched.confirm(DEPLOYMENT, "prod", "a", None)                 # a get found none (404)
    assert watched.current(DEPLOYMENT, "prod", "a") is None        # read again, not the stale copy
    watched.gone(DEPLOYMENT, "prod", "a")                          # the watch delivers the deletion
    assert watched.current(DEPLOYMENT, "prod", "a") is None
    watched.confirm(DEPLOYMENT, "prod", "a", "9")                  # re-created by the operator
    assert watched.current(DEPLOYMENT, "prod", "a") is None
    watched.seen(DEPLOYMENT, _body("a", "9"))
    assert watched.current(DEPLOYMENT, "prod", "a") == _body("a", "9")


def test_a_held_status_counts_only_on_the_version_it_was_decided_on() -> None:
    watched = Watched()
    status = {"analysis": {"lastSampleAt": "2026-12-02T04:00:03Z"}}
    watched.hold("prod", "a", "10", status)
    assert watched.held(_body("a", "10")) == status
    assert watched.held(_body("a", "11")) is None                  # changed since: the written status counts
    assert watched.held(_body("a", "10", namespace="dev")) is None
    watched.release("prod", "a")
    assert watched.held(_body("a", "10")) is None
    watched.hold("prod", "a", "10", status)
    watched.gone(SD, "prod", "a")
    assert watched.held(_body("a", "10")) is None
