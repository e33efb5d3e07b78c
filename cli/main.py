"""Entry point of the ``egpu`` command and of the ``kubectl egpu`` plugin.

Subcommands are the modules ``cli/*_cmd.py``, found at start-up: adding a command touches
no other file.
Exit status: 0 ok, 1 some input invalid, 2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _command_modules() -> list[str]:
    """Every ``cli/*_cmd.py``: each defines COMMAND, HELP, add_arguments(parser), run(args)."""
    package = Path(__file__).parent
    return sorted(f"cli.{m.name}" for m in pkgutil.iter_modules([str(package)])
                  if m.name.endswith("_cmd"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="egpu", description="egpu: share NVIDIA GPUs safely.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _command_modules():
        module = importlib.import_module(module_name)
        command = sub.add_parser(module.COMMAND, help=module.HELP, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``egpu`` with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`egpu top -o json | head`): not an error of ours; stdout is
        # pointed at /dev/null so that the interpreter's final flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


PLUGIN_COMMANDS = ("advise",)  # `kubectl egpu advise ...`; anything else is `egpu top`


def kubectl_plugin() -> int:
    """``kubectl egpu advise ...`` is ``egpu advise ...``; any other ``kubectl egpu ...`` is
    ``egpu top ...``."""
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in PLUGIN_COMMANDS:
        return main(argv)
    return main(["top", *argv])


if __name__ == "__main__":
    sys.exit(main())
