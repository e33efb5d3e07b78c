"""``egpu-hook``: the OCI hook that gives a container its egpu share.

Protocol: OCI runtime spec v1.0.2/v1.1 (config.md "POSIX-platform Hooks", runtime.md "State").
Install it as a ``createRuntime`` or ``prestart`` hook (or ``createContainer``); the runtime
passes the container state JSON on stdin. The hook reads the bundle's config.json, decides
(runtime_hook.plan) and, for a container with a share:

- writes ``<private>/hook/<pod-uid>_<container>/config.json`` (records.ContainerConfig) and
  ``ld.so.preload`` (the image's own lines, then the interposer), and creates the accounting
  folder ``<runtime>/containers/<pod-uid>_<container>/`` and ``<runtime>/cards/``;
- in the container's mount namespace, bind-mounts: the interposer at
  ``/usr/lib/egpu/libegpu_interpose.so`` (ro), the config at ``/run/egpu/config.json`` (ro),
  the preload list at ``/etc/ld.so.preload`` (ro), the accounting folder and the cards folder
  at the same paths under ``/var/run/egpu`` (rw).

Other containers pass untouched. Reruns are idempotent (existing mount points are kept).
Exit status: 0 done or untouched; 1 refused (the message on stderr names the container and
why; the runtime fails the container's creation with it); 2 the hook could not do its work
(it never lets a container with a share start without its cap).
"""

from __future__ import annotations

import os
import sys
import time

from egpu.contract import (
    ALLOCATIONS_SUBDIR,
    CARDS_SUBDIR,
    CONTAINER_CONFIG_PATH,
    CONTAINERS_SUBDIR,
    ENV_NODE_PRIVATE_DIR,
    ENV_RUNTIME_DIR,
    HOOK_SUBDIR,
    HOST_INTERPOSER_PATH,
    INTERPOSER_PATH_IN_CONTAINER,
    LD_SO_PRELOAD,
    NODE_PRIVATE_DIR,
    OCI_ANN_CONTAINER_TYPE,
    RUNTIME_DIR,
    allocation_file_name,
)
from runtime_hook.oci import OciError, Spec, State, load_spec, parse_state
from runtime_hook.plan import Apply, Inputs, Refuse, Skip, decide, identify, preload_text

TYPE_CHECKING = False  # startup time: no typing, argparse, dataclasses, json on this path
if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime_hook.shares import PodShares

ENV_INTERPOSER: str = "EGPU_INTERPOSER"  # host path of the interposer library (hook option)
ENV_HOOK_LOG: str = "EGPU_HOOK_LOG"  # file to append one line per run to (hook option)

USAGE = ("usage: egpu-hook [-h] [--runtime-dir RUNTIME_DIR] [--private-dir PRIVATE_DIR]\n"
         "                 [--interposer INTERPOSER] [--log LOG] [stage]\n")
OPTIONS = """
positional arguments:
  stage                 hook stage, for the log only (createRuntime, prestart, ...)

options:
  -h, --help            show this help message and exit
  --runtime-dir RUNTIME_DIR
                        host folder of the accounting regions (default $EGPU_RUNTIME_DIR,
                        else /var/run/egpu)
  --private-dir PRIVATE_DIR
                        host folder of allocation files and hook files (root only; default
                        $EGPU_NODE_PRIVATE_DIR, else /var/run/egpu-node)
  --interposer INTERPOSER
                        host path of libegpu_interpose.so (default $EGPU_INTERPOSER, else
                        /usr/local/egpu/lib/libegpu_interpose.so)
  --log LOG             append one line per run to this file (default $EGPU_HOOK_LOG)
"""


class Args:
    """The hook's options (argparse's command line, parsed by hand: argparse alone costs the
    hook more than its work)."""

    __slots__ = ("interposer", "log", "private_dir", "runtime_dir", "stage")

    def __init__(self) -> None:
        self.stage = "createRuntime"
        self.runtime_dir = os.environ.get(ENV_RUNTIME_DIR, RUNTIME_DIR)
        self.private_dir = os.environ.get(ENV_NODE_PRIVATE_DIR, NODE_PRIVATE_DIR)
        self.interposer = os.environ.get(ENV_INTERPOSER, HOST_INTERPOSER_PATH)
        self.log = os.environ.get(ENV_HOOK_LOG, "")


_VALUED = ("--runtime-dir", "--private-dir", "--interposer", "--log")


def _usage_error(message: str) -> SystemExit:
    sys.stderr.write(f"{USAGE}egpu-hook: error: {message}\n")
    return SystemExit(2)


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """The command line as argparse read it: ``[stage] [--opt VALUE | --opt=VALUE]...``, long
    options abbreviated to any unique prefix, ``-h``/``--help``. Raises SystemExit (2 on a
    usage error, 0 after the help)."""
    args = Args()
    words = list(sys.argv[1:] if argv is None else argv)
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            positional.extend(words[i:])
            break
        if word in ("-h", "--help") or (len(word) > 2 and "--help".startswith(word)
                                        and word.startswith("--")):
            sys.stdout.write(USAGE + "\n" + (__doc__ or "") + OPTIONS)
            raise SystemExit(0)
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, eq, value = word.partition("=")
        matches = [o for o in _VALUED if o.startswith(name)] if name.startswith("--") else []
        if name in _VALUED:
            matches = [name]
        if len(matches) != 1:
            if len(matches) > 1:
                raise _usage_error(f"ambiguous option: {name} could match "
                                   f"{', '.join(matches)}")
            raise _usage_error(f"unrecognized arguments: {word}")
        if not eq:
            if i >= len(words) or (words[i].startswith("-") and words[i] != "-"):
                raise _usage_error(f"argument {matches[0]}: expected one argument")
            value = words[i]
            i += 1
        setattr(args, matches[0][2:].replace("-", "_"), value)
    if len(positional) > 1:
        raise _usage_error(f"unrecognized arguments: {' '.join(positional[1:])}")
    if positional:
        args.stage = positional[0]
    return args


