"""Create the webhook's certificates and put the CA into its configuration.

  egpu certs create --service egpu-webhook --namespace egpu-system --out DIR
                    [--days N] [--key-type ecdsa-p256|rsa-2048] [--extra-san NAME ...]
      writes DIR/ca.crt, ca.key, tls.crt, tls.key (a serving certificate for the Service's
      DNS names: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local, plus each --extra-san,
      e.g. 127.0.0.1 or localhost).

  egpu certs inject-ca --ca DIR/ca.crt --in manifests/webhook/mutatingwebhook.yaml [--out F]
      prints (or writes to F) the manifest with clientConfig.caBundle set on every webhook;
      with --kubeconfig, patches the live MutatingWebhookConfiguration --name instead.

Exit status: 0 ok, 2 bad arguments or I/O error.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from certs.inject import InjectError, inject_ca_live, inject_ca_text
from certs.issue import (
    DEFAULT_DAYS,
    KEY_TYPES,
    create_ca,
    create_serving,
    service_names,
    write_bundle,
)

COMMAND = "certs"
HELP = "create the webhook's certificates; put the CA into its configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``create`` and ``inject-ca`` subcommands."""
    sub = parser.add_subparsers(dest="certs_command", required=True, metavar="SUBCOMMAND")
    create = sub.add_parser("create", help="create a CA and a serving certificate")
    create.add_argument("--service", default="egpu-webhook", help="Service name")
    create.add_argument("--namespace", default="egpu-system", help="Service namespace")
    create.add_argument("--out", required=True, help="output folder")
    create.add_argument("--days", type=int, default=DEFAULT_DAYS, help="validity, days")
    create.add_argument("--key-type", choices=KEY_TYPES, default=KEY_TYPES[0])
    create.add_argument("--extra-san", action="append", default=[], metavar="NAME",
                        help="another DNS name or IP address (repeatable)")
    inject = sub.add_parser("inject-ca", help="set caBundle in the webhook configuration")
    inject.add_argument("--ca", required=True, help="CA certificate (PEM)")
    inject.add_argument("--in", dest="input", help="manifest YAML ('-' for stdin)")
    inject.add_argument("--out", help="write here instead of stdout")
    inject.add_argument("--kubeconfig", help="patch the live object through this kubeconfig")
    inject.add_argument("--context", help="kubeconfig context")
    inject.add_argument("--name", default="egpu-webhook",
                        help="live MutatingWebhookConfiguration name (with --kubeconfig)")


def _create(args: argparse.Namespace) -> int:
    names = [*service_names(args.service, args.namespace), *args.extra_san]
    try:
        ca = create_ca(f"{args.service}.{args.namespace} CA", args.days + 1, args.key_type)
        serving = create_serving(ca, names, args.days, args.key_type)
        paths = write_bundle(args.out, ca, serving)
    except (ValueError, OSError) as exc:
        print(f"egpu certs create: {exc}", file=sys.stderr)
        return 2
    for path in paths.values():
        print(path)
    return 0


def _inject(args: argparse.Namespace) -> int:
    try:
        with open(args.ca, "rb") as handle:
            ca_pem = handle.read()
        if args.kubeconfig:
            count = inject_ca_live(args.name, ca_pem, args.kubeconfig, args.context)
            print(f"patched {count} webhook(s) of MutatingWebhookConfiguration {args.name}")
            return 0
        if not args.input:
            print("egpu certs inject-ca: --in FILE (or --kubeconfig) is required",
                  file=sys.stderr)
            return 2
        if args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input, encoding="utf-8") as handle:
                text = handle.read()
        result = inject_ca_text(text, ca_pem)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(result)
        else:
            sys.stdout.write(result)
    except (InjectError, OSError, yaml.YAMLError) as exc:
        print(f"egpu certs inject-ca: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the Kubernetes client's errors (ApiException, config errors)
        print(f"egpu certs inject-ca: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to ``create`` or ``inject-ca``; return the exit status."""
    return _create(args) if args.certs_command == "create" else _inject(args)
