"""The `specdeploy` command: plan, render, crd, dev-cluster (and later run, demo)."""

from __future__ import annotations

import click

from specdeploy.devcluster.cli import dev_cluster


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Speculative decoding on Kubernetes: plan it, render it, run it, roll it back."""


main.add_command(dev_cluster)
