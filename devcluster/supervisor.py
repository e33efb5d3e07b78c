"""One process supervisor: every child process that the dev cluster, the demo, the benchmarks
and the e2e tests start goes through here (the control plane, a real node's daemons and its
relay, egpu-kube-scheduler, the webhook, the demo's agents).

    start(name, argv, log, cwd=None, env=None, new_session=True) -> ProcessInfo
        stdout and stderr appended to ``log`` after a header line (time, command line);
        stdin /dev/null; ``new_session``: it outlives the Python process that started it
    wait_ready(proc, ready, what, timeout_s, interval_s=0.25) -> None
        poll ``ready()`` (an exception counts as "not yet") until it is true; raises
        ProcessFailed, naming the process and quoting its log's last lines, when the process
        exits first or when ``timeout_s`` has passed
    alive(pid, program=None, ticks=None) -> bool
        running and not a zombie; with ``program``, still running it (``program_of(argv)``);
        with ``ticks``, still the process that started then (``start_ticks``): a pid that a
        new process took over is never taken for the recorded one
    start_ticks(pid) -> int | None          the start time (/proc/PID/stat field 22)
    stop(pid, grace_s=10, program=None, ticks=None, group=False) -> bool
        SIGTERM, SIGKILL after ``grace_s``; only while ``alive`` with those checks
    kill(pid, ...) -> bool                  SIGKILL at once, as a crash would
    tail(path, lines=25, indent="    ") -> str
    Child(name, argv, log, ...)             one process that can be started again

``ProcessInfo`` (name, pid, argv, log) is what the state files record (cluster.json,
node.json, relay.json, the demo's processes.json): these four fields, nothing else.
Children of this Python process are reaped (no zombies).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.errors import DevClusterError

TAIL_LINES = 25
STOP_GRACE_S = 10.0
REAP_S = 5.0

# Popen objects of the processes this Python process started, by pid: polled, so they are
# reaped, and their exit status is known.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass
class ProcessInfo:
    """A started process as the state files record it."""

    name: str
    pid: int
    argv: list[str]
    log: str


class ProcessFailed(DevClusterError):
    """A process exited before it was ready, or was not ready in time; the message names it
    and quotes the last lines of its log."""

    def __init__(self, proc: ProcessInfo, message: str, lines: int = TAIL_LINES) -> None:
        super().__init__(f"{message}\n--- last lines of {proc.log} ({proc.name}):\n"
                         f"{tail(proc.log, lines)}")
        self.process = proc


def start(name: str, argv: Sequence[str], log: Path | str, cwd: Path | str | None = None,
          env: Mapping[str, str] | None = None, new_session: bool = True) -> ProcessInfo:
    """Start ``argv`` with its output appended to ``log`` (see the module docstring)."""
    argv = [str(a) for a in argv]
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd,
                                env=dict(env) if env is not None else None,
                                start_new_session=new_session)
    _CHILDREN[proc.pid] = proc
    return ProcessInfo(name=name, pid=proc.pid, argv=argv, log=str(log))


def program_of(argv: Sequence[str]) -> str:
    """What a command line runs once started: its first word, or for ``nsenter ... -- CMD``
    the CMD that nsenter replaces itself with."""
    if argv and Path(argv[0]).name == "nsenter" and "--" in argv:
        rest = list(argv)[list(argv).index("--") + 1:]
        if rest:
            return rest[0]
    return argv[0]


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (FileNotFoundError, ProcessLookupError) or not ours to read
        return None
    return text.rsplit(")", 1)[-1].split()


def start_ticks(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22)."""
    fields = _stat(pid) if pid > 0 else None
    return int(fields[19]) if fields else None  # fields[0] is field 3


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None:
        child.poll()
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int, program: str | None = None, ticks: int | None = None) -> bool:
    """Whether ``pid`` runs, is not a zombie, (``program``) runs that program (the binary,
    or the script an interpreter runs: one of its first three words) and (``ticks``) started
    at that time."""
    if pid <= 0:
        return False
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    fields = _stat(pid)
    if fields is None:
        return False
    if fields[0] in ("Z", "X"):
        _reap(pid)
        return False
    if ticks is not None and int(fields[19]) != ticks:
        return False
    return program is None or program.encode() in _cmdline(pid)[:3]


def _cmdline(pid: int) -> list[bytes]:
    """/proc/PID/cmdline's words; [] when gone. It reads empty for a moment while the process
    is in execve (its new memory not set up yet): read again then."""
    for _ in range(20):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        if raw:
            return raw.split(b"\0")
        time.sleep(0.01)
    return []


