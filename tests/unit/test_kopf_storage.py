"""The operator's kopf storages: nothing written to an SD but its status, except a handler's retries."""

from __future__ import annotations

import kopf

from specdeploy.controller.handlers import ANNOTATION_PREFIX, HandledSpecs, RetriesOnly


def _body(uid: str = "u1", replicas: int = 1, **metadata: object) -> kopf.Body:
    return kopf.Body({"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
                      "metadata": {"name": "a", "namespace": "n", "uid": uid, **metadata},
                      "spec": {"replicas": replicas}, "status": {"phase": "Serving", "analysis": {"x": 1}}})


def test_the_handled_spec_is_the_spec_alone_kept_by_uid_and_written_nowhere() -> None:
    handled, patch = HandledSpecs(), kopf.Patch()
    body = _body(labels={"team": "a"}, annotations={"owner": "b"})
    essence = handled.build(body=body)
    assert essence == {"spec": {"replicas": 1}}
    assert handled.fetch(body=body) is None                     # never seen: kopf's create
    handled.store(body=body, patch=patch, essence=essence)
    assert not patch                                            # no PATCH of the SD
    assert handled.fetch(body=_body(replicas=2)) == {"spec": {"replicas": 1}}   # same uid: the old spec
    assert handled.fetch(body=_body(uid="u2")) is None
    handled.forget("u1")
    assert handled.fetch(body=body) is None


def test_the_essence_is_a_copy() -> None:
    body = _body()
    essence = HandledSpecs().build(body=body)
    essence["spec"]["replicas"] = 5
    assert body["spec"]["replicas"] == 1


def test_a_first_success_writes_no_progress_and_no_marker() -> None:
    storage, patch = RetriesOnly(prefix=ANNOTATION_PREFIX), kopf.Patch()
    storage.store(key=kopf.HandlerId("reconcile"), record={"success": True, "retries": 1}, body=_body(), patch=patch)
    assert not patch


def test_a_failure_is_written_for_kopf_to_retry_and_the_success_after_it_too() -> None:
    storage, patch = RetriesOnly(prefix=ANNOTATION_PREFIX), kopf.Patch()
    key = kopf.HandlerId("reconcile")
    storage.store(key=key, record={"failure": False, "retries": 1, "delayed": "2026-12-02T00:00:05"},
                  body=_body(), patch=patch)
    annotations = dict(patch["metadata"]["annotations"])
    assert f"{ANNOTATION_PREFIX}/reconcile" in annotations
    retried = _body(annotations=annotations)
    assert storage.fetch(key=key, body=retried) is not None
    after = kopf.Patch()
    storage.store(key=key, record={"success": True, "retries": 2}, body=retried, patch=after)
    assert f"{ANNOTATION_PREFIX}/reconcile" in after["metadata"]["annotations"]   # then purged by kopf
