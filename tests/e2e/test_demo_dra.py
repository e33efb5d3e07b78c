"""`egpu demo --dra` end to end: the same inputs, placed through ResourceClaims (issue 14).

Runs the real demo in DRA mode (``demo.Options(dra=True)``: ``allocationMode: dra``, the
DeviceClasses of manifests/dra, node agents with ``--dra --no-device-plugin``, no
egpu-kube-scheduler) in a private state folder, without the runc container of the device-plugin demo
(tests/e2e/test_demo.py runs it; it does not depend on the mode). Checks through the API that
every share input is a ResourceClaim the default kube-scheduler allocated as the input's
comment says (read with ``egpu.cluster_view``, the decoder of ``kubectl egpu``), that the
placement table shows each share with its claim, that the four mistakes are denied with the
device-plugin mode's messages, and (as root) that the real node's container runs its share
prepared by the DRA kubelet plugin.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo import run as demo
from egpu.cluster_view import PATH_DRA, CardView, ShareView, cluster_view
from egpu.contract import ALLOCATION_MODE_DRA, ANN_ALLOCATION, ANN_ALLOCATION_MODE, RES_GPU
from egpu.dra.allocation import pod_claim_names
from egpu.dra.shareconfig import ShareConfig
from tests.e2e.demo_cluster import DemoCluster

pytestmark = pytest.mark.e2e

SHARE_PODS = ("chat-serving", "lora-finetune", "notebook-ana", "retrieval", "tts-day",
              "ocr-with-warmup", "translate-small")


class Outcome(DemoCluster):
    """The DRA demo's cluster (tests/e2e/demo_cluster.py), with its claims."""

    def __init__(self, state_dir: Path, lines: list[str]) -> None:
        super().__init__(state_dir, lines)
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
                       for c in self.get("resourceclaims", "-A")}
        self.views = cluster_view(list(self.nodes.values()), list(self.pods.values()),
                                  claims=list(self.claims.values()))

    def shares(self, pod: dict[str, Any]) -> list[tuple[CardView, ShareView]]:
        """(card, share) of each container and card of the pod, read from its claim."""
        name = pod["metadata"]["name"]
        return [(card, share) for view in self.views for card in view.cards
                for share in card.shares if share.pod == name]

    def claim(self, pod: dict[str, Any]) -> dict[str, Any]:
        [name] = pod_claim_names(pod)
        return self.claims[(pod["metadata"]["namespace"], name)]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    state_dir = tmp_path_factory.mktemp("demo-dra")
    lines: list[str] = []
    try:
        assert demo.up(demo.Options(state_dir=state_dir, say=lines.append, wait_s=120,
                                    container=False, dra=True,
                                    # right-sizing, its one reader, runs in device-plugin mode
                                    prometheus=False)) == 0
        yield Outcome(state_dir, lines)
    finally:
        demo.down(state_dir, say=lines.append)
        (state_dir / "demo-output.txt").write_text("\n".join(lines) + "\n")  # for a failure


def test_demo_in_dra_mode_places_every_input_through_claims(outcome: Outcome) -> None:
    """Each share input: the webhook's claim `egpu` (no egpu.io/* left, no egpu.io/allocation,
    the default scheduler), allocated by the kube-scheduler as the input's comment says."""
    for prefix in SHARE_PODS:
        pods = outcome.named(prefix)
        assert pods, prefix
        for pod in pods:
            assert [c["name"] for c in pod["spec"]["resourceClaims"]] == ["egpu"], prefix
            assert pod["spec"]["schedulerName"] == "default-scheduler"
            assert ANN_ALLOCATION not in (pod["metadata"].get("annotations") or {})
            assert pod["spec"].get("nodeName"), (prefix, pod.get("status"))
            limits = [c.get("resources", {}).get("limits", {})
                      for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])]
            assert not any(k.startswith(("egpu.io/", "volcano.sh/")) for lim in limits
                           for k in lim), (prefix, limits)
            assert all(s.path == PATH_DRA and s.claim for _, s in outcome.shares(pod)), prefix

    serving = outcome.named("chat-serving-")
    assert len(serving) == 2
    for pod in serving:
        [(card, share)] = outcome.shares(pod)
        assert "H100" in card.card.model or "A100" in card.card.model
        assert (share.memory_mib, share.cores, share.priority) == (24000, 50, "high")

    [train] = outcome.named("lora-finetune-")
    shares = outcome.shares(train)
    assert len({card.card.uuid for card, _ in shares}) == len(shares) == 2
    assert all(card.card.model.split()[-1] != "A10" for card, _ in shares)
    assert all((s.memory_mib, s.cores, s.priority, s.compute_policy) ==
               (30000, 30, "low", "elastic") for _, s in shares)

    [(card, share)] = outcome.shares(outcome.pods["notebook-ana"])
    assert share.memory_mib == card.card.memory_mib * 25 // 100 and share.cores == 10

    retrieval = outcome.shares(outcome.pods["retrieval"])
    assert {(s.container, s.memory_mib, s.cores) for _, s in retrieval} == {
        ("embedding", 4000, 10), ("reranker", 6000, 10)}

    tts = outcome.pods["tts-day"]
    [(_, share)] = outcome.shares(tts)
    assert (share.memory_mib, share.cores) == (32000, 20)
    [config] = outcome.claim(tts)["spec"]["devices"]["config"]
    assert ShareConfig.decode(config["opaque"]["parameters"]).memory_oversubscription is True

    ocr = outcome.shares(outcome.pods["ocr-with-warmup"])
    [card] = {id(c): c for c, _ in ocr}.values()  # one card, booked max(init, app)
    assert (card.dra_booked_mib, card.dra_booked_cores) == (12000, 100)

    [(_, share)] = outcome.shares(outcome.pods["translate-small"])
    assert (share.memory_mib, share.cores) == (3000, 30)


