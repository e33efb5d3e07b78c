"""devcluster.supervisor: start with a log, wait until ready or dead, stop with a grace
period, pid-reuse-safe liveness; and the state files written before it (cluster.json, the
demo's processes.json) still stop what they recorded."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from demo import run as demo
from devcluster import cluster, supervisor
from devcluster.errors import DevClusterError
from devcluster.supervisor import Child, ProcessFailed, ProcessInfo

PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", code]


def test_start_appends_a_header_and_the_output_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "hello.log"
    proc = supervisor.start("hello", _py("print('hi there', flush=True)"), log)
    assert proc == ProcessInfo("hello", proc.pid, [PY, "-c", "print('hi there', flush=True)"],
                               str(log))
    deadline = time.monotonic() + 10
    while supervisor.alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not supervisor.alive(proc.pid)
    assert supervisor.exit_code(proc.pid) == 0
    text = log.read_text()
    assert text.startswith("\n=== ") and f"{PY} -c" in text and "hi there" in text


def test_wait_ready_returns_once_the_check_passes(tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    proc = supervisor.start("server", _py(
        f"import time, pathlib; time.sleep(0.3); pathlib.Path({str(marker)!r}).touch(); "
        "time.sleep(60)"), tmp_path / "server.log")
    try:
        supervisor.wait_ready(proc, marker.exists, "the marker", 10, interval_s=0.05)
        assert supervisor.alive(proc.pid)
    finally:
        assert supervisor.stop(proc.pid, grace_s=5)
    assert not supervisor.alive(proc.pid)


def test_a_process_that_dies_first_is_named_with_its_log_tail(tmp_path: Path) -> None:
    proc = supervisor.start("broken", _py(
        "import sys; print('\\n'.join(f'line {i}' for i in range(40))); "
        "print('config is wrong', file=sys.stderr); sys.exit(3)"), tmp_path / "broken.log")
    with pytest.raises(ProcessFailed) as err:
        supervisor.wait_ready(proc, lambda: False, "GET /healthz", 10)
    message = str(err.value)
    assert message.startswith("broken exited (code 3) before it was ready (GET /healthz)")
    assert f"--- last lines of {proc.log} (broken):" in message
    assert "    config is wrong" in message and "line 39" in message
    assert "line 5\n" not in message  # only the tail
    assert isinstance(err.value, DevClusterError) and err.value.process == proc


def test_a_process_never_ready_times_out_with_the_last_error(tmp_path: Path) -> None:
    proc = supervisor.start("slow", _py("import time; time.sleep(60)"), tmp_path / "slow.log")

    def probe() -> bool:
        raise ConnectionRefusedError("nothing listens")

    try:
        with pytest.raises(ProcessFailed, match=r"slow not ready after 0s \(GET /x; last: "
                                                r"ConnectionRefusedError: nothing listens\)"):
            supervisor.wait_ready(proc, probe, "GET /x", 0.3, interval_s=0.05)
    finally:
        supervisor.stop(proc.pid, grace_s=5)


def test_stop_kills_what_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    marker = tmp_path / "handler"
    proc = supervisor.start("stubborn", _py(
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"), tmp_path / "stubborn.log")
    supervisor.wait_ready(proc, marker.exists, "SIGTERM ignored", 10, interval_s=0.05)
    t0 = time.monotonic()
    assert supervisor.stop(proc.pid, grace_s=0.5)
    assert 0.4 < time.monotonic() - t0 < 5
    assert not supervisor.alive(proc.pid)
    assert not supervisor.stop(proc.pid)  # nothing left to stop


def test_liveness_checks_the_program_and_the_start_time(tmp_path: Path) -> None:
    proc = supervisor.start("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    try:
        ticks = supervisor.start_ticks(proc.pid)
        assert ticks is not None
        assert supervisor.alive(proc.pid, "sleep", ticks)
        assert not supervisor.alive(proc.pid, "etcd")  # the pid runs another program now
        assert not supervisor.alive(proc.pid, ticks=ticks + 1)  # a pid taken over
        assert not supervisor.stop(proc.pid, program="etcd")  # so it is left alone
        assert supervisor.alive(proc.pid)
    finally:
        assert supervisor.stop(proc.pid, grace_s=5, ticks=ticks)
    assert supervisor.start_ticks(proc.pid) is None or not supervisor.alive(proc.pid)
    assert not supervisor.alive(0) and not supervisor.alive(-1)


def test_program_of_looks_through_nsenter() -> None:
    assert supervisor.program_of(["/bin/etcd", "--x"]) == "/bin/etcd"
    assert supervisor.program_of(["nsenter", "-t", "7", "-m", "--", "/k/kubelet", "-v"]) == \
        "/k/kubelet"


def test_a_child_is_killed_and_started_again_on_the_same_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = Child("child", _py("import time; print('up', flush=True); time.sleep(60)"), log)
    assert child.pid == 0 and not child.alive() and not child.stop()
    child.start(lambda: "up" in log.read_text(), "its greeting", 10)
    first = child.pid
    assert child.alive() and child.returncode is None
    assert child.kill()
    assert not child.alive()
    child.start(lambda: log.read_text().count("up") == 2, "its second greeting", 10)
    assert child.pid != first and child.alive()
    assert child.stop(grace_s=5) and not child.alive()
    assert log.read_text().count("\n=== ") == 2


def test_a_child_that_fails_to_get_ready_is_stopped(tmp_path: Path) -> None:
    child = Child("never", ["sleep", "60"], tmp_path / "never.log")
    with pytest.raises(ProcessFailed, match="never not ready after 0s"):
        child.start(lambda: False, "never", 0.2)
    assert not child.alive()


def _old_cluster_json(state: Path, proc: ProcessInfo) -> None:
    """cluster.json exactly as `up` wrote it before the supervisor (same fields)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "cluster.json").write_text(json.dumps({
        "state_dir": str(state), "kubeconfig": str(state / "kubeconfig"),
        "server": "https://127.0.0.1:1", "ca_file": "ca", "client_cert": "c", "client_key": "k",
        "bin_dir": "/nonexistent", "k8s_version": "v1.37.2", "etcd_url": "http://127.0.0.1:2",
        "ports": {"etcd-client": 2}, "processes": {"etcd": asdict(proc)},
        "extender_url": None, "started_at": 1.0, "startup_s": 2.0, "extender_ca_file": None,
    }, indent=2))


