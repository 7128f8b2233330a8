"""The simulator's HTTP server: the OpenAI API, health, Prometheus metrics and the admin knobs, in front of
the engine core running on the real clock.

    server = SimServer(served, knobs=Knobs(), seed=0, time_scale=1.0)
    runner = await server.start("127.0.0.1", 8000)      # returns once the port listens

Endpoints: POST /v1/completions and /v1/chat/completions (streamed as server-sent events or not, with
usage), GET /v1/models, GET /health, GET the engine's metrics path (vLLM and SGLang /metrics, TensorRT-LLM
/prometheus/metrics; /metrics as well), GET and POST /admin/knobs, GET /admin/info (with the k in use),
GET /server_info (SGLang only: its adaptive tier).

Time: each engine step lasts its model seconds × time_scale of wall-clock time; latencies in the metrics
are wall-clock seconds. Steps are scheduled on a timeline (a step starts when the previous one was due
to end, or when work arrives after idling), so sleep overshoot does not accumulate. An idle simulator
waits on an event and uses no CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import traceback
from typing import Any

from aiohttp import web

from specdeploy_engine.sim.console import oom_message
from specdeploy_engine.sim.engine import Engine, SimRequest
from specdeploy_engine.sim.engines import SIMULATED_ENGINES
from specdeploy_engine.sim.exposition import CONTENT_TYPE
from specdeploy_engine.sim.knobs import KnobError, Knobs
from specdeploy_engine.sim.metrics import EngineMetrics, SglangMetrics, engine_metrics
from specdeploy_engine.sim.model import ServedModel
from specdeploy_engine.sim.openai_api import (
    ApiError,
    Asked,
    completion_chunk,
    completion_response,
    generated_text,
    models_response,
    per_request_metrics,
    read_request,
    usage_chunk,
)

CRASH_DELAY_SECONDS = 0.05      # lets the admin POST that asked for the crash get its answer first


class RealTimeDriver:
    """Runs the engine core against the event loop's clock."""

    def __init__(self, engine: Engine, metrics: EngineMetrics, time_scale: float) -> None:
        self.engine = engine
        self.metrics = metrics
        self.time_scale = time_scale
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-core")
        self._task.add_done_callback(_die_with_the_core)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, request: SimRequest) -> None:
        now = asyncio.get_running_loop().time()
        request.arrival = now
        self.engine.add(request, now)
        self.metrics.on_idle(self.engine)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        self.engine.abort(request, asyncio.get_running_loop().time())
        self.metrics.on_idle(self.engine)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            now = max(due, loop.time()) if self.engine.has_work else loop.time()
            step = self.engine.plan_step(now)
            if step is None:
                self.metrics.on_idle(self.engine)
                self._wake.clear()
                await self._wake.wait()
                due = loop.time()
                continue
            due = now + step.seconds * self.time_scale
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)          # let handlers run between back-to-back steps
            self.engine.complete_step(step, due)


def _die_with_the_core(task: asyncio.Task[None]) -> None:
    """An engine whose core loop died serves nothing: print why and exit, as vLLM's API server does when
    its EngineCore process dies."""
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    sys.stderr.write("ERROR [core.py] EngineCore encountered a fatal error.\n")
    traceback.print_exception(error)
    sys.stderr.flush()
    os._exit(1)