def load_shares(private_dir: str, pod_uid: str) -> tuple[PodShares | None, str | None]:
    """The pod's allocation file: (record, None), (None, None) when absent, or
    (None, reason) when unreadable or malformed. An absent file costs one open(2) and no
    import: most containers of a node have none."""
    if not pod_uid or "/" in pod_uid or pod_uid in (".", ".."):
        return None, None if not pod_uid else f"bad pod uid {pod_uid!r}"
    path = os.path.join(private_dir, ALLOCATIONS_SUBDIR, allocation_file_name(pod_uid))
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: {exc}"
    from runtime_hook.shares import ShareError, decode_pod_shares

    try:
        return decode_pod_shares(data), None
    except ShareError as exc:
        return None, f"{path}: {exc}"


def _write_file(path: str, data: bytes, mode: int) -> None:
    """Make ``path`` hold ``data`` with ``mode``. Unchanged content is left alone and a change
    is written in place (never replaced): the file may already be bind-mounted into the
    container (a rerun), and a mount keeps the inode it was made with."""
    try:
        with open(path, "rb") as handle:
            if handle.read() == data:
                return
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _make_dir(path: str, mode: int) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)


def apply(plan: Apply, state: State, spec: Spec, args: Args) -> None:
    """Write the host files and bind-mount them into the container (module docstring).
    Raises OSError (MountError, EscapeError) on failure."""
    from runtime_hook import mounts, rootfs  # ctypes and libc: only for containers with a share

    if not os.path.isfile(args.interposer):
        raise FileNotFoundError(f"interposer library {args.interposer} is missing on the node")
    region_host = os.path.join(args.runtime_dir, CONTAINERS_SUBDIR, plan.dir_name)
    cards_host = os.path.join(args.runtime_dir, CARDS_SUBDIR)
    private = os.path.join(args.private_dir, HOOK_SUBDIR, plan.dir_name)
    _make_dir(region_host, 0o777)  # every uid of the container writes its region
    _make_dir(cards_host, 0o1777)
    _make_dir(private, 0o711)
    config_host = os.path.join(private, "config.json")
    if plan.config is not None:
        _write_file(config_host, plan.config.encode().encode(), 0o444)
    preload_host = os.path.join(private, "ld.so.preload")
    root = spec.rootfs

    def inside() -> None:
        _write_file(preload_host, preload_text(rootfs.read_in_root(root, LD_SO_PRELOAD)), 0o444)
        rootfs.make_file_in_root(root, INTERPOSER_PATH_IN_CONTAINER)
        mounts.bind(args.interposer, root, INTERPOSER_PATH_IN_CONTAINER, read_only=True)
        if plan.config is not None:
            rootfs.make_file_in_root(root, CONTAINER_CONFIG_PATH)
            mounts.bind(config_host, root, CONTAINER_CONFIG_PATH, read_only=True)
        rootfs.make_file_in_root(root, LD_SO_PRELOAD)
        mounts.bind(preload_host, root, LD_SO_PRELOAD, read_only=True)
        region_in = f"{RUNTIME_DIR}/{CONTAINERS_SUBDIR}/{plan.dir_name}"
        rootfs.make_dirs_in_root(root, region_in)
        mounts.bind(region_host, root, region_in, read_only=False)
        cards_in = f"{RUNTIME_DIR}/{CARDS_SUBDIR}"
        rootfs.make_dirs_in_root(root, cards_in)
        mounts.bind(cards_host, root, cards_in, read_only=False)

    mounts.in_mount_namespace(state.pid, inside)


def _log(path: str, line: str) -> None:
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError:
        pass


def run(argv: Sequence[str] | None = None, stdin: bytes | None = None) -> int:
    """Run the hook; returns the exit status (module docstring)."""
    args = parse_args(argv)
    started = time.monotonic()
    try:
        state = parse_state(stdin if stdin is not None else sys.stdin.buffer.read())
        if state.annotations.get(OCI_ANN_CONTAINER_TYPE) == "sandbox":
            decision = Skip("sandbox container")  # the pause container: not even its bundle
            spec = None
        else:
            spec = load_spec(state.bundle)
    except OciError as exc:
        print(f"egpu-hook: {exc}", file=sys.stderr)
        return 2
    if spec is not None:
        annotations = {**spec.annotations, **state.annotations}
        pod_uid, _ = identify(spec.env, annotations)
        shares, shares_error = load_shares(args.private_dir, pod_uid)
        decision = decide(Inputs(state.id, spec.env, annotations, shares, shares_error))
    status = 0
    if isinstance(decision, Refuse):
        print(decision.message, file=sys.stderr)
        status = 1
    elif isinstance(decision, Apply) and spec is not None:
        try:
            apply(decision, state, spec, args)
        except OSError as exc:
            print(f"egpu-hook: container {state.id}: cannot install its egpu share: {exc}",
                  file=sys.stderr)
            status = 2
    if args.log:
        took = (time.monotonic() - started) * 1000
        what = decision.reason if isinstance(decision, Skip) else type(decision).__name__.lower()
        _log(args.log, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {args.stage} {state.id} "
                       f"{what} status={status} {took:.1f}ms")
    return status


def main() -> None:
    """Console entry point ``egpu-hook``."""
    sys.exit(run())


if __name__ == "__main__":
    main()
