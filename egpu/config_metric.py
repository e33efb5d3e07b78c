"""``egpu_config_info``: which config each part runs (a Prometheus info-style gauge)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from egpu.config import LoadedConfig
from egpu.contract import METRIC_CONFIG_INFO


def config_info(registry: CollectorRegistry, part: str, loaded: LoadedConfig) -> Gauge:
    """Register ``egpu_config_info{part, generation, source} 1`` in ``registry``: the config
    generation the part runs, and whether it is the file's ("file") or, the file being bad,
    the last good one ("last-good", alert EgpuConfigNotApplied). Returns the gauge, for
    ``set_config_info`` on a part that reloads its config."""
    gauge = Gauge(METRIC_CONFIG_INFO, "The config a part runs: its generation (SHA-256 prefix "
                  "of the config text) and source (file, or last-good when the file is bad)",
                  ["part", "generation", "source"], registry=registry)
    set_config_info(gauge, part, loaded)
    return gauge


def set_config_info(gauge: Gauge, part: str, loaded: LoadedConfig) -> None:
    """The gauge says ``loaded``, and only it (one series per part)."""
    gauge.clear()
    gauge.labels(part, loaded.generation, loaded.source).set(1)
