"""`specdeploy dev-cluster` (placeholder until the dev-cluster work lands)."""

import click


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real local control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes."""
