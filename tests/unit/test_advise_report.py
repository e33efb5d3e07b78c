"""`kubectl egpu advise`'s report (cli/advise_cmd.build_report, pure): pods grouped by the
workload that owns them, history of deleted pods joined, bookings read from the allocation
records, the cards freed computed by placing the shares again, and the patch lines.

Bugs caught: replicas advised one by one (six rows for one Deployment), a roll's deleted pods'
history dropped, cards-freed from a formula instead of the extender's placement (it would
ignore the slot limit), a patch that leaves the gpu-memory-percentage or alias name beside
the new gpu-memory (the webhook refuses two name sets), a patch for a bare pod (immutable)."""

from __future__ import annotations

import json
from typing import Any

from cli.advise_cmd import as_data, build_report, format_table, patch_lines
from egpu.advise import VERDICT_LOWER, VERDICT_NONE, Policy
from egpu.records import Allocation, Card, CardShare, ContainerAllocation, Inventory
from egpu.usage_history import ContainerHistory

MIB = 1 << 20
NOW = 1_800_000_000.0
CARDS = tuple(Card(f"GPU-{i}", i, "NVIDIA A10", 24000) for i in range(4))
POLICY = Policy(min_history_s=3600, min_samples=10)
SUFFIXES = [f"{c}bcdf" for c in "ghjklmnp"]  # generated names: no vowels, no 0 1 3


def node() -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": {
        "egpu.io/inventory": Inventory(CARDS).encode(),
        "egpu.io/inventory-heartbeat": "2027-01-15T08:00:00Z"}}}


def replica(name: str, card: int, mib: int, owner: dict[str, Any] | None,
            template_hash: str = "") -> dict[str, Any]:
    allocation = Allocation((ContainerAllocation(
        "serve", False, (CardShare(f"GPU-{card}", card, mib, 10),)),), node="n1")
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "annotations": {"egpu.io/allocation": allocation.encode()},
                            "labels": {"pod-template-hash": template_hash} if template_hash
                            else {}}
    if owner:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": "n1", "containers": [{
        "name": "serve", "resources": {"limits": {"egpu.io/gpu-memory": str(mib),
                                                  "egpu.io/gpu-cores": "10"}}}]},
        "status": {"phase": "Running"}}


def history(peak_mib: float, hours: float = 2.0) -> ContainerHistory:
    steps = int(hours * 3600 / 15)
    samples = [(NOW - hours * 3600 + 15 * i, peak_mib * (0.5 + 0.5 * (i % 2)))
               for i in range(steps)]
    return ContainerHistory(memory={"GPU-0": samples},
                            compute={"GPU-0": [(t, 4.0) for t, _ in samples]})


