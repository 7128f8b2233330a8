"""The status patch: applied as the apiserver applies a JSON merge patch (RFC 7386; the dev cluster's audit
replay, devcluster/audit.py, written from the RFC's pseudocode), it turns the status as read into the status
decided, whatever either holds — nested figures that disappear included."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from specdeploy.clients.kube import merge_patch
from specdeploy.devcluster.audit import apply_merge_patch

# Documents as to_wire writes them: no nulls (a null in a patch means "remove").
scalars = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5))
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abcde"), inner, max_size=4)), max_leaves=20)
objects = st.dictionaries(st.sampled_from("abcdef"), documents, max_size=5)


@given(objects, objects)
def test_the_patch_turns_the_old_status_into_the_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_merge_patch(old, merge_patch(old, new)) == new


@given(objects)
def test_no_change_is_an_empty_patch(status: dict[str, Any]) -> None:
    assert merge_patch(status, status) == {}


def test_a_sample_patches_only_the_figures_that_changed_and_removes_one_no_longer_measured() -> None:
    old = {"observedGeneration": 3, "deployRecord": {"target": {"commit": "abc"}},
           "conditions": [{"type": "Ready", "status": "True"}],
           "analysis": {"lastSampleAt": "t1", "acceptanceRate": 0.7, "speedup": {"value": 1.8}}}
    new = {"observedGeneration": 3, "deployRecord": {"target": {"commit": "abc"}},
           "conditions": [{"type": "Ready", "status": "True"}],
           "analysis": {"lastSampleAt": "t2", "acceptanceRate": 0.71}}
    assert merge_patch(old, new) == {"analysis": {"lastSampleAt": "t2", "acceptanceRate": 0.71, "speedup": None}}
