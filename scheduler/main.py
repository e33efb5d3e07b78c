"""``egpu-extender``: the kube-scheduler extender process (wiring only).

    egpu-extender [--kubeconfig PATH] [--host 0.0.0.0] [--port 8888] [--config PATH]
                  [--metrics-host 0.0.0.0 --metrics-port 8889]

``--config``: the egpu YAML config (default: $EGPU_CLUSTER_CONFIG, else built-in defaults).
Lists and watches nodes and pods, then serves /filter, /prioritize, /bind, /healthz and
/metrics (see scheduler.app). With ``--metrics-port``, a second listener serves /metrics and
/healthz only: the deployment runs the extender beside kube-scheduler in one pod, verbs on
127.0.0.1, so that nothing else on the pod network can ask it to bind a pod. Exit status 2
for a bad config or kubeconfig, or a listener that cannot be opened.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator

from aiohttp import web
from kubernetes import config as k8s_config

from egpu.config import ConfigError, load_config_keeping
from egpu.config_metric import config_info
from egpu.contract import CONFIG_FILE_ENV
from scheduler.app import METRICS, make_app
from scheduler.extender import Extender
from scheduler.kube import KubeApi, RawApi, Watcher, load_client
from scheduler.state import ClusterState

log = logging.getLogger("egpu.scheduler")
SWITCH_INTERVAL_S = 0.0005


def _port(text: str) -> int:
    """A TCP port, 0..65535 (0: the metrics listener is off / any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; allowed: 0..65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port; allowed: 0..65535")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="egpu-extender", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=_port, default=8888, help="listen port (default 8888)")
    parser.add_argument("--metrics-host", default="0.0.0.0",
                        help="listen address of the metrics listener (default 0.0.0.0)")
    parser.add_argument("--metrics-port", type=_port, default=0,
                        help="a second listener for /metrics and /healthz only (default: none)")
    parser.add_argument("--config", default=os.environ.get(CONFIG_FILE_ENV),
                        help=f"egpu config YAML (default: ${CONFIG_FILE_ENV})")
    parser.add_argument("--config-keep-dir", default=None,
                        help="where the last good config is kept, for a restart on a bad one "
                             "(default: none kept)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace) -> web.Application:
    """The application with its watch threads and API client tied to its lifetime."""
    loaded = load_config_keeping(args.config, args.config_keep_dir)
    if loaded.error:
        log.error("config: %s; running on the last good config (generation %s) until the "
                  "config is fixed", loaded.error, loaded.generation)
    config = loaded.config
    state = ClusterState(config)
    api_client = load_client(args.kubeconfig)
    raw = RawApi(api_client)
    kube_api = KubeApi(raw)
    extender = Extender(state, config, kube_api)
    synced = asyncio.Event()

    async def watching(app: web.Application) -> AsyncIterator[None]:
        watcher = Watcher(raw, state, asyncio.get_running_loop())
        watcher.synced = synced
        watcher.start()

        async def expire() -> None:
            await synced.wait()
            # The first lists are long-lived: move them out of the collector's generations,
            # so that full collections (pauses of tens of ms at 1000s of nodes and pods) walk
            # only what changed since. Cycles are rare in the view (plain dicts and frozen
            # records, freed by reference counting when replaced).
            gc.collect()
            gc.freeze()
            while True:
                await asyncio.sleep(30)
                state.expire_reservations()

        sweeper = asyncio.create_task(expire())
        yield
        sweeper.cancel()
        watcher.stop()
        kube_api.close()
        api_client.close()

    app = make_app(extender, synced, cleanup_ctx=[watching], read_only_port=args.metrics_port)
    config_info(app[METRICS].registry, "extender", loaded)
    return app


def listeners(args: argparse.Namespace) -> list[socket.socket]:
    """The listening sockets: the verbs' (``--host``/``--port``), then the metrics one when
    ``--metrics-port`` is set. Raises OSError when one cannot be opened."""
    wanted = [(args.host, args.port)]
    if args.metrics_port:
        if args.metrics_port == args.port:
            raise OSError(f"--metrics-port {args.metrics_port} is --port; allowed: another port")
        wanted.append((args.metrics_host, args.metrics_port))
    socks: list[socket.socket] = []
    try:
        for host, port in wanted:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            socks.append(socket.create_server((host, port), family=family, backlog=1024))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def main(argv: list[str] | None = None) -> int:
    """Run the extender until interrupted."""
    args = parse_args(argv)
    # The event loop gives the GIL up in every socket call; a watch or API worker thread
    # that takes it then keeps it for the whole switch interval (5 ms by default) before the
    # loop may answer kube-scheduler again. 0.5 ms keeps filter/prioritize/bind latency low.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(args)
    except ConfigError as exc:
        print(f"egpu-extender: bad config: {exc}", file=sys.stderr)
        return 2
    except (k8s_config.ConfigException, OSError) as exc:
        print(f"egpu-extender: cannot reach the API (kubeconfig): {exc}", file=sys.stderr)
        return 2
    try:
        socks = listeners(args)
    except OSError as exc:
        print(f"egpu-extender: cannot listen: {exc}", file=sys.stderr)
        return 2
    web.run_app(app, sock=socks, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
