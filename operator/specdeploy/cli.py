"""The `specdeploy` command: plan, render, crd, dev-cluster (and later run, demo)."""

from __future__ import annotations

import click

from specdeploy.api.crd import crd_yaml
from specdeploy.devcluster.cli import dev_cluster


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Speculative decoding on Kubernetes: plan it, render it, run it, roll it back."""


@main.command()
def crd() -> None:
    """Print the SpeculativeDeployment CustomResourceDefinition (generated from the models)."""
    click.echo(crd_yaml(), nl=False)


main.add_command(dev_cluster)
