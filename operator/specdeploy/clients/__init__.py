"""The edge: the clients of the Kubernetes API, Prometheus and Alertmanager, and the credentials they send.

They decide nothing; what to ask and what to do with the answer is the pure core's (docs/architecture.md).
"""