class TokenStream:
    """Tokens the engine produced for one request, waiting for its handler to send them."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.pending = 0
        self.total = 0
        self.done = False

    def push(self, request: SimRequest, count: int, finished: bool) -> None:
        self.pending += count
        self.total += count
        self.done = self.done or finished
        self.ready.set()

    def take(self) -> tuple[int, bool]:
        count, self.pending = self.pending, 0
        self.ready.clear()
        return count, self.done


def _sse(document: dict[str, Any] | str) -> bytes:
    payload = document if isinstance(document, str) else json.dumps(document, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


class SimServer:
    """One simulated engine process."""

    def __init__(self, served: ServedModel, *, knobs: Knobs, seed: int = 0, time_scale: float = 1.0) -> None:
        self.served = served
        self.knobs = knobs
        self.seed = seed
        self.metrics = engine_metrics(served)
        self.engine = Engine(served, seed=seed, knobs=knobs, observer=self.metrics)
        self.driver = RealTimeDriver(self.engine, self.metrics, time_scale)
        self._requests = 0
        self._crash_handle: asyncio.TimerHandle | None = None

    # --- application --------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        config = self.served.config
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get(config.health_path, self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        for path in {config.metrics_path or "/metrics", "/metrics"}:
            app.router.add_get(path, self._metrics)
        app.router.add_get("/admin/knobs", self._get_knobs)
        app.router.add_post("/admin/knobs", self._post_knobs)
        app.router.add_get("/admin/info", self._info)
        if SIMULATED_ENGINES[config.kind].server_info:
            app.router.add_get("/server_info", self._server_info)
        return app

    async def start(self, host: str, port: int) -> web.AppRunner:
        """Listen on host:port and start the engine core; the caller keeps the runner to clean up."""
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        self.driver.start()
        return runner

    async def stop(self, runner: web.AppRunner) -> None:
        await self.driver.stop()
        await runner.cleanup()

    # --- handlers -----------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        config = self.served.config
        return web.json_response(models_response(config.served_model_name, config.model, self.served.max_model_len,
                                                 SIMULATED_ENGINES[config.kind].owned_by))

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.served.config.metrics_path is None:
            raise web.HTTPNotFound(text="metrics are not enabled with these engine flags\n")
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _get_knobs(self, request: web.Request) -> web.Response:
        return web.json_response(self.knobs.to_wire())

    async def _post_knobs(self, request: web.Request) -> web.Response:
        try:
            document = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "the body must be a JSON object of knobs"}, status=400)
        try:
            self.knobs.update(document)
        except KnobError as error:
            return web.json_response({"error": str(error)}, status=400)
        if self.knobs.oom and self._crash_handle is None:
            loop = asyncio.get_running_loop()
            self._crash_handle = loop.call_later(CRASH_DELAY_SECONDS, crash, self.served, self.knobs.exit_code)
        return web.json_response(self.knobs.to_wire())

    async def _info(self, request: web.Request) -> web.Response:
        served, config = self.served, self.served.config
        speculation = config.speculation
        return web.json_response({
            "engine": config.kind.value, "model": config.model, "servedModelName": config.served_model_name,
            "gpu": served.gpu.name, "tensorParallelSize": config.tensor_parallel_size,
            "method": speculation.engine_method if speculation else None, "k": served.k,
            "kInUse": self.engine.schedule.k_now, "kSchedule": self.engine.schedule.describe(),
            "defaultAcceptance": served.default_acceptance_rate, "acceptance": self.engine.acceptance_rate(),
            "kvCacheTokens": served.kv_cache_tokens, "maxModelLen": served.max_model_len,
            "maxNumSeqs": config.max_num_seqs, "running": len(self.engine.running),
            "waiting": len(self.engine.waiting), "notes": list(served.notes),
        })

    async def _server_info(self, request: web.Request) -> web.Response:
        """SGLang's GET /server_info, as far as speculation goes: the server args that set it, and in
        internal_states[0] the steps now in use (the adaptive tier) and the recent accept length."""
        config, speculation = self.served.config, self.served.config.speculation
        adaptive = speculation.adaptive if speculation else None
        steps = self.engine.schedule.k_now if speculation else None
        return web.json_response({
            "model_path": config.model, "served_model_name": config.served_model_name,
            "max_running_requests": config.max_num_seqs,
            "speculative_algorithm": speculation.engine_method if speculation else None,
            "speculative_num_steps": adaptive.initial_steps if adaptive else steps,
            "speculative_adaptive": adaptive is not None,
            "internal_states": [{
                "speculative_num_steps": steps,
                "speculative_num_draft_tokens": (self.engine.schedule.k_now + 1 if adaptive
                                                 else speculation.verify_tokens if speculation else None),
                "avg_spec_accept_length": (self.metrics.recent_accept_length()
                                           if isinstance(self.metrics, SglangMetrics) else None),
            }],
        })

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        rng = random.Random(f"{self.seed}:request:{self._requests}")
        self._requests += 1
        try:
            body = await request.json()
        except json.JSONDecodeError:
            error = ApiError(400, "the request body is not valid JSON")
            return web.json_response(error.body, status=error.status)
        try:
            asked = read_request(body, chat=chat, served_name=self.served.config.served_model_name,
                                 max_model_len=self.served.max_model_len, rng=rng)
        except ApiError as error:
            return web.json_response(error.body, status=error.status)
        stream = TokenStream()
        sim_request = SimRequest(asked.id, arrival=0.0, prompt_tokens=asked.prompt_tokens,
                                 output_tokens=asked.output_tokens, temperature=asked.temperature,
                                 finish_reason=asked.finish_reason, on_output=stream.push, text=asked.text)
        self.driver.submit(sim_request)
        try:
            if asked.stream:
                return await self._stream(request, asked, stream, rng, sim_request)
            while not stream.done:
                await stream.ready.wait()
                stream.take()
            text = generated_text(rng, stream.total)
            metrics = per_request_metrics(asked, sim_request.spec_stats, streamed=False)
            return web.json_response(completion_response(asked, text, stream.total, asked.finish_reason, metrics))
        except (asyncio.CancelledError, ConnectionResetError):
            self.driver.abort(sim_request)
            raise

    async def _stream(self, request: web.Request, asked: Asked, stream: TokenStream,
                      rng: random.Random, sim_request: SimRequest) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        first = True
        while True:
            await stream.ready.wait()
            count, done = stream.take()
            if count or done:
                finish = asked.finish_reason if done else None
                await response.write(_sse(completion_chunk(asked, generated_text(rng, count), finish, first=first)))
                first = False
            if done:
                break
        if asked.include_usage:
            metrics = per_request_metrics(asked, sim_request.spec_stats, streamed=True)
            await response.write(_sse(usage_chunk(asked, stream.total, metrics)))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response


def crash(served: ServedModel, exit_code: int) -> None:
    """Die as an engine dies of a CUDA out-of-memory error: the error on stderr, then exit."""
    sys.stdout.flush()
    sys.stderr.write(oom_message(served))
    sys.stderr.flush()
    os._exit(exit_code)
