"""Write a CDI spec (Container Device Interface, spec version 0.6.0) for this node's cards.

Each card is a device of kind ``egpu.io/gpu``, named both by its index and by its UUID
(``egpu.io/gpu=0``, ``egpu.io/gpu=GPU-...``); its edits add its device node ``/dev/nvidia<i>``
and ``EGPU_CDI_CARD_<i>=<uuid>`` to the environment.
The spec-wide edits, applied whenever one of its devices is injected, add the control device
nodes and the egpu runtime hook as a ``createRuntime`` hook, which then installs the interposer
and the container's share (docs/node.md). Cards come from NVML (``--nvml-library`` to choose
the library) or from an inventory file (``--inventory``: the ``egpu.io/inventory`` JSON).
The spec is built by ``node_agent.cdi.cdi_spec``, as the node agent's own (which the agent
writes to ``/var/run/cdi/egpu.json`` itself); the file is replaced atomically.

Exit status: 0 written, 2 cards or output unavailable.
"""

from __future__ import annotations

import argparse
import sys

from egpu.contract import HOST_HOOK_PATH
from egpu.records import Card, Inventory, RecordError
from node_agent.cdi import cdi_spec, spec_text, write_spec

COMMAND = "cdi"
HELP = "write a CDI spec (egpu.io/gpu devices + the egpu runtime hook)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``egpu cdi generate [--output FILE] [--inventory FILE] [--nvml-library PATH]
    [--hook PATH] [--no-device-nodes]``."""
    parser.add_argument("action", choices=("generate",), help="what to do")
    parser.add_argument("--output", "-o", default="-",
                        help="file to write (e.g. /etc/cdi/egpu.json); '-' for stdout")
    parser.add_argument("--inventory", help="read cards from an egpu.io/inventory JSON file")
    parser.add_argument("--nvml-library", help="path of libnvidia-ml.so.1 to use")
    parser.add_argument("--hook", default=HOST_HOOK_PATH, help="host path of egpu-hook")
    parser.add_argument("--no-device-nodes", action="store_true",
                        help="no /dev/nvidia* nodes (a fake driver, tests)")


def _cards(args: argparse.Namespace) -> tuple[Card, ...]:
    if args.inventory:
        with open(args.inventory, encoding="utf-8") as handle:
            return Inventory.decode(handle.read()).cards
    from node_agent import discovery  # NVML only when asked for

    if args.nvml_library:
        discovery.use_library(args.nvml_library)
    return discovery.discover()


def run(args: argparse.Namespace) -> int:
    """Generate the spec and write it; 0 on success, 2 when cards or output fail."""
    try:
        cards = _cards(args)
    except (OSError, RecordError, RuntimeError) as exc:
        print(f"egpu cdi: cannot read the cards: {exc}", file=sys.stderr)
        return 2
    present = (lambda _path: False) if args.no_device_nodes else (lambda _path: True)
    text = spec_text(cdi_spec(cards, args.hook, present))
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_spec(args.output, text)
    except OSError as exc:
        print(f"egpu cdi: {args.output}: {exc}", file=sys.stderr)
        return 2
    return 0
