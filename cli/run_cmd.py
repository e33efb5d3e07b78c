"""Run a command under the interposer with a share, on a raw node (no Kubernetes).

Examples:
  egpu run --gpu-memory 4096 --gpu-cores 30 -- python train.py
  egpu run --gpu-memory-percentage 25 --priority low --name batch -- ./job

The share applies to every card the command sees (CUDA_VISIBLE_DEVICES as usual). Processes
started with the same --name share one accounting region, so their memory adds up to one cap,
and the command replaces egpu (exec). Without --name the region is the run's own
(``raw_run-<pid>``): egpu waits for the command, passes it SIGTERM and SIGHUP, removes the
folder when it ends and exits with its status (128 + N after signal N).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from egpu.contract import (
    ENV_COMPUTE_POLICY,
    ENV_CONFIG_PATH,
    ENV_CONTAINER_REGION,
    ENV_CORES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_MEMORY_OVERSUBSCRIPTION,
    ENV_MEMORY_PERCENTAGE,
    ENV_PRIORITY,
    ENV_RUNTIME_DIR,
    INTERPOSER_LIBRARY,
    INTERPOSER_PATH_IN_CONTAINER,
    MAX_SHARE_MIB,
    RUNTIME_DIR,
    container_region_path,
)

COMMAND = "run"
HELP = "run a command under the interposer with a GPU share (raw nodes)"
REPO = Path(__file__).resolve().parent.parent
REPO_LIBRARY = REPO / "libinterpose" / "build" / INTERPOSER_LIBRARY
PRELOAD_SEPARATORS = (" ", ":", "\t", "\n")  # where ld.so splits LD_PRELOAD
END_OF_OPTIONS = "--"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # sent to egpu alone: passed on
# The terminal sends these to the command too: egpu only outlives it, to remove its folder
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)
SIGNAL_EXIT_BASE = 128  # exit status of a command killed by signal N: 128 + N (as a shell)
EXEC_FAILED = 127


# An accounting group's name becomes one folder name under <runtime>/containers/
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _percent(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: 1..100") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: 1..100")
    return value


def _mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer; allowed: 1..{MAX_SHARE_MIB} (MiB)") from None
    if not 1 <= value <= MAX_SHARE_MIB:
        raise argparse.ArgumentTypeError(
            f"{value} is out of range; allowed: 1..{MAX_SHARE_MIB} (MiB)")
    return value


def _name(text: str) -> str:
    if not NAME_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; allowed: 1 to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder of the accounting)")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the share options and the command."""
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--gpu-memory", type=_mib, metavar="MiB", help="MiB per card")
    memory.add_argument("--gpu-memory-percentage", type=_percent, metavar="P",
                        help="%% of each card's memory")
    parser.add_argument("--gpu-cores", type=_percent, metavar="P", help="%% of each card's compute")
    parser.add_argument("--priority", choices=("high", "low"), default="high")
    parser.add_argument("--compute-policy", choices=("strict", "elastic"), default="strict")
    parser.add_argument("--memory-oversubscription", action="store_true")
    parser.add_argument("--name", type=_name, default=None,
                        help="accounting group: runs with one name share one cap (default: pid)")
    parser.add_argument("--library", type=Path, default=None,
                        help="the interposer (default: $EGPU_INTERPOSER, the build, /usr/lib/egpu)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD...")


def find_library(explicit: Path | None) -> Path | None:
    """The interposer to preload: explicit, $EGPU_INTERPOSER, this checkout's build, installed."""
    candidates = [explicit, os.environ.get("EGPU_INTERPOSER"), REPO_LIBRARY,
                  INTERPOSER_PATH_IN_CONTAINER]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def share_environment(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """The environment for the command: ``base`` plus LD_PRELOAD and the EGPU_* share."""
    env = dict(base)
    # the interposer reads a config file before the environment: an inherited path would
    # replace the share given here
    env.pop(ENV_CONFIG_PATH, None)
    runtime = env.get(ENV_RUNTIME_DIR, RUNTIME_DIR)
    name = args.name or f"run-{os.getpid()}"
    env[ENV_CONTAINER_REGION] = container_region_path(f"raw_{name}", str(Path(runtime)))
    memory = args.gpu_memory_percentage or 100
    if args.gpu_memory is not None:
        env[ENV_MEMORY_LIMIT_MIB] = str(args.gpu_memory)
        env.pop(ENV_MEMORY_PERCENTAGE, None)
    else:
        env[ENV_MEMORY_PERCENTAGE] = str(memory)
        env.pop(ENV_MEMORY_LIMIT_MIB, None)
    env[ENV_CORES] = str(args.gpu_cores or 0)
    env[ENV_PRIORITY] = args.priority
    env[ENV_COMPUTE_POLICY] = args.compute_policy
    env[ENV_MEMORY_OVERSUBSCRIPTION] = "true" if args.memory_oversubscription else "false"
    return env


def run(args: argparse.Namespace) -> int:
    """Exec the command with the interposer preloaded; 2 when it cannot."""
    # only the "--" that ends egpu's own options: the command's own are its arguments
    command = args.command[1:] if args.command[:1] == [END_OF_OPTIONS] else args.command
    if not command:
        print("egpu run: no command given; usage: egpu run [share options] -- CMD...",
              file=sys.stderr)
        return 2
    library = find_library(args.library)
    if library is None:
        print(f"egpu run: the interposer {INTERPOSER_LIBRARY} was not found; build it with "
              f"`make native` or pass --library", file=sys.stderr)
        return 2
    if any(c in str(library) for c in PRELOAD_SEPARATORS):
        # ld.so splits LD_PRELOAD at these, with no escape: the command would run without
        # the interposer, unlimited
        print(f"egpu run: the interposer's path {str(library)!r} holds a space or a colon, "
              "which LD_PRELOAD cannot carry; allowed: a path without them (copy or link "
              "the library there and pass --library)", file=sys.stderr)
        return 2
    env = share_environment(args, dict(os.environ))
    region_dir = Path(env[ENV_CONTAINER_REGION]).parent
    try:
        region_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"egpu run: cannot create the accounting folder {region_dir}: {exc}; "
              f"set {ENV_RUNTIME_DIR} to a writable folder", file=sys.stderr)
        return 2
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library} {preload}".strip()
    if args.name is None:  # the run's own folder: nobody else will remove it
        return run_and_remove(command, env, region_dir)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"egpu run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return EXEC_FAILED
    return 0  # not reached


def run_and_remove(command: list[str], env: dict[str, str], region_dir: Path) -> int:
    """Run ``command`` to its end, then remove ``region_dir`` (the run's own accounting
    folder); returns its exit status (module docstring)."""
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            print(f"egpu run: cannot run {command[0]}: {exc}", file=sys.stderr)
            return EXEC_FAILED

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        # set after the start: an ignored signal would stay ignored in the command
        previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
        previous.update({s: signal.signal(s, lambda _n, _f: None) for s in TERMINAL_SIGNALS})
        try:
            status = child.wait()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return status if status >= 0 else SIGNAL_EXIT_BASE - status
    finally:
        shutil.rmtree(region_dir, ignore_errors=True)