def exit_code(pid: int) -> int | None:
    """The exit status of a child of this process that has ended (None: running, or not
    started here)."""
    child = _CHILDREN.get(pid)
    return child.poll() if child is not None else None


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _forget(pid: int, wait_s: float = REAP_S) -> None:
    """Reap our child ``pid`` (waiting ``wait_s`` at most) and drop it once it has ended."""
    child = _CHILDREN.get(pid)
    if child is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=wait_s)
    if child.returncode is not None:
        del _CHILDREN[pid]


def stop(pid: int, grace_s: float = STOP_GRACE_S, program: str | None = None,
         ticks: int | None = None, group: bool = False, first: int = signal.SIGTERM) -> bool:
    """Stop the process if it is still the one meant (``alive(pid, program, ticks)``):
    ``first`` (SIGTERM) to it (``group``: to its process group), SIGKILL after ``grace_s``.
    Returns whether it was running."""
    if not alive(pid, program, ticks):
        _forget(pid, 0.0)  # not the process meant (or gone): nothing to wait for
        return False
    _signal(pid, first, group)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive(pid, program, ticks):
        time.sleep(0.1)
    if alive(pid, program, ticks):
        _signal(pid, signal.SIGKILL, group)
        deadline = time.monotonic() + REAP_S
        while time.monotonic() < deadline and alive(pid, program, ticks):
            time.sleep(0.05)
    _forget(pid)
    return True


def kill(pid: int, program: str | None = None, ticks: int | None = None,
         group: bool = False) -> bool:
    """SIGKILL at once, as a crash would; returns whether it was running."""
    return stop(pid, 0.0, program, ticks, group, first=signal.SIGKILL)


def tail(path: Path | str, lines: int = TAIL_LINES, indent: str = "    ") -> str:
    """The last ``lines`` lines of a log, each indented."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return f"{indent}(no log at {path})"
    last = text.splitlines()[-lines:]
    while last and not last[0].strip():  # the blank line before a start's header
        last.pop(0)
    return "\n".join(indent + line for line in last)


def wait_ready(proc: ProcessInfo, ready: Callable[[], Any], what: str, timeout_s: float,
               interval_s: float = 0.25, lines: int = TAIL_LINES) -> None:
    """Poll ``ready()`` until it returns something true. Raises ProcessFailed when the
    process exits first or after ``timeout_s`` (``what``: the check, for the message)."""
    deadline = time.monotonic() + timeout_s
    last = "not yet"
    while True:
        if not alive(proc.pid):
            raise ProcessFailed(proc, f"{proc.name} exited (code {exit_code(proc.pid)}) "
                                      f"before it was ready ({what})", lines)
        try:
            if ready():
                return
        except Exception as exc:  # not up yet: connection refused, TLS, 5xx...
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise ProcessFailed(proc, f"{proc.name} not ready after {timeout_s:.0f}s "
                                      f"({what}; last: {last})", lines)
        time.sleep(interval_s)


class Child:
    """One process that may be started again with the same command line and log (a server
    under test that is stopped, killed and restarted). Liveness and stop check its recorded
    start time, so a pid taken over by another process is left alone."""

    def __init__(self, name: str, argv: Sequence[str], log: Path | str,
                 cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
                 new_session: bool = False) -> None:
        self.name, self.argv, self.log = name, [str(a) for a in argv], Path(log)
        self.cwd, self.env, self.new_session = cwd, env, new_session
        self.info: ProcessInfo | None = None
        self.ticks: int | None = None

    @property
    def pid(self) -> int:
        """The pid of the last start (0 before the first)."""
        return self.info.pid if self.info else 0

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has ended (None while it runs)."""
        return exit_code(self.pid) if self.info else None

    def start(self, ready: Callable[[], Any] | None = None, what: str = "",
              timeout_s: float = 60.0, interval_s: float = 0.1) -> ProcessInfo:
        """Start it; with ``ready``, wait for it (``wait_ready``; stopped again on failure)."""
        self.info = start(self.name, self.argv, self.log, self.cwd, self.env, self.new_session)
        self.ticks = start_ticks(self.info.pid)
        if ready is not None:
            try:
                wait_ready(self.info, ready, what or "ready", timeout_s, interval_s)
            except ProcessFailed:
                self.stop()
                raise
        return self.info

    def alive(self) -> bool:
        return self.info is not None and alive(self.info.pid, ticks=self.ticks)

    def stop(self, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGTERM, SIGKILL after ``grace_s``; whether it was running."""
        return self.info is not None and stop(self.info.pid, grace_s, ticks=self.ticks,
                                              group=self.new_session)

    def kill(self) -> bool:
        """SIGKILL, as a crash would; whether it was running."""
        return self.info is not None and kill(self.info.pid, ticks=self.ticks,
                                              group=self.new_session)
