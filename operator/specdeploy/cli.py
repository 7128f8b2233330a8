"""The `specdeploy` command: plan, render, crd and reference offline; run (the operator); get, probe, retry, pause and
resume against a cluster, found as kubectl finds it (-n, --kubeconfig, --context); demo, dev-cluster, load and sim on
this machine.

Exit codes of `plan` and `render`: 0 the spec fits, 1 it is rejected, 2 the input is bad (YAML error,
unknown field, unknown model, a model or revision the Hub does not have, a gated model without a token,
a config.json that cannot be read) — always with the field path and a hint, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console, RenderableType

from specdeploy.api.crd import crd_yaml
from specdeploy.api.reference import reference_markdown
from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, load_resource
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import CountsFrom, ProbeTrigger
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

if TYPE_CHECKING:
    import httpx

    from specdeploy.clients.cluster_access import ClusterAccess
    from specdeploy.engines.base import MetricNames
    from specdeploy.judgment.probe import ProbeBudget, ProbeCell, ProbeOutcome
    from specdeploy.planning.acceptance_floor import AcceptanceFloor

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


def _cluster_options(command: Callable[..., None]) -> Callable[..., None]:
    """kubectl's flags for the cluster and namespace, on every command that talks to a cluster."""
    for option in reversed((
        click.option("-n", "--namespace", default=None, help="The SD's namespace (default: the context's, else default)."),
        click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
                     help="The kubeconfig (default: $KUBECONFIG, ~/.kube/config, else the pod's service account)."),
        click.option("--context", default=None, help="The kubeconfig context (default: its current context)."),
    )):
        command = option(command)
    return command


def _access(kubeconfig: str | None, context: str | None, namespace: str | None) -> ClusterAccess:
    from specdeploy.clients.cluster_access import NoCluster, cluster_access

    try:
        return cluster_access(kubeconfig, context, namespace)
    except NoCluster as error:
        _fail(str(error))


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


HARNESS_COMMANDS = {"demo": "demo_cmd", "dev-cluster": "dev_cluster", "load": "load_cmd", "sim-admin": "sim_admin_cmd"}
NOT_INSTALLED = ("`specdeploy {name}` needs the dev cluster, which is not part of the installed operator package: "
                 "it runs from a checkout of the repository, `pip install -e '.[dev]'` (docs/dev-cluster.md)")


class _Commands(click.Group):
    """The operator's commands and, loaded only when named, the dev cluster's (specdeploy.devcluster.cli): the
    operator's wheel and image do not contain the dev cluster, and every other command works without it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *HARNESS_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in HARNESS_COMMANDS:
            return super().get_command(ctx, cmd_name)
        try:
            import specdeploy.devcluster.cli as harness
        except ModuleNotFoundError as missing:
            return _not_installed(cmd_name, missing)
        command: click.Command = getattr(harness, HARNESS_COMMANDS[cmd_name])
        return command


def _not_installed(name: str, missing: ModuleNotFoundError) -> click.Command:
    """A stand-in that says where the dev cluster's command is, instead of a traceback."""

    def fail(args: tuple[str, ...]) -> NoReturn:
        _fail(f"{NOT_INSTALLED.format(name=name)} (missing module: {missing.name})")

    return click.Command(name, callback=fail, short_help="Not installed: the dev cluster runs from a checkout.",
                         params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
                         context_settings={"ignore_unknown_options": True, "help_option_names": []})


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specdeploy", message="%(prog)s %(version)s")
def main() -> None:
    """Speculative decoding on Kubernetes: plan it, render it, run it, roll it back."""


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--offline", is_flag=True,
              help="Do not ask the Hugging Face Hub: the spec's architecture, a local configPath or the catalog "
              "(also when HF_HUB_OFFLINE=1).")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the predicted speedup against batch size, with the break-even, into this .png or "
              ".svg (needs the `plot` extra: pip install 'specdeploy[plot]').")
