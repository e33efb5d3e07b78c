"""The command lines: ``egpu-webhook`` start-up errors and ``egpu webhook`` (dry review)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from certs.issue import create_ca, create_serving, write_bundle
from cli.main import main as egpu
from webhook.main import main as egpu_webhook

REPO = Path(__file__).resolve().parents[2]


def test_webhook_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = create_ca()
    write_bundle(tmp_path, ca, create_serving(ca, ["localhost"]))
    config = tmp_path / "config.yaml"
    config.write_text("schedulerNam: x\n")
    assert egpu_webhook(["--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"),
                         "--config", str(config)]) == 2
    assert "schedulerNam" in capsys.readouterr().err


def test_webhook_refuses_a_missing_or_mismatched_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = create_ca()
    write_bundle(tmp_path, ca, create_serving(ca, ["localhost"]))
    assert egpu_webhook(["--cert", str(tmp_path / "tls.crt"), "--key",
                         str(tmp_path / "nope.key")]) == 2
    assert egpu_webhook(["--cert", str(tmp_path / "tls.crt"), "--key",
                         str(tmp_path / "ca.key")]) == 2
    assert "TLS" in capsys.readouterr().err


def test_egpu_webhook_command_prints_patches_and_denials(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: team}
spec:
  template:
    spec:
      containers:
        - name: c
          resources: {limits: {volcano.sh/vgpu-memory: 3000}}
---
apiVersion: v1
kind: Pod
metadata: {name: bad, namespace: team}
spec:
  containers:
    - name: c
      resources: {limits: {egpu.io/gpu-cores: 150}}
""")
    assert egpu(["webhook", str(pods)]) == 1
    out = capsys.readouterr().out
    assert "Deployment team/d: patched" in out and "egpu.io~1gpu-memory" in out
    assert "Pod team/bad: DENIED: container 'c': egpu.io/gpu-cores='150'" in out
    assert egpu(["webhook", "-o", "json", str(pods)]) == 1
    reports = json.loads(capsys.readouterr().out)
    assert [r["allowed"] for r in reports] == [True, False]
    assert egpu(["webhook", str(tmp_path / "missing.yaml")]) == 2
