"""egpu's DRA kubelet plugin on the real node (kubelet v1.37.2 + containerd 2.x + runc, the
fake GPU as the cards): egpu installed with ``kubectl apply -k`` plus the ``manifests/dra``
component (DeviceClasses, ``--dra --no-device-plugin`` on the node agent, the kubelet's plugin
folders mounted).

A pod with a ResourceClaimTemplate of DeviceClass share.gpu.egpu.io is placed by the default
kube-scheduler from the agent's ResourceSlices, prepared by the agent's kubelet plugin
(NodePrepareResources: the pod's allocation file, the claim's CDI spec) and started by the
real kubelet through CDI; inside it the probe (demo/real_node.py) sees exactly the share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu import card_roster
from egpu.contract import DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY
from egpu.dra import allocation
from egpu.dra.allocation import MIB
from egpu.dra.slices import parse_quantity
from egpu.node_records import Card
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

NS = inst.SHARE_NS
CUDA_ERROR_OUT_OF_MEMORY = 2
# The agent's log line when the kubelet's NotifyRegistrationStatus says it registered the plugin
# (the kubelet's own "Registered DRA plugin" line is at -v=3; the node runs -v=2).
REGISTERED = "the kubelet registered the DRA plugin gpu.egpu.io"
SHARE_MIB = 4096


def _kustomization(work: Path) -> Path:
    folder = inst.kustomization(work / "kustomize-dra")
    doc = yaml.safe_load((folder / "kustomization.yaml").read_text())
    doc["components"] = [doc["resources"][0] + "/dra"]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return folder


def _agent(cluster: RealCluster) -> dict[str, Any]:
    pods = inst.get_json(cluster, "pods", "-n", inst.NAMESPACE, "-l",
                         "app.kubernetes.io/name=egpu-node-agent")["items"]
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    return dict(running[0])


def _slices(cluster: RealCluster) -> list[dict[str, Any]]:
    items = inst.get_json(cluster, "resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == "gpu.egpu.io"
            and s["spec"].get("nodeName") == cluster.node.name]


def _wait_dra_ready(cluster: RealCluster) -> None:
    out = cluster.kubectl("-n", inst.NAMESPACE, "rollout", "status",
                          "daemonset/egpu-node-agent", "--timeout=180s", check=False,
                          timeout=200)
    assert "successfully rolled out" in out, out + inst.describe_namespace(cluster)
    agent = _agent(cluster)
    assert "--dra" in agent["spec"]["containers"][0]["args"], agent["spec"]["containers"][0]
    cluster.wait_for("the node's ResourceSlices of gpu.egpu.io", lambda: _slices(cluster),
                     timeout=90, interval=1.0)
    registry = cluster.node.host_path("/var/lib/kubelet/plugins_registry/gpu.egpu.io-reg.sock")
    cluster.wait_for("the DRA plugin's registration socket", registry.exists, timeout=60)


@pytest.fixture(scope="module")
def dra(installed: RealCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[RealCluster]:
    """The install with the manifests/dra component; the plain install again afterwards."""
    work = tmp_path_factory.mktemp("dra-install")
    folder = _kustomization(work)
    installed.kubectl("apply", "-k", str(folder), timeout=120)
    _wait_dra_ready(installed)
    yield installed
    installed.kubectl("-n", NS, "delete", "pods,resourceclaims,resourceclaimtemplates", "-l",
                      "egpu-e2e=dra", "--wait=true", "--ignore-not-found", check=False,
                      timeout=150)
    plain = inst.kustomization(work / "kustomize")
    installed.kubectl("apply", "-k", str(plain), timeout=120)
    installed.kubectl("delete", "deviceclass", "share.gpu.egpu.io", "whole.gpu.egpu.io",
                      "--ignore-not-found", check=False)
    # the plain install changes the webhook's and the agent's pods back: every part rolled out
    # (one ReplicaSet's pods each) before the next module's tests count them
    inst.wait_installed(installed)
    installed.wait_for("the replaced egpu pods gone", lambda: not any(
        p["metadata"].get("deletionTimestamp") for p in inst.get_json(
            installed, "pods", "-n", inst.NAMESPACE)["items"]), timeout=120, interval=1.0)


def _template(name: str, memory: str = "4Gi", cores: str = "30",
              config: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "share.gpu.egpu.io",
        "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}
    if config is not None:
        spec["devices"]["config"] = [{"opaque": {"driver": "gpu.egpu.io",
                                                 "parameters": config}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS, "labels": {"egpu-e2e": "dra"}},
            "spec": {"spec": spec}}


def _pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"egpu-e2e": "dra"}},
        "spec": {
            "nodeSelector": {inst.REAL_LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "probe", "image": inst.devimages.IMAGE_EGPU,
                "command": ["python3", "-c", inst.PROBE],
                "resources": {"limits": {"cpu": inst.PROBE_CPU, "memory": inst.PROBE_MEMORY},
                              "claims": [{"name": "gpu"}]},
            }],
        },
    }


def _claim_of(cluster: RealCluster, pod: str) -> dict[str, Any]:
    live = inst.get_json(cluster, "pod", "-n", NS, pod)
    name = live["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return dict(inst.get_json(cluster, "resourceclaim", "-n", NS, name))


def _claim_files(cluster: RealCluster, claim_uid: str, pod_uid: str) -> dict[str, Path]:
    node = cluster.node
    return {"state": node.host_path(f"/var/run/egpu-node/dra/claims/{claim_uid}.json"),
            "cdi": node.host_path(f"/var/run/cdi/egpu-claim-{claim_uid}.json"),
            "allocation": node.host_path(f"/var/run/egpu-node/allocations/{pod_uid}.json"),
            "shares": node.host_path(f"/var/run/egpu-node/claim-shares/{claim_uid}.json"),
            # the claim's accounting folder (its containers' one budget), made by the hook
            "region": node.host_path(f"/var/run/egpu/containers/claim-{claim_uid}_gpu")}


def _run_share(cluster: RealCluster, name: str) -> dict[str, Any]:
    inst.apply_json(cluster, _template(name))
    inst.apply_json(cluster, _pod(name, name))
    return inst.probe_result(cluster, NS, name)


def _assert_share(result: dict[str, Any]) -> None:
    assert result["preload"].endswith("libegpu_interpose.so"), result
    assert result["config"] is True, result
    assert result["total_mib"] == SHARE_MIB, result
    assert result["nvml_total_mib"] == SHARE_MIB, result
    assert result["alloc_one_more_mib"] == CUDA_ERROR_OUT_OF_MEMORY, result


def test_the_dra_agent_serves_no_device_plugin_and_its_node_says_so(dra: RealCluster) -> None:
    """manifests/dra runs the agent with --no-device-plugin: its node says
    egpu.io/allocation-mode: dra (the extender places no share there) and the kubelet offers
    no egpu.io/gpu on it once the device plugin is gone, so no card is booked by both paths."""
    args = _agent(dra)["spec"]["containers"][0]["args"]
    assert "--dra" in args and "--no-device-plugin" in args, args

    def node() -> dict[str, Any]:
        return dict(inst.get_json(dra, "node", dra.node.name))

    dra.wait_for("the node's egpu.io/allocation-mode: dra", lambda: node()["metadata"].get(
        "annotations", {}).get("egpu.io/allocation-mode") == "dra", timeout=60, interval=1.0)
    dra.wait_for("no allocatable egpu.io/gpu on the node", lambda: node()["status"].get(
        "allocatable", {}).get("egpu.io/gpu", "0") == "0", timeout=120, interval=2.0)


def test_a_share_claim_runs_and_its_container_sees_exactly_the_share(dra: RealCluster) -> None:
    result = _run_share(dra, "dra-share")
    _assert_share(result)
    claim = _claim_of(dra, "dra-share")
    (device,) = claim["status"]["allocation"]["devices"]["results"]
    # one of the card's shares, the capacity's default (egpu/dra/slices.py)
    assert device["consumedCapacity"] == {"memory": "4Gi", "cores": "30", "shares": "1"}
    assert device["pool"] == dra.node.name
    # The interposer's config, as the hook wrote it from the claim's allocation file.
    live = inst.get_json(dra, "pod", "-n", NS, "dra-share")
    config_path = dra.node.host_path(
        f"/var/run/egpu-node/hook/{live['metadata']['uid']}_probe/config.json")
    config = json.loads(config_path.read_text())
    assert [(c["memory_mib"], c["cores"]) for c in config["cards"]] == [(SHARE_MIB, 30)]
    assert config["priority"] == "high" and config["compute_policy"] == "strict"


def test_the_claims_files_live_while_the_pod_runs_and_go_with_it(dra: RealCluster) -> None:
    live = inst.get_json(dra, "pod", "-n", NS, "dra-share")
    claim = _claim_of(dra, "dra-share")
    files = _claim_files(dra, claim["metadata"]["uid"], live["metadata"]["uid"])
    missing = [k for k, p in files.items() if not p.exists()]
    assert missing == [], files
    spec = json.loads(files["cdi"].read_text())
    assert spec["devices"][0]["name"] == f"claim-{claim['metadata']['uid']}-gpu"
    dra.kubectl("-n", NS, "delete", "pod", "dra-share", "--wait=true", timeout=90)
    dra.wait_for("the claim of the deleted pod gone",
                 lambda: claim["metadata"]["name"] not in dra.kubectl(
                     "-n", NS, "get", "resourceclaims", "-o", "name"), timeout=60)
    dra.wait_for("the claim's files removed from the node",
                 lambda: not any(p.exists() for p in files.values()), timeout=60)
    own = dra.node.host_path(f"/var/run/egpu/containers/{live['metadata']['uid']}_probe")
    assert not own.exists()  # never made: the container drew on the claim's folder


def test_a_bad_share_config_never_starts_and_says_why(dra: RealCluster) -> None:
    bad = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig", "priority": "urgent"}
    inst.apply_json(dra, _template("dra-bad", config=bad))
    inst.apply_json(dra, _pod("dra-bad", "dra-bad"))
    want = "ShareConfig.priority: 'urgent'"

    def said() -> str | None:
        events = dra.kubectl("-n", NS, "get", "events", "--field-selector",
                             "involvedObject.name=dra-bad", "-o", "json")
        found = [(e.get("reason", ""), e.get("message", ""))
                 for e in json.loads(events)["items"] if want in e.get("message", "")]
        return found[0] if found else None

    reason, message = dra.wait_for("the pod's event with the ShareConfig message", said,
                                   timeout=90, interval=1.0)
    assert reason == "FailedPrepareDynamicResources", (reason, message)
    assert "egpu: ShareConfig.priority: 'urgent'; allowed: high, low" in message, message
    live = inst.get_json(dra, "pod", "-n", NS, "dra-bad")
    assert live["status"]["phase"] != "Running", live["status"]
    assert not live["status"].get("containerStatuses", [{}])[0].get("state", {}).get("running")
    dra.kubectl("-n", NS, "delete", "pod", "dra-bad", "--wait=true", timeout=90)


def test_the_plugin_registers_again_after_an_agent_restart(dra: RealCluster) -> None:
    def registered(agent: str) -> bool:
        return REGISTERED in dra.kubectl("-n", inst.NAMESPACE, "logs", agent, "-c", "agent",
                                         check=False)

    old = _agent(dra)["metadata"]["name"]
    dra.wait_for("the kubelet's registration of the plugin", lambda: registered(old),
                 timeout=60)
    dra.kubectl("-n", inst.NAMESPACE, "delete", "pod", old, "--wait=true", timeout=120)
    _wait_dra_ready(dra)
    new = _agent(dra)["metadata"]["name"]
    assert new != old
    dra.wait_for("the kubelet's registration of the restarted plugin", lambda: registered(new),
                 timeout=90)
    _assert_share(_run_share(dra, "dra-after-restart"))
    dra.kubectl("-n", NS, "delete", "pod", "dra-after-restart", "--wait=true", timeout=90)


def _container_probe(cluster: RealCluster, pod: str, container: str) -> dict[str, Any]:
    def result() -> dict[str, Any] | None:
        logs = cluster.kubectl("-n", NS, "logs", pod, "-c", container, check=False)
        for line in logs.splitlines():
            if line.startswith("PROBE "):
                return dict(json.loads(line[len("PROBE "):]))
        return None

    try:
        return dict(cluster.wait_for(f"probe output of {pod}/{container}", result,
                                     timeout=inst.POD_START_S, interval=1.0))
    except Exception as exc:
        raise AssertionError(f"{exc}\n{inst.describe_namespace(cluster, NS)}") from exc


def test_the_webhook_in_dra_mode_gives_each_container_its_own_share(dra: RealCluster) -> None:
    """FC-11 through the whole DRA path: an ordinary pod spec (egpu.io/gpu-memory per
    container, `egpu.io/allocation-mode: dra`) -> the webhook's ResourceClaim (a request per
    container) -> the kube-scheduler's allocation -> the plugin's per-request CDI
    devices and allocation file -> each container sees its own share, not the claim's."""
    shares = {"embed": 3000, "rerank": 1000}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "dra-webhook", "namespace": NS, "labels": {"egpu-e2e": "dra"},
                     "annotations": {"egpu.io/allocation-mode": "dra"}},
        "spec": {
            "nodeSelector": {inst.REAL_LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": name, "image": inst.devimages.IMAGE_EGPU,
                "command": ["python3", "-c", inst.PROBE],
                "resources": {"limits": {"cpu": inst.PROBE_CPU, "memory": inst.PROBE_MEMORY,
                                         "egpu.io/gpu-memory": str(mib)}},
            } for name, mib in shares.items()],
        },
    }
    inst.apply_json(dra, pod)
    live = inst.get_json(dra, "pod", "-n", NS, "dra-webhook")
    assert [c["name"] for c in live["spec"]["resourceClaims"]] == ["egpu"], live["spec"]
    for name, mib in shares.items():
        result = _container_probe(dra, "dra-webhook", name)
        assert (result["total_mib"], result["nvml_total_mib"]) == (mib, mib), (name, result)
        assert result["alloc_one_more_mib"] == CUDA_ERROR_OUT_OF_MEMORY, (name, result)
    claim = live["spec"]["resourceClaims"][0]["resourceClaimName"]
    dra.kubectl("-n", NS, "delete", "pod", "dra-webhook", "--wait=true", timeout=90)
    # the pod's share is freed with the pod (the claim unreserved and deallocated); the claim
    # itself goes at the webhook's next sweep past its 120 s grace (test_dra_claims_e2e.py
    # checks that on a short grace): deleted here so the next tests start from no claim
    dra.wait_for("the webhook's claim freed", lambda: not (inst.get_json(
        dra, "resourceclaim", "-n", NS, claim).get("status") or {}).get("allocation"),
        timeout=60, interval=1.0)
    dra.kubectl("-n", NS, "delete", "resourceclaim", claim, "--wait=true", timeout=90)


