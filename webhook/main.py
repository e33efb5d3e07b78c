"""``egpu-webhook``: serve the admission webhook over HTTPS.

Usage: ``egpu-webhook --cert tls.crt --key tls.key [--port 8443] [--host 0.0.0.0]
[--config config.yaml] [--reload-interval 10] [--kubeconfig FILE] [--claim-grace-seconds
120] [--claim-sweep-interval-seconds 30]``. The config defaults to the file named by
``$EGPU_CLUSTER_CONFIG``, else built-in defaults. The certificate, key and config are re-read
when they change on disk. In DRA mode (``allocationMode: dra``) the webhook creates each GPU
pod's ResourceClaim through the Kubernetes API, and sweeps away the ones no pod can use
(``webhook.claimsweep``): with ``--kubeconfig``, else its service account (connecting only
when the config makes DRA pods or a pod asks for DRA). Exit status: 0 after SIGTERM/SIGINT,
2 for a bad config, certificate or key.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web

from egpu.config import ConfigError
from egpu.contract import CONFIG_FILE_ENV
from webhook.claimstore import ApiClaimStore
from webhook.claimsweep import DEFAULT_GRACE_S, DEFAULT_INTERVAL_S, ClaimSweeper
from webhook.server import DEFAULT_RELOAD_INTERVAL_S, ConfigSource, Settings, create_app
from webhook.tls import CertReloader


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``egpu-webhook``."""
    parser = argparse.ArgumentParser(prog="egpu-webhook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cert", required=True, help="serving certificate (PEM, chain)")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8443, help="port (default 8443)")
    parser.add_argument("--config", default=os.environ.get(CONFIG_FILE_ENV),
                        help=f"egpu config YAML (default ${CONFIG_FILE_ENV} or built-ins)")
    parser.add_argument("--reload-interval", type=float, default=DEFAULT_RELOAD_INTERVAL_S,
                        help="seconds between checks of the cert, key and config files")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig for DRA mode's API calls (default: in-cluster)")
    parser.add_argument("--config-keep-dir", default=None,
                        help="where the last good config is kept, for a restart on a bad one "
                             "(default: none kept)")
    parser.add_argument("--claim-grace-seconds", type=float, default=DEFAULT_GRACE_S,
                        help="DRA mode: a claim the webhook made is deleted once no pod can "
                             "use it and it is older than this (default %(default)s)")
    parser.add_argument("--claim-sweep-interval-seconds", type=float,
                        default=DEFAULT_INTERVAL_S,
                        help="DRA mode: seconds between two sweeps of those claims "
                             "(default %(default)s)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load config and TLS, serve until signalled."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ConfigSource(args.config, keep_dir=args.config_keep_dir)
    except (ConfigError, OSError) as exc:
        print(f"egpu-webhook: config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        tls = CertReloader(args.cert, args.key)
    except (ssl.SSLError, OSError) as exc:
        print(f"egpu-webhook: TLS {args.cert}, {args.key}: {exc}", file=sys.stderr)
        return 2
    store = ApiClaimStore(args.kubeconfig)
    settings = Settings(config=config, tls=tls, reload_interval_s=args.reload_interval,
                        claims=store, sweeper=ClaimSweeper(store, args.claim_grace_seconds),
                        sweep_interval_s=args.claim_sweep_interval_seconds)
    web.run_app(create_app(settings), host=args.host, port=args.port,
                ssl_context=tls.context, access_log=None, shutdown_timeout=5,
                print=lambda *_: logging.getLogger("webhook").info(
                    "serving https://%s:%d/mutate", args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