def plan(file: str, output: str, offline: bool, plot_file: Path | None) -> None:
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
    if plot_file is not None:
        _plot(lambda: _write_plan_figure(resource.metadata.name, the_plan, plot_file), plot_file)
    sys.exit(EXIT_FITS if the_plan.accepted else EXIT_REJECTED)


def _plot(draw: Callable[[], object], path: Path) -> None:
    """Draw a picture, or stop with why not (matplotlib missing, no picture format, nothing to draw)."""
    from specdeploy.views.plots import CannotPlot

    try:
        draw()
    except CannotPlot as error:
        _fail(str(error))
    click.echo(f"picture written to {path}", err=True)


def _write_plan_figure(name: str, the_plan: Plan, path: Path) -> None:
    from specdeploy.views.plots import write_plan_figure

    write_plan_figure(name, the_plan, path)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--pod-monitor/--no-pod-monitor", default=False, help="Also render the PodMonitor.")
def render(file: str, pod_monitor: bool) -> None:
    """Print the child manifests (Deployments, or LeaderWorkerSets for a layout across nodes, Service, ConfigMap) FILE
    would run, as YAML."""
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
@click.argument("target", required=False)
@_cluster_options
@click.option("--sd", metavar="NAMESPACE/NAME", default=None, help="Deprecated: NAME -n NAMESPACE.")
@click.option("--url", default=None, help="The engine to probe, e.g. http://127.0.0.1:8000 after `kubectl "
              "port-forward pod/<a speculative pod> 8000`. Needed with FILE; for a NAME the default is a Ready "
              "speculative pod reached through the apiserver's pod proxy.")
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
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw acceptance by temperature and workload, with the floor, into this .png or .svg "
              "(the `plot` extra).")
def probe(target: str | None, namespace: str | None, kubeconfig: str | None, context: str | None, sd: str | None,
          url: str | None, workloads_file: str | None, temperatures: str, requests_per_cell: int, max_tokens: int,
          rate: float, deadline: float, batch_size: int, output: str, offline: bool, plot_file: Path | None) -> None:
    """Measure an SD's speculation: acceptance per workload and temperature, and where it would not pay.

    TARGET is a file (or -) holding the SD, probed at --url; or the NAME of an SD in the cluster, whose
    speculative pod is reached through the apiserver's pod proxy (or --url), and the result is also written
    into its status.probe, for `kubectl describe sd` (needs get on pods/proxy and patch on
    speculativedeployments/status). Prompts of each workload are sent one at a time at each temperature,
    within the budget, with each cell's acceptance so far on stderr; each answer's own counts are read (vLLM
    `--per-request-spec-decode-metrics summary`), else the engine's spec-decode counters around each
    request. Exit 1 when nothing could be measured, 2 when the engine is no OpenAI server.
    """
    import asyncio
    import datetime

    import yaml

    from specdeploy.engines import metric_names
    from specdeploy.judgment.probe import (
        NEUTRAL_PROMPTS,
        NEUTRAL_WORKLOAD,
        ProbeBudget,
        UnusableWorkloads,
        probe_cells,
        probe_result,
        workloads_from,
    )
    from specdeploy.report import render_probe
    from specdeploy.views.probe_progress import ProbeProgress

    if sd is not None:
        click.echo("warning: --sd NAMESPACE/NAME is deprecated: give NAME -n NAMESPACE", err=True)
        if target is not None:
            _fail("give TARGET or --sd, not both")
        namespace, _, target = sd.partition("/")
        if not namespace or not target:
            _fail(f"--sd: expected NAMESPACE/NAME, got {sd!r}")
    if target is None:
        _fail("give a FILE or the NAME of an SD")
    from_file = target == "-" or Path(target).is_file()
    access = None if from_file else _access(kubeconfig, context, namespace)
    body: dict[str, object] | None = None
    if access is not None:
        body = asyncio.run(_read_sd(access, target))
        resource = _validated(body, f"{access.namespace}/{target}")
        the_plan = _plan_or_none(resource, _hub_resolver(offline))
    else:
        if url is None:
            _fail(f"{target} is a file: give --url, the engine to probe (or the NAME of an SD in the cluster)")
        resource, the_plan = _load(target, _hub_resolver(offline))
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
    progress = ProbeProgress(list(workloads), temperature_list, requests_per_cell, Console(stderr=True))
    with progress:
        reached = asyncio.run(_probe_engine(access, resource, url, workloads, temperature_list, budget, deadline,
                                            metric_names(spec.engine.kind), progress.add))
    model, outcomes, url_probed = reached
    result = probe_result(spec, the_plan, outcomes, budget, cells_count, model, url_probed,
                          datetime.datetime.now(datetime.UTC), trigger=ProbeTrigger.MANUAL, batch_size=batch_size)
    floor = the_plan.acceptance_floor(batch_size) if the_plan is not None else None
    cells = probe_cells(outcomes, spec.speculation.num_speculative_tokens, result.break_even)
    from_counters = result.counts_from == CountsFrom.COUNTERS
    if output == "json":
        click.echo(json.dumps({**result.to_wire(), "errors": sorted({o.error for o in outcomes if o.error})},
                              indent=2))
    else:
        render_probe(resource.metadata.name, url_probed, cells, floor, result.budget or "", from_counters,
                     Console(highlight=False))
        for reason in sorted({o.error for o in outcomes if o.error}):
            click.echo(f"failed requests: {reason}", err=True)
    if not any(c.requests for c in cells):
        sys.exit(1)
    if plot_file is not None:
        _plot(lambda: _write_probe_figure(resource.metadata.name, cells, floor, plot_file), plot_file)
    if body is not None and access is not None:
        asyncio.run(_write_probe(access, body, result.to_wire()))
        click.echo(f"written to {access.namespace}/{target}'s status.probe", err=True)


