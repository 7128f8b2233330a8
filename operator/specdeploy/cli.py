"""The `specdeploy` command: plan, render, crd, dev-cluster (and later run, demo).

Exit codes of `plan` and `render`: 0 the spec fits, 1 it is rejected, 2 the input is bad (YAML error,
unknown field, unknown model, a model or revision the Hub does not have, a gated model without a token,
a config.json that cannot be read) — always with the field path and a hint, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console

from specdeploy.api.crd import crd_yaml
from specdeploy.api.reference import reference_markdown
from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, load_resource
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.devcluster.cli import dev_cluster, sim_admin_cmd
from specdeploy.judgment.verdict import objective_checks
from specdeploy.modelsource import ModelSourceError
from specdeploy.modelsource.local import is_true, resolve_here
from specdeploy.modelsource.resolve import Origin, ResolvedModels
from specdeploy.paths import cache_dir
from specdeploy.planning.catalog import UnknownModel
from specdeploy.planning.plan import Plan, make_plan, plan_document
from specdeploy.reconcile.children import PodMonitoring, Variant, desired_children, engine_command
from specdeploy.report import render_plan
from specdeploy.yamltext import dump_documents

EXIT_FITS, EXIT_REJECTED, EXIT_BAD_INPUT = 0, 1, 2


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


Resolver = Callable[[SpeculativeDeploymentSpec], ResolvedModels]


def _load(path: str, resolver: Resolver | None = None) -> tuple[SpeculativeDeployment, Plan]:
    """The resource in `path` and its plan; `resolver` resolves its models (None: spec and catalog only)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        _fail(f"cannot read {path}: {error.strerror}")
    try:
        resource = load_resource(text)
        models = resolver(resource.spec) if resolver is not None else None
        return resource, make_plan(resource.spec, models)
    except (InvalidResource, UnknownModel, ModelSourceError) as error:
        _fail(f"{path}:\n{error}")


def _plan_or_none(resource: SpeculativeDeployment, resolver: Resolver) -> Plan | None:
    """The plan of an SD read from a cluster, or None with a note when its models cannot be resolved: the probe
    still measures, without a break-even."""
    try:
        return make_plan(resource.spec, resolver(resource.spec))
    except (UnknownModel, ModelSourceError) as error:
        click.echo(f"note: no break-even, the models cannot be resolved: {error}", err=True)
        return None