# A burst on the node's two cards (100 cores each): 40 cores a pod, so 2 pods fit a card and
# 4 of the 6 run; the other 2 stay Pending.
BURST_CORES = 40
PER_CARD = 100 // BURST_CORES  # 2 burst shares fit a card's cores
CLAIM_STATE = "/var/run/egpu-node/dra/claims"


def _slice_cards(cluster: RealCluster) -> dict[str, tuple[Card, Decimal, Decimal]]:
    """device name -> (the card, its memory in bytes, its cores) as the node's ResourceSlices
    publish them (the capacity the kube-scheduler books against)."""
    out = {}
    for s in _slices(cluster):
        for d in s["spec"]["devices"]:
            attrs = {k: next(iter(v.values())) for k, v in d["attributes"].items()}
            card = Card(uuid=attrs["uuid"], index=attrs["index"], model=attrs["model"],
                        memory_mib=attrs["memoryMiB"])
            memory = parse_quantity(d["capacity"][DRA_CAPACITY_MEMORY]["value"])
            cores = parse_quantity(d["capacity"][DRA_CAPACITY_CORES]["value"])
            assert memory is not None and cores is not None, d
            out[d["name"]] = (card, memory, cores)
    return out


def _booked(cluster: RealCluster, cards: list[Card]) -> dict[str, tuple[int, int]]:
    """card UUID -> (MiB, cores) booked by every allocated claim on the node, decoded with
    egpu.dra.allocation (the plugin's and kubectl egpu's decoder)."""
    booked: dict[str, tuple[int, int]] = {c.uuid: (0, 0) for c in cards}
    for claim in inst.get_json(cluster, "resourceclaims", "-A")["items"]:
        if allocation.claim_pool(claim) != cluster.node.name:
            continue
        for d in allocation.claim_devices(claim, cluster.node.name, cards):
            mib, cores = booked[d.uuid]
            booked[d.uuid] = (mib + d.memory_mib, cores + d.cores)
    return booked


