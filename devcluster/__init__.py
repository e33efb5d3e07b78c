"""A local Kubernetes control plane with simulated GPU nodes, for tests and demos.

See docs/devcluster.md. Entry points for the CLI (``egpu dev-cluster``):

    devcluster.up(config: Config | None = None) -> ClusterInfo
    devcluster.down(state_dir: Path | str | None = None) -> list[str]
    devcluster.status(state_dir: Path | str | None = None) -> ClusterStatus
    devcluster.set_egpu_profile(info: ClusterInfo, egpu_profile: bool) -> ClusterInfo
        (restart only kube-scheduler, with or without the egpu-scheduler profile)
    devcluster.main(argv: list[str] | None = None) -> int      # ``python -m devcluster``
"""

from __future__ import annotations

from typing import Any

_CLUSTER_NAMES = (
    "AlreadyRunning",
    "ClusterInfo",
    "ClusterStatus",
    "Config",
    "DevClusterError",
    "default_state_dir",
    "down",
    "set_egpu_profile",
    "status",
    "up",
)


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m devcluster.build` does not import devcluster.build twice.
    if name in _CLUSTER_NAMES:
        from devcluster import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'devcluster' has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    # Lazy too: `python -m devcluster` runs devcluster.__main__ as __main__ (runpy warns when
    # the package imported it first), and `import devcluster` stays cheap.
    from devcluster.__main__ import main as _main

    return _main(argv)


__all__ = [
    "AlreadyRunning",
    "ClusterInfo",
    "ClusterStatus",
    "Config",
    "DevClusterError",
    "default_state_dir",
    "down",
    "main",
    "set_egpu_profile",
    "status",
    "up",
]
