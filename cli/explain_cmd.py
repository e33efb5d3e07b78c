"""Show, per pod template and container, how egpu reads pod specs and workload objects.

Reads YAML files (multi-document; Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
CronJob, List) or '-' for stdin. Exit status 1 when any input is invalid, 2 when a file
cannot be read or parsed.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from egpu.config import ConfigError, load_config_file
from egpu.explain import explain_objects, format_text

COMMAND = "explain"
HELP = "show how egpu reads pod specs and workloads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register FILE..., --output and --config."""
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files, '-' for stdin")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")
    parser.add_argument("--config", help="egpu config YAML (default: built-in defaults)")


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def run(args: argparse.Namespace) -> int:
    """Explain every file; print text or JSON; return 0, 1 (invalid input) or 2 (I/O)."""
    try:
        config = load_config_file(args.config)
    except (ConfigError, OSError) as exc:
        print(f"egpu explain: config {args.config}: {exc}", file=sys.stderr)
        return 2
    reports = []
    for path in args.files:
        try:
            documents = [d for d in yaml.safe_load_all(_read(path)) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            print(f"egpu explain: {path}: {exc}", file=sys.stderr)
            return 2
        for report in explain_objects(documents, config):
            reports.append({"file": path, **report})
    if args.output == "json":
        print(json.dumps(reports, indent=2))
    else:
        current = None
        for report in reports:
            if report["file"] != current:
                current = report["file"]
                print(f"# {current}")
            print(format_text([report]))
    return 0 if all(r["valid"] for r in reports) else 1