def _state_files(cluster: RealCluster) -> set[str]:
    folder = cluster.node.host_path(CLAIM_STATE)
    return {p.stem for p in folder.glob("*.json")} if folder.exists() else set()


def _agent_container(cluster: RealCluster) -> tuple[str, dict[str, Any]]:
    agent = _agent(cluster)
    (status,) = [c for c in agent["status"]["containerStatuses"] if c["name"] == "agent"]
    return agent["metadata"]["name"], dict(status)


def _prepared_lines(log: str) -> list[str]:
    """The claim UIDs of the agent's "prepared ResourceClaim ns/name (uid)" lines (one per
    fresh prepare: a repeated call answers from the state without the line)."""
    return [line.split("prepared ResourceClaim ", 1)[1].split("(", 1)[1].split(")", 1)[0]
            for line in log.splitlines() if "prepared ResourceClaim " in line
            and "unprepared ResourceClaim " not in line]


def test_an_agent_sigkill_during_a_burst_of_claims_overbooks_no_card_and_loses_no_share(
        dra: RealCluster) -> None:
    """Issue 14 on the real node: share pods (4Gi, 40 cores) two more than the node's cards of
    100 cores hold (2 a card), the node agent SIGKILLed (its container, as a crash) once the
    first claim of the burst is prepared, with the second half of the burst created while it
    is down. Afterwards: no card booked past its ResourceSlice capacity (exactly 2 shares a
    card), the placed pods run and each sees exactly its share, the other 2 stay Pending
    (Unschedulable, never Failed),
    no claim prepared twice across both agent lives, and after the pods go no claim's or
    pod's file is left on the node."""
    dra.wait_for("no claims of earlier tests", lambda: not inst.get_json(
        dra, "resourceclaims", "-n", NS)["items"], timeout=60, interval=1.0)
    agent, before = _agent_container(dra)
    dra.wait_for("the kubelet's registration of the plugin", lambda: REGISTERED in dra.kubectl(
        "-n", inst.NAMESPACE, "logs", agent, "-c", "agent", check=False), timeout=60)
    known = _state_files(dra)
    fit = PER_CARD * len(_slice_cards(dra))  # what the node's cards hold
    burst_wave = (fit + 2) // 2
    names = [f"dra-burst-{i}" for i in range(fit + 2)]

    def wave(part: list[str]) -> None:
        inst.apply_json(dra, {"apiVersion": "v1", "kind": "List",
                              "items": [_pod(n, "dra-burst") for n in part]})

    inst.apply_json(dra, _template("dra-burst", cores=str(BURST_CORES)))
    wave(names[:burst_wave])
    first = dra.wait_for("the burst's first claim prepared", lambda: _state_files(dra) - known,
                         timeout=inst.POD_START_S, interval=0.1)
    dra.node.crictl("stop", "--timeout=0", before["containerID"].split("//", 1)[1])  # SIGKILL
    wave(names[burst_wave:])

    def restarted() -> bool:
        name, status = _agent_container(dra)
        return (name == agent and status["restartCount"] > before["restartCount"]
                and bool(status.get("ready")) and REGISTERED in dra.kubectl(
                    "-n", inst.NAMESPACE, "logs", agent, "-c", "agent", check=False))

    dra.wait_for("the killed agent's container restarted and registered", restarted,
                 timeout=90, interval=1.0)

    def pods() -> dict[str, dict[str, Any]]:
        items = inst.get_json(dra, "pods", "-n", NS)["items"]
        return {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in names}

    def unschedulable(pod: dict[str, Any]) -> bool:
        return pod["status"]["phase"] == "Pending" and any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in pod["status"].get("conditions", []))

    def settled() -> dict[str, dict[str, Any]] | None:
        now = pods()
        running = [p for p in now.values() if p["status"]["phase"] == "Running"]
        return now if len(running) == fit and sum(map(unschedulable, now.values())) == 2 \
            else None

    try:
        live = dra.wait_for(f"{fit} burst pods Running, 2 Unschedulable", settled,
                            timeout=inst.POD_START_S, interval=1.0)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{inst.describe_namespace(dra, NS)}") from exc
    # (1) no card booked past its published capacity: exactly 2 shares on each card
    published = _slice_cards(dra)
    cards = [card for card, _, _ in published.values()]
    booked = _booked(dra, cards)
    for card, memory, cores in published.values():
        mib, used = booked[card.uuid]
        assert mib * MIB <= memory and used <= cores, (card, booked)
        assert (mib, used) == (2 * SHARE_MIB, 2 * BURST_CORES), (card, booked)
    # (2) each running pod's container sees exactly its share, from its own prepared claim
    claims: dict[str, dict[str, Any]] = {n: _claim_of(dra, n) for n in names}
    running = sorted(n for n, p in live.items() if p["status"]["phase"] == "Running")
    for name in running:
        _assert_share(inst.probe_result(dra, NS, name))
        uid = live[name]["metadata"]["uid"]
        config = json.loads(dra.node.host_path(
            f"/var/run/egpu-node/hook/{uid}_probe/config.json").read_text())
        assert [(c["memory_mib"], c["cores"]) for c in config["cards"]] == [
            (SHARE_MIB, BURST_CORES)], (name, config)
        files = _claim_files(dra, claims[name]["metadata"]["uid"], uid)
        assert all(p.exists() for p in files.values()), (name, files)
    # (3) the surplus stays Pending, unallocated, unprepared; none Failed; no double prepare
    pending = sorted(set(names) - set(running))
    for name in pending:
        assert unschedulable(live[name]), live[name]["status"]
        assert not claims[name].get("status", {}).get("allocation"), claims[name]["status"]
    assert claims[pending[0]]["metadata"]["uid"] not in _state_files(dra)
    killed = _prepared_lines(dra.kubectl("-n", inst.NAMESPACE, "logs", agent, "-c", "agent",
                                         "--previous"))
    new = _prepared_lines(dra.kubectl("-n", inst.NAMESPACE, "logs", agent, "-c", "agent"))
    uids = {n: claims[n]["metadata"]["uid"] for n in names}
    for name in names:
        assert (killed + new).count(uids[name]) <= 1, (name, killed, new)
    # what the killed agent prepared runs; the second wave (at least one of it places: the first
    # wave is short of the cards by one) was prepared by the restarted agent, once
    assert set(first) <= {uids[n] for n in running}, (first, uids)
    late = [n for n in running if names.index(n) >= burst_wave]
    assert late and all(new.count(uids[n]) == 1 for n in late), (late, new)
    assert {uids[n] for n in running} <= _state_files(dra)

    dra.kubectl("-n", NS, "delete", "pod", *names, "--wait=true", timeout=120)
    dra.wait_for("the burst's claims gone", lambda: not inst.get_json(
        dra, "resourceclaims", "-n", NS)["items"], timeout=60, interval=1.0)

    def left() -> dict[str, list[str]]:
        """What the node still holds of the burst: each claim's state and CDI spec, each
        pod's allocation file, hook and region folders, and any claim state whose
        ResourceClaim is gone."""
        found = {}
        for n in names:
            pod_uid = live[n]["metadata"]["uid"]
            paths = [*_claim_files(dra, claims[n]["metadata"]["uid"], pod_uid).values(),
                     dra.node.host_path(f"/var/run/egpu-node/hook/{pod_uid}_probe"),
                     dra.node.host_path(f"/var/run/egpu/containers/{pod_uid}_probe")]
            found[n] = [str(p) for p in paths if p.exists()]
        exist = {c["metadata"]["uid"] for c in inst.get_json(
            dra, "resourceclaims", "-A")["items"]}
        found["state of deleted claims"] = sorted(_state_files(dra) - exist)
        return {k: v for k, v in found.items() if v}

    try:
        dra.wait_for("no file of the burst's claims and pods left on the node",
                     lambda: not left(), timeout=60, interval=1.0)
    except Exception as exc:
        raise AssertionError(f"{exc}: {left()}") from exc


