"""The plan as a platform engineer reads it: verdict first, where each model's numbers came from, memory
per GPU, what the draft costs, findings and fixes, predicted speedup, and the engine command that will run;
and a probe's acceptance per workload and temperature (`specdeploy probe`)."""

from __future__ import annotations

import shlex

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specdeploy.api.spec import ScheduleMode
from specdeploy.api.status import Finding, Severity, Verdict
from specdeploy.engines.base import EngineCommand
from specdeploy.judgment.probe import ProbeCell, not_paying
from specdeploy.judgment.verdict import OBJECTIVE_MEANING, objective_checks
from specdeploy.modelsource.resolve import ArchitectureSource, Origin
from specdeploy.planning.acceptance_floor import AcceptanceFloor
from specdeploy.planning.plan import MEASURED_MODEL_ERROR, Plan, model_error, speedup_interval

_VERDICT_STYLE = {Verdict.FITS: "bold green", Verdict.FITS_WITH_WARNINGS: "bold yellow", Verdict.REJECTED: "bold red"}
_SEVERITY_MARK = {Severity.ERROR: ("✗", "red"), Severity.WARNING: ("!", "yellow"), Severity.INFO: ("i", "cyan")}


def _headline(name: str, plan: Plan) -> Text:
    spec = plan.spec
    speculation = spec.speculation
    method = speculation.enabled_method.value if speculation.enabled else "off"
    if speculation.enabled and speculation.draft is not None:
        method += f" ({speculation.draft.name})"
    if speculation.enabled and speculation.schedule_mode == ScheduleMode.FIXED:
        method += f", k={speculation.num_speculative_tokens}"
    elif speculation.enabled:
        method += f", k≤{speculation.num_speculative_tokens} by batch ({speculation.schedule_mode.value})"
    layout = plan.layout
    gpus = f"{spec.resources.gpu_count}× {spec.resources.gpu.product}, TP {layout.tensor_parallel_size}"
    if layout.spans_nodes or layout.pipeline_parallel_size > 1:
        gpus = f"{layout.gpus}× {spec.resources.gpu.product}, TP {layout.tensor_parallel_size} × PP " \
               f"{layout.pipeline_parallel_size}"
    quantization = "" if spec.model.quantization.value == "none" else f" [{spec.model.quantization.value}]"
    text = Text()
    text.append(name, style="bold")
    text.append(f"  {spec.engine.kind.value} · {spec.model.name}{quantization} · {method} · {gpus}")
    return text


_SOURCE_WORDS = {
    ArchitectureSource.SPEC: "spec architecture", ArchitectureSource.HUB: "Hub", ArchitectureSource.CATALOG: "catalog",
}
_SHORT_SHA = 12


def _source(origin: Origin) -> str:
    """Where the numbers came from; a ConfigMap or a path by name (a Hub URL is its commit, shown beside)."""
    return _SOURCE_WORDS.get(origin.source) or origin.location


def _revision(origin: Origin) -> str:
    """The commit the pods will load, or that nothing pins one."""
    if origin.commit_sha:
        return f"{origin.requested_revision or 'main'} → {origin.commit_sha[:_SHORT_SHA]}"
    return f"{origin.requested_revision}, not pinned" if origin.requested_revision else "not pinned"


def _models_table(plan: Plan) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    table.add_column()
    table.add_column(style="dim")
    rows = [("target", plan.target_origin)]
    if plan.draft_origin is not None:
        rows.append(("draft", plan.draft_origin))
    for role, origin in rows:
        table.add_row(role, origin.name, _source(origin), _revision(origin))
    return table


def _memory_table(plan: Plan) -> Table:
    memory = plan.memory
    per_gpu = memory.per_gpu
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(justify="right")
    table.add_column(style="dim")
    table.add_row("budget", f"{per_gpu.budget_gib:.2f} GiB",
                  f"gpuMemoryUtilization {plan.spec.resources.gpu_memory_utilization:g}")
    table.add_row("target weights", f"{per_gpu.target_weights_gib:.2f} GiB", "")
    table.add_row("draft weights", f"{per_gpu.draft_weights_gib:.2f} GiB", "")
    table.add_row("overhead", f"{per_gpu.overhead_gib:.2f} GiB",
                  f"activations {per_gpu.activation_peak_gib:.2f} + non-torch {per_gpu.non_torch_gib:.2f}"
                  f" + CUDA graphs {per_gpu.cuda_graph_gib:.2f}")
    table.add_row("KV cache", f"{per_gpu.kv_cache_gib:.2f} GiB",
                  f"{memory.kv_cache_tokens:,} tokens × {memory.kv_bytes_per_token:,} B")
    table.add_row("concurrency", f"{memory.max_concurrency:.2f}",
                  f"sequences of maxModelLen {memory.max_model_len:,} (maxNumSeqs {plan.spec.serving.max_num_seqs})")
    cost = memory.draft_cost
    table.add_row("speculation costs", f"{cost.kv_cache_gib:.2f} GiB",
                  f"{cost.kv_cache_tokens:,} KV tokens, {cost.concurrent_sequences:.2f} sequences")
    return table


