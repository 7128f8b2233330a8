"""`specdeploy dev-cluster build|up|down|status|env|kubectl|scrape-target|pod-runner|sim-admin|endpoints`.

Usage::

    specdeploy dev-cluster up --monitoring [--engine vllm]
    eval "$(specdeploy dev-cluster env)"
    specdeploy dev-cluster scrape-target add sim-0 127.0.0.1:8000 -l namespace=demo
    specdeploy dev-cluster sim-admin --sd demo/llama --variant speculative --set acceptance=0.3
    specdeploy dev-cluster endpoints --sd demo/llama
    specdeploy dev-cluster down

`sim_admin_cmd` and `endpoints_cmd` are plain click commands, so the top-level CLI can register them too; so are
`demo_cmd` and `load_cmd`. The top-level CLI loads this module only when one of them runs (or --help lists them):
the operator's wheel does not contain the dev cluster.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from specdeploy.devcluster import build, podrunner, versions, vllm_env
from specdeploy.devcluster.cluster import DevCluster
from specdeploy.devcluster.errors import DevClusterError
from specdeploy.devcluster.simadmin import VARIANTS, endpoints, parse_knob, sim_admin
from specdeploy.devcluster.state import ENGINES

_state_dir = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                          envvar="SPECDEPLOY_DEV_CLUSTER_DIR", show_envvar=True,
                          help="Where the cluster keeps pids, certificates, kubeconfig and logs "
                               "[default: ~/.local/state/specdeploy/dev-cluster].")


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def _fail(exc: DevClusterError) -> None:
    raise click.ClickException(str(exc)) from exc


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real local control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes."""


_leader_worker_sets = click.option(
    "--leader-worker-sets", is_flag=True,
    help=f"Also the LeaderWorkerSet controller (sigs.k8s.io/lws {versions.LWS}, a few minutes to build the first "
         "time), for SDs laid out across nodes; `up` runs it with its CRD and its webhooks on loopback.")


@dev_cluster.command("build")
@click.option("--engine", type=click.Choice(["sim", "vllm"]), default="sim", show_default=True,
              help="vllm: also install real vLLM's CPU build and its stand-in models (what `up --engine vllm` "
                   "and the real-vLLM tests run; ~3 GiB download on first use, then a no-op).")
@_leader_worker_sets
def build_cmd(engine: str, leader_worker_sets: bool) -> None:
    """Build (or find) every binary; a quick no-op when the cache is warm."""
    started = time.monotonic()
    _echo_err(f"dev-cluster binaries for Kubernetes {versions.KUBERNETES}, etcd {versions.ETCD}, "
              f"kwok {versions.KWOK}, helm {versions.HELM}"
              + (f", LeaderWorkerSet {versions.LWS}" if leader_worker_sets else "") + f" (cache: {build.bin_dir()})")
    names = (*build.NAMES, *build.LEADER_WORKER_SET) if leader_worker_sets else build.NAMES
    try:
        binaries = build.ensure_binaries(progress=_echo_err, names=names)
        stage = build.kwok_stage_dir()
    except DevClusterError as exc:
        _fail(exc)
    for binary in build.BINARIES:
        if binary.name not in binaries or not binary.version_args:
            continue   # not asked for, or cannot say its version (its build manifest vouches for it)
        found = build.probe_version(binaries[binary.name], binary)
        if found is None or found.split(".")[:2] != binary.version.lstrip("v").split(".")[:2]:
            raise click.ClickException(f"{binaries[binary.name]} reports version {found!r}, "
                                       f"expected {binary.version}")
    _echo_err(f"  kwok stages              {stage}")
    _echo_err(f"all {len(binaries)} binaries ready in {time.monotonic() - started:.1f}s")
    if engine == "vllm":
        try:
            vllm_env.ensure_real_vllm(progress=_echo_err)
        except DevClusterError as exc:
            _fail(exc)


@dev_cluster.command("up")
@_state_dir
@click.option("--nodes", default=4, show_default=True, help="Number of fake GPU nodes (8 x nvidia.com/gpu each).")
@click.option("--monitoring/--no-monitoring", default=False, show_default=True,
              help="Also start Prometheus and Alertmanager on loopback.")
