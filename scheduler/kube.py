"""The extender's Kubernetes API access: list+watch of nodes and pods, and bind's writes.

Uses the ``kubernetes`` package's ``ApiClient`` for configuration, authentication and its
connection pool, but sends requests and reads answers as plain JSON (no model classes):
faster, and the objects are the same dicts the extender gets from kube-scheduler. Blocking
calls run in worker threads; ``Watcher`` hands every event to the event loop with
``loop.call_soon_threadsafe`` so that ``ClusterState`` is only touched on the loop's thread.

Bind is ONE request: a Binding whose ``metadata.annotations`` carries ``egpu.io/allocation``
(the API server copies a Binding's annotations onto the pod in the write that sets
``spec.nodeName``).

Watch protocol (API conventions, "Efficient detection of changes"): list (paginated) to get
the state and a resourceVersion, then watch from it; events ADDED / MODIFIED / DELETED /
BOOKMARK; an ERROR event with code 410 (Gone), or any broken stream, means list again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from egpu.kube import KubeNode, KubeObject, KubePod
from scheduler.extender import BIND_CLIENT_SLACK_S, BIND_POST_MAX_S, BindError
from scheduler.state import ClusterState

log = logging.getLogger("egpu.scheduler.kube")

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
        next request pays a new TLS handshake, on both sides (the extender's binds did:
        bench/scheduling.py)."""
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


class Watcher:
    """Keeps a ClusterState in step with the API's nodes and pods (two daemon threads).

    ``synced`` is set once both first lists have been applied (a restart loses nothing: the
    whole state is rebuilt from these lists). Pods are listed after nodes are synced.
    """

    def __init__(self, api: RawApi, state: ClusterState, loop: asyncio.AbstractEventLoop) -> None:
        self.api = api
        self.state = state
        self.loop = loop
        self.synced = asyncio.Event()
        self._stop = threading.Event()
        self._nodes_synced = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the node and pod threads."""
        for name, path, replace, upsert, delete in (
            ("nodes", "/api/v1/nodes", self.state.replace_nodes, self.state.upsert_node,
             lambda obj: self.state.delete_node(KubeNode(obj).name)),
            ("pods", "/api/v1/pods", self.state.replace_pods, self.state.observe_pod,
             lambda obj: self.state.delete_pod(KubePod(obj).uid)),
        ):
            thread = threading.Thread(target=self._run, name=f"egpu-watch-{name}", daemon=True,
                                      args=(name, path, replace, upsert, delete))
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Ask the threads to end (they finish their current request first)."""
        self._stop.set()

    def running(self) -> list[str]:
        """The names of the threads still running (after ``stop``: those blocked in a read)."""
        return [t.name for t in self._threads if t.is_alive()]

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def _run(self, name: str, path: str, replace: Callable[[Any], None],
             upsert: Callable[[Any], None], delete: Callable[[Any], None]) -> None:
        while not self._stop.is_set():
            try:
                if name == "pods":
                    self._nodes_synced.wait()
                items, version = self.api.list_all(path)
                self._post(replace, items)
                if name == "nodes":
                    self._nodes_synced.set()
                else:
                    self._post(self.synced.set)
                log.info("listed %d %s at resourceVersion %s", len(items), name, version)
                while not self._stop.is_set():
                    gone = False
                    for event in self.api.watch(path, version):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            gone = obj.get("code") == 410
                            log.info("watch %s: %s", name, obj.get("message"))
                            break
                        version = KubeObject(obj).resource_version or version
                        if kind in ("ADDED", "MODIFIED"):
                            self._post(upsert, obj)
                        elif kind == "DELETED":
                            self._post(delete, obj)
                        if self._stop.is_set():
                            return
                    if gone:
                        break
            except Exception as exc:
                log.warning("watch %s failed (%s); listing again", name, exc)
                self._stop.wait(1.0)


class KubeApi:
    """``extender.BindApi`` over the API: reads and writes run in a thread pool."""

    def __init__(self, api: RawApi, workers: int = 16) -> None:
        self.api = api
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="egpu-api")

    async def _run(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, lambda: fn(*args, **kw))
        except ApiStatusError as exc:
            raise BindError(str(exc), exc.status) from exc
        except Exception as exc:
            raise BindError(f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when it does not exist (404)."""
        path = self._pod_path(namespace, name)
        try:
            pod = await self._run(self.api.json, "GET", path,
                                  timeout=BIND_POST_MAX_S + BIND_CLIENT_SLACK_S)
        except BindError as exc:
            if isinstance(exc.__cause__, ApiStatusError) and exc.__cause__.status == 404:
                return None
            raise
        if not isinstance(pod, dict):  # JSON of any shape until checked
            raise BindError(f"GET {path}: the answer is not an object")
        return pod

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None,
                   timeout_s: float = BIND_POST_MAX_S) -> None:
        """POST pods/<name>/binding with the pod's UID as a precondition.

        The API server sets ``spec.nodeName`` and merges the Binding's ``annotations`` into
        the pod's in one write (``BindingREST.setPodNodeAndMetadata``): one request, atomic.
        Bounded to ``timeout_s`` seconds on the server (its ``timeout`` query parameter) and
        BIND_CLIENT_SLACK_S more on the client: after a leader change the new leader's
        extender must never meet a bind of the old one landing late (kube-scheduler's lease:
        15 s, renew deadline 10 s), and the extender's whole bind ends within its budget.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self._run(self.api.json, "POST", self._pod_path(namespace, name) + "/binding",
                        query={"timeout": f"{timeout_s:.3f}s"}, body=body,
                        content_type="application/json",
                        timeout=timeout_s + BIND_CLIENT_SLACK_S)

    def close(self) -> None:
        """Stop the worker threads."""
        self.pool.shutdown(wait=False, cancel_futures=True)