def _write_probe_figure(name: str, cells: list[ProbeCell], floor: AcceptanceFloor | None, path: Path) -> None:
    from specdeploy.views.plots import write_probe_figure

    write_probe_figure(name, cells, floor, path)


async def _probe_engine(access: ClusterAccess | None, resource: SpeculativeDeployment, url: str | None,
                        workloads: dict[str, list[str]], temperatures: tuple[float, ...], budget: ProbeBudget,
                        deadline: float, counters: MetricNames,
                        on_outcome: Callable[[ProbeOutcome], None]) -> tuple[str, list[ProbeOutcome], str]:
    """The served model, every request's outcome, and the URL probed: `url` as given, else a Ready speculative
    pod of the SD through the apiserver's pod proxy."""
    import httpx

    from specdeploy.clients.engine_probe import EngineUnreachable, run_probe

    proxied = url is None
    if url is None:
        assert access is not None
        url = await _proxied_pod_url(access, resource)
        http = access.proxied_http()
    else:
        http = httpx.AsyncClient()
    async with http:
        try:
            if proxied:
                await _check_proxy(http, url)
            model, outcomes = await run_probe(http, url, workloads, temperatures, budget, deadline,
                                              counters=counters, on_outcome=on_outcome)
        except EngineUnreachable as error:
            _fail(str(error))
    return model, outcomes, url


async def _proxied_pod_url(access: ClusterAccess, resource: SpeculativeDeployment) -> str:
    """The pod-proxy URL of the Ready speculative pod the operator's own probe would pick."""
    from specdeploy.clients import kube
    from specdeploy.controller.probe_loop import ready_speculative_pod

    name = resource.metadata.name
    client = access.client()
    try:
        pod = ready_speculative_pod(await kube.engine_pods(client, access.namespace, name))
    finally:
        await client.close()
    if pod is None:
        _fail(f"no speculative pod of {access.namespace}/{name} is Ready: nothing to probe yet "
              f"(specdeploy get {name} -n {access.namespace})")
    return access.pod_proxy_url(pod["metadata"]["name"], resource.spec.serving.port)


