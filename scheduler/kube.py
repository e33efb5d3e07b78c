"""JSON access to the Kubernetes API for egpu's tools and benchmarks (the scheduling, chaos,
pod-start and node-restart benchmarks, the kwok e2e modules): plain requests, paginated lists
and watches, without the ``kubernetes`` package's model classes.

Uses the package's ``ApiClient`` for configuration, authentication and its connection pool,
but sends requests and reads answers as plain JSON: faster, and the objects are the dicts the
rest of egpu reads (egpu.kube).

Watch protocol (API conventions, "Efficient detection of changes"): list (paginated) to get
the state and a resourceVersion, then watch from it; events ADDED / MODIFIED / DELETED /
BOOKMARK; an ERROR event with code 410 (Gone), or any broken stream, means list again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from egpu.kube import KubeObject

WATCH_TIMEOUT_S = 240  # server-side timeoutSeconds of one watch request
LIST_PAGE = 500


def load_client(kubeconfig: str | None, pool_size: int = 32) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else the in-cluster service account, else ~/.kube."""
    configuration = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return k8s_client.ApiClient(configuration)


class ApiStatusError(Exception):
    """A non-2xx answer: ``status`` (HTTP code) and the API's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class RawApi:
    """JSON requests through an ApiClient (blocking; call from worker threads)."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self.client = api_client

    def open(self, method: str, path: str, *, query: dict[str, Any] | None = None,
             body: Any = None, content_type: str | None = None,
             timeout: float | tuple[float, float] = 30.0) -> Any:
        """Send a request; returns the (unread) RESTResponse. Raises ApiStatusError.

        Read the answer to its end (``json``, ``.read()``): until then the connection stays
        the response's, and an answer dropped unread never goes back to the pool, so the
        next request pays a new TLS handshake, on both sides."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.client.param_serialize(
            method=method, resource_path=path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers, body=body, auth_settings=["BearerToken"])
        response = self.client.call_api(method, url, header_params=headers, body=body,
                                        _request_timeout=timeout)
        if not 200 <= response.status < 300:
            text = response.read().decode("utf-8", "replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise ApiStatusError(response.status, message)
        return response

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """``open`` and decode the JSON answer."""
        return json.loads(self.open(method, path, **kw).read())

    def list_all(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """All items of a collection (paginated) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.json("GET", path, query={"limit": LIST_PAGE, "continue": token})
            items.extend(page.get("items") or [])
            listing = KubeObject(page)  # a List: its metadata has continue, resourceVersion
            token = listing.metadata.get("continue")
            if not token:
                return items, listing.resource_version

    def watch(self, path: str, resource_version: str) -> Iterator[dict[str, Any]]:
        """Events of a watch from ``resource_version`` until the server ends it."""
        response = self.open("GET", path, query={
            "watch": "true", "resourceVersion": resource_version,
            "allowWatchBookmarks": "true", "timeoutSeconds": WATCH_TIMEOUT_S,
        }, timeout=(10.0, WATCH_TIMEOUT_S + 30.0))
        buffer = b""
        try:
            for chunk in response.response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.response.release_conn()
