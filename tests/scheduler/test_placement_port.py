"""The Go port of the placement (kube-scheduler/, issue 24: step 2 of docs/scheduler.md "The
placement inside kube-scheduler") answers every case of placement_cases.yaml as the Python
placement does, reads and writes every record of tests/unit/record_cases.yaml as
egpu.records does, and reads every pod of tests/unit/request_cases.yaml as egpu.requests
does: ``go test`` there, from the module cache that ``make k8s`` fills
(GOPROXY=off, go.mod and go.sum as committed: -mod=readonly), and ``gofmt`` finds nothing to
change. Bug caught: a rule or a record format changed on one side only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from devcluster import build

MODULE = Path(__file__).resolve().parents[2] / "kube-scheduler"


def go_env() -> dict[str, str]:
    """The module cache only; -trimpath as devcluster.build builds egpu-kube-scheduler, so
    that the packages compiled there serve the tests and vet (and the reverse)."""
    return {**build.go_env(), "GOPROXY": "off", "GOFLAGS": "-mod=readonly -trimpath"}


def test_the_go_port_answers_every_placement_record_and_request_case_as_written() -> None:
    proc = subprocess.run([build.find_go(), "test", "-count=1", "-v", "./..."], cwd=MODULE,
                          env=go_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for test, cases_file in (("TestPlacementAnswersEachCaseAsWritten",
                              Path(__file__).with_name("placement_cases.yaml")),
                             ("TestEachRecordReadsAsWritten",
                              MODULE.parent / "tests" / "unit" / "record_cases.yaml"),
                             ("TestEachPodReadsAsWritten",
                              MODULE.parent / "tests" / "unit" / "request_cases.yaml")):
        cases = len(yaml.safe_load(cases_file.read_text())["cases"])
        assert proc.stdout.count(f"    --- PASS: {test}/") == cases, test


def test_the_plugin_module_requires_the_pinned_kubernetes() -> None:
    """Bug caught: K8S_VERSION moved on and the plugin still built against the old
    k8s.io/kubernetes (its scheduler framework would differ from the dev cluster's)."""
    requires = (MODULE / "go.mod").read_text()
    assert f"\tk8s.io/kubernetes {build.K8S_VERSION}\n" in requires
    assert f"k8s.io/kube-scheduler => k8s.io/kube-scheduler {build.staging_version()}" in requires


def test_the_go_port_is_gofmt_clean_and_vet_finds_nothing() -> None:
    gofmt = Path(build.find_go()).with_name("gofmt")
    unformatted = subprocess.run([str(gofmt), "-l", "."], cwd=MODULE, capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
    assert not unformatted, f"gofmt -w {' '.join(unformatted)}"
    vet = subprocess.run([build.find_go(), "vet", "./..."], cwd=MODULE, env=go_env(),
                         capture_output=True, text=True, timeout=300)
    assert vet.returncode == 0, vet.stdout + vet.stderr
