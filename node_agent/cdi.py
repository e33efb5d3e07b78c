"""CDI (Container Device Interface, spec 0.6.0) for this node's cards: the spec and its names.

Pure (used by ``egpu cdi generate`` and by the node agent):

- ``cdi_spec(cards, hook_path, present, hook_args)``: egpu's spec, kind ``egpu.io/gpu``. Each
  card is a device named both by its index and by its UUID (``egpu.io/gpu=0``,
  ``egpu.io/gpu=GPU-...``); its edits add its device node ``/dev/nvidia<i>`` and
  ``EGPU_CDI_CARD_<i>=<uuid>`` to the environment. The spec-wide edits, applied whenever one
  of its devices is injected, add the control device nodes and egpu-hook as a
  ``createRuntime`` hook, which installs the interposer and the container's share, and as a
  ``poststop`` hook, which frees a raw container's share (runtime_hook.main). A device
  node for which ``present(path)`` is False is left out (the runtime fails a container whose
  CDI device names a node missing on the host), with a warning; a card whose own node or
  /dev/nvidiactl is missing is also marked unhealthy by the agent (``node_agent.devnodes``).
- ``device_names(uuids, indexes, vendor_names)``: the fully qualified CDI device names the
  device plugin's Allocate returns for a container's cards: ``egpu.io/gpu=<uuid>`` each, and
  the NVIDIA Container Toolkit's ``nvidia.com/gpu=<name>`` each where its spec names the card.

I/O edge (node agent):

- ``write_spec(path, text)``: an atomic write (temporary file in the same folder, then rename).
- ``SpecFolders``: the CDI spec folders as the runtime reads them (``*.json``, ``*.yaml``),
  parsed once per file version: the device names of a kind (``nvidia.com/gpu``).
- ``CdiPublisher``: the agent's CDI: ``publish(cards)`` writes egpu's spec when its content
  changed; ``names(uuids, cards)`` answers Allocate (no names until the spec is written);
  ``publish_claim(uid, devices)`` / ``remove_claim(uid)``: a prepared DRA claim's own spec
  ``egpu-claim-<uid>.json`` (``claim_spec``: a device ``claim-<uid>-<request>`` per request,
  with its environment), written by the kubelet plugin (node_agent.draplugin).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from egpu.contract import (
    CDI_KIND,
    CLAIM_MARK_HOST_DEVICE,
    ENV_CDI_CARD_PREFIX,
    claim_mark_of_device,
)
from egpu.records import Card

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CARD_DEVICE_NODE = "/dev/nvidia{index}"
DEFAULT_SPEC_DIR = "/var/run/cdi"  # where the agent writes its spec (containerd's default dirs)
DEFAULT_SEARCH_DIRS = ("/etc/cdi", "/var/run/cdi")  # containerd's cdi_spec_dirs default
SPEC_FILE_NAME = "egpu.json"
SPEC_FILE_MODE = 0o644
NVIDIA_CDI_KIND = "nvidia.com/gpu"  # the NVIDIA Container Toolkit's (nvidia-ctk cdi generate)
SPEC_EXTENSIONS = (".json", ".yaml", ".yml")  # the files a CDI registry reads
# The device a refused Allocate names: no card, only the spec-wide edits (the hook), so that
# the hook refuses the container at creation with EGPU_ALLOCATION_ERROR's message (FC-05,
# FC-12) instead of the container starting without a card.
UNALLOCATED_DEVICE = "unallocated"
HOOK_STAGES = ("createRuntime", "poststop")  # egpu-hook's: install the share, free a raw one
CLAIM_SPEC_PREFIX = "egpu-claim-"  # its spec file: <spec-dir>/egpu-claim-<claim-uid>.json


def _always(_path: str) -> bool:
    return True


def cdi_spec(cards: Sequence[Card], hook_path: str,
             present: Callable[[str], bool] = _always,
             hook_args: Sequence[str] = ()) -> dict[str, Any]:
    """egpu's CDI spec (a JSON-ready dict) for ``cards`` (module docstring). ``present``: whether
    a device node path exists (default: every one is named); ``hook_args``: options put before
    the hook's stage argument (e.g. ``--runtime-dir DIR``)."""
    devices = []
    for card in sorted(cards, key=lambda c: c.index):
        # CDI rejects a device without edits: each names its card in the environment too.
        edits: dict[str, Any] = {"env": [f"{ENV_CDI_CARD_PREFIX}{card.index}={card.uuid}"]}
        node = CARD_DEVICE_NODE.format(index=card.index)
        if present(node):
            edits["deviceNodes"] = [{"path": node}]
        for name in (str(card.index), card.uuid):
            devices.append({"name": name, "containerEdits": edits})
    devices.append({"name": UNALLOCATED_DEVICE,
                    "containerEdits": {"env": ["EGPU_CDI_UNALLOCATED=1"]}})
    # poststop: the hook frees a raw container's share (no pod, so no agent cleans up)
    common: dict[str, Any] = {
        "hooks": [{"hookName": stage, "path": hook_path,
                   "args": [os.path.basename(hook_path), *hook_args, stage]}
                  for stage in HOOK_STAGES],
    }
    nodes = [{"path": p} for p in CONTROL_DEVICE_NODES if present(p)]
    if nodes:
        common["deviceNodes"] = nodes
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": common}