def _findings(findings: list[Finding]) -> Text:
    text = Text()
    for finding in findings:
        mark, style = _SEVERITY_MARK[finding.severity]
        text.append(f" {mark} ", style=style)
        text.append(f"{finding.code}: ", style="bold")
        text.append(finding.message + "\n")
    return text


def _speedup(plan: Plan) -> Text | None:
    estimate = plan.speedup
    if estimate is None:
        return None
    source = "measured" if estimate.acceptance_rate_measured else "assumed for the method"
    pays = (
        f"pays up to maxNumSeqs {estimate.max_batch_size}"
        if estimate.breakeven_batch_size is None
        else f"stops paying at batch {estimate.breakeven_batch_size} (maxNumSeqs {estimate.max_batch_size})"
    )
    error = model_error(estimate.gpu, fitted=False)
    text = Text()
    text.append(f" {estimate.speedup_at_batch_1:.2f}× at batch 1", style="bold")
    text.append(f" ({_interval(estimate.speedup_at_batch_1, error)})")
    text.append(f", {estimate.speedup_at_max_batch:.2f}× at batch {estimate.max_batch_size} "
                f"({_interval(estimate.speedup_at_max_batch, error)}); {pays}\n")
    text.append(f" the prior model: ± {error:.0%} ({_ERROR_BASIS[error == MEASURED_MODEL_ERROR]})\n")
    text.append(
        f" acceptance rate {estimate.assumed_acceptance_rate:.2f} ({source}; α {estimate.alpha:.2f}), "
        f"{estimate.expected_tokens_per_step:.2f} tokens per step, draft cost {estimate.draft_cost_ratio:.3f} "
        f"of a target step; best k {estimate.best_k} (now {estimate.k}) on {estimate.gpu}"
    )
    floor = _acceptance_floor(plan)
    if floor is not None:
        text.append("\n acceptance floor", style="bold")
        text.append(" — ")
        text.append(floor)
    return text


_ERROR_BASIS = {
    True: "its error against the step times measured on an H100",
    False: "a GPU scaled from its datasheet: wider than the H100's measured error",
}


def _interval(speedup: float, error: float) -> str:
    """"1.68–2.02×": the predicted speedup under the model's stated error (planning/plan.py speedup_interval)."""
    low, high = speedup_interval(speedup, error)
    return f"{low:.2f}–{high:.2f}×"


_SCHEDULE_MEANING = {
    ScheduleMode.FIXED: "numSpeculativeTokens at every batch size",
    ScheduleMode.AUTO: "derived from the speedup model",
    ScheduleMode.TABLE: "as written",
}


def schedule_table(plan: Plan) -> Group | None:
    """k per batch range and the predicted speedup at each end of the range (planning.schedule)."""
    schedule = plan.schedule
    if schedule is None:
        return None
    source = "measured" if schedule.acceptance_measured else "assumed for the method"
    heading = Text()
    heading.append(f" {schedule.mode.value}", style="bold")
    error = plan.model_error
    heading.append(f": {_SCHEDULE_MEANING[schedule.mode]} (acceptance {source}); speedup against no speculation "
                   f"from the {plan.prediction_source} model, ± {error:.0%}")
    table = Table(box=None, pad_edge=True)
    table.add_column("BATCH")
    table.add_column("K", justify="right")
    table.add_column("PREDICTED SPEEDUP")
    table.add_column("INTERVAL")
    table.add_column("MODEL")
    for entry in schedule.ranges:
        batches = f"{entry.min_batch}–{entry.max_batch}" if entry.max_batch > entry.min_batch else str(entry.min_batch)
        single = entry.max_batch == entry.min_batch
        speedups = (f"{entry.speedup_at_min_batch:.2f}×" if single
                    else f"{entry.speedup_at_min_batch:.2f}× → {entry.speedup_at_max_batch:.2f}×")
        interval = (_interval(entry.speedup_at_min_batch, error) if single else
                    f"{_interval(entry.speedup_at_min_batch, error)} → {_interval(entry.speedup_at_max_batch, error)}")
        table.add_row(batches, str(entry.k), speedups, interval, plan.prediction_source)
    return Group(heading, table)


def _acceptance_floor(plan: Plan) -> str | None:
    """The acceptance rate below which the analysis loop counts speculation as failing: Auto at batch 1
    and at maxNumSeqs, or Fixed with the model's break-even beside it."""
    floor = plan.acceptance_floor()
    if floor is None:
        return None
    if floor.fixed:
        return f"{floor.describe()} (the model's break-even at batch {floor.batch_size}: {floor.break_even:.2f})"
    max_batch = plan.spec.serving.max_num_seqs
    at_max = plan.acceptance_floor(max_batch)
    if at_max is None or max_batch == floor.batch_size:
        return floor.describe()
    return f"{floor.describe()}; {at_max.rate:.2f} at maxNumSeqs {max_batch}"


