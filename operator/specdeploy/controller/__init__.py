"""The shell: kopf handlers, the reconcile pass (observe, decide, act), the analysis loop, the resync, the
Lease, settings and the operator's own metrics. Everything here is I/O around the pure core.
"""
