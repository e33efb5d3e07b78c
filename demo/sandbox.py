"""Real containers on this machine: a tiny root filesystem and ``runc run`` (tests and demo).

``RuncWorld`` builds, once per test session: the probe program (cuda_probe.c, linked against
the fake libcuda), a base root filesystem holding it, its shared libraries (copied as ldd lists
them), the fake driver libraries in /usr/lib and the interposer's dependencies; ``/var/run`` is
a symlink to ``../run`` as in Debian images. ``run()`` copies the base rootfs, writes an OCI
config.json (OCI runtime spec 1.0.2) whose ``createRuntime`` hook is ``egpu-hook``, runs it
with ``runc run`` and returns the probe's key=value output.

For tests that run containers side by side (tests/security): ``programs`` puts more host
programs (and the libraries ldd lists for them) into the base rootfs; ``start()`` is ``run()``
without waiting (a ``Container``: ``exec()`` runs a command in it with ``runc exec``,
``wait()`` collects its result and deletes it); ``mounts`` adds bind mounts (``Mount``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAKEGPU = REPO / "fakegpu" / "build"
INTERPOSER = REPO / "libinterpose" / "build" / "libegpu_interpose.so"
HOOK = Path(sys.executable).parent / "egpu-hook"
FAKE_DEFAULT_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # fakegpu's card without config
FAKE_DEFAULT_MIB = 24576
NULL_MAJOR, NULL_MINOR = 1, 3  # /dev/null's device numbers (Linux devices.txt)
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


@dataclass(frozen=True)
class Mount:
    """A bind mount of host path ``source`` at ``destination`` in the container."""

    source: Path
    destination: str
    read_only: bool = False

    def spec(self) -> dict[str, Any]:
        return {"destination": self.destination, "type": "bind", "source": str(self.source),
                "options": ["rbind", "ro" if self.read_only else "rw"]}


class RuncWorld:
    """A session's worth of runc state under ``base`` (module docstring). ``programs``:
    in-container path -> host program, copied into the base rootfs with its libraries."""

    def __init__(self, base: Path, interposer: Path,
                 programs: Mapping[str, Path] | None = None) -> None:
        self.base = base
        self.programs = dict(programs or {})
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
        for dest, program in self.programs.items():
            _copy_into(root, str(program), dest)
            libs |= set(_ldd(program))
        for lib in libs:
            _copy_into(root, lib)
        for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            _copy_into(root, str(FAKEGPU / name), f"/usr/lib/{name}")

    def new_rootfs(self, name: str) -> Path:
        """A fresh copy of the base rootfs for one container."""
        bundle = self.base / "bundles" / name
        shutil.copytree(self.rootfs, bundle / "rootfs", symlinks=True)
        return bundle

    def hook_entry(self, stage: str = "createRuntime") -> dict[str, Any]:
        return {"path": str(HOOK), "args": [
            "egpu-hook", stage, "--runtime-dir", str(self.runtime_dir),
            "--private-dir", str(self.private_dir), "--interposer", str(self.interposer),
            "--log", str(self.log)]}

    def _spec(self, args: list[str], env: dict[str, str] | None,
              annotations: dict[str, str] | None, hooks: int,
              mounts: Sequence[Mount] = (), devices: Sequence[str] = (),
              poststop: bool = False) -> dict[str, Any]:
        """The OCI config.json of a container running ``args``; ``mounts`` come after /proc
        and /dev; ``devices``: device node paths, each a copy of /dev/null (what a CDI
        device's deviceNodes edit with that hostPath gives); ``poststop``: egpu-hook is its
        poststop hook too (as egpu's CDI spec installs it)."""
        stages: dict[str, Any] = {"createRuntime": [self.hook_entry()] * hooks}
        if poststop:
            stages["poststop"] = [self.hook_entry("poststop")]
        return {
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
                *(m.spec() for m in mounts),
            ],
            "annotations": annotations or {},
            "hooks": stages,
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
                      "maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"],
                      "devices": [{"path": d, "type": "c", "major": NULL_MAJOR,
                                   "minor": NULL_MINOR, "fileMode": 0o666, "uid": 0, "gid": 0}
                                  for d in devices]},
        }

    def run(self, args: list[str], env: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, hooks: int = 1,
            bundle: Path | None = None, devices: Sequence[str] = (),
            poststop: bool = False) -> tuple[Result, Path]:
        """Run ``args`` in a new container; ``hooks``: how many times egpu-hook is listed;
        ``devices``, ``poststop``: as ``_spec``. Returns the result and the bundle folder."""
        self.counter += 1
        name = f"egpu-test-{os.getpid()}-{self.counter}"
        bundle = bundle or self.new_rootfs(name)
        spec = self._spec(args, env, annotations, hooks, devices=devices, poststop=poststop)
        (bundle / "config.json").write_text(json.dumps(spec))
        proc = subprocess.run(["runc", "--root", str(self.runc_root), "run", "--bundle",
                               str(bundle), name], capture_output=True, text=True, timeout=60)
        subprocess.run(["runc", "--root", str(self.runc_root), "delete", "--force", name],
                       capture_output=True)
        return Result(proc.returncode, proc.stdout, proc.stderr), bundle

    def start(self, args: list[str], env: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, *, mounts: Sequence[Mount] = (),
              name: str | None = None, devices: Sequence[str] = ()) -> Container:
        """Start ``args`` in a new container (``runc run`` in the background) and return at
        once; ``Container.wait()`` collects it."""
        self.counter += 1
        name = name or f"egpu-test-{os.getpid()}-{self.counter}"
        bundle = self.new_rootfs(name)
        spec = self._spec(args, env, annotations, 1, mounts, devices)
        (bundle / "config.json").write_text(json.dumps(spec))
        proc = subprocess.Popen(["runc", "--root", str(self.runc_root), "run", "--bundle",
                                 str(bundle), name], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return Container(self, name, bundle, proc)


@dataclass
class Container:
    """A container started by ``RuncWorld.start``."""

    world: RuncWorld
    name: str
    bundle: Path
    proc: subprocess.Popen[str]

    def _runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.world.runc_root), *args]

    def exec(self, args: list[str], timeout: float = 30) -> Result:
        """Run ``args`` in the running container (``runc exec``: its environment, its
        namespaces and mounts, no hook). A timeout kills it and counts as status 124."""
        try:
            p = subprocess.run(self._runc("exec", self.name, *args), capture_output=True,
                               text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return Result(124, str(exc.stdout or ""), f"timed out after {timeout} s")
        return Result(p.returncode, p.stdout, p.stderr)

    def wait(self, timeout: float = 60) -> Result:
        """The container's result; past ``timeout`` it is killed (status 124 with what it
        printed). The container is deleted either way."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
            code = self.proc.returncode
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            code, err = 124, f"{err}\n(killed: still running after {timeout} s)"
        self.delete()
        return Result(code, out, err)

    def signal(self, sig: str) -> None:
        """Send ``sig`` (e.g. ``TERM``) to the container's first process, if it still runs."""
        if self.proc.poll() is None:
            subprocess.run(self._runc("kill", self.name, sig), capture_output=True)

    def kill(self) -> None:
        subprocess.run(self._runc("kill", self.name, "KILL"), capture_output=True)
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def delete(self) -> None:
        subprocess.run(self._runc("delete", "--force", self.name), capture_output=True)