def _hub_resolver(offline: bool) -> Resolver:
    """Resolution as `plan` does it: a local configPath, the Hub (HF_ENDPOINT, HF_TOKEN), the catalog.

    Notes on what only the operator can read, and the warning of a catalog that stood in for the Hub,
    go to stderr, so `-o json` stays one JSON document on stdout. The token is never printed.
    """
    def resolve(spec: SpeculativeDeploymentSpec) -> ResolvedModels:
        models, notes = resolve_here(
            spec, offline=offline or is_true(os.environ.get("HF_HUB_OFFLINE")),
            cache_dir=cache_dir() / "hub-configs",
            endpoint=os.environ.get("HF_ENDPOINT"), token=os.environ.get("HF_TOKEN"),
        )
        for note in notes:
            click.echo(f"note: {note}", err=True)
        origins: list[tuple[str, Origin]] = [("spec.model", models.target.origin)]
        if models.draft is not None:
            origins.append(("spec.speculation.draft", models.draft.origin))
        for spec_field, origin in origins:
            for warning in origin.warnings:
                click.echo(f"warning: `{spec_field}.name` {origin.name}: {warning}", err=True)
        return models
    return resolve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Speculative decoding on Kubernetes: plan it, render it, run it, roll it back."""


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--offline", is_flag=True,
              help="Do not ask the Hugging Face Hub: the spec's architecture, a local configPath or the catalog "
              "(also when HF_HUB_OFFLINE=1).")
def plan(file: str, output: str, offline: bool) -> None:
    """Will FILE's SpeculativeDeployment fit on its GPUs, and what will run?

    Each model's architecture comes from the spec, a local configPath, its config.json on the Hub at the
    commit its revision names (HF_ENDPOINT for a mirror, HF_TOKEN for a gated model), or the catalog.
    """
    resource, the_plan = _load(file, _hub_resolver(offline))
    # An incompatible spec has no command to show: rendering it would fail on what the findings explain.
    command = (engine_command(the_plan, Variant.SPECULATIVE, resource.spec.speculation.enabled)
               if the_plan.compatibility.compatible else None)
    if output == "json":
        document = plan_document(the_plan, None if command is None else {
            "command": list(command.command), "args": list(command.args), "configFiles": dict(command.config_files)})
        analysis = resource.spec.analysis
        document["analysis"] = {"objective": analysis.objective.value,
                                "checks": objective_checks(analysis.objective, analysis.checks)}
        click.echo(json.dumps(document, indent=2))
    else:
        render_plan(resource.metadata.name, the_plan, command, Console(highlight=False))
    sys.exit(EXIT_FITS if the_plan.accepted else EXIT_REJECTED)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--pod-monitor/--no-pod-monitor", default=False, help="Also render the PodMonitor.")
def render(file: str, pod_monitor: bool) -> None:
    """Print the child manifests (Deployments, Service, ConfigMap) FILE would run, as YAML."""
    resource, the_plan = _load(file)
    if not the_plan.accepted:
        findings = the_plan.memory.reasons + the_plan.compatibility.findings
        click.echo(f"{resource.metadata.name} is rejected; nothing would run:", err=True)
        for finding in findings:
            click.echo(f"  {finding.severity.value} {finding.code}: {finding.message}", err=True)
        sys.exit(EXIT_REJECTED)
    children = desired_children(resource, the_plan, pod_monitoring=PodMonitoring(render=pod_monitor))
    click.echo(dump_documents(children.all()), nl=False)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True), required=False)
@click.option("--sd", metavar="NAMESPACE/NAME", default=None,
              help="Probe this SD of the cluster ($KUBECONFIG) instead of FILE, and write the result into its "
              "status.probe (needs patch on speculativedeployments/status).")
@click.option("--url", required=True, help="The engine to probe, e.g. http://127.0.0.1:8000 after `kubectl "
              "port-forward pod/<a speculative pod> 8000` (dev cluster: `specdeploy dev-cluster endpoints --sd`).")
@click.option("--workloads", "workloads_file", type=click.Path(dir_okay=False), default=None,
              help="YAML: workload name -> list of prompts (default: a built-in neutral set).")
@click.option("--temperatures", default="0,0.7,1.0", show_default=True, help="Comma-separated.")
@click.option("--requests-per-cell", type=click.IntRange(1, 1000), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=64, show_default=True)
@click.option("--rate", type=click.FloatRange(0.01, 100), default=1.0, show_default=True,
              help="At most this many requests per second, one at a time.")
@click.option("--deadline", type=click.FloatRange(1, 3600), default=600, show_default=True,
              help="Seconds; requests left then are not sent.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=1, show_default=True,
              help="Running sequences per pod the break-even is computed at.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--offline", is_flag=True, help="Resolve the models from the spec and the catalog only (as `plan`).")
def probe(file: str | None, sd: str | None, url: str, workloads_file: str | None, temperatures: str,
          requests_per_cell: int, max_tokens: int, rate: float, deadline: float, batch_size: int, output: str,
          offline: bool) -> None:
    """Measure an SD's speculation at URL: acceptance per workload and temperature, and where it would not pay.

    The SD is FILE, or `--sd` from the cluster (then the result is also written into its status.probe, for
    `kubectl describe sd`). Prompts of each workload are sent one at a time at each temperature, within the
    budget; each answer's own counts are read (vLLM `--per-request-spec-decode-metrics summary`), else the
    engine's spec-decode counters around each request. Exit 1 when nothing could be measured, 2 when URL is
    no OpenAI server.
    """
    import asyncio
    import datetime

    import httpx
    import yaml

    from specdeploy.clients.engine_probe import EngineUnreachable, run_probe
    from specdeploy.engines import metric_names
    from specdeploy.judgment.probe import (
        NEUTRAL_PROMPTS,
        NEUTRAL_WORKLOAD,
        ProbeBudget,
        ProbeOutcome,
        UnusableWorkloads,
        probe_cells,
        probe_result,
        workloads_from,
    )
    from specdeploy.report import render_probe

    if (file is None) == (sd is None):
        _fail("give FILE or --sd NAMESPACE/NAME, one of them")
    body: dict[str, object] | None = None
    if sd is not None:
        namespace, _, name = sd.partition("/")
        if not namespace or not name:
            _fail(f"--sd: expected NAMESPACE/NAME, got {sd!r}")
        body = asyncio.run(_read_sd(namespace, name))
        resource = _validated(body, sd)
        the_plan = _plan_or_none(resource, _hub_resolver(offline))
    else:
        assert file is not None
        resource, the_plan = _load(file, _hub_resolver(offline))
    spec = resource.spec
    if not spec.speculation.enabled:
        _fail(f"{resource.metadata.name} does not speculate: there is nothing to probe")
    try:
        temperature_list = tuple(float(t) for t in temperatures.split(","))
    except ValueError:
        _fail(f"--temperatures: not a comma-separated list of numbers: {temperatures!r}")
    workloads: dict[str, list[str]] = {NEUTRAL_WORKLOAD: list(NEUTRAL_PROMPTS)}
    if workloads_file is not None:
        try:
            workloads = workloads_from(yaml.safe_load(Path(workloads_file).read_text()), workloads_file)
        except (OSError, yaml.YAMLError, UnusableWorkloads) as error:
            _fail(f"cannot read {workloads_file}: {error}")
    budget = ProbeBudget(requests_per_cell, max_tokens, rate)
    cells_count = len(workloads) * len(temperature_list)

    async def run() -> tuple[str, list[ProbeOutcome]]:
        async with httpx.AsyncClient() as http:
            try:
                return await run_probe(http, url, workloads, temperature_list, budget, deadline,
                                       counters=metric_names(spec.engine.kind))
            except EngineUnreachable as error:
                _fail(str(error))

    model, outcomes = asyncio.run(run())
    result = probe_result(spec, the_plan, outcomes, budget, cells_count, model, url,
                          datetime.datetime.now(datetime.UTC), trigger="Manual", batch_size=batch_size)
    floor = the_plan.acceptance_floor(batch_size) if the_plan is not None else None
    cells = probe_cells(outcomes, spec.speculation.num_speculative_tokens, result.break_even)
    from_counters = result.counts_from == "counters"
    if output == "json":
        click.echo(json.dumps({**result.to_wire(), "errors": sorted({o.error for o in outcomes if o.error})},
                              indent=2))
    else:
        render_probe(resource.metadata.name, url, cells, floor, result.budget or "", from_counters,
                     Console(highlight=False))
        for reason in sorted({o.error for o in outcomes if o.error}):
            click.echo(f"failed requests: {reason}", err=True)
    if not any(c.requests for c in cells):
        sys.exit(1)
    if body is not None:
        asyncio.run(_write_probe(body, result.to_wire()))
        click.echo(f"written to {sd}'s status.probe", err=True)


async def _read_sd(namespace: str, name: str) -> dict[str, object]:
    from lightkube import AsyncClient
    from lightkube.core.exceptions import ApiError, ConfigError

    from specdeploy.clients import kube

    try:
        client = AsyncClient()
    except ConfigError as error:
        _fail(f"no cluster to read the SD from: {error}")
    try:
        body = await kube.get_resource(client, namespace, name)
    except ApiError as error:
        _fail(f"cannot read {namespace}/{name}: {error.status.message}")
    finally:
        await client.close()
    if body is None:
        _fail(f"no SpeculativeDeployment {namespace}/{name}")
    return body


def _validated(body: dict[str, object], where: str) -> SpeculativeDeployment:
    from pydantic import ValidationError

    from specdeploy.api.resource import describe_validation_error

    try:
        return SpeculativeDeployment.model_validate({**body, "status": None})
    except ValidationError as error:
        _fail(f"{where} does not validate: {describe_validation_error(error)}")


async def _write_probe(body: dict[str, object], probe: dict[str, object]) -> None:
    """Merge-patch only status.probe: the operator's own status writes carry it forward."""
    from lightkube import AsyncClient
    from lightkube.core.exceptions import ApiError

    from specdeploy.clients import kube

    metadata = body["metadata"]
    assert isinstance(metadata, dict)
    status = body.get("status") if isinstance(body.get("status"), dict) else {}
    assert isinstance(status, dict)
    client = AsyncClient()
    try:
        await kube.write_status(client, metadata["namespace"], metadata["name"], {"probe": status.get("probe")},
                                {"probe": probe})
    except ApiError as error:
        _fail(f"cannot write status.probe of {metadata['namespace']}/{metadata['name']}: {error.status.message}")
    finally:
        await client.close()