async def _check_proxy(http: httpx.AsyncClient, url: str) -> None:
    """Stop with the apiserver's own words when it will not proxy to the pod (RBAC, an address it refuses)."""
    import httpx

    try:
        response = await http.get(f"{url}/v1/models", timeout=30)
    except httpx.HTTPError as error:
        _fail(f"the apiserver's pod proxy to {url} failed: {error}")
    if response.status_code == 200:
        return
    try:
        message = response.json().get("message") or response.text
    except ValueError:
        message = response.text
    hint = ""
    if "address not allowed" in message:
        hint = (" — the apiserver proxies only to global unicast pod IPs, and this pod's is not (the dev cluster's "
                "pods have loopback addresses): give --url (dev cluster: `specdeploy dev-cluster endpoints --sd "
                "NAMESPACE/NAME`)")
    elif response.status_code == 403:
        hint = " — probing through the apiserver needs `get` on pods/proxy in the SD's namespace"
    _fail(f"the apiserver will not proxy to {url}: HTTP {response.status_code} {message.strip()[:300]}{hint}")


async def _read_sd(access: ClusterAccess, name: str) -> dict[str, object]:
    from lightkube.core.exceptions import ApiError

    from specdeploy.clients import kube

    client = access.client()
    try:
        body = await kube.get_resource(client, access.namespace, name)
    except ApiError as error:
        _fail(f"cannot read {access.namespace}/{name}: {error.status.message}")
    finally:
        await client.close()
    if body is None:
        _fail(f"no SpeculativeDeployment {name} in namespace {access.namespace}")
    return body


def _validated(body: dict[str, object], where: str) -> SpeculativeDeployment:
    from pydantic import ValidationError

    from specdeploy.api.resource import describe_validation_error

    try:
        return SpeculativeDeployment.model_validate({**body, "status": None})
    except ValidationError as error:
        _fail(f"{where} does not validate: {describe_validation_error(error)}")


async def _write_probe(access: ClusterAccess, body: dict[str, object], probe: dict[str, object]) -> None:
    """Merge-patch only status.probe: the operator's own status writes carry it forward."""
    from lightkube.core.exceptions import ApiError

    from specdeploy.clients import kube

    metadata = body["metadata"]
    assert isinstance(metadata, dict)
    status = body.get("status") if isinstance(body.get("status"), dict) else {}
    assert isinstance(status, dict)
    client = access.client()
    try:
        await kube.write_status(client, metadata["namespace"], metadata["name"], {"probe": status.get("probe")},
                                {"probe": probe})
    except ApiError as error:
        _fail(f"cannot write status.probe of {metadata['namespace']}/{metadata['name']}: {error.status.message}")
    finally:
        await client.close()


WATCH_REFRESH_SECONDS = 5.0
"""How often `get -w` re-reads the pods and Events between changes of the SD (the watch redraws at once)."""


@main.command()
@click.argument("name")
@_cluster_options
@click.option("-w", "--watch", is_flag=True, help="Redraw as the SD changes, until interrupted or it is deleted.")
def get(name: str, namespace: str | None, kubeconfig: str | None, context: str | None, watch: bool) -> None:
    """One SD as the operator sees it: pods per variant with their k, acceptance against its floor, speedup
    with its interval, verdicts, the last rollback and the SD's Events (from its status, pods and Events)."""
    import asyncio

    access = _access(kubeconfig, context, namespace)
    with contextlib.suppress(KeyboardInterrupt):   # Ctrl-C ends a watch, as kubectl's does
        asyncio.run(_show_sd(access, name, watch, Console(highlight=False)))