def claim_spec(devices: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The CDI spec of one prepared DRA claim: kind ``egpu.io/gpu``, a device per request of
    the claim (``devices``: name ``claim-<uid>-<request>`` -> the env its edits set: the
    request's cards and egpu's mark), each with the claim's device node
    ``/dev/egpu-claim-<uid>-<request>`` (egpu.contract.CLAIM_MARK_PREFIX: a read-only copy
    of /dev/null, the hook's proof that the kubelet gave the container the claim). The cards'
    own devices (``egpu.io/gpu=<uuid>``, in egpu.json) bring the card nodes and the hook."""
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND,
            "devices": [{"name": name, "containerEdits": {
                "env": [f"{k}={v}" for k, v in env.items()],
                "deviceNodes": [{"path": claim_mark_of_device(name),
                                 "hostPath": CLAIM_MARK_HOST_DEVICE, "permissions": "r"}]}}
                        for name, env in devices.items()]}


def spec_text(spec: Mapping[str, Any]) -> str:
    """The spec as the file holds it (JSON, indented, newline-terminated)."""
    return json.dumps(spec, indent=2) + "\n"


def spec_device_names(spec: Any) -> frozenset[str]:
    """The device names of a parsed CDI spec (empty for anything malformed)."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if not isinstance(devices, list):
        return frozenset()
    return frozenset(str(d["name"]) for d in devices if isinstance(d, Mapping) and d.get("name"))


def vendor_device_name(uuid: str, index: int | None, names: Collection[str]) -> str | None:
    """The name a vendor's spec gives the card: its UUID, else its index, else ``gpu<index>``
    (nvidia-ctk's device name strategies uuid, index and type-index); None when it has none."""
    candidates = [uuid] if index is None else [uuid, str(index), f"gpu{index}"]
    return next((c for c in candidates if c in names), None)


def device_names(uuids: Sequence[str], indexes: Mapping[str, int],
                 vendor_names: Collection[str]) -> list[str]:
    """Allocate's CDI devices for a container's cards ``uuids`` (in allocation order):
    ``egpu.io/gpu=<uuid>`` for each, then ``nvidia.com/gpu=<name>`` for each card the vendor
    spec's names (``vendor_names``, empty: no such spec) know. ``indexes``: uuid -> card index."""
    if not uuids:  # a refused container: the device that only runs the hook, which refuses it
        return [f"{CDI_KIND}={UNALLOCATED_DEVICE}"]
    names = [f"{CDI_KIND}={u}" for u in uuids]
    for uuid in uuids:
        vendor = vendor_device_name(uuid, indexes.get(uuid), vendor_names)
        if vendor is not None:
            names.append(f"{NVIDIA_CDI_KIND}={vendor}")
    return names


# --- I/O edge ---------------------------------------------------------------------------------
def write_spec(path: str, text: str, mode: int = SPEC_FILE_MODE,
               folder_mode: int = 0o755) -> bool:
    """Make the file ``path`` hold ``text`` (``mode``, default 0644), atomically: a temporary
    file in the same folder (a dot name ending in ``.tmp``, which no CDI registry reads)
    renamed over it. The folder is created (``folder_mode``) when missing. Returns False when
    the file already held ``text`` (nothing written). Raises OSError."""
    with contextlib.suppress(FileNotFoundError, UnicodeDecodeError), \
            open(path, encoding="utf-8") as handle:
        if handle.read() == text:
            return False
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, mode=folder_mode, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)  # whatever the umask
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def _parse_spec(path: str) -> Any:
    """A CDI spec file's content (JSON or YAML). Raises OSError or ValueError."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if path.endswith(".json"):
        return json.loads(text)
    import yaml  # only where a YAML spec exists (nvidia-ctk writes YAML by default)

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


class SpecFolders:
    """The CDI spec folders ``folders`` (thread-safe). Each spec file is parsed once per
    version (its mtime in ns and size); an unreadable or malformed file is skipped with one
    log line per version."""

    def __init__(self, folders: Sequence[str]) -> None:
        self.folders = tuple(folders)
        self._lock = threading.Lock()
        # path -> ((mtime_ns, size), kind, device names)
        self._files: dict[str, tuple[tuple[int, int], str, frozenset[str]]] = {}

    def device_names(self, kind: str) -> frozenset[str]:
        """The names of the devices of ``kind`` over every spec file of the folders (empty
        when no spec of that kind exists)."""
        found: set[str] = set()
        seen: set[str] = set()
        with self._lock:
            for folder in self.folders:
                try:
                    entries = list(os.scandir(folder))
                except OSError:
                    continue
                for entry in entries:
                    if not entry.name.endswith(SPEC_EXTENSIONS) or entry.name.startswith("."):
                        continue
                    seen.add(entry.path)
                    spec_kind, names = self._read(entry)
                    if spec_kind == kind:
                        found.update(names)
            for path in [p for p in self._files if p not in seen]:
                del self._files[path]
        return frozenset(found)

    def _read(self, entry: os.DirEntry[str]) -> tuple[str, frozenset[str]]:
        try:
            info = entry.stat()  # follows a symlink, as the runtime does
        except OSError:
            return "", frozenset()
        version = (info.st_mtime_ns, info.st_size)
        cached = self._files.get(entry.path)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        try:
            spec = _parse_spec(entry.path)
            kind = str(spec.get("kind", "")) if isinstance(spec, Mapping) else ""
            names = spec_device_names(spec)
        except (OSError, ValueError) as exc:
            log.warning("CDI spec %s unreadable, skipped: %s", entry.path, exc)
            kind, names = "", frozenset()
        self._files[entry.path] = (version, kind, names)
        return kind, names


class CdiPublisher:
    """The node agent's CDI (thread-safe). ``spec_dir``: where egpu's spec is written
    (``<spec_dir>/egpu.json``); ``search_dirs``: the folders whose ``nvidia.com/gpu`` spec is
    looked for; ``hook_path`` / ``hook_args``: the hook entry of the spec; ``present``:
    whether a device node exists on the host."""

    def __init__(self, spec_dir: str, search_dirs: Sequence[str], hook_path: str,
                 hook_args: Sequence[str] = (),
                 present: Callable[[str], bool] = os.path.exists) -> None:
        self.spec_dir = spec_dir
        self.path = os.path.join(spec_dir, SPEC_FILE_NAME)
        self.hook_path = hook_path
        self.hook_args = tuple(hook_args)
        self.present = present
        self.vendor = SpecFolders(search_dirs)
        self._lock = threading.Lock()
        self._ready = False
        self._left_out: tuple[str, ...] | None = None

    @property
    def ready(self) -> bool:
        """Whether egpu's spec is in place (Allocate names CDI devices only then)."""
        return self._ready

    def publish(self, cards: Sequence[Card]) -> bool:
        """Write egpu's spec for ``cards`` when the file does not hold it yet (at start, and
        at each heartbeat: cards or device nodes may change). Returns whether the spec is in
        place; a failure is logged, never raised."""
        spec = cdi_spec(cards, self.hook_path, self.present, self.hook_args)
        with self._lock:
            self._log_left_out(cards)
            try:
                if write_spec(self.path, spec_text(spec)):
                    log.info("wrote the CDI spec %s (%d cards)", self.path, len(cards))
                self._ready = True
            except OSError as exc:
                log.warning("cannot write the CDI spec %s: %s", self.path, exc)
                self._ready = os.path.isfile(self.path)  # a previous version stays usable
            return self._ready

    def _log_left_out(self, cards: Sequence[Card]) -> None:
        nodes = [*CONTROL_DEVICE_NODES,
                 *(CARD_DEVICE_NODE.format(index=c.index) for c in cards)]
        missing = tuple(n for n in nodes if not self.present(n))
        if missing != self._left_out:
            self._left_out = missing
            if missing:
                log.warning("CDI spec: device nodes missing on this node, left out: %s",
                            ", ".join(missing))

    def names(self, uuids: Sequence[str], cards: Sequence[Card]) -> list[str]:
        """Allocate's CDI device names for a container's cards (``device_names``; no cards:
        the ``unallocated`` device of a refused container); empty while egpu's spec is not in
        place."""
        if not self._ready:
            return []
        indexes = {c.uuid: c.index for c in cards}
        return device_names(uuids, indexes, self.vendor.device_names(NVIDIA_CDI_KIND))

    def claim_path(self, claim_uid: str) -> str:
        """The spec file of a prepared DRA claim: ``<spec_dir>/egpu-claim-<uid>.json``."""
        return os.path.join(self.spec_dir, f"{CLAIM_SPEC_PREFIX}{claim_uid}.json")

    def publish_claim(self, claim_uid: str, devices: Mapping[str, Mapping[str, str]]
                      ) -> dict[str, str]:
        """Write the claim's spec (``claim_spec``; atomic, only when it changed). Returns each
        device's fully qualified name (``egpu.io/gpu=claim-<uid>-<request>``) by its name.
        Raises OSError."""
        write_spec(self.claim_path(claim_uid), spec_text(claim_spec(devices)))
        return {name: f"{CDI_KIND}={name}" for name in devices}

    def remove_claim(self, claim_uid: str) -> None:
        """Remove the claim's spec (absent: nothing to do). Raises OSError."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.claim_path(claim_uid))