@click.option("--engine", type=click.Choice(ENGINES), default="sim", show_default=True,
              help="What engine pods run: the simulator, or (vllm, with --monitoring) real vLLM's CPU build with "
                   "stand-in models for pods that run `vllm serve`, installed on first use (~3 GiB download).")
@_leader_worker_sets
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for readiness.")
def up_cmd(state_dir: Path | None, nodes: int, monitoring: bool, engine: str, leader_worker_sets: bool,
           timeout: float) -> None:
    """Start the cluster (building binaries if missing) and wait until it is ready."""
    if engine != "sim" and not monitoring:
        raise click.BadParameter(f"--engine {engine} needs --monitoring (the pod runner starts with it)",
                                 param_hint="--engine")
    cluster = DevCluster(state_dir, nodes=nodes, monitoring=monitoring, progress=_echo_err, engine=engine,
                         leader_worker_sets=leader_worker_sets)
    try:
        cluster.up(timeout=timeout)
    except DevClusterError as exc:
        _fail(exc)
    for key, value in cluster.env().items():
        click.echo(f"export {key}={value}")


@dev_cluster.command("down")
@_state_dir
@click.option("--keep-logs", is_flag=True, help="Keep <state-dir>/logs for a post-mortem.")
def down_cmd(state_dir: Path | None, keep_logs: bool) -> None:
    """Stop every process the cluster started (by pid) and remove its state."""
    cluster = DevCluster(state_dir)
    status = cluster.status()
    cluster.down(keep_logs=keep_logs)
    _echo_err(f"stopped {len(status.components)} processes; removed {cluster.state_dir}")


@dev_cluster.command("status")
@_state_dir
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def status_cmd(state_dir: Path | None, output: str) -> None:
    """What runs and where. Exit status 1 when the cluster is not (fully) running."""
    status = DevCluster(state_dir).status()
    if output == "json":
        data = asdict(status)
        data["state_dir"] = str(status.state_dir)
        data["running"] = status.running
        click.echo(json.dumps(data, indent=2))
    elif not status.components:
        click.echo(f"no dev cluster in {status.state_dir}")
    else:
        click.echo(f"state dir   {status.state_dir}")
        click.echo(f"kubeconfig  {status.kubeconfig}")
        click.echo(f"apiserver   {status.apiserver_url}")
        if status.prometheus_url:
            click.echo(f"prometheus  {status.prometheus_url}")
            click.echo(f"alertmanager {status.alertmanager_url}")
        click.echo(f"nodes       {', '.join(status.nodes)}")
        for c in status.components:
            click.echo(f"  {c.name:<24} {'running' if c.running else 'STOPPED':<8} pid {c.pid:<8} "
                       f"{c.address:<28} {c.log}")
    sys.exit(0 if status.running else 1)


@dev_cluster.command("env")
@_state_dir
def env_cmd(state_dir: Path | None) -> None:
    """Print `export` lines: KUBECONFIG, PROMETHEUS_URL, ALERTMANAGER_URL (use with eval)."""
    try:
        env = DevCluster(state_dir).env()
    except DevClusterError as exc:
        _fail(exc)
    for key, value in env.items():
        click.echo(f"export {key}={value}")