def test_demo_in_dra_mode_runs_a_dra_only_fleet_without_egpu_kube_scheduler(
        outcome: Outcome) -> None:
    """The simulated nodes' agents run --dra --no-device-plugin: each node says
    egpu.io/allocation-mode: dra and offers no egpu.io/gpu; no egpu-kube-scheduler was started
    (the default kube-scheduler allocates the claims)."""
    simulated = [n for n in outcome.nodes.values()
                 if (n["metadata"].get("labels") or {}).get(demo.REAL_NODE_LABEL) != "true"]
    assert len(simulated) == 6
    for node in simulated:
        assert node["metadata"]["annotations"].get(ANN_ALLOCATION_MODE) == ALLOCATION_MODE_DRA
        assert node["status"]["allocatable"].get(RES_GPU, "0") == "0"
    assert "starting egpu-kube-scheduler" not in outcome.text
    classes = subprocess.run(outcome.kubectl("get", "deviceclasses", "-o", "name"),
                             capture_output=True, text=True, check=True).stdout.split()
    assert {"deviceclass.resource.k8s.io/share.gpu.egpu.io",
            "deviceclass.resource.k8s.io/whole.gpu.egpu.io"} <= set(classes)


def test_demo_in_dra_mode_table_shows_each_share_with_its_claim(outcome: Outcome) -> None:
    table = outcome.text.split(demo.DRA_PLACEMENT_TITLE)[1].split("\n\n")[0].strip()
    assert table.splitlines()[0].split()[-1] == "CLAIM"
    for prefix in SHARE_PODS:
        for pod in outcome.named(prefix):
            [claim] = pod_claim_names(pod)
            rows = [line for line in table.splitlines() if f"/{pod['metadata']['name']} " in line]
            assert rows and all(line.rstrip().endswith(claim) for line in rows), (claim, table)


def test_demo_in_dra_mode_leaves_pods_without_egpu_resources_alone(outcome: Outcome) -> None:
    for name in ("api-gateway", "benchmark-whole-card"):
        pod = outcome.pods[name]
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert not pod["spec"].get("resourceClaims"), name
    assert outcome.pods["api-gateway"]["status"]["phase"] == "Running"


def test_demo_in_dra_mode_denies_the_four_mistakes_with_the_same_messages(
        outcome: Outcome) -> None:
    for name in ("bad-cores", "bad-both-memory", "bad-zero-percentage", "bad-priority"):
        assert name not in outcome.pods
    text = outcome.text
    assert "container 'c': egpu.io/gpu-cores='150' is not allowed (out of range)" in text
    assert "egpu.io/gpu-memory-percentage='50' is not allowed (egpu.io/gpu-memory=4000 is " \
        "given too)" in text
    assert "egpu.io/gpu-memory-percentage='0' is not allowed" in text
    assert "pod annotation egpu.io/priority='urgent' is not allowed; allowed: high, low" in text


def test_demo_in_dra_mode_runs_the_real_nodes_share_through_its_claim(outcome: Outcome) -> None:
    """As root: the real node's agent serves the DRA kubelet plugin (no device plugin); input
    03 (25% of a card: a firstAvailable claim) runs there and its container sees its share."""
    from demo import real_node

    if real_node.prerequisite_missing():
        pytest.fail(real_node.prerequisite_missing())
    pod = outcome.pods[real_node.POD]
    assert pod["spec"]["nodeName"] == real_node.NAME
    assert pod["status"]["phase"] == "Running"
    node = outcome.nodes[real_node.NAME]
    assert node["metadata"]["annotations"].get(ANN_ALLOCATION_MODE) == ALLOCATION_MODE_DRA
    assert node["status"]["allocatable"].get(RES_GPU, "0") == "0"
    [(card, share)] = outcome.shares(pod)
    assert share.memory_mib == card.card.memory_mib * 25 // 100 and share.path == PATH_DRA
    row = next(line for line in outcome.text.splitlines() if real_node.POD in line
               and real_node.NAME in line)
    assert row.split()[-2:] == ["yes", share.claim]
    assert f"total {share.memory_mib} MiB" in outcome.text
    assert "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY" in outcome.text