async def _show_sd(access: ClusterAccess, name: str, watch: bool, console: Console) -> None:
    """Print the view once, or redraw it on every change of the SD and every WATCH_REFRESH_SECONDS: in place
    on a terminal, else as a new frame each time it differs."""
    import asyncio
    import io

    from rich.live import Live

    from specdeploy.clients import kube
    from specdeploy.clients.cluster_access import sd_changes, sd_events
    from specdeploy.views.live import VerdictHistory, sd_view

    client = access.client()
    history = VerdictHistory()

    async def frame(body: dict[str, object]) -> RenderableType:
        pods = await kube.engine_pods(client, access.namespace, name)
        events = await sd_events(client, access.namespace, name)
        history.record(body)
        return sd_view(body, pods, events, history)

    try:
        body = await kube.get_resource(client, access.namespace, name)
        if body is None:
            _fail(f"no SpeculativeDeployment {name} in namespace {access.namespace}")
        if not watch:
            console.print(await frame(body))
            return
        live = Live(console=console, auto_refresh=False) if console.is_terminal else None
        printed = ""

        def show(view: RenderableType) -> None:
            nonlocal printed
            if live is not None:
                live.update(view, refresh=True)
                return
            text = io.StringIO()
            Console(file=text, width=console.width, highlight=False).print(view)
            if text.getvalue() != printed:
                printed = text.getvalue()
                console.rule()
                console.print(view)

        changes = sd_changes(client, access.namespace, name)
        next_change = asyncio.ensure_future(anext(changes))
        if live is not None:
            live.start()
        try:
            while True:
                show(await frame(body))
                done, _ = await asyncio.wait({next_change}, timeout=WATCH_REFRESH_SECONDS)
                if next_change in done:
                    kind, body = next_change.result()
                    if kind == "DELETED":
                        show(await frame(body))
                        console.print(f"{access.namespace}/{name} was deleted")
                        return
                    next_change = asyncio.ensure_future(anext(changes))
        finally:
            next_change.cancel()
            if live is not None:
                live.stop()
    finally:
        await client.close()


@main.command()
@click.argument("name")
@_cluster_options
def retry(name: str, namespace: str | None, kubeconfig: str | None, context: str | None) -> None:
    """Bring speculation back after a rollback: a new value of the SD's specdeploy.io/retry-speculation
    annotation, which the operator acts on at its next pass (docs/operator.md). Exit 1 when nothing is
    rolled back."""
    import asyncio
    import datetime

    from specdeploy.clients.cluster_access import ANNOTATION_RETRY

    access = _access(kubeconfig, context, namespace)
    body = asyncio.run(_read_sd(access, name))
    status = body.get("status") if isinstance(body.get("status"), dict) else {}
    assert isinstance(status, dict)
    speculation = status.get("speculation") or {}
    if speculation.get("decided", True):
        click.echo(f"{access.namespace}/{name}: speculation is not rolled back; nothing to retry", err=True)
        sys.exit(1)
    value = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    asyncio.run(_set_retry(access, name, value))
    click.echo(f"{access.namespace}/{name}: {ANNOTATION_RETRY}={value}; the operator re-enables speculation at its "
               f"next pass (watch it: specdeploy get {name} -n {access.namespace} -w)")


async def _set_retry(access: ClusterAccess, name: str, value: str) -> None:
    from lightkube.core.exceptions import ApiError

    from specdeploy.clients.cluster_access import set_retry

    client = access.client()
    try:
        await set_retry(client, access.namespace, name, value)
    except ApiError as error:
        _fail(f"cannot annotate {access.namespace}/{name}: {error.status.message}")
    finally:
        await client.close()


@main.command()
@click.argument("name")
@_cluster_options
def pause(name: str, namespace: str | None, kubeconfig: str | None, context: str | None) -> None:
    """Hold the judgment's rollbacks for one SD: sets its specdeploy.io/paused annotation to the current time.
    Samples are still taken and judged; status says what the judgment would do (docs/analysis.md "Observe, and
    pausing the judgment"). Exit 1 when it is paused already."""
    import datetime

    value = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _set_paused(name, namespace, kubeconfig, context, value)


