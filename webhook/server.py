"""The webhook's HTTP edge: an aiohttp app that maps AdmissionReviews to ``review.review``.

Routes:
- ``POST /mutate``: body an AdmissionReview (admission.k8s.io/v1), answer an AdmissionReview
  (HTTP 200). Not an AdmissionReview (bad JSON, wrong shape): HTTP 400, JSON
  ``{"reason": ...}`` naming the field. Integer literals too long to convert are kept as
  their digits (``egpu.podshape.decode_int``), so the review names them like any bad value.
  Body over ``max_body_bytes``: HTTP 413. In DRA mode an allowed GPU pod's own claim
  is created (``Settings.claims``, ``webhook.claimstore``) before the answer, except for a
  dry run (``sideEffects: NoneOnDryRun``); when it cannot be, the pod is denied (code 500,
  the reason in the message): a GPU pod fails closed, other pods never get here. A bug
  while reviewing a valid AdmissionReview is logged and answered as a denial (code 500 in
  the Status, HTTP 200), so that no body ever gets a 5xx and the pod is refused rather than
  admitted unchanged.
- ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 when a certificate
  and a config are loaded and the app is not shutting down, else 503.
- ``GET /metrics``: Prometheus text format (``webhook.metrics``).

``create_app(settings)`` builds the app; a ``cleanup_ctx`` runs the watcher that reloads the
certificate (``CertReloader.check``) and the config file when they change on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from egpu.config import Config, ConfigError, LoadedConfig, load_config_keeping
from egpu.config_metric import set_config_info
from egpu.podshape import decode_int
from webhook.claimstore import ClaimStore, ClaimStoreError
from webhook.claimsweep import DEFAULT_INTERVAL_S, ClaimSweeper, run_sweeper
from webhook.metrics import WEBHOOK_PART, Metrics, new_metrics
from webhook.review import (
    DENY_CLAIM,
    Decision,
    InvalidReview,
    decide,
    no_card_sizes,
    response_for,
)
from webhook.reviews import API_VERSION_V1
from webhook.tls import CertReloader, file_signature

log = logging.getLogger(__name__)

# The API server caps a request body at 3 MiB; an AdmissionReview wraps one object, so
# 4 MiB leaves room for the envelope.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_RELOAD_INTERVAL_S = 10.0


class ConfigSource:
    """The current egpu Config, and the file it came from (None: built-in defaults).

    ``check()`` reloads the file when its signature changes; an invalid new file is logged
    and the previous config kept. ``keep_dir``: where the last good config is kept, so that a
    webhook restarted on an invalid file runs on it (``egpu.config.load_config_keeping``)
    instead of failing every start.
    """

    def __init__(self, path: str | None = None, config: Config | None = None,
                 keep_dir: str | None = None) -> None:
        self.path = path
        self.keep_dir = keep_dir
        self._signature = file_signature(path) if path else None
        if config is not None:
            self.loaded = LoadedConfig(config, "file", "given")
            return
        loaded = load_config_keeping(path, keep_dir)
        if loaded.error:
            log.error("config: %s; running on the last good config (generation %s) until "
                      "the file is fixed", loaded.error, loaded.generation)
        self.loaded = loaded  # what egpu_config_info says (generation, file or last-good)

    @property
    def config(self) -> Config:
        """The config in use (the loaded one's)."""
        return self.loaded.config

    def check(self) -> bool:
        """Reload when the file changed; True when a new config is now in use."""
        if not self.path:
            return False
        signature = file_signature(self.path)
        if signature is None or signature == self._signature:
            return False
        try:
            loaded = load_config_keeping(self.path, self.keep_dir)
            if loaded.error:
                raise ConfigError(loaded.error)
        except (ConfigError, OSError) as exc:
            log.warning("config: keeping the current config; %s: %s", self.path, exc)
            self._signature = signature  # do not log again until it changes
            self.loaded = replace(self.loaded, source="last-good", error=str(exc))
            return False
        self._signature = signature
        self.loaded = loaded
        log.info("config: reloaded %s", self.path)
        return True


@dataclass
class Settings:
    """What ``create_app`` needs: the config source, the TLS reloader (None when TLS is
    terminated elsewhere, as in tests), limits, the watch interval (seconds) and, for DRA
    mode, the claim store."""

    config: ConfigSource = field(default_factory=ConfigSource)
    tls: CertReloader | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S
    metrics: Metrics = field(default_factory=new_metrics)
    ready: bool = True
    claims: ClaimStore | None = None  # DRA mode's API access; None: DRA pods are denied
    sweeper: ClaimSweeper | None = None  # deletes the claims no pod can use (DRA mode)
    sweep_interval_s: float = DEFAULT_INTERVAL_S
    _sweeping: asyncio.Task[None] | None = field(default=None, repr=False)

    def start_sweeping(self) -> None:
        """Run the claim sweeper from now on (once; nothing without a sweeper). Called in
        the event loop: when the app starts, whatever its config (claims of earlier pods,
        replicas or modes are still to be removed), and when the webhook creates a claim."""
        if self.sweeper is None or self._sweeping is not None:
            return
        metrics = self.metrics
        self._sweeping = asyncio.create_task(
            run_sweeper(self.sweeper, self.sweep_interval_s, metrics.claims_swept.inc),
            name="egpu-webhook-claim-sweep")

    async def stop_sweeping(self) -> None:
        """Cancel the sweeper's task, if it runs."""
        task, self._sweeping = self._sweeping, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


SETTINGS = web.AppKey("settings", Settings)


def _problem(status: int, reason: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"reason": reason}).encode(),
                        content_type="application/json")