def _default(field: str) -> str:
    """The setting's one default, for --help (the flags default to None: not given keeps it)."""
    from specdeploy.controller.settings import OperatorSettings

    return f"(default: {OperatorSettings.model_fields[field].default})"


@main.command()
@click.option("-n", "--namespace", "namespaces", multiple=True,
              help="Watch only this namespace (repeatable); all namespaces when none is given.")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True,
              help="Liveness endpoint URL; empty to disable.")
@click.option("--log-format", type=click.Choice(["json", "plain"]), default="json", show_default=True)
@click.option("--lease-namespace", default=None,
              help="Namespace of the Lease that keeps one operator active (default: $POD_NAMESPACE or default).")
@click.option("--resync-seconds", type=float, default=None, help=f"Period of the full re-reconcile {_default('resync_seconds')}.")
@click.option("--prometheus-url", default=None, help="Prometheus for SDs that set no spec.analysis.prometheus.url.")
@click.option("--alertmanager-url", default=None, help="Alertmanager for SDs that set no spec.alerting.alertmanagerUrl.")
@click.option("--prometheus-headers-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Directory with one file per HTTP header (a mounted Secret), sent to --prometheus-url for "
              "SDs that name neither a URL nor a headers Secret.")
@click.option("--alertmanager-headers-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The same for --alertmanager-url.")
@click.option("--analysis-tick-seconds", type=float, default=None,
              help=f"How often the analysis loop looks for SDs whose interval has passed {_default('analysis_tick_seconds')}.")