@main.command()
@click.argument("name")
@_cluster_options
def resume(name: str, namespace: str | None, kubeconfig: str | None, context: str | None) -> None:
    """Let the judgment act again: removes the SD's specdeploy.io/paused annotation; the next sample is judged on
    the failures counted while paused. Exit 1 when it is not paused."""
    _set_paused(name, namespace, kubeconfig, context, None)


def pause_patch(body: Mapping[str, Any], value: str | None) -> tuple[dict[str, Any] | None, str]:
    """The merge patch that pauses (`value`) or resumes (None) the judgment of `body`, and the sentence to print;
    no patch when it is that way already."""
    from specdeploy.reconcile.decide import PAUSED_ANNOTATION, paused

    metadata = body.get("metadata") or {}
    where = f"{metadata.get('namespace')}/{metadata.get('name')}"
    now_paused = paused(body)
    if value is not None and now_paused:
        since = (metadata.get("annotations") or {}).get(PAUSED_ANNOTATION)
        return None, f"{where}: the judgment is paused already ({PAUSED_ANNOTATION}={since}); nothing to pause"
    if value is None and not now_paused:
        return None, f"{where}: the judgment is not paused; nothing to resume"
    patch = {"metadata": {"annotations": {PAUSED_ANNOTATION: value}}}
    if value is not None:
        return patch, (f"{where}: {PAUSED_ANNOTATION}={value}; from its next sample the operator judges and says "
                       "what it would do, and rolls nothing back")
    return patch, f"{where}: {PAUSED_ANNOTATION} removed; the judgment acts again from its next sample"


def _set_paused(name: str, namespace: str | None, kubeconfig: str | None, context: str | None,
                value: str | None) -> None:
    import asyncio

    access = _access(kubeconfig, context, namespace)
    body = asyncio.run(_read_sd(access, name))
    patch, said = pause_patch(body, value)
    if patch is None:
        click.echo(said, err=True)
        sys.exit(1)
    asyncio.run(_patch_metadata(access, name, patch))
    click.echo(f"{said} (watch it: specdeploy get {name} -n {access.namespace} -w)")


async def _patch_metadata(access: ClusterAccess, name: str, patch: dict[str, Any]) -> None:
    from lightkube.core.exceptions import ApiError
    from lightkube.types import PatchType

    from specdeploy.clients.kube import SpeculativeDeploymentResource

    client = access.client()
    try:
        await client.patch(SpeculativeDeploymentResource, name, patch, namespace=access.namespace,
                           patch_type=PatchType.MERGE)
    except ApiError as error:
        _fail(f"cannot annotate {access.namespace}/{name}: {error.status.message}")
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
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="The kubeconfig (default: $KUBECONFIG, ~/.kube/config, else the pod's service account); its "
              "current context.")
@click.option("-v", "--verbose", is_flag=True)
def run(namespaces: tuple[str, ...], liveness: str, log_format: str, lease_namespace: str | None,
        resync_seconds: float | None, prometheus_url: str | None, alertmanager_url: str | None,
        prometheus_headers_dir: Path | None, alertmanager_headers_dir: Path | None,
        analysis_tick_seconds: float | None, metrics_port: int | None, pod_monitors: bool | None,
        pod_monitor_labels: tuple[str, ...], kubeconfig: str | None, verbose: bool) -> None:
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
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig   # kopf's kubeconfig login reads it (controller/handlers.py)
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
def reference() -> None:
    """Print the configuration reference (docs/configuration.md) generated from the models."""
    click.echo(reference_markdown(), nl=False)


@main.command()
def crd() -> None:
    """Print the SpeculativeDeployment CustomResourceDefinition (generated from the models)."""
    click.echo(crd_yaml(), nl=False)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
def sim(arguments: tuple[str, ...]) -> None:
    """The engine simulator: `specdeploy sim [--port P] -- ENGINE ARGV...` (see docs/simulator.md)."""
    from specdeploy_engine.sim.__main__ import main as simulator

    sys.exit(simulator(list(arguments)))


if __name__ == "__main__":
    main()