def _analysis(plan: Plan) -> Text:
    """The objective and the limits that decide under it."""
    analysis = plan.spec.analysis
    text = Text()
    text.append(f" objective {analysis.objective.value}", style="bold")
    text.append(f" — {OBJECTIVE_MEANING[analysis.objective]}\n")
    limits = ", ".join(f"{name} {'unset' if value is None else f'{value:g}'}"
                       for name, value in objective_checks(analysis.objective, analysis.checks).items())
    text.append(f" checks: {limits}; baseline {analysis.baseline.mode.value}")
    return text


def _command_lines(argv: list[str]) -> str:
    """The program and its positional words on the first line, then one flag (with its value) per line."""
    lines: list[str] = [""]
    for word in argv:
        quoted = shlex.quote(word)
        if word.startswith("-"):
            lines.append("    " + quoted)
        else:
            lines[-1] = f"{lines[-1]} {quoted}".lstrip() if len(lines) == 1 else f"{lines[-1]} {quoted}"
    return " \\\n".join(lines)


def render_plan(name: str, plan: Plan, command: EngineCommand | None, console: Console) -> None:
    """Print `plan` for a person."""
    verdict = plan.verdict
    console.print(_headline(name, plan))
    console.print(Text(f"Verdict: {verdict.value}", style=_VERDICT_STYLE[verdict]))
    if plan.layout.spans_nodes or plan.layout.pipeline_parallel_size > 1:
        console.print(Text(f"Layout: {plan.layout.describe()}; the memory plan is the last pipeline stage's (it "
                           "holds the drafter)" + ("; one LeaderWorkerSet group per replica"
                                                   if plan.layout.spans_nodes else "")))
    console.print(Panel(_models_table(plan), title="models", title_align="left"))
    console.print(Panel(_memory_table(plan), title="memory per GPU", title_align="left"))
    findings = list(plan.memory.reasons) + list(plan.compatibility.findings)
    if findings:
        console.print(Panel(_findings(findings), title="findings", title_align="left"))
    if plan.memory.suggestions:
        text = Text()
        for suggestion in plan.memory.suggestions:
            text.append(" → ", style="green")
            text.append(f"{suggestion.field}: {suggestion.value}", style="bold")
            text.append(f"  {suggestion.message}\n")
        console.print(Panel(text, title="what would fit", title_align="left"))
    speedup = _speedup(plan)
    if speedup is not None:
        console.print(Panel(speedup, title="predicted speedup", title_align="left"))
    schedule = schedule_table(plan)
    if schedule is not None:
        console.print(Panel(schedule, title="speculation schedule", title_align="left"))
    console.print(Panel(_analysis(plan), title="analysis", title_align="left"))
    if command is not None:
        console.print(Panel(Text(_command_lines(command.argv())), title="engine command", title_align="left"))
        for file_name, content in sorted(command.config_files.items()):
            console.print(Panel(Text(content.rstrip()), title=f"/etc/specdeploy/{file_name}", title_align="left"))


def render_probe(name: str, url: str, cells: list[ProbeCell], floor: AcceptanceFloor | None, budget: str,
                 from_counters: bool, console: Console) -> None:
    """`specdeploy probe`: acceptance per workload × temperature, what the cost model makes of it, and the
    cells where speculation would not pay, by name."""
    source = ("the engine's counters around each request (exact only while nothing else is served by it)"
              if from_counters else "each answer's metrics.speculative_decoding")
    console.print(Text(f"probe of {name} at {url}: {budget}; counts from {source}", style="bold"))
    console.print(f"break-even: {floor.describe()}" if floor is not None
                  else "break-even: unknown (the models cannot be resolved): no speedup predicted")
    table = Table(box=None, pad_edge=False)
    for column in ("WORKLOAD", "TEMPERATURE", "REQUESTS", "FAILED", "ACCEPTANCE", "MEAN LENGTH", "PREDICTED", "PAYS"):
        table.add_column(column)
    for cell in cells:
        table.add_row(
            cell.workload, f"{cell.temperature:g}", str(cell.requests), str(cell.failed),
            "-" if cell.acceptance_rate is None else f"{cell.acceptance_rate:.2f}",
            "-" if cell.mean_acceptance_length is None else f"{cell.mean_acceptance_length:.2f}",
            "-" if cell.predicted_speedup is None else f"{cell.predicted_speedup:.2f}×",
            {True: "yes", False: "no", None: "-"}[cell.pays],
        )
    console.print(table)
    for sentence in not_paying(cells, floor.break_even if floor is not None else None):
        console.print(f"not paying: {sentence}")