@dev_cluster.command("kubectl", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_state_dir
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl_cmd(state_dir: Path | None, args: tuple[str, ...]) -> None:
    """Run the harness's own kubectl against the dev cluster, e.g. `dev-cluster kubectl get nodes`."""
    try:
        proc = DevCluster(state_dir).kubectl(*args, check=False)
    except DevClusterError as exc:
        _fail(exc)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    sys.exit(proc.returncode)


@dev_cluster.group("scrape-target")
def scrape_target() -> None:
    """Prometheus scrape targets (file-based service discovery)."""


@scrape_target.command("add")
@_state_dir
@click.argument("name")
@click.argument("address")
@click.option("-l", "--label", "labels", multiple=True, help="KEY=VALUE label for every scraped series.")
@click.option("--metrics-path", default="/metrics", show_default=True)
def scrape_add(state_dir: Path | None, name: str, address: str, labels: tuple[str, ...], metrics_path: str) -> None:
    """Scrape ADDRESS (host:port) as target NAME."""
    parsed: dict[str, str] = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"labels must look like KEY=VALUE, got {label!r}", param_hint="--label")
        parsed[key] = value
    try:
        path = DevCluster(state_dir).add_scrape_target(name, address, parsed, metrics_path)
    except (DevClusterError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_err(f"added {name} -> {address} ({path})")


@scrape_target.command("remove")
@_state_dir
@click.argument("name")
def scrape_remove(state_dir: Path | None, name: str) -> None:
    """Stop scraping target NAME."""
    try:
        existed = DevCluster(state_dir).remove_scrape_target(name)
    except (DevClusterError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_err(f"removed {name}" if existed else f"{name} was not registered")


@scrape_target.command("list")
@_state_dir
def scrape_list(state_dir: Path | None) -> None:
    """Registered scrape targets as JSON."""
    try:
        targets = DevCluster(state_dir).scrape_targets()
    except DevClusterError as exc:
        _fail(exc)
    click.echo(json.dumps(targets, indent=2))


@dev_cluster.command("pod-runner")
@_state_dir
@click.option("-v", "--verbose", is_flag=True)
def pod_runner_cmd(state_dir: Path | None, verbose: bool) -> None:
    """Run the pod runner in the foreground: a simulator for every Running engine pod (until Ctrl-C).

    `up --monitoring` already starts one; use this for a cluster started without it.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        podrunner.serve(DevCluster(state_dir).state_dir)
    except DevClusterError as exc:
        _fail(exc)


_sd_option = click.option("--sd", "sd", required=True, metavar="NAMESPACE/NAME",
                          help="The SpeculativeDeployment whose engine simulators to reach.")
_variant_option = click.option("--variant", type=click.Choice(list(VARIANTS)), default=None,
                               help="Only the speculative or only the control pods [default: both].")


@click.command("sim-admin")
@_state_dir
@_sd_option
@_variant_option
@click.option("--set", "assignments", multiple=True, required=True, metavar="KNOB=VALUE",
              help="A run-time knob, e.g. acceptance=0.3, extraLatencySeconds=0.05, oom=true (repeatable).")
def sim_admin_cmd(state_dir: Path | None, sd: str, variant: str | None, assignments: tuple[str, ...]) -> None:
    """Change the run-time knobs of an SD's engine simulators (POST /admin/knobs on each)."""
    try:
        knobs = dict(parse_knob(a) for a in assignments)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from exc
    try:
        results = sim_admin(DevCluster(state_dir), sd, variant, knobs)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sd") from exc
    except DevClusterError as exc:
        _fail(exc)
    for result in results:
        where = f"{result.endpoint.namespace}/{result.endpoint.pod} ({result.endpoint.variant}, {result.endpoint.url})"
        click.echo(f"{where}: {json.dumps(result.knobs, sort_keys=True) if result.ok else 'FAILED ' + result.error}")
    if not all(result.ok for result in results):
        sys.exit(1)


@click.command("endpoints")
@_state_dir
@_sd_option
@_variant_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def endpoints_cmd(state_dir: Path | None, sd: str, variant: str | None, output: str) -> None:
    """Base URLs of an SD's ready engine simulators, one a line (what its Service would balance over)."""
    try:
        urls = endpoints(DevCluster(state_dir), sd, variant)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sd") from exc
    except DevClusterError as exc:
        _fail(exc)
    if output == "json":
        click.echo(json.dumps(urls))
    else:
        for url in urls:
            click.echo(url)
    if not urls:
        _echo_err(f"no simulator of {sd} is ready yet")
        sys.exit(1)


dev_cluster.add_command(sim_admin_cmd)
dev_cluster.add_command(endpoints_cmd)


@click.command("demo")
@click.option("--no-tty", is_flag=True, help="Plain line output (CI, logs).")
@click.option("--cleanup", is_flag=True, help="Tear the cluster down at the end.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The dev cluster's state directory (default: the user's dev cluster).")
def demo_cmd(no_tty: bool, cleanup: bool, state_dir: Path | None) -> None:
    """The whole loop on this machine: dev cluster, chart, operator, simulated engines, a rollback."""
    from specdeploy.devcluster.demo import run_demo

    sys.exit(run_demo(tty=not no_tty and sys.stdout.isatty(), cleanup=cleanup, state_dir=state_dir))


@click.command("load")
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
def load_cmd(sd: str, qps: float, duration: str, output_tokens: str, temperature: str, prompts: str,
             state_dir: str | None) -> None:
    """Drive load through a dev-cluster SD's engine pods, as its Service would; print percentiles."""
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
