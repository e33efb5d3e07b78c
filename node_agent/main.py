"""``egpu-node-agent``: wiring of discovery, inventory, pods, device plugin and metrics.

Threads: the pod watch (``pods.watch_pods``), the XID health watcher, the device plugin's
keep-registered loop, with ``--dra`` the DRA kubelet plugin's (``draplugin``), the inventory
heartbeat (main thread; it also rewrites the CDI spec
``<--cdi-spec-dir>/egpu.json`` when the cards or their device nodes changed, and with ``--dra``
brings the node's ResourceSlices of the DRA driver gpu.egpu.io to the healthy cards) and the
metrics HTTP server.
Options come from the command line, with environment defaults for the DaemonSet:
``NODE_NAME`` (downward API), ``EGPU_CLUSTER_CONFIG`` (the config YAML).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from egpu.config import ConfigError, load_config_keeping
from egpu.config_metric import config_info
from egpu.contract import (
    ALLOCATION_MODE_DRA,
    ALLOCATION_MODE_EXTENDER,
    CONFIG_FILE_ENV,
    DRA_DRIVER,
    ENV_NODE_PRIVATE_DIR,
    ENV_RUNTIME_DIR,
    HOST_HOOK_PATH,
    HOST_INSTALL_DIR,
    NODE_PRIVATE_DIR,
    RUNTIME_DIR,
)
from egpu.records import Card, NodeUsage
from node_agent import discovery, inventory
from node_agent.cdi import DEFAULT_SEARCH_DIRS, DEFAULT_SPEC_DIR, CdiPublisher
from node_agent.deviceplugin.service import (
    DEFAULT_PLUGIN_DIR,
    AgentFunctions,
    EgpuDevicePlugin,
    PluginServer,
)
from node_agent.devnodes import HOST_DEV, missing_card_nodes, present_under
from node_agent.draplugin.service import DEFAULT_KUBELET_DIR
from node_agent.health import HealthWatcher
from node_agent.metrics.card_region import CardRegion, scan_cards
from node_agent.metrics.collector import EgpuCollector, Sources, regions_under
from node_agent.metrics.region import scan
from node_agent.pods import PodCatchUp, PodRegistry, list_node_pods, watch_pods
from node_agent.usage import node_usage

log = logging.getLogger("egpu-node-agent")
CONFIG_KEEP = "config"  # <private dir>/config/: the last good config, kept for restarts


class CardState:
    """The node's cards with their current health (thread-safe): a card is unhealthy after a
    critical XID (until the agent restarts) and while one of its device nodes is missing."""

    def __init__(self, cards: tuple[Card, ...]) -> None:
        self._cards = cards
        self._no_node: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def get(self) -> tuple[Card, ...]:
        with self._lock:
            return tuple(replace(c, healthy=False) if c.uuid in self._no_node else c
                         for c in self._cards)

    def set_missing_nodes(self, missing: dict[str, tuple[str, ...]]) -> bool:
        """The cards whose device nodes are missing now (``devnodes.missing_card_nodes``);
        logs each change. Returns True when that changed which cards are unhealthy."""
        uuids = frozenset(missing)
        with self._lock:
            before, self._no_node = self._no_node, uuids
            indexes = {c.uuid: c.index for c in self._cards}
        for uuid in sorted(uuids - before):
            log.warning("card %s (index %d): device node %s missing on this node: marked "
                        "unhealthy", uuid, indexes.get(uuid, -1), ", ".join(missing[uuid]))
        for uuid in sorted(before - uuids):
            log.warning("card %s: its device nodes are back: healthy again", uuid)
        return uuids != before

    def mark_unhealthy(self, uuid: str) -> bool:
        """Returns True when the card was healthy until now."""
        with self._lock:
            changed = any(c.uuid == uuid and c.healthy for c in self._cards)
            self._cards = tuple(replace(c, healthy=False) if c.uuid == uuid else c
                                for c in self._cards)
            return changed


def parser() -> argparse.ArgumentParser:
    """The command line (see ``egpu-node-agent --help``)."""
    p = argparse.ArgumentParser(prog="egpu-node-agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME)")
    p.add_argument("--config", default=os.environ.get(CONFIG_FILE_ENV),
                   help="egpu config YAML (default: $EGPU_CLUSTER_CONFIG, else built-in)")
    p.add_argument("--nvml-library", help="path of libnvidia-ml.so.1 (default: loader search)")
    p.add_argument("--plugin-dir", default=DEFAULT_PLUGIN_DIR, help="kubelet device-plugin dir")
    p.add_argument("--runtime-dir", default=os.environ.get(ENV_RUNTIME_DIR, RUNTIME_DIR))
    p.add_argument("--private-dir",
                   default=os.environ.get(ENV_NODE_PRIVATE_DIR, NODE_PRIVATE_DIR))
    p.add_argument("--metrics-port", type=int, default=9400, help="0 disables the exporter")
    p.add_argument("--heartbeat-seconds", type=float, default=30.0)
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="what the agent logs (default: %(default)s)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    p.add_argument("--no-kubernetes", action="store_true",
                   help="no API server: device plugin and metrics only (tests)")
    p.add_argument("--cdi-spec-dir", default=DEFAULT_SPEC_DIR,
                   help="folder to write the CDI spec egpu.json into; Allocate then names "
                        "the cards as CDI devices. '' disables CDI (default: %(default)s)")
    p.add_argument("--cdi-search-dirs", default=",".join(DEFAULT_SEARCH_DIRS),
                   help="comma list of the runtime's CDI spec folders, where an nvidia.com/gpu "
                        "spec (nvidia-ctk cdi generate) is looked for (default: %(default)s)")
    p.add_argument("--hook", default=HOST_HOOK_PATH,
                   help="host path of egpu-hook, named in the CDI spec (default: %(default)s)")
    p.add_argument("--dev-root", default=os.environ.get("EGPU_DEV_ROOT", HOST_DEV),
                   help="where this agent sees the host's /dev: a card whose device node is "
                   "missing there is unhealthy (default: $EGPU_DEV_ROOT, else /dev)")
    p.add_argument("--dra", action="store_true",
                   help="publish the node's ResourceSlices of the DRA driver gpu.egpu.io (one "
                        "device per healthy card, consumable memory and cores) at each beat, "
                        "and serve its kubelet plugin (prepares the claims' shares; needs the "
                        "CDI spec); needs Kubernetes >= 1.34 with DRAConsumableCapacity")
    p.add_argument("--device-plugin", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the kubelet device plugin egpu.io/gpu (the scheduler's shares). "
                        "--no-device-plugin (needs --dra) makes a node of the DRA pool: no "
                        "device plugin, and the node says egpu.io/allocation-mode: dra, so the "
                        "scheduler places no share on it and no card is booked twice "
                        "(default: serve it)")
    p.add_argument("--dra-kubelet-dir", default=DEFAULT_KUBELET_DIR,
                   help="with --dra: the kubelet's root folder, whose plugins_registry/ the "
                        "DRA kubelet plugin registers in and plugins/gpu.egpu.io/ it serves "
                        "in (default: %(default)s)")
    p.add_argument("--pod-name", default=os.environ.get("POD_NAME", ""),
                   help="the agent's own pod (downward API): when it stops because its "
                        "DaemonSet is being deleted, it removes egpu from the node "
                        "(node_agent.uninstall; default: $POD_NAME, '' never removes)")
    p.add_argument("--pod-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="its namespace (default: $POD_NAMESPACE)")
    p.add_argument("--install-dir", default=HOST_INSTALL_DIR,
                   help="the host's egpu install folder (hook, interposer) as the agent sees "
                        "it; emptied when egpu is removed (default: %(default)s)")
    p.add_argument("--dra-memory-oversubscription", action="store_true",
                   help="with --dra: offer each card's memory x the config's "
                        "memoryOversubscriptionRatio, for every claim on this node "
                        "(default: the card's memory)")
    return p


def hook_args(runtime_dir: str, private_dir: str) -> list[str]:
    """The hook's options for the CDI spec: the agent's folders where they are not the
    hook's defaults (the hook runs on the host with its defaults otherwise)."""
    out: list[str] = []
    if os.path.abspath(runtime_dir) != RUNTIME_DIR:
        out += ["--runtime-dir", os.path.abspath(runtime_dir)]
    if os.path.abspath(private_dir) != NODE_PRIVATE_DIR:
        out += ["--private-dir", os.path.abspath(private_dir)]
    return out


