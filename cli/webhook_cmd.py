"""Show what the admission webhook would answer for pods and workloads, without a cluster.

Reads YAML files (multi-document; Pods and the pod templates of Deployments, Jobs, CronJobs,
...; '-' for stdin) and prints, per pod template, the webhook's decision: the JSON Patch it
would apply, its warnings, or the denial message. Exit status 1 when any pod would be
denied, 2 when a file or the config cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from egpu.config import Config, ConfigError, load_config_file
from egpu.workloads import pod_templates
from webhook.review import Decision, decide

COMMAND = "webhook"
HELP = "show what the admission webhook would do to pods and workloads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register FILE..., --config and --output."""
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files, '-' for stdin")
    parser.add_argument("--config", help="egpu config YAML (default: built-in defaults)")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")


def _documents(path: str) -> list[Any]:
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _review(pod: dict[str, Any], namespace: str, config: Config) -> Decision:
    """The decision for creating ``pod`` in ``namespace``, as the API server would ask."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "egpu-webhook-cli", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace, "operation": "CREATE", "object": pod}}
    return decide(review, config)[2]


def run(args: argparse.Namespace) -> int:
    """Review every pod template; print text or JSON; 0, 1 (some denied) or 2 (I/O)."""
    try:
        config = load_config_file(args.config)
    except (ConfigError, OSError) as exc:
        print(f"egpu webhook: config {args.config}: {exc}", file=sys.stderr)
        return 2
    reports: list[dict[str, Any]] = []
    for path in args.files:
        try:
            documents = _documents(path)
        except (OSError, yaml.YAMLError) as exc:
            print(f"egpu webhook: {path}: {exc}", file=sys.stderr)
            return 2
        for document in documents:
            for template in pod_templates(document):
                pod = {"apiVersion": "v1", "kind": "Pod", **dict(template.pod)}
                decision = _review(pod, template.namespace, config)
                reports.append({"file": path, "object": template.label,
                                "allowed": decision.allowed, "patch": decision.patch,
                                "warnings": list(decision.warnings),
                                "denial": decision.message})
    if args.output == "json":
        print(json.dumps(reports, indent=2))
    else:
        for report in reports:
            if not report["allowed"]:
                print(f"{report['object']}: DENIED: {report['denial']}")
                continue
            state = "patched" if report["patch"] else "allowed, unchanged"
            print(f"{report['object']}: {state}")
            for op in report["patch"]:
                value = f" {json.dumps(op['value'])}" if "value" in op else ""
                source = f" from {op['from']}" if "from" in op else ""
                print(f"  {op['op']} {op['path']}{source}{value}")
            for warning in report["warnings"]:
                print(f"  warning: {warning}")
    return 0 if all(r["allowed"] for r in reports) else 1