@click.option("--metrics-port", type=int, default=None, help=f"Port of the operator's /metrics; 0: off {_default('metrics_port')}.")
@click.option("--pod-monitors/--no-pod-monitors", default=None,
              help="A PodMonitor per SD where the prometheus-operator CRD exists (default: on).")
@click.option("--pod-monitor-label", "pod_monitor_labels", multiple=True, metavar="KEY=VALUE",
              help="A label for each SD's PodMonitor (repeatable), e.g. release=kube-prometheus-stack.")
@click.option("-v", "--verbose", is_flag=True)
def run(namespaces: tuple[str, ...], liveness: str, log_format: str, lease_namespace: str | None,
        resync_seconds: float | None, prometheus_url: str | None, alertmanager_url: str | None,
        prometheus_headers_dir: Path | None, alertmanager_headers_dir: Path | None,
        analysis_tick_seconds: float | None, metrics_port: int | None, pod_monitors: bool | None,
        pod_monitor_labels: tuple[str, ...], verbose: bool) -> None:
    """Run the operator against the cluster of $KUBECONFIG (or in-cluster credentials).

    Every setting may also come from SPECDEPLOY_<NAME> (e.g. SPECDEPLOY_PROMETHEUS_URL); a flag wins. The
    Hub client reads HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE."""
    import logging
    import os

    import kopf

    from specdeploy.controller.settings import OperatorSettings, label_pairs

    try:
        settings = OperatorSettings.from_environment(
            os.environ, namespaces=namespaces or None, lease_namespace=lease_namespace,
            resync_seconds=resync_seconds, prometheus_url=prometheus_url, alertmanager_url=alertmanager_url,
            prometheus_headers_dir=prometheus_headers_dir, alertmanager_headers_dir=alertmanager_headers_dir,
            analysis_tick_seconds=analysis_tick_seconds, metrics_port=metrics_port, pod_monitors=pod_monitors,
            pod_monitor_labels=label_pairs(pod_monitor_labels) or None)
    except ValueError as error:   # a pydantic ValidationError is one
        _fail(f"operator settings: {error}")
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.PLAIN)
    for noisy in ("httpx", "httpx2"):  # lightkube logs every API call at INFO; that would drown the decisions
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import specdeploy.controller.handlers  # noqa: F401 - registers the handlers with kopf
    from specdeploy.controller.logs import QuietWatchHandlers

    logging.getLogger("kopf.objects").addFilter(QuietWatchHandlers())

    kopf.run(
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        liveness_endpoint=liveness or None,
        memo=kopf.Memo(settings=settings),
    )