def _core_v1(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(kubeconfig)
    else:
        config.load_incluster_config()
    return client.CoreV1Api()


def run(argv: Sequence[str] | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT; returns the exit status (2: bad options or
    no NVML). ``egpu-node-agent uninstall ...`` is the chart's pre-delete hook instead
    (node_agent.uninstall)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["uninstall"]:
        from node_agent import uninstall as removal

        return removal.main(argv[1:])
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    if not args.node_name:
        print("egpu-node-agent: --node-name or NODE_NAME is required", file=sys.stderr)
        return 2
    if not args.device_plugin and not args.dra:
        print("egpu-node-agent: --no-device-plugin needs --dra (a node agent serves the device "
              "plugin, the DRA kubelet plugin, or both)", file=sys.stderr)
        return 2
    try:
        loaded = load_config_keeping(args.config, os.path.join(args.private_dir, CONFIG_KEEP))
        config = loaded.config
        if loaded.error:
            log.error("config: %s; running on the last good config (generation %s) until the "
                      "config is fixed", loaded.error, loaded.generation)
        if args.nvml_library:
            discovery.use_library(args.nvml_library)
        cards = CardState(discovery.with_driver_limits(discovery.discover()))
        discovery.write_driver_limits(args.private_dir, cards.get())
    except (ConfigError, OSError, discovery.DiscoveryError) as exc:
        print(f"egpu-node-agent: {exc}", file=sys.stderr)
        return 2
    log.info("found %d cards: %s", len(cards.get()), ", ".join(c.uuid for c in cards.get()))
    device_node = present_under(args.dev_root)
    cards.set_missing_nodes(missing_card_nodes(cards.get(), device_node))
    stop = threading.Event()
    heartbeat_now = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        heartbeat_now.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    core_v1 = None if args.no_kubernetes else _core_v1(args.kubeconfig)
    uninstaller = None
    if core_v1 is not None and args.pod_name and args.pod_namespace:
        from node_agent.uninstall import Uninstaller

        uninstaller = Uninstaller.from_pod(core_v1, args.pod_namespace, args.pod_name)
    cdi = None
    if args.cdi_spec_dir:
        cdi = CdiPublisher(args.cdi_spec_dir,
                           [d.strip() for d in args.cdi_search_dirs.split(",") if d.strip()],
                           args.hook, hook_args(args.runtime_dir, args.private_dir),
                           present=device_node)
        cdi.publish(cards.get())  # before the plugin registers: Allocate names its devices
    dra_driver = None
    if args.dra and core_v1 is not None and cdi is not None:
        from node_agent.draplugin.driver import DraDriver
        from node_agent.draplugin.kube import KubeReader
        from node_agent.draplugin.service import KubeletPlugin
        from node_agent.draplugin.state import ClaimStore

        dra_driver = DraDriver(args.node_name, cards.get, KubeReader(core_v1),
                               ClaimStore(args.private_dir), cdi, args.runtime_dir,
                               config.low_priority_floor_percent)
        kubelet_plugin = KubeletPlugin(dra_driver, args.dra_kubelet_dir)
        threading.Thread(target=kubelet_plugin.run, args=(stop,), daemon=True,
                         name="egpu-dra").start()
    elif args.dra and cdi is None:
        log.warning("--dra without CDI (--cdi-spec-dir ''): no DRA kubelet plugin, only the "
                    "ResourceSlices")
    registry = PodRegistry(args.node_name, config, args.private_dir, args.runtime_dir,
                           owned_elsewhere=dra_driver.owns_pod if dra_driver else None,
                           init_claim_folders=dra_driver.init_only_folders if dra_driver
                           else None)
    catch_up = (PodCatchUp(registry, list_node_pods(core_v1, args.node_name))
                if core_v1 is not None else None)
    dra = None
    if args.dra and core_v1 is not None:
        from node_agent.dra import DraPublisher

        dra = DraPublisher(core_v1, args.node_name,
                           config.memory_oversubscription_ratio
                           if args.dra_memory_oversubscription else 1.0,
                           shares_per_card=config.shares_per_card)
    plugin = EgpuDevicePlugin(
        AgentFunctions(cards.get, registry.pending, registry.consume, catch_up=catch_up,
                       cdi_names=cdi.names if cdi is not None else None),
        config.shares_per_card, args.node_name)

    def unhealthy(uuid: str, xid: int) -> None:
        if cards.mark_unhealthy(uuid):
            plugin.notify()
            heartbeat_now.set()

    HealthWatcher([c.uuid for c in cards.get()], unhealthy).start(stop)
    server: PluginServer | None = None
    if args.device_plugin:
        server = PluginServer(plugin, args.plugin_dir)
        threading.Thread(target=server.run, args=(stop,), daemon=True, name="egpu-dp").start()
    mode = ALLOCATION_MODE_EXTENDER if args.device_plugin else ALLOCATION_MODE_DRA
    if core_v1 is not None:
        threading.Thread(target=watch_pods, args=(core_v1, registry, stop), daemon=True,
                         name="egpu-pods").start()
    last_beat: list[float] = []  # unix time of the last successful heartbeat

    def card_regions() -> dict[str, CardRegion]:
        return scan_cards(args.runtime_dir)

    if args.metrics_port:
        from prometheus_client import REGISTRY

        from node_agent.metrics import http
        from node_agent.metrics.window import UsageWindow

        config_info(REGISTRY, "node-agent", loaded)
        collector = EgpuCollector(Sources(
            args.node_name, cards.get,
            (lambda: {**registry.shares(), **dra_driver.shares()}) if dra_driver
            else registry.shares, regions_under(args.runtime_dir),
            discovery.memory_used_bytes, discovery.utilization_percent,
            card_regions=card_regions, heartbeat=lambda: last_beat[-1] if last_beat else None))
        REGISTRY.register(collector)
        # `kubectl egpu advise` without Prometheus reads this (node_agent/metrics/window.py)
        window = UsageWindow(collector)
        threading.Thread(target=window.run, args=(stop,), daemon=True,
                         name="egpu-usage-window").start()
        # ready once the kubelet has the slots (a roll's old agent stops only then)
        http.serve(args.metrics_port, lambda: server is None or server.serving,
                   usage_history=window.document)

    def usage() -> NodeUsage | None:
        try:
            return node_usage(cards.get(), scan(args.runtime_dir), card_regions(),
                              discovery.memory_used_bytes, discovery.utilization_percent,
                              time.monotonic_ns())
        except Exception as exc:  # never let a measurement stop the heartbeat
            log.warning("usage: %s", exc)
            return None

    while not stop.is_set():
        # device nodes come and go with the driver: their health is looked at every beat
        if cards.set_missing_nodes(missing_card_nodes(cards.get(), device_node)):
            plugin.notify()
        if cdi is not None:
            cdi.publish(cards.get())
        if core_v1 is not None:
            try:
                inventory.publish(core_v1, args.node_name, cards.get(), usage(), mode,
                                  f"{loaded.generation} {loaded.source}")
                last_beat[:] = [time.time()]
            except Exception as exc:  # the API server may be away; retry at the next beat
                log.warning("inventory heartbeat: %s", exc)
        if dra is not None:
            try:
                dra.publish(cards.get())
            except Exception as exc:  # as the heartbeat: retry at the next beat
                log.warning("ResourceSlices: %s", exc)
        heartbeat_now.wait(args.heartbeat_seconds)
        heartbeat_now.clear()
    if uninstaller is not None and uninstaller.removed():
        _remove_from_node(args, core_v1, cdi, dra)
    return 0


def _remove_from_node(args: argparse.Namespace, core_v1: Any, cdi: CdiPublisher | None,
                      dra: Any) -> None:
    """egpu is being removed (the agent's DaemonSet is going): take egpu off this node."""
    from node_agent.uninstall import cdi_files, clean_node

    folders = [args.runtime_dir, args.private_dir, args.install_dir]
    if args.dra:
        folders.append(os.path.join(args.dra_kubelet_dir, "plugins", DRA_DRIVER))
    left = clean_node(core_v1, args.node_name, folders,
                      cdi_files(cdi.spec_dir) if cdi is not None else [],
                      dra.withdraw if dra is not None else None)
    if left:
        log.error("egpu removed from node %s, but these are left: %s", args.node_name,
                  "; ".join(left))
    else:
        log.info("egpu removed from node %s: annotations, CDI specs, %s", args.node_name,
                 ", ".join(folders))


def main() -> None:
    """Console entry point ``egpu-node-agent``."""
    sys.exit(run())


if __name__ == "__main__":
    main()
