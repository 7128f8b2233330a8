"""The judgment, pure: Prometheus samples → verdict → counting and decision → the speculation state machine.

No I/O and no clock (docs/architecture.md, docs/analysis.md).
"""