def _uid_of(data: Any) -> str | None:
    request = data.get("request") if isinstance(data, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and uid else None


async def mutate(request: web.Request) -> web.Response:
    """POST /mutate: one AdmissionReview in, one out (see the module docstring)."""
    settings = request.app[SETTINGS]
    metrics = settings.metrics
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.requests.labels("too_large").inc()
        return _problem(413, f"body over {settings.max_body_bytes} bytes")
    started = time.perf_counter()
    try:
        # the API server sends UTF-8; integers too long to convert stay text (LongNumber)
        data = json.loads(body.decode("utf-8"), parse_int=decode_int)
    except (ValueError, RecursionError) as exc:
        metrics.requests.labels("invalid").inc()
        return _problem(400, f"body: not valid JSON ({str(exc)[:200]})")
    try:
        card_sizes = settings.claims.card_sizes_mib if settings.claims else no_card_sizes
        api_version, uid, decision = decide(data, settings.config.config, card_sizes)
        if decision.claims and decision.allowed and not _dry_run(data):
            decision = await _with_claims(settings, decision)
        answer = response_for(api_version, uid, decision)
        text = json.dumps(answer, separators=(",", ":"))
    except InvalidReview as exc:
        metrics.requests.labels("invalid").inc()
        return _problem(400, str(exc))
    except RecursionError:
        metrics.requests.labels("invalid").inc()
        return _problem(400, "body: nested too deeply")
    except Exception:  # a bug: refuse the pod instead of failing the request
        log.exception("review failed")
        metrics.requests.labels("error").inc()
        known_uid = _uid_of(data)
        if known_uid is None:
            return _problem(400, "body: not an AdmissionReview egpu can answer")
        version = data.get("apiVersion") if isinstance(data.get("apiVersion"), str) else ""
        answer = {"apiVersion": version or API_VERSION_V1, "kind": "AdmissionReview",
                  "response": {"uid": known_uid, "allowed": False, "status": {
                      "code": 500, "reason": "InternalError",
                      "message": "egpu webhook: internal error (see the webhook's log)"}}}
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
    metrics.latency.observe(time.perf_counter() - started)
    metrics.requests.labels(decision.result).inc()
    for reason in decision.denials:
        metrics.denials.labels(reason).inc()
    if not decision.allowed:
        log.info("denied %s: %s", uid, decision.message)
    return web.Response(body=text.encode(), content_type="application/json")


def _dry_run(data: Any) -> bool:
    """Whether the AdmissionReview is for a dry run (nothing may be created for it)."""
    return bool(isinstance(data, dict) and isinstance(data.get("request"), dict)
                and data["request"].get("dryRun") is True)


async def _with_claims(settings: Settings, decision: Decision) -> Decision:
    """``decision`` once its claims exist; a denial (code 500) naming the claim and the
    reason when one cannot be created (or no store is configured)."""
    store = settings.claims
    try:
        if store is None:
            raise ClaimStoreError("the webhook has no Kubernetes API access for DRA mode "
                                  "(egpu-webhook --kubeconfig, or its service account)")
        loop = asyncio.get_running_loop()
        for claim in decision.claims:
            await loop.run_in_executor(None, store.create_claim, claim)
        settings.start_sweeping()
    except ClaimStoreError as exc:
        log.warning("claim: %s", exc)
        return Decision(allowed=False, code=500, reason="InternalError", denials=(DENY_CLAIM,),
                        message=f"egpu webhook (DRA mode): {exc}; the pod is refused so that "
                                "its share is never placed without its claim")
    return decision


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 200 with a certificate (or no TLS) and a config loaded, else 503."""
    settings = request.app[SETTINGS]
    if settings.ready:
        return web.Response(text="ok")
    return web.Response(status=503, text="not ready")


async def metrics_handler(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text exposition of the app's registry."""
    body = generate_latest(request.app[SETTINGS].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _record_cert(settings: Settings) -> None:
    if settings.tls is not None and settings.tls.not_after is not None:
        settings.metrics.cert_expiry.set(settings.tls.not_after.timestamp())


def check_files(settings: Settings) -> None:
    """One watch step: reload the certificate and the config when they changed on disk."""
    if settings.tls is not None:
        result = settings.tls.check()
        if result.changed:
            settings.metrics.cert_reloads.labels("ok" if result.loaded else "error").inc()
            _record_cert(settings)
    before = settings.config.loaded
    settings.config.check()
    if settings.config.loaded != before:
        set_config_info(settings.metrics.config_info, WEBHOOK_PART, settings.config.loaded)


async def _watch(settings: Settings, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
    while True:
        await sleep(settings.reload_interval_s)
        try:
            check_files(settings)
        except Exception:  # keep watching whatever happens
            log.exception("file watch step failed")


async def _watcher_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: run the file watcher while the app runs; readiness off at shutdown."""
    settings = app[SETTINGS]
    _record_cert(settings)
    set_config_info(settings.metrics.config_info, WEBHOOK_PART, settings.config.loaded)
    task = asyncio.create_task(_watch(settings), name="egpu-webhook-watch")
    # whatever the config says now: claims made before (a pod's own allocation-mode, a
    # cluster moved back to extender mode, another replica) are this webhook's to remove
    settings.start_sweeping()
    yield
    settings.ready = False
    await settings.stop_sweeping()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(settings: Settings | None = None) -> web.Application:
    """The webhook app: routes, body size limit, file watcher (see the module docstring)."""
    settings = settings or Settings()
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.cleanup_ctx.append(_watcher_ctx)
    return app
