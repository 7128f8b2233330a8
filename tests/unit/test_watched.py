"""`Watched`: a watched copy stands in for a read only while it is the version the operator last read or wrote."""

from __future__ import annotations

from typing import Any

from lightkube import ALL_NS

from specdeploy.controller.watched import DEPLOYMENT, SD, Watched


def _body(name: str, version: str, namespace: str = "prod") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


def test_a_copy_is_used_only_once_a_read_or_write_returned_its_version() -> None:
    watched = Watched()
    watched.seen(SD, _body("a", "10"))
    assert watched.unchanged(SD, "prod", "a") is None            # never read: read it
    watched.confirm(SD, "prod", "a", "10")
    assert watched.unchanged(SD, "prod", "a") == _body("a", "10")
    watched.confirm(SD, "prod", "a", "11")                         # the operator's status write returned 11
    assert watched.unchanged(SD, "prod", "a") is None            # the watch has not delivered it yet
    watched.seen(SD, _body("a", "11"))
    assert watched.unchanged(SD, "prod", "a") == _body("a", "11")
    watched.seen(SD, _body("a", "12"))                             # someone else's change
    assert watched.unchanged(SD, "prod", "a") is None


def test_kinds_and_namespaces_are_kept_apart() -> None:
    watched = Watched()
    watched.seen(SD, _body("a", "1"))
    watched.seen(DEPLOYMENT, _body("a", "2"))
    watched.seen(SD, _body("b", "3", namespace="dev"))
    watched.confirm(DEPLOYMENT, "prod", "a", "2")
    assert watched.unchanged(SD, "prod", "a") is None
    assert watched.unchanged(DEPLOYMENT, "prod", "a") == _body("a", "2")
    assert [b["metadata"]["name"] for b in watched.bodies(SD, ["prod"])] == ["a"]
    assert sorted(b["metadata"]["name"] for b in watched.bodies(SD, [ALL_NS])) == ["a", "b"]
    assert watched.bodies(DEPLOYMENT, ["dev"]) == []


def test_gone_and_read_as_missing_forget_the_confirmation() -> None:
    watched = Watched()
    watched.seen(DEPLOYMENT, _body("a", "5"))
    watched.confirm(DEPLOYMENT, "prod", "a", "5")
    watched.confirm(DEPLOYMENT, "prod", "a", None)                # a get found none (404)
    assert watched.unchanged(DEPLOYMENT, "prod", "a") is None
    watched.confirm(DEPLOYMENT, "prod", "a", "5")
    watched.gone(DEPLOYMENT, "prod", "a")
    watched.seen(DEPLOYMENT, _body("a", "5"))                     # the same version seen again after a delete
    assert watched.unchanged(DEPLOYMENT, "prod", "a") is None
