"""The chart's Grafana dashboard asked of the dev cluster's Prometheus, as Grafana would ask it for one SD: which
panels show data (the demo prints it; tests/e2e/test_rollback_scenarios.py asserts it).

    queries = dashboard_queries("demo", "llama-8b-eagle3")
    missing = panels_without_data(cluster.prometheus_url, queries, since)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[3] / "charts" / "specdeploy" / "dashboards" / "specdeploy.json"
RATE_INTERVAL = "20s"
"""Grafana's $__rate_interval, max(4 × scrape interval, step + scrape interval), at the dev cluster's 2 s scrape."""


def dashboard_queries(namespace: str, name: str) -> dict[str, list[str]]:
    """Each panel's and annotation's queries, by title, with the dashboard's variables set to this SD."""
    dashboard = json.loads(DASHBOARD.read_text())

    def concrete(expr: str) -> str:
        return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$namespace", namespace).replace("$sd", name)

    queries = {p["title"]: [concrete(t["expr"]) for t in p["targets"]] for p in dashboard["panels"] if p["type"] != "row"}
    queries.update({f"annotation {a['name']}": [concrete(a["expr"])] for a in dashboard["annotations"]["list"]})
    return queries


def panels_without_data(prometheus_url: str, queries: dict[str, list[str]], start: float) -> list[str]:
    """The panels none of whose queries returns a point between `start` (Unix time) and now."""
    def points(query: str) -> int:
        response = httpx.get(f"{prometheus_url}/api/v1/query_range", timeout=10, params={
            "query": query, "start": start, "end": time.time(), "step": "2s"})
        response.raise_for_status()
        return sum(len(series["values"]) for series in response.json()["data"]["result"])

    return [panel for panel, exprs in queries.items() if not any(points(expr) for expr in exprs)]