# --- issue 24: one ResourceClaim used by two containers of a pod and by a second pod --------------
SHARED_MIB = 3000
SHARED_CORES = 25
HELD_MIB = 2000
CONTEXT_MIB = 256  # what the interposer charges a CUDA context (EGPU_CONTEXT_OVERHEAD_MIB default)
# MODE=hold: allocate HELD_MIB, mark /shared/held (an emptyDir of the pod), keep it until
# SIGTERM. MODE=try: wait for the mark (with WAIT set), then try HELD_MIB (over the share: the
# holder has it) and 400 MiB (within it); print, and with HOLD set keep the 400 MiB, else free
# and exit.
SHARED_PROBE = inst.HELD_ALLOCATIONS + '''
import json, time
cuda.cuInit(0)
dev, ctx = C.c_int(), C.c_void_p()
cuda.cuDeviceGet(C.byref(dev), 0)
out = {"ctx": cuda.cuCtxCreate_v2(C.byref(ctx), 0, dev)}
if os.environ["MODE"] == "hold":
    out["hold"] = alloc(HELD)
    if os.path.isdir("/shared"):
        open("/shared/held", "w").close()
else:
    while os.environ.get("WAIT") and not os.path.exists("/shared/held"):
        time.sleep(0.2)
free, total = C.c_size_t(), C.c_size_t()
cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total))
out["total_mib"], out["free_mib"] = total.value // MIB, free.value // MIB
if os.environ["MODE"] == "try":
    out["over"] = alloc(HELD)
    out["within"] = alloc(400)
print("PROBE " + json.dumps(out), flush=True)
if os.environ["MODE"] == "try" and not os.environ.get("HOLD"):
    release()
while True:
    time.sleep(3600)
'''.replace("HELD", str(HELD_MIB))


