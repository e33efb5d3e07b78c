"""The alert rules under ``promtool test rules`` (issue 26), from the Prometheus built with
the dev cluster (devcluster/build.py), on the rule file the dev cluster's Prometheus loads
(devcluster.prometheus.rule_file of the PrometheusRule the install ships).

Bugs this catches: an alert that never fires (a metric renamed, a label the exporter does not
set, a job label the Prometheus Operator does not give: EgpuNodeAgentDown watched
``job="egpu-node-agent"`` and fired on every healthy cluster), one that fires on a healthy
series (a bound off by one), a broken summary template, and an alert added without a case
here (every alert of the rule file must appear in alert_rules_test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from devcluster import build as devbuild
from devcluster import prometheus

HERE = Path(__file__).resolve().parent
CASES = HERE / "alert_rules_test.yaml"


def _rules() -> dict:
    (rule,) = prometheus.load_documents(prometheus.PROMETHEUS_RULE, "PrometheusRule")
    return prometheus.rule_file(rule)


def test_every_alert_fires_on_a_firing_series_and_stays_quiet_on_a_healthy_one(
        tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_rules(), sort_keys=False))
    cases = yaml.safe_load(CASES.read_text())
    cases["rule_files"] = [str(rules)]
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(cases, sort_keys=False))
    proc = subprocess.run([str(devbuild.binary_path("promtool")), "test", "rules",
                           str(test_file)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    alerts = {r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    cases = yaml.safe_load(CASES.read_text())["tests"]
    firing = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    # a quiet case: an explicit empty expectation, or a series in the firing case's group
    # that the expected alerts leave out (the "b" series)
    quiet = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    quiet |= {t["alertname"] for c in cases for t in c["alert_rule_test"]
              if t["exp_alerts"] and len(c["input_series"]) > len(t["exp_alerts"])}
    assert firing == alerts, sorted(alerts ^ firing)
    assert quiet == alerts, sorted(alerts - quiet)
