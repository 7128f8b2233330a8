"""The analysis loop's pure decisions: which SDs are due for a sample, from the object as listed."""

from __future__ import annotations

from datetime import UTC, datetime

from specdeploy.reconcile.analysis_loop import due

NOW = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC).timestamp()


def _listed(interval: str, last_sample_at: str | None) -> dict[str, object]:
    """An SD as the apiserver lists it: the CRD's defaults filled in, status as the operator wrote it."""
    status = {"analysis": {"lastSampleAt": last_sample_at}} if last_sample_at else {}
    return {"spec": {"analysis": {"interval": interval}}, "status": status}


def test_an_sd_is_due_once_its_interval_has_passed_or_when_never_sampled() -> None:
    assert due(_listed("30s", None), NOW)
    assert due({"spec": {}}, NOW)                                        # no status at all yet
    assert due(_listed("30s", "2026-11-29T12:00:00Z"), NOW)             # 30 s ago
    assert not due(_listed("1m", "2026-11-29T12:00:00Z"), NOW)
    assert due(_listed("3s", "2026-11-29T12:00:27Z"), NOW)              # half a second of slack for the tick
    assert not due(_listed("3s", "2026-11-29T12:00:28Z"), NOW)