def test_a_deployment_is_one_row_with_its_deleted_pods_history_and_frees_cards() -> None:
    """Eight replicas of 8000 MiB (three per 24000 MiB card: three cards) that peak at 1800
    MiB, with part of their history under a deleted ReplicaSet's pod names: one row, advised
    round_up(1800 x 1.15, 256) = 2304 MiB and 5% cores. The bare pod (4000 MiB) has no
    history: no advice, no patch. Placed again: as booked 3 cards (3 + 3 + 2 replicas, the
    bare pod beside the last two); as advised 8 x 2304 + 4000 = 22432 MiB fit one card (8
    shares + 1 under the 10 slots): 2 cards freed."""
    rs = {"kind": "ReplicaSet", "name": "serve-6d5c8b7f9"}
    pods = [replica(f"serve-6d5c8b7f9-{SUFFIXES[i]}", i // 3, 8000, rs, "6d5c8b7f9")
            for i in range(8)]
    pods.append(replica("solo", 3, 4000, None))
    hist = {("ml", f"serve-6d5c8b7f9-{SUFFIXES[i]}", "serve"): history(1800) for i in range(8)}
    hist[("ml", "serve-55f4d7c8b6-zzzzz", "serve")] = history(1700)  # a deleted pod's
    hist[("ml", "egpu-node-agent-n1", "serve")] = history(20000)  # no workload of ours
    report = build_report([node()], pods, hist, POLICY, None, 7200, now=NOW)

    (serve, solo) = report.rows
    assert (serve.workload.label, serve.pods, serve.booked.memory_mib) == \
        ("ml/Deployment/serve", 8, 8000)
    assert serve.usage is not None and serve.usage.samples == 9 * 480
    assert (serve.advice.memory_mib, serve.advice.cores, serve.advice.verdict) == \
        (2304, 5, VERDICT_LOWER)
    assert (solo.workload.label, solo.advice.verdict) == ("ml/Pod/solo", VERDICT_NONE)
    assert (report.cards_now, report.cards_advised, report.cards_freed) == (3, 1, 2)
    assert "the advice frees 2 cards" in format_table(report)
    assert json.loads(json.dumps(as_data(report)))["cards"]["freed"] == 2

    (line,) = patch_lines(report, ["volcano.sh/vgpu-memory", "volcano.sh/vgpu-number"])
    assert line.startswith("kubectl -n ml patch deployment/serve --type=strategic -p '")
    body = json.loads(line.split(" -p '", 1)[1][:-1])
    (container,) = body["spec"]["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert container["name"] == "serve" and limits == container["resources"]["requests"]
    assert (limits["egpu.io/gpu"], limits["egpu.io/gpu-memory"], limits["egpu.io/gpu-cores"]) \
        == ("1", "2304", "5")
    for clash in ("egpu.io/gpu-memory-percentage", "volcano.sh/vgpu-memory",
                  "volcano.sh/vgpu-number"):
        assert limits[clash] is None  # deleted by the strategic merge


def test_bad_flags_are_refused_naming_the_flag_and_what_is_allowed(capsys) -> None:
    """Bugs: a bad window read as 0 (advice from nothing), a traceback instead of a message."""
    from cli.main import main

    assert main(["advise", "--since", "7x", "--prometheus", "http://127.0.0.1:9"]) == 1
    assert "--since: '7x' is not a duration; allowed: a positive number and one of s, m, h, " \
        "d, w" in capsys.readouterr().err
    # a number too big for a float ended in a traceback (OverflowError; found by review)
    assert main(["advise", "--since", "1" + "0" * 400 + "s", "--prometheus",
                 "http://127.0.0.1:9"]) == 1
    assert "is not a duration; allowed: a positive number and one of s, m, h, d, w (e.g. 7d, " \
        "12h, 30m), at most 3650d" in capsys.readouterr().err
    assert main(["advise", "--min-samples", "0", "--prometheus", "http://127.0.0.1:9"]) == 1
    assert "--min-samples: 0 is not allowed; allowed: 1 or more" in capsys.readouterr().err


def test_kubectl_egpu_advise_runs_advise_and_anything_else_runs_top(monkeypatch) -> None:
    import cli.main

    seen: list[list[str]] = []
    monkeypatch.setattr(cli.main, "main", lambda argv: seen.append(list(argv)) or 0)
    for argv in (["kubectl-egpu", "advise", "-n", "ml"], ["kubectl-egpu", "--node", "n1"]):
        monkeypatch.setattr("sys.argv", argv)
        cli.main.kubectl_plugin()
    assert seen == [["advise", "-n", "ml"], ["top", "--node", "n1"]]


def test_prometheus_answers_with_nan_and_an_agent_roll_are_read_right() -> None:
    """A NaN sample is dropped (it crashed the advice); a share's refused counter seen under
    two series (the node agent rolled: a new instance label) continues, so a counter flat at
    3 is no increase; a counter that first shows up late in the window at 2 is an increase
    of 2. Bugs found by review."""
    from egpu.advise import summarize
    from egpu.usage_history import add_matrix, settle_counters

    out: dict = {}
    labels = {"namespace": "ml", "pod": "p", "container": "c", "UUID": "GPU-0"}
    add_matrix(out, "memory", 1.0, [{"metric": labels, "values": [[100, "5"], [115, "NaN"]]}])
    add_matrix(out, "refused", 1.0, [
        {"metric": {**labels, "instance": "b"}, "values": [[160, "3"], [175, "3"]]},
        {"metric": {**labels, "instance": "a"}, "values": [[100, "3"], [115, "3"]]}])
    late = {**labels, "pod": "q"}
    add_matrix(out, "refused", 1.0, [{"metric": late, "values": [[160, "2"], [175, "2"]]}])
    settle_counters(out, start=100, step=15)
    history = out[("ml", "p", "c")]
    assert history.memory["GPU-0"] == [(100.0, 5.0)]
    assert summarize([], refused=[[v for _, v in history.refused["GPU-0"]]]).refused == 0
    late_history = out[("ml", "q", "c")]
    assert summarize([], refused=[[v for _, v in late_history.refused["GPU-0"]]]).refused == 2


def test_sidecars_add_up_in_the_repack_as_the_extender_books_them() -> None:
    """Three pods, each an 8000 MiB app container and an 8000 MiB sidecar (an init container
    with restartPolicy Always) on one card: 16000 MiB a pod, one pod per 24000 MiB card: 3
    cards. Bug (found by review): the sidecar read as a plain init container (max instead of
    sum): 1 card."""
    pods = []
    for i in range(3):
        allocation = Allocation((
            ContainerAllocation("side", True, (CardShare(f"GPU-{i}", i, 8000, 0),),
                                kind="sidecar"),
            ContainerAllocation("app", False, (CardShare(f"GPU-{i}", i, 8000, 0),))),
            node="n1")
        limits = {"egpu.io/gpu-memory": "8000"}
        pods.append({"metadata": {"name": f"s{i}", "namespace": "ml", "uid": f"u{i}",
                                  "annotations": {"egpu.io/allocation": allocation.encode()}},
                     "spec": {"nodeName": "n1", "initContainers": [
                         {"name": "side", "restartPolicy": "Always",
                          "resources": {"limits": limits}}],
                         "containers": [{"name": "app", "resources": {"limits": limits}}]},
                     "status": {"phase": "Running"}})
    report = build_report([node()], pods, {}, POLICY, None, 7200, now=NOW)
    assert report.cards_now == 3
