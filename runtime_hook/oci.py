"""The OCI wire formats the hook reads (OCI runtime spec v1.0.2 / v1.1, runtime.md, config.md).

- The *state* arrives on the hook's stdin (runtime.md "State"):
  ``{"ociVersion", "id", "status", "pid", "bundle", "annotations"}``.
- The bundle's ``config.json`` holds ``root.path`` (absolute, or relative to the bundle),
  ``process.env`` (``["NAME=value", ...]``) and ``annotations``.

Only the fields egpu uses are typed; everything else passes through untouched.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # the hook imports no typing, dataclasses (startup time)
if TYPE_CHECKING:
    from typing import Any


class OciError(ValueError):
    """The state or the bundle's config.json is unreadable or lacks a field the hook needs."""


class State:
    """The container state a hook receives on stdin. pid: the container's init, in the
    runtime's pid namespace (0 when the runtime gave none or gave no positive integer: the
    hook then refuses to install a share, ``runtime_hook.main``)."""

    __slots__ = ("annotations", "bundle", "id", "pid", "status")

    def __init__(self, id: str, pid: int, bundle: str, status: str = "",
                 annotations: dict[str, str] | None = None) -> None:
        self.id = id
        self.pid = pid
        self.bundle = bundle
        self.status = status
        self.annotations = {} if annotations is None else annotations

    def __repr__(self) -> str:
        return (f"State(id={self.id!r}, pid={self.pid!r}, bundle={self.bundle!r}, "
                f"status={self.status!r}, annotations={self.annotations!r})")


class Spec:
    """The parts of the bundle's config.json the hook reads. rootfs: absolute host path;
    devices: the paths of ``linux.devices`` (the device nodes the runtime creates: set by the
    runtime from CDI devices, never by a pod's own fields)."""

    __slots__ = ("annotations", "devices", "env", "gid", "rootfs", "uid")

    def __init__(self, rootfs: str, env: dict[str, str], annotations: dict[str, str],
                 uid: int = 0, gid: int = 0, devices: frozenset[str] = frozenset()) -> None:
        self.rootfs = rootfs
        self.env = env
        self.annotations = annotations
        self.uid = uid
        self.gid = gid
        self.devices = devices

    def __repr__(self) -> str:
        return (f"Spec(rootfs={self.rootfs!r}, env={self.env!r}, "
                f"annotations={self.annotations!r}, uid={self.uid!r}, gid={self.gid!r}, "
                f"devices={sorted(self.devices)!r})")


def parse_state(text: str | bytes) -> State:
    """Parse the state JSON. Raises OciError when it is not an object with id and bundle."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OciError(f"state on stdin: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise OciError("state on stdin: not a JSON object")
    bundle = data.get("bundle")
    cid = data.get("id")
    if not isinstance(bundle, str) or not bundle or not isinstance(cid, str):
        raise OciError("state on stdin: 'id' and 'bundle' are required strings")
    pid = data.get("pid", 0)
    annotations = data.get("annotations") or {}
    return State(
        id=cid,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
        bundle=bundle,
        status=str(data.get("status", "")),
        annotations={str(k): str(v) for k, v in annotations.items()}
        if isinstance(annotations, dict) else {},
    )


def parse_env(entries: list[Any]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` -> ``{"A": "1", "B": "x=y"}``; the last of repeated names wins
    (as execve's consumers read it); entries without '=' are ignored."""
    env: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def parse_spec(text: str | bytes, bundle: str) -> Spec:
    """Parse the bundle's config.json. Raises OciError when root.path is missing."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OciError(f"{bundle}/config.json: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise OciError(f"{bundle}/config.json: not a JSON object")
    root = data.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise OciError(f"{bundle}/config.json: root.path missing")
    rootfs = os.path.normpath(path if os.path.isabs(path) else os.path.join(bundle, path))
    raw_process = data.get("process")
    process: dict[str, Any] = raw_process if isinstance(raw_process, dict) else {}
    raw_user = process.get("user")
    user: dict[str, Any] = raw_user if isinstance(raw_user, dict) else {}
    env = parse_env(process.get("env") or [])
    annotations = data.get("annotations") or {}
    raw_linux = data.get("linux")
    raw_devices = raw_linux.get("devices") if isinstance(raw_linux, dict) else None
    if not isinstance(raw_devices, list):
        raw_devices = []
    devices = frozenset(d["path"] for d in raw_devices
                        if isinstance(d, dict) and isinstance(d.get("path"), str))
    return Spec(
        rootfs=rootfs,
        env=env,
        annotations={str(k): str(v) for k, v in annotations.items()}
        if isinstance(annotations, dict) else {},
        uid=int(user.get("uid", 0) or 0),
        gid=int(user.get("gid", 0) or 0),
        devices=devices,
    )


def load_spec(bundle: str) -> Spec:
    """Read and parse ``<bundle>/config.json``. Raises OciError (also for I/O errors)."""
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as handle:
            return parse_spec(handle.read(), bundle)
    except OSError as exc:
        raise OciError(f"{bundle}/config.json: {exc.strerror}") from None
