"""``testbed.realnode_install.probe_result``: where a real-node test reads what a container saw.

Bug caught: a containerd restart cuts a running container's output from its log, and the
density checks then fail a replica that runs with exactly its share (the probe's file in the
container still says what it saw); and the other way, a probe that wrote nothing anywhere must
still fail the wait.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from demo import real_node
from testbed import realnode_install as inst

SEEN = {"total_mib": 1000, "nvml_total_mib": 1000}


class FakeCluster:
    """kubectl answers: ``logs`` gives ``log``, ``exec ... cat PROBE_FILE`` gives ``file``."""

    def __init__(self, log: str, file: str) -> None:
        self.log, self.file = log, file
        self.execs = 0

    def kubectl(self, *args: str, check: bool = True) -> str:
        if "logs" in args:
            return self.log
        assert args[-2:] == ("cat", real_node.PROBE_FILE), args
        self.execs += 1
        return self.file

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float,
                 interval: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (value := check()) is not None:
                return value
            time.sleep(0.01)
        raise TimeoutError(what)


def test_the_log_line_is_read_first_and_no_exec_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inst, "LOG_LOST_AFTER_S", 0.0)
    cluster = FakeCluster("egpu: a note\nPROBE " + json.dumps(SEEN) + "\n", "")
    found = inst.probe_result(cluster, "ns", "p", timeout=1)
    assert found["total_mib"] == 1000 and found["log"] == ["egpu: a note"]
    assert cluster.execs == 0


def test_a_log_line_lost_is_read_from_the_probes_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inst, "LOG_LOST_AFTER_S", 0.0)
    cluster = FakeCluster("", json.dumps(SEEN))
    found = inst.probe_result(cluster, "ns", "p", timeout=1)
    assert (found["total_mib"], found["source"]) == (1000, "exec")


def test_a_probe_that_wrote_nothing_still_fails_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inst, "LOG_LOST_AFTER_S", 0.0)
    monkeypatch.setattr(inst, "container_diagnosis", lambda *a: "")
    monkeypatch.setattr(inst, "describe_namespace", lambda *a: "")
    monkeypatch.setattr(inst, "scheduler_log_tail", lambda *a: "")
    cluster = FakeCluster("", "cat: /tmp/egpu-probe.json: No such file or directory")
    with pytest.raises(AssertionError, match="probe output of ns/p"):
        inst.probe_result(cluster, "ns", "p", timeout=0.3)


def test_the_file_is_read_never_before_the_wait_began_then_once_per_interval() -> None:
    """Bug caught: a pacer that started at its first ``due`` (not at ``start``) let the node
    restarts bench spend its first read before the container ran, or read at every poll
    (a runc exec each)."""
    pacer = inst.ProbeFilePacer()
    step = inst.LOG_LOST_AFTER_S
    assert not pacer.due(1000.0)  # not started: never
    pacer.start(1000.0)
    pacer.start(1000.0 + step)  # a later start changes nothing
    assert not pacer.due(1000.0 + step - 0.1)
    assert pacer.due(1000.0 + step)
    assert not pacer.due(1000.0 + 1.5 * step)
    assert pacer.due(1000.0 + 2 * step)
