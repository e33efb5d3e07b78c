"""The webhook's Prometheus metrics, kept in a registry of their own (one per app).

- ``egpu_webhook_requests_total{result}``: requests to /mutate by result: ``allowed`` (no
  change), ``patched``, ``denied``, ``invalid`` (not an AdmissionReview: HTTP 400),
  ``too_large`` (HTTP 413), ``error`` (a bug: answered as a denial, see server.py).
- ``egpu_webhook_denials_total{reason}``: denials by kind (``invalid-request``, ``node-name``,
  ``privileged``, ``host-path``, ``reserved-path``, ``allocation``, ``claim``: DRA mode); one
  denial may count under several kinds.
- ``egpu_webhook_review_seconds``: time from the body being read to the answer being ready,
  seconds (histogram).
- ``egpu_webhook_claims_swept_total``: DRA mode: claims the webhook made that its sweeper
  deleted, no pod being able to use them (``webhook.claimsweep``).
- ``egpu_webhook_certificate_reloads_total{result}``: ``ok`` / ``error``.
- ``egpu_webhook_certificate_expiry_timestamp_seconds``: the served certificate's notAfter
  (Unix seconds).
- ``egpu_config_info{part="webhook", generation, source}``: the config the webhook runs
  (``egpu.config_metric``), set again on each reload: ``source="last-good"`` while the file
  is bad (alert EgpuConfigNotApplied). The webhook is the one part that reloads its config
  live, so it is often the first to see a ConfigMap edit.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from egpu.config import Config, LoadedConfig
from egpu.config_metric import config_info

WEBHOOK_PART = "webhook"  # the part label of egpu_config_info

LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class Metrics:
    """The collectors, registered in ``registry``."""

    registry: CollectorRegistry
    requests: Counter
    denials: Counter
    latency: Histogram
    cert_reloads: Counter
    cert_expiry: Gauge
    claims_swept: Counter
    config_info: Gauge


def new_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """Create the collectors in ``registry`` (default: a fresh one)."""
    registry = registry or CollectorRegistry()
    return Metrics(
        registry=registry,
        requests=Counter("egpu_webhook_requests", "Requests to /mutate by result",
                         ["result"], registry=registry),
        denials=Counter("egpu_webhook_denials", "Denied pods by kind of denial",
                        ["reason"], registry=registry),
        latency=Histogram("egpu_webhook_review_seconds", "Time to answer one AdmissionReview",
                          buckets=LATENCY_BUCKETS, registry=registry),
        cert_reloads=Counter("egpu_webhook_certificate_reloads", "Certificate reloads",
                             ["result"], registry=registry),
        cert_expiry=Gauge("egpu_webhook_certificate_expiry_timestamp_seconds",
                          "notAfter of the served certificate, Unix seconds", registry=registry),
        claims_swept=Counter("egpu_webhook_claims_swept",
                             "Claims made by the webhook and deleted once no pod could use them",
                             registry=registry),
        # the built-in defaults until the app starts and sets what its ConfigSource loaded
        config_info=config_info(registry, WEBHOOK_PART, LoadedConfig(
            Config(), "file", "defaults")),
    )
