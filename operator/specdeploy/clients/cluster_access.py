"""The CLI's way into a cluster, found as kubectl finds it, and what the CLI reads and writes there.

The kubeconfig is --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the pod's service account; the
context is --context, else the file's current one; the namespace is -n, else the context's, else `default`.
The apiserver's pod proxy (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/…`) carries `specdeploy probe NAME`'s
requests to one engine pod with the user's own credentials: no port-forward, no route to the pod network.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import AsyncClient, ConfigError, KubeConfig
from lightkube.config.client_adapter import AsyncClient as kube_http_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import SingleConfig
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from specdeploy.api.resource import KIND
from specdeploy.clients.kube import SpeculativeDeploymentResource

ANNOTATION_RETRY = "specdeploy.io/retry-speculation"
"""A new value re-enables speculation after a rollback (docs/operator.md "Analysis and rollback")."""


class NoCluster(Exception):
    """No kubeconfig, or no such context in it: the sentence says which."""


@dataclass(frozen=True)
class ClusterAccess:
    """One context of one kubeconfig, and the namespace the command works in."""

    config: SingleConfig
    namespace: str

    def client(self) -> AsyncClient:
        return AsyncClient(config=self.config, namespace=self.namespace)

    def pod_proxy_url(self, pod: str, port: int) -> str:
        """The base URL of `pod`:`port` through the apiserver's pod proxy."""
        server = self.config.cluster.server.rstrip("/")
        return f"{server}/api/v1/namespaces/{self.namespace}/pods/{pod}:{port}/proxy"

    def proxied_http(self) -> httpx.AsyncClient:
        """An httpx client whose requests go through the apiserver with this context's credentials (token,
        client certificate or exec plugin: whatever lightkube supports), for URLs from `pod_proxy_url`."""
        kube_http = kube_http_client(self.config, ConnectionParams(timeout=httpx2.Timeout(60)))
        return httpx.AsyncClient(transport=_ThroughApiserver(kube_http))


def cluster_access(kubeconfig: str | None, context: str | None, namespace: str | None) -> ClusterAccess:
    """The context and namespace kubectl would use with the same flags and environment."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if path:
            config = KubeConfig.from_file(path.split(os.pathsep)[0])
        elif Path("~/.kube/config").expanduser().exists():
            config = KubeConfig.from_file(Path("~/.kube/config").expanduser())
        else:
            config = KubeConfig.from_service_account()
        single = config.get(context_name=context)
    except (ConfigError, OSError) as error:
        where = path or "~/.kube/config or a pod's service account"
        raise NoCluster(f"no cluster to talk to ({where}): {error}") from error
    if single is None:
        raise NoCluster(f"no context {context!r} in {path}" if context else f"no current context in {path}")
    return ClusterAccess(single, namespace or single.namespace)


class _ThroughApiserver(httpx.AsyncBaseTransport):
    """httpx requests sent by lightkube's client (httpx2), so the probe's code (httpx) keeps its error handling:
    a transport failure here is an httpx.TransportError there."""

    def __init__(self, kube_http: httpx2.AsyncClient) -> None:
        self._kube_http = kube_http

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            response = await self._kube_http.request(
                request.method, str(request.url), content=await request.aread(),
                headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")},
                timeout=httpx2.Timeout(timeout) if timeout else httpx2.USE_CLIENT_DEFAULT)
        except httpx2.TimeoutException as error:
            raise httpx.ReadTimeout(str(error), request=request) from error
        except httpx2.HTTPError as error:
            raise httpx.ConnectError(f"{type(error).__name__}: {error}", request=request) from error
        return httpx.Response(response.status_code, headers=[(k, v) for k, v in response.headers.items()
                                                             if k.lower() not in ("content-encoding",
                                                                                  "transfer-encoding")],
                              content=response.content, request=request)

    async def aclose(self) -> None:
        await self._kube_http.aclose()


async def sd_events(client: AsyncClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events posted on SD `name`, oldest first."""
    events = [event.to_dict() async for event in client.list(
        Event, namespace=namespace, fields={"involvedObject.name": name, "involvedObject.kind": KIND})]
    return sorted(events, key=_event_time)


def _event_time(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               (event.get("metadata") or {}).get("creationTimestamp") or "")


async def sd_changes(client: AsyncClient, namespace: str, name: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(ADDED, MODIFIED or DELETED; the SD) each time the apiserver reports a change to it: a watch of that one
    name, which lightkube resumes when the connection drops."""
    async for kind, obj in client.watch(SpeculativeDeploymentResource, namespace=namespace,
                                        fields={"metadata.name": name}):
        yield kind, obj.to_dict()


async def set_retry(client: AsyncClient, namespace: str, name: str, value: str) -> None:
    """Merge-patch the retry annotation: the operator acts on a value it has not seen (never on spec)."""
    await client.patch(SpeculativeDeploymentResource, name, {"metadata": {"annotations": {ANNOTATION_RETRY: value}}},
                       namespace=namespace, patch_type=PatchType.MERGE)
