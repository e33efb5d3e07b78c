"""Real containers on this machine: a tiny root filesystem and ``runc run`` (tests and demo).

``RuncWorld`` builds, once per test session: the probe program (cuda_probe.c, linked against
the fake libcuda), a base root filesystem holding it, its shared libraries (copied as ldd lists
them), the fake driver libraries in /usr/lib and the interposer's dependencies; ``/var/run`` is
a symlink to ``../run`` as in Debian images. ``run()`` copies the base rootfs, writes an OCI
config.json (OCI runtime spec 1.0.2) whose ``createRuntime`` hook is ``egpu-hook``, runs it
with ``runc run`` and returns the probe's key=value output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAKEGPU = REPO / "fakegpu" / "build"
INTERPOSER = REPO / "libinterpose" / "build" / "libegpu_interpose.so"
HOOK = Path(sys.executable).parent / "egpu-hook"
FAKE_DEFAULT_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # fakegpu's card without config
FAKE_DEFAULT_MIB = 24576
# containerd's / Docker's default capability set: root in the container may override file
# modes (CAP_DAC_OVERRIDE) but not mount (no CAP_SYS_ADMIN).
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")


def missing_prerequisite() -> str | None:
    """Why the runc tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (runc creates namespaces and mounts)"
    if shutil.which("runc") is None:
        return "runc is not installed (Debian: apt-get install -y runc)"
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    if not (FAKEGPU / "libcuda.so.1").exists():
        return "the fake GPU is not built (make native)"
    if not HOOK.exists():
        return f"{HOOK} is missing (pip install -e .)"
    return None


def _ldd(path: Path) -> list[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(FAKEGPU)}
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env).stdout
    return [m for m in re.findall(r"(/\S+)", out) if os.path.exists(m)
            and not m.startswith(str(REPO))]


def _copy_into(root: Path, src: str, dest: str | None = None) -> None:
    target = root / (dest or src).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(src), target)


@dataclass
class Result:
    """One container run: exit status, output, and the probe's key=value pairs."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def values(self) -> dict[str, int]:
        line = next((ln for ln in self.stdout.splitlines() if ln.startswith("env=")), "")
        return {k: int(v) for k, v in (p.split("=", 1) for p in line.split())}


class RuncWorld:
    """A session's worth of runc state under ``base`` (module docstring)."""

    def __init__(self, base: Path, interposer: Path) -> None:
        self.base = base
        self.real_interposer = interposer.exists()
        self.interposer = interposer if self.real_interposer else self._stand_in()
        self.runtime_dir = base / "run-egpu"
        self.private_dir = base / "run-egpu-node"
        self.runc_root = base / "runc-root"
        self.rootfs = base / "rootfs-base"
        self.log = base / "hook.log"
        self.counter = 0
        self._build()

    def _stand_in(self) -> Path:
        """An empty shared library in place of the interposer (tests of the hook's mounts
        that run before libinterpose is built)."""
        src, lib = self.base / "stand_in.c", self.base / "libegpu_stand_in.so"
        src.write_text("int egpu_stand_in;\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        return lib

    def _build(self) -> None:
        probe = self.base / "cuda_probe"
        subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", f"-I{REPO}/libinterpose/include",
                        "-o", str(probe), str(Path(__file__).parent / "cuda_probe.c"),
                        f"-L{FAKEGPU}", "-l:libcuda.so.1"], check=True)
        root = self.rootfs
        for d in ("etc", "run", "tmp", "proc", "dev", "sys", "var", "usr/lib"):
            (root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "tmp", 0o1777)
        os.symlink("../run", root / "var" / "run")
        _copy_into(root, str(probe), "/probe")
        libs = set(_ldd(probe)) | set(_ldd(FAKEGPU / "libcuda.so.1"))
        libs |= set(_ldd(self.interposer))
        for lib in libs:
            _copy_into(root, lib)
        for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            _copy_into(root, str(FAKEGPU / name), f"/usr/lib/{name}")

    def new_rootfs(self, name: str) -> Path:
        """A fresh copy of the base rootfs for one container."""
        bundle = self.base / "bundles" / name
        shutil.copytree(self.rootfs, bundle / "rootfs", symlinks=True)
        return bundle

    def hook_entry(self) -> dict[str, Any]:
        return {"path": str(HOOK), "args": [
            "egpu-hook", "createRuntime", "--runtime-dir", str(self.runtime_dir),
            "--private-dir", str(self.private_dir), "--interposer", str(self.interposer),
            "--log", str(self.log)]}

    def run(self, args: list[str], env: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, hooks: int = 1,
            bundle: Path | None = None) -> tuple[Result, Path]:
        """Run ``args`` in a new container; ``hooks``: how many times egpu-hook is listed.
        Returns the result and the bundle folder."""
        self.counter += 1
        name = f"egpu-test-{os.getpid()}-{self.counter}"
        bundle = bundle or self.new_rootfs(name)
        spec = {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "cwd": "/",
                "env": [f"{k}={v}" for k, v in {"PATH": "/bin", **(env or {})}.items()],
                "capabilities": {k: list(DEFAULT_CAPS) for k in
                                 ("bounding", "effective", "permitted", "ambient")},
                "noNewPrivileges": True,
            },
            "root": {"path": "rootfs", "readonly": False},
            "hostname": "egpu-test",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            ],
            "annotations": annotations or {},
            "hooks": {"createRuntime": [self.hook_entry()] * hooks},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
                      "maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"]},
        }
        (bundle / "config.json").write_text(json.dumps(spec))
        proc = subprocess.run(["runc", "--root", str(self.runc_root), "run", "--bundle",
                               str(bundle), name], capture_output=True, text=True, timeout=60)
        subprocess.run(["runc", "--root", str(self.runc_root), "delete", "--force", name],
                       capture_output=True)
        return Result(proc.returncode, proc.stdout, proc.stderr), bundle
