"""``egpu-hook``: the OCI hook that gives a container its egpu share.

Protocol: OCI runtime spec v1.0.2/v1.1 (config.md "POSIX-platform Hooks", runtime.md "State").
Install it as a ``createRuntime`` or ``prestart`` hook (or ``createContainer``); the runtime
passes the container state JSON on stdin. The hook reads the bundle's config.json, decides
(runtime_hook.plan) and, for a container with a share:

- writes ``<private>/hook/<pod-uid>_<container>/config.json`` (records.ContainerConfig) and
  ``ld.so.preload`` (the image's own lines, then the interposer), creates the accounting
  folder ``<runtime>/containers/<pod-uid>_<container>/`` (0777; for a ResourceClaim's
  requests the claim's, shared by every container naming them:
  ``<runtime>/containers/claim-<claim-uid>_<requests>/``) and, for each of the
  container's cards, the card folder ``<runtime>/cards/<uuid>/`` (root's, 0755; a card region
  file of the previous version at that path is unlinked first: running containers keep their
  mapping). There it registers the share in the card's ``roster`` (egpu.card_roster: slot,
  priority, compute policy, booked cores, floor; the owner is the share's key, FNV-1a 64 of
  its container region path) and creates its file ``share-<owner>`` (4096 bytes, 0666). Every
  host path under the runtime and private folders is created and opened without following
  symlinks (runtime_hook.hostfs, egpu.card_roster): a symlink, FIFO or hard link planted
  there is refused, never followed;
- in the container's mount namespace, bind-mounts (from those file descriptors): the
  interposer at ``/usr/lib/egpu/libegpu_interpose.so`` (ro), the config at
  ``/run/egpu/config.json`` (ro), the preload list at ``/etc/ld.so.preload`` (ro), the
  accounting folder at the same path under ``/var/run/egpu`` (rw), and for each card its
  folder at ``/var/run/egpu/cards/<uuid>`` (ro: the roster and every co-tenant's share file
  can be read, none written, nothing created) with the share's own file on top of
  ``/var/run/egpu/cards/<uuid>/share-<owner>`` (rw, this container only). Nothing else of the
  host's ``/var/run/egpu`` is visible;
- on the cards ``<private>/driver-memory-limits.json`` names (the node agent found that their
  driver takes a per-container memory limit: egpu.driver_limits), sets the driver's hard
  limit for the container's cgroup to the share's memory, a second wall under the interposer
  (not for a share with memory oversubscription: its overflow is the interposer's to place).

As a ``poststop`` hook (stage argument ``poststop``; egpu's CDI spec installs it beside
``createRuntime``) it frees what a raw container's share held (runtime_hook.plan rule 6: no
pod, so no node agent cleans up after it): its entry in each card's roster and its share
files, and its folders ``<runtime>/containers/<oci-id>_raw`` and ``<private>/hook/<oci-id>_raw``
(``release_raw_share``). A pod's are the node agent's, at the pod's deletion.

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
    CLAIM_SHARES_SUBDIR,
    CONTAINER_CONFIG_PATH,
    CONTAINER_REGION_FILE,
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
    container_dir_name,
    is_file_name,
)
from runtime_hook.oci import OciError, Spec, State, load_spec, parse_state
from runtime_hook.plan import (
    RAW_CONTAINER,
    Apply,
    Inputs,
    Refuse,
    Skip,
    decide,
    identify,
    preload_text,
)

TYPE_CHECKING = False  # startup time: no typing, argparse, dataclasses on this path
if TYPE_CHECKING:
    from collections.abc import Sequence

    from egpu.records import PodShares
    from runtime_hook.plan import Decision

ENV_INTERPOSER: str = "EGPU_INTERPOSER"  # host path of the interposer library (hook option)
ENV_HOOK_LOG: str = "EGPU_HOOK_LOG"  # file to append one line per run to (hook option)
ENV_NVML_LIBRARY: str = "EGPU_NVML_LIBRARY"  # the host's NVML, for the driver's memory limit
DEFAULT_NVML_LIBRARY: str = "libnvidia-ml.so.1"
POSTSTOP_STAGE: str = "poststop"  # the stage argument that frees a raw container's share
CONFIG_FILE_NAME: str = "config.json"  # in <private>/hook/<dir>/
MAX_CONFIG_BYTES = 1 << 16  # the interposer reads at most 64 KiB of it (config.c)

USAGE = ("usage: egpu-hook [-h] [--runtime-dir RUNTIME_DIR] [--private-dir PRIVATE_DIR]\n"
         "                 [--interposer INTERPOSER] [--nvml-library NVML_LIBRARY]\n"
         "                 [--log LOG] [stage]\n")
OPTIONS = """
positional arguments:
  stage                 hook stage (createRuntime, prestart, ...; poststop frees a raw
                        container's share)

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
  --nvml-library NVML_LIBRARY
                        the host's NVML, loaded only on cards with the driver's memory limit
                        (default $EGPU_NVML_LIBRARY, else libnvidia-ml.so.1)
  --log LOG             append one line per run to this file (default $EGPU_HOOK_LOG)
"""


class Args:
    """The hook's options (argparse's command line, parsed by hand: argparse alone costs the
    hook more than its work)."""

    __slots__ = ("interposer", "log", "nvml_library", "private_dir", "runtime_dir", "stage")

    def __init__(self) -> None:
        self.stage = "createRuntime"
        self.runtime_dir = os.environ.get(ENV_RUNTIME_DIR, RUNTIME_DIR)
        self.private_dir = os.environ.get(ENV_NODE_PRIVATE_DIR, NODE_PRIVATE_DIR)
        self.interposer = os.environ.get(ENV_INTERPOSER, HOST_INTERPOSER_PATH)
        self.log = os.environ.get(ENV_HOOK_LOG, "")
        self.nvml_library = os.environ.get(ENV_NVML_LIBRARY, DEFAULT_NVML_LIBRARY)


_VALUED = ("--runtime-dir", "--private-dir", "--interposer", "--nvml-library", "--log")


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


def load_shares(private_dir: str, pod_uid: str,
                subdir: str = ALLOCATIONS_SUBDIR) -> tuple[PodShares | None, str | None]:
    """The pod's allocation file (``subdir`` CLAIM_SHARES_SUBDIR and a claim's UID: the
    claim's shares file): (record, None), (None, None) when absent, or (None, reason) when
    unreadable or malformed (egpu.records.PodShares.decode, the one decoder of the file). An
    absent file costs one open(2) and no import: most containers of a node have none."""
    if not is_file_name(pod_uid):
        what = "pod" if subdir == ALLOCATIONS_SUBDIR else "claim"
        return None, None if not pod_uid else f"bad {what} uid {pod_uid!r}"
    path = os.path.join(private_dir, subdir, allocation_file_name(pod_uid))
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: {exc}"
    from egpu.records import PodShares, RecordError

    try:
        return PodShares.decode(data), None
    except RecordError as exc:
        return None, f"{path}: {exc}"


RUNTIME_DIR_MODE = 0o755  # <runtime>: root's; nothing of it is mounted into a container
CONTAINERS_DIR_MODE = 0o755  # <runtime>/containers: root's
REGION_DIR_MODE = 0o777  # <runtime>/containers/<dir>: every uid of the container writes it
CARDS_DIR_MODE = 0o755  # <runtime>/cards: root's, never mounted
CARD_DIR_MODE = 0o755  # <runtime>/cards/<uuid>: root's, mounted read-only (egpu.card_roster)
SHARE_FILE_MODE = 0o666  # <runtime>/cards/<uuid>/share-<owner>: any uid of its container
PRIVATE_DIR_MODE = 0o711  # <private> and its hook folders: root's
PRIVATE_FILE_MODE = 0o444


def apply(plan: Apply, state: State, spec: Spec, args: Args) -> None:
    """Write the host files and bind-mount them into the container (module docstring).

    Every host path under the runtime and private folders is created and opened without
    following a symlink (runtime_hook.hostfs, egpu.card_roster), and mounted from its file
    descriptor; only the container's own accounting folder and share files are mounted
    writable. Raises OSError (MountError, EscapeError, HostPathError, RosterError: a full
    card names it) on failure."""
    from egpu import card_roster
    from runtime_hook import hostfs, mounts, rootfs  # ctypes and libc: only for shares
    from runtime_hook.plan import card_shares

    if not os.path.isfile(args.interposer):
        raise FileNotFoundError(f"interposer library {args.interposer} is missing on the node")
    root = spec.rootfs
    runtime, private = args.runtime_dir, args.private_dir
    shares = card_shares(plan)

    def inside() -> None:
        # In the container's mount namespace (a copy of the host's, not yet pivoted): the
        # folders are created here so that the descriptors mounted below belong to it.
        fds: list[int] = []
        try:
            base = hostfs.open_base(runtime, RUNTIME_DIR_MODE)
            fds.append(base)
            region = hostfs.make_dirs(base, runtime, [CONTAINERS_SUBDIR, plan.region_name],
                                      [CONTAINERS_DIR_MODE, REGION_DIR_MODE])
            fds.append(region)
            region_path = os.path.join(runtime, CONTAINERS_SUBDIR, plan.region_name)
            if plan.region_name == plan.dir_name and unlink_held_region(region, region_path):
                print(f"egpu-hook: container {state.id}: a process of an earlier instance of "
                      f"{plan.dir_name} still holds its accounting region; this instance "
                      "starts on a new one (that process's memory is not counted in it)",
                      file=sys.stderr)
            card_mounts: list[tuple[str, int, str, int]] = []  # uuid, folder, share file
            if shares:
                cards = hostfs.make_dirs(base, runtime, [CARDS_SUBDIR], [CARDS_DIR_MODE])
                fds.append(cards)
                cards_path = os.path.join(runtime, CARDS_SUBDIR)
                for uuid, entry in shares:
                    hostfs.remove_regular_file(cards, cards_path, uuid)  # the old layout's
                    card = hostfs.make_dirs(cards, cards_path, [uuid], [CARD_DIR_MODE])
                    fds.append(card)
                    card_path = os.path.join(cards_path, uuid)
                    card_roster.register(card, uuid, entry, where=card_path)
                    name = card_roster.share_file_name(entry.owner)
                    share = hostfs.create_file(card, card_path, name, SHARE_FILE_MODE)
                    fds.append(share)
                    card_mounts.append((uuid, card, name, share))
            pbase = hostfs.open_base(private, PRIVATE_DIR_MODE)
            fds.append(pbase)
            hook_dir = hostfs.make_dirs(pbase, private, [HOOK_SUBDIR, plan.dir_name],
                                        [PRIVATE_DIR_MODE, PRIVATE_DIR_MODE])
            fds.append(hook_dir)
            hook_path = os.path.join(private, HOOK_SUBDIR, plan.dir_name)
            config_fd = -1
            if plan.config is not None:
                config_fd = hostfs.write_file(hook_dir, hook_path, CONFIG_FILE_NAME,
                                              plan.config.encode().encode(), PRIVATE_FILE_MODE)
                fds.append(config_fd)
            preload = preload_text(rootfs.read_in_root(root, LD_SO_PRELOAD))
            preload_fd = hostfs.write_file(hook_dir, hook_path, "ld.so.preload", preload,
                                           PRIVATE_FILE_MODE)
            fds.append(preload_fd)

            rootfs.make_file_in_root(root, INTERPOSER_PATH_IN_CONTAINER)
            mounts.bind(args.interposer, root, INTERPOSER_PATH_IN_CONTAINER, read_only=True)
            if config_fd >= 0:
                rootfs.make_file_in_root(root, CONTAINER_CONFIG_PATH)
                mounts.bind(config_fd, root, CONTAINER_CONFIG_PATH, read_only=True,
                            label=os.path.join(hook_path, CONFIG_FILE_NAME))
            rootfs.make_file_in_root(root, LD_SO_PRELOAD)
            mounts.bind(preload_fd, root, LD_SO_PRELOAD, read_only=True,
                        label=os.path.join(hook_path, "ld.so.preload"))
            region_in = f"{RUNTIME_DIR}/{CONTAINERS_SUBDIR}/{plan.region_name}"
            rootfs.make_dirs_in_root(root, region_in)
            mounts.bind(region, root, region_in, read_only=False,
                        label=region_path)
            for uuid, card, name, share in card_mounts:
                card_in = f"{RUNTIME_DIR}/{CARDS_SUBDIR}/{uuid}"
                card_path = os.path.join(runtime, CARDS_SUBDIR, uuid)
                rootfs.make_dirs_in_root(root, card_in)
                mounts.bind(card, root, card_in, read_only=True, label=card_path)
                # the share's own file, on top, inside the read-only folder: it exists there
                mounts.bind(share, root, f"{card_in}/{name}", read_only=False,
                            label=os.path.join(card_path, name))
        finally:
            for fd in fds:
                os.close(fd)

    mounts.in_mount_namespace(state.pid, inside)


def unlink_held_region(folder: int, folder_path: str) -> bool:
    """Unlink the accounting region in ``folder`` (a container's own: ``<pod-uid>_<container>``,
    never a claim's) when some process still holds it (egpu.region_layout.held_by_a_process);
    returns whether it did. The hook runs before any process of this instance exists, and
    Kubernetes runs one instance of a container at a time, so a holder is a process of an
    earlier instance that the runtime lost track of (containerd restarted while it started:
    the kubelet saw the start fail and created the container again). The new instance would
    otherwise find its share already used and start without it; the interposer creates a
    fresh region, and the holder keeps the old, unlinked one (docs/security.md: its memory is
    not counted in the new one). Raises OSError."""
    from egpu import safefile  # both loaded already, by apply's hostfs
    from runtime_hook import hostfs

    try:
        fd = safefile.open_regular(CONTAINER_REGION_FILE, dir_fd=folder)
    except (FileNotFoundError, safefile.NotRegularFile):
        return False  # none yet, or not a file: the interposer refuses what is not a region
    # only on a restart: a container's first start has no region yet
    from egpu.region_layout import held_by_a_process

    try:
        held = held_by_a_process(fd)
    finally:
        os.close(fd)
    return held and hostfs.remove_regular_file(folder, folder_path, CONTAINER_REGION_FILE)


class DriverLimitRefused(OSError):
    """The node says a card has the driver's memory limit and setting it failed."""


def set_driver_limits(plan: Apply, state: State, args: Args) -> int:
    """Set the driver's hard memory limit of the container's cgroup to the share's memory on
    each of its cards that ``<private>/driver-memory-limits.json`` names (module docstring);
    returns how many were set. No record (the common case): one failed open, no NVML call.
    Raises DriverLimitRefused naming the card and NVML's answer (fail closed: the node said
    the wall is there)."""
    config = plan.config
    if config is None or config.memory_oversubscription:
        return 0
    from egpu.contract import DRIVER_LIMITS_FILE

    try:
        with open(os.path.join(args.private_dir, DRIVER_LIMITS_FILE), "rb") as handle:
            text = handle.read()
    except FileNotFoundError:
        return 0
    from egpu import driver_limits

    try:
        walled = driver_limits.decode_cards(text)
        # a raw share's percentage of a card: the interposer's wall alone (no size known here)
        cards = [c for c in config.cards if c.uuid in walled and c.memory_mib > 0]
        if not cards:
            return 0
        namespace = driver_limits.cgroup_dir(state.pid)
        nvml = driver_limits.Nvml(args.nvml_library)
        try:
            for card in cards:
                nvml.set_limit(card.uuid, namespace, card.memory_mib << 20)
        finally:
            nvml.close()
    except driver_limits.DriverLimitError as exc:
        raise DriverLimitRefused(f"the driver's memory limit: {exc}") from None
    return len(cards)


def release_raw_share(container_id: str, args: Args) -> bool:
    """Poststop: free raw container ``container_id``'s share (module docstring): the roster
    entries of the owner its config file names on the cards it names, their share files, and
    its region and hook folders. Returns whether it had one. A container without one costs
    one lstat. The hook folder is root's (never mounted), so its config is the hook's own;
    the region folder, which the container could write, goes with shutil.rmtree, which never
    follows a link on Linux. Raises OSError (RosterError) when a roster cannot be changed."""
    name = container_dir_name(container_id, RAW_CONTAINER)
    if not is_file_name(name):
        return False
    hook_path = os.path.join(args.private_dir, HOOK_SUBDIR, name)
    if not os.path.lexists(hook_path):
        return False
    import shutil

    from egpu import card_roster
    from egpu.records import ContainerConfig, RecordError

    try:
        fd = os.open(os.path.join(hook_path, CONFIG_FILE_NAME),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        config = None
    else:
        try:
            config = ContainerConfig.decode(os.pread(fd, MAX_CONFIG_BYTES, 0))
        except RecordError:
            config = None  # not the hook's: nothing to unregister, the folders still go
        finally:
            os.close(fd)
    if config is not None:
        owner = card_roster.region_owner(config.container_region)
        for card in config.cards:
            if not is_file_name(card.uuid):
                continue
            card_path = os.path.join(args.runtime_dir, CARDS_SUBDIR, card.uuid)
            try:  # noqa: SIM105 - contextlib costs the hook's startup
                card_roster.unregister(card_path, [owner], where=card_path)
            except FileNotFoundError:
                pass  # the card folder is gone: nothing to free
    shutil.rmtree(os.path.join(args.runtime_dir, CONTAINERS_SUBDIR, name), ignore_errors=True)
    shutil.rmtree(hook_path, ignore_errors=True)
    return True


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
    decision: Decision
    try:
        state = parse_state(stdin if stdin is not None else sys.stdin.buffer.read())
        if args.stage == POSTSTOP_STAGE:
            return _poststop(state, args, started)
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
        inputs = Inputs(state.id, spec.env, annotations, shares, shares_error,
                        devices=spec.devices)
        if len(inputs.claim_requests) == 1:  # a pod that may have joined a prepared claim
            inputs.claim, inputs.claim_error = load_shares(
                args.private_dir, next(iter(inputs.claim_requests)), CLAIM_SHARES_SUBDIR)
        decision = decide(inputs)
    status = 0
    if isinstance(decision, Refuse):
        print(decision.message, file=sys.stderr)
        status = 1
    elif isinstance(decision, Apply) and spec is not None and state.pid <= 0:
        # Fail closed: without the container's pid the mounts would land in the hook's own
        # mount namespace and the container would start without its interposer.
        print(f"egpu-hook: container {state.id}: the runtime's state names no container "
              "process (\"pid\" missing or not a positive integer): its egpu share cannot "
              "be installed", file=sys.stderr)
        status = 2
    elif isinstance(decision, Apply) and spec is not None:
        try:
            set_driver_limits(decision, state, args)
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


def _poststop(state: State, args: Args, started: float) -> int:
    """The poststop stage: ``release_raw_share``; 2 when it failed (the runtime logs it)."""
    status, what = 0, "no raw share"
    try:
        if release_raw_share(state.id, args):
            what = "released raw share"
    except OSError as exc:
        print(f"egpu-hook: container {state.id}: cannot free its raw share: {exc}",
              file=sys.stderr)
        status, what = 2, "release failed"
    if args.log:
        took = (time.monotonic() - started) * 1000
        _log(args.log, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {args.stage} {state.id} "
                       f"{what} status={status} {took:.1f}ms")
    return status


def main() -> None:
    """Console entry point ``egpu-hook``."""
    sys.exit(run())


if __name__ == "__main__":
    main()