def _shared_claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS, "labels": {"egpu-e2e": "dra"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "share.gpu.egpu.io",
                "capacity": {"requests": {"memory": f"{SHARED_MIB}Mi",
                                          "cores": str(SHARED_CORES)}}}}]}}}


def _shared_pod(name: str, claim: str, containers: dict[str, dict[str, str]]) -> dict[str, Any]:
    """A pod of ``containers`` (name -> SHARED_PROBE's env), each naming ResourceClaim
    ``claim`` (by resourceClaimName), with an emptyDir /shared between them."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"egpu-e2e": "dra"}},
        "spec": {
            "nodeSelector": {inst.REAL_LABEL: "true"},
            "terminationGracePeriodSeconds": 5,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "containers": [{
                "name": c, "image": inst.devimages.IMAGE_EGPU,
                "command": ["python3", "-c", SHARED_PROBE],
                "env": [{"name": k, "value": v} for k, v in env.items()],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                "resources": {"limits": {"cpu": inst.PROBE_CPU, "memory": inst.PROBE_MEMORY},
                              "claims": [{"name": "gpu"}]},
            } for c, env in containers.items()],
        },
    }


def test_a_claim_shared_by_two_containers_and_a_second_pod_holds_one_budget_and_one_cap(
        dra: RealCluster) -> None:
    """Issue 24 on the real node: ResourceClaim dra-shared (3000 MiB, 25 cores) named by both
    containers of one pod and by a second pod that joins it later (the kubelet prepares a
    claim once: its containers get their share from the claim's shares file). While one
    container holds 2000 MiB, each of the others sees a 3000 MiB total, gets OUT_OF_MEMORY for
    2000 MiB and CUDA_SUCCESS for 400 MiB (3000 - 2000 - a context each); the card's roster
    lists the claim once with its 25 cores (one compute cap for all of them). Deleted while in
    use, the claim stays until its pods end; then no file of it or of its pods is left.
    The bug this catches: NodePrepareResources refused two containers on one request, and a
    budget per container would have given each the whole 3000 MiB."""
    inst.apply_json(dra, _shared_claim("dra-shared"))
    inst.apply_json(dra, _shared_pod("dra-shared-a", "dra-shared", {
        "holder": {"MODE": "hold"}, "sidecar": {"MODE": "try", "WAIT": "1"}}))
    holder = _container_probe(dra, "dra-shared-a", "holder")
    assert (holder["ctx"], holder["hold"], holder["total_mib"]) == (0, 0, SHARED_MIB), holder
    sidecar = _container_probe(dra, "dra-shared-a", "sidecar")
    assert (sidecar["total_mib"], sidecar["over"], sidecar["within"]) == (
        SHARED_MIB, CUDA_ERROR_OUT_OF_MEMORY, 0), sidecar
    assert sidecar["free_mib"] == SHARED_MIB - HELD_MIB - 2 * CONTEXT_MIB, sidecar
    # the sidecar freed its 400 MiB and exited: the second pod joins the claim
    def sidecar_done() -> bool:
        statuses = inst.get_json(dra, "pod", "-n", NS, "dra-shared-a")["status"].get(
            "containerStatuses") or []
        return any(c["name"] == "sidecar" and "terminated" in c["state"] for c in statuses)

    dra.wait_for("the sidecar done", sidecar_done, timeout=60, interval=1.0)
    inst.apply_json(dra, _shared_pod("dra-shared-b", "dra-shared", {
        "joiner": {"MODE": "try", "HOLD": "1"}}))
    joiner = _container_probe(dra, "dra-shared-b", "joiner")
    assert (joiner["total_mib"], joiner["over"], joiner["within"]) == (
        SHARED_MIB, CUDA_ERROR_OUT_OF_MEMORY, 0), joiner
    assert joiner["free_mib"] == SHARED_MIB - HELD_MIB - 2 * CONTEXT_MIB, joiner

    claim = inst.get_json(dra, "resourceclaim", "-n", NS, "dra-shared")
    claim_uid = claim["metadata"]["uid"]
    reserved = {r["name"] for r in claim["status"]["reservedFor"]}
    assert reserved == {"dra-shared-a", "dra-shared-b"}, claim["status"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    card = _slice_cards(dra)[result["device"]][0]
    folder = f"claim-{claim_uid}_gpu"
    roster = card_roster.read_roster(str(dra.node.host_path(f"/var/run/egpu/cards/{card.uuid}")))
    entries = [e for e in roster.shares().values() if e.owner == card_roster.share_owner(folder)]
    assert [e.cores for e in entries] == [SHARED_CORES], roster
    pods = {n: inst.get_json(dra, "pod", "-n", NS, n)["metadata"]["uid"]
            for n in ("dra-shared-a", "dra-shared-b")}
    for uid in pods.values():  # no accounting folder of a container's own
        assert not list(dra.node.host_path("/var/run/egpu/containers").glob(f"{uid}_*"))

    # deleted while in use: it stays (its finalizer) and its pods keep running
    dra.kubectl("-n", NS, "delete", "resourceclaim", "dra-shared", "--wait=false")
    time.sleep(3)
    live = inst.get_json(dra, "resourceclaim", "-n", NS, "dra-shared")
    assert live["metadata"].get("deletionTimestamp"), live["metadata"]
    assert inst.get_json(dra, "pod", "-n", NS, "dra-shared-b")["status"]["phase"] == "Running"
    files = [dra.node.host_path(p) for p in (
        f"/var/run/egpu-node/dra/claims/{claim_uid}.json",
        f"/var/run/egpu-node/claim-shares/{claim_uid}.json",
        f"/var/run/cdi/egpu-claim-{claim_uid}.json", f"/var/run/egpu/containers/{folder}",
        *(f"/var/run/egpu-node/allocations/{u}.json" for u in pods.values()),
        *(f"/var/run/egpu-node/hook/{u}_{c}" for u, c in (
            (pods["dra-shared-a"], "holder"), (pods["dra-shared-a"], "sidecar"),
            (pods["dra-shared-b"], "joiner"))))]
    assert [str(p) for p in files[:4] if not p.exists()] == []

    dra.kubectl("-n", NS, "delete", "pod", "dra-shared-a", "dra-shared-b", "--wait=true",
                timeout=120)
    dra.wait_for("the deleted claim gone with its last pod",
                 lambda: "dra-shared" not in dra.kubectl(
                     "-n", NS, "get", "resourceclaims", "-o", "name"), timeout=90, interval=1.0)
    try:
        dra.wait_for("no file of the shared claim or its pods left", lambda: not any(
            p.exists() for p in files), timeout=60, interval=1.0)
    except Exception as exc:
        raise AssertionError(f"{exc}: {[str(p) for p in files if p.exists()]}") from exc
    roster = card_roster.read_roster(str(dra.node.host_path(f"/var/run/egpu/cards/{card.uuid}")))
    assert card_roster.share_owner(folder) not in {e.owner for e in roster.shares().values()}
