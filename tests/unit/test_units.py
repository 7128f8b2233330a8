"""Durations and memory sizes as users write them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.units import format_duration, format_gib, parse_duration, parse_gib


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), (45, 45)])
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["-5s", "5", "five minutes", "", True, -1, float("nan")])
def test_bad_durations_are_refused_with_an_example(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@given(st.integers(min_value=0, max_value=10**7))
def test_duration_round_trip(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000)) == pytest.approx(millis / 1000)


@pytest.mark.parametrize(("text", "gib"), [("80Gi", 80), (80, 80), ("81920Mi", 80), ("1Ti", 1024), ("40", 40),
                                           ("85.899345920G", 80)])
def test_parse_gib(text: str | int, gib: float) -> None:
    assert parse_gib(text) == pytest.approx(gib)


@pytest.mark.parametrize("bad", ["80GB", "-1Gi", "lots", None, False])
def test_bad_memory_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_gib(bad)


def test_format_gib() -> None:
    assert format_gib(80.0) == 80
    assert format_gib(79.19) == "79.19Gi"