@main.command()
@click.option("--no-tty", is_flag=True, help="Plain line output (CI, logs).")
@click.option("--cleanup", is_flag=True, help="Tear the cluster down at the end.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The dev cluster's state directory (default: the user's dev cluster).")
def demo(no_tty: bool, cleanup: bool, state_dir: Path | None) -> None:
    """The whole loop on this machine: dev cluster, chart, operator, simulated engines, a rollback."""
    from specdeploy.demo import run_demo

    sys.exit(run_demo(tty=not no_tty and sys.stdout.isatty(), cleanup=cleanup, state_dir=state_dir))


@main.command()
def reference() -> None:
    """Print the configuration reference (docs/configuration.md) generated from the models."""
    click.echo(reference_markdown(), nl=False)


@main.command()
def crd() -> None:
    """Print the SpeculativeDeployment CustomResourceDefinition (generated from the models)."""
    click.echo(crd_yaml(), nl=False)


@main.command()
@click.option("--sd", required=True, metavar="NAMESPACE/NAME", help="The SD whose simulators get the traffic.")
@click.option("--qps", type=float, default=2.0, show_default=True, help="Requests per second (Poisson).")
@click.option("--duration", default="60s", show_default=True, help="How long to send, e.g. 60s or 2m.")
@click.option("--output-tokens", default="32-96", show_default=True, help='Output length: "64", "32-96" …')
@click.option("--temperature", default="0.7", show_default=True, help='Temperature, or a mix "0:0.5,1.0:0.5".')
@click.option("--prompts", type=click.Choice(["english", "predictable", "unpredictable", "standin"]),
              default="english", show_default=True,
              help="Prompt words: English for the simulators; the stand-in models' words for real vLLM "
              "(`dev-cluster up --engine vllm`): the half its draft predicts, the half it does not, or both.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="The dev cluster's state.")
def load(sd: str, qps: float, duration: str, output_tokens: str, temperature: str, prompts: str,
         state_dir: str | None) -> None:
    """Drive load through a dev-cluster SD's engine pods, as its Service would; print percentiles."""
    from specdeploy.devcluster import DevCluster
    from specdeploy.devcluster.standins import PREDICTABLE, UNPREDICTABLE, half_words
    from specdeploy.devcluster.traffic import Traffic
    from specdeploy_engine.loadgen import parse_duration
    from specdeploy_engine.loadgen.client import PROMPT_WORDS

    words = {"english": PROMPT_WORDS, "predictable": half_words(PREDICTABLE),
             "unpredictable": half_words(UNPREDICTABLE),
             "standin": half_words(PREDICTABLE) + half_words(UNPREDICTABLE)}[prompts]
    cluster = DevCluster(Path(state_dir) if state_dir else None)
    report = Traffic(cluster, sd, qps, parse_duration(duration), output_tokens=output_tokens,
                     temperature=temperature, prompt_words=words).run()
    click.echo(report.to_text())


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
def sim(arguments: tuple[str, ...]) -> None:
    """The engine simulator: `specdeploy sim [--port P] -- ENGINE ARGV...` (see docs/simulator.md)."""
    from specdeploy_engine.sim.__main__ import main as simulator

    sys.exit(simulator(list(arguments)))


main.add_command(dev_cluster)
main.add_command(sim_admin_cmd, "sim-admin")


if __name__ == "__main__":
    main()
