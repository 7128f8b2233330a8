"""The operator's own /metrics endpoint (rollbacks, speculation, acceptance, verdicts, query cost)."""

from __future__ import annotations

from aiohttp import web

from specdeploy.controller.metrics import CONTENT_TYPE, OperatorMetrics


async def serve_metrics(metrics: OperatorMetrics, port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """Serve `metrics` on http://host:port/metrics until the returned runner is cleaned up."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