def test_a_cluster_recorded_before_is_still_stopped_by_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sleeper = supervisor.start("etcd", ["sleep", "60"], tmp_path / "etcd.log")
    _old_cluster_json(state, sleeper)
    st = cluster.status(state)
    assert st.recorded and st.processes == {"etcd": True} and not st.up
    assert cluster.down(state) == ["etcd"]
    assert not supervisor.alive(sleeper.pid)
    assert not (state / "cluster.json").exists()
    assert cluster.down(state) == []


def test_down_leaves_a_pid_that_runs_another_program(tmp_path: Path) -> None:
    state = tmp_path / "state"
    other = supervisor.start("other", ["sleep", "60"], tmp_path / "other.log")
    try:
        _old_cluster_json(state, ProcessInfo("etcd", other.pid, ["/k8s/bin/etcd"], "log"))
        assert cluster.status(state).processes == {"etcd": False}
        assert cluster.down(state) == []
        assert supervisor.alive(other.pid)
    finally:
        supervisor.stop(other.pid, grace_s=5)


def test_demo_down_stops_what_an_older_processes_json_recorded(tmp_path: Path) -> None:
    proc = supervisor.start("node-agent-x", _py(
        "import signal, time; signal.signal(signal.SIGTERM, lambda *a: exit(0)); "
        "time.sleep(60)"), tmp_path / "logs" / "agent.log")
    (tmp_path / "processes.json").write_text(json.dumps([
        {"name": proc.name, "pid": proc.pid, "argv": proc.argv, "log": proc.log},
        {"name": "gone", "pid": 2 ** 22 + 1, "argv": ["/x"], "log": "/x.log"}], indent=1))
    said: list[str] = []
    demo.down(tmp_path, say=said.append)
    assert said == [f"stopped node-agent-x (pid {proc.pid})"]
    assert not supervisor.alive(proc.pid)
    assert not (tmp_path / "processes.json").exists()


def test_kill_is_immediate(tmp_path: Path) -> None:
    proc = supervisor.start("victim", _py(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"),
        tmp_path / "victim.log")
    t0 = time.monotonic()
    assert supervisor.kill(proc.pid)
    assert time.monotonic() - t0 < 3 and not supervisor.alive(proc.pid)
