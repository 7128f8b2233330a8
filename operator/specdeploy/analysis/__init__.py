"""Analysis: Prometheus samples → verdicts → rollback decisions, alerts and the operator's metrics.

Only `prometheus` (queries) and `alerts.post_alerts` do I/O; everything else is pure. See docs/analysis.md.
"""
