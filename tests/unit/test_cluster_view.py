"""egpu top's pure view: bookings per card from allocation annotations, usage from the node."""

from __future__ import annotations

from typing import Any

import pytest

from cli.top_cmd import format_views
from egpu.cluster_view import cluster_view
from egpu.config import Config, config_generation
from egpu.records import (
    Allocation,
    Card,
    CardShare,
    CardUsage,
    ContainerAllocation,
    Inventory,
    NodeUsage,
)

CARDS = (Card("GPU-a", 0, "NVIDIA A10", 23028), Card("GPU-b", 1, "NVIDIA A10", 23028))


def node(name: str = "n1", usage: NodeUsage | None = None) -> dict[str, Any]:
    annotations = {"egpu.io/inventory": Inventory(CARDS).encode()}
    if usage:
        annotations["egpu.io/usage"] = usage.encode()
    return {"metadata": {"name": name, "annotations": annotations}}


def pod(name: str, allocation: Allocation, spec: dict[str, Any], phase: str = "Running",
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "annotations": {
        "egpu.io/allocation": allocation.encode(), **(annotations or {})}},
        "spec": {"nodeName": "n1", **spec}, "status": {"phase": phase}}


def limits(mib: int, cores: int) -> dict[str, Any]:
    return {"resources": {"limits": {"egpu.io/gpu-memory": mib, "egpu.io/gpu-cores": cores}}}


def test_fc07_init_rule_and_summed_containers_per_card() -> None:
    init_pod = pod("ocr", Allocation((
        ContainerAllocation("warm", True, (CardShare("GPU-a", 0, 12000, 100),)),
        ContainerAllocation("ocr", False, (CardShare("GPU-a", 0, 8000, 20),)))),
        {"initContainers": [{"name": "warm", **limits(12000, 100)}],
         "containers": [{"name": "ocr", **limits(8000, 20)}]})
    two = pod("retrieval", Allocation((
        ContainerAllocation("e", False, (CardShare("GPU-b", 1, 4000, 10),)),
        ContainerAllocation("r", False, (CardShare("GPU-b", 1, 6000, 10),)))),
        {"containers": [{"name": "e", **limits(4000, 10)}, {"name": "r", **limits(6000, 10)}]},
        annotations={"egpu.io/priority": "low"})
    finished = ContainerAllocation("x", False, (CardShare("GPU-b", 1, 9, 9),))
    done = pod("old", Allocation((finished,)),
               {"containers": [{"name": "x", **limits(9, 9)}]}, phase="Succeeded")
    usage = NodeUsage((CardUsage("GPU-a", 5000, 42.0),))
    [view] = cluster_view([node(usage=usage), {"metadata": {"name": "cpu-node"}}],
                          [init_pod, two, done])
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores, len(a.shares)) == (12000, 100, 2)
    assert (b.booked_mib, b.booked_cores, len(b.shares)) == (10000, 20, 2)
    assert (a.used_mib, a.compute_used_percent, b.used_mib) == (5000, 42.0, None)
    assert {s.priority for s in b.shares} == {"low"}
    text = format_views([view])
    assert "ns/ocr/warm (init): 12000 MiB, 100% cores" in text


def test_malformed_annotations_are_problems_not_crashes() -> None:
    bad_node = {"metadata": {"name": "n1", "annotations": {"egpu.io/inventory": "{"}}}
    [view] = cluster_view([bad_node], [])
    assert view.problems and "not valid JSON" in view.problems[0]
    bad_pod = {"metadata": {"name": "p", "namespace": "ns",
                            "annotations": {"egpu.io/allocation": "[]"}},
               "spec": {"nodeName": "n1"}}
    [view] = cluster_view([node()], [bad_pod])
    assert "pod ns/p" in view.problems[0]


def test_placed_records_are_read_without_the_pod_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record with kinds and policies (a current extender's): bookings by the
    effective-request rule from the record's kinds, priority from the record, and the pod
    spec never read (here it is empty)."""
    def read_pod(*_: object) -> None:
        raise AssertionError("kubectl egpu read the pod spec for what the record says")

    monkeypatch.setattr("egpu.cluster_view.read_pod", read_pod)

    def entry(name: str, kind: str, uuid: str, mib: int, cores: int) -> ContainerAllocation:
        return ContainerAllocation(name, kind != "container",
                                   (CardShare(uuid, 0 if uuid == "GPU-a" else 1, mib, cores),),
                                   kind)

    # GPU-a: an init (12000) then the app (8000): max. GPU-b: a sidecar (2000), an init after
    # it (4000: it runs beside the sidecar), the app (3000): max(2000 + 3000, 2000 + 4000).
    ocr = pod("ocr", Allocation((entry("warm", "init", "GPU-a", 12000, 100),
                                 entry("ocr", "container", "GPU-a", 8000, 20)),
                                "n1", "high", "strict", False), {})
    mixed = pod("mixed", Allocation((entry("proxy", "sidecar", "GPU-b", 2000, 5),
                                     entry("load", "init", "GPU-b", 4000, 30),
                                     entry("serve", "container", "GPU-b", 3000, 10)),
                                    "n1", "low", "elastic", True), {},
                annotations={"egpu.io/priority": "high"})  # the record wins
    [view] = cluster_view([node()], [ocr, mixed])
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores) == (12000, 100)
    assert (b.booked_mib, b.booked_cores) == (6000, 35)
    assert {s.priority for s in a.shares} == {"high"} and {s.priority for s in b.shares} == {"low"}
    assert [(s.container, s.init) for s in b.shares] == [
        ("proxy", True), ("load", True), ("serve", False)]


def test_record_bookings_equal_the_spec_reading_for_a_placed_pod() -> None:
    """The same pod, its record with and without kinds: the same bookings (one with the spec
    read, one without)."""
    spec = {"initContainers": [{"name": "proxy", "restartPolicy": "Always", **limits(2000, 5)},
                               {"name": "load", **limits(4000, 30)}],
            "containers": [{"name": "serve", **limits(3000, 10)}]}
    shares = [("proxy", "sidecar", 2000, 5), ("load", "init", 4000, 30),
              ("serve", "container", 3000, 10)]
    containers = tuple(ContainerAllocation(n, k != "container",
                                           (CardShare("GPU-b", 1, m, c),), k)
                       for n, k, m, c in shares)
    placed = Allocation(containers, "n1", "high", "strict", False)
    old = Allocation(tuple(c.replace(kind=None) for c in containers), "n1")
    [new_view] = cluster_view([node()], [pod("p", placed, spec)])
    [old_view] = cluster_view([node()], [pod("p", old, spec)])
    assert [(c.booked_mib, c.booked_cores) for c in new_view.cards] == [
        (c.booked_mib, c.booked_cores) for c in old_view.cards] == [(0, 0), (6000, 35)]


# --- DRA shares (ResourceClaims of driver gpu.egpu.io) beside the extender's ------------------

SHARE_CONFIG = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig",
                "priority": "low", "computePolicy": "elastic"}


def claim(name: str, results: list[tuple[str, str, str, str]], config: Any = SHARE_CONFIG,
          namespace: str = "ml", pool: str = "n1") -> dict[str, Any]:
    """An allocated ResourceClaim: results [(request, device, memory, cores)]."""
    entries = [] if config is None else [{"source": "FromClaim", "requests": [], "opaque": {
        "driver": "gpu.egpu.io", "parameters": config}}]
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"config": entries, "results": [
                {"request": r, "driver": "gpu.egpu.io", "pool": pool, "device": d,
                 "shareID": f"share-{i}", "consumedCapacity": {"memory": m, "cores": c}}
                for i, (r, d, m, c) in enumerate(results)]}}}}


def claim_pod(name: str, claim_name: str, containers: dict[str, list[str] | None],
              init: dict[str, list[str] | None] | None = None, phase: str = "Running",
              namespace: str = "ml") -> dict[str, Any]:
    """A pod with one pod claim ``egpu`` (from a template, resolved to ``claim_name``);
    containers: name -> the requests it names (None: the whole claim)."""
    def spec(entries: dict[str, list[str] | None]) -> list[dict[str, Any]]:
        return [{"name": n, "resources": {"claims": [{"name": "egpu"}] if rs is None else [
            {"name": "egpu", "request": r} for r in rs]}} for n, rs in entries.items()]

    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"nodeName": "n1", "initContainers": spec(init or {}),
                     "containers": spec(containers),
                     "resourceClaims": [{"name": "egpu", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": phase, "resourceClaimStatuses": [
                {"name": "egpu", "resourceClaimName": claim_name}]}}


def test_a_dra_share_shows_per_pod_and_card_and_books_beside_the_extenders() -> None:
    extender = pod("ocr", Allocation((ContainerAllocation(
        "ocr", False, (CardShare("GPU-a", 0, 8000, 20),), "container"),),
        "n1", "high", "strict", False), {})
    dra_pod = claim_pod("share-pod", "share-pod-egpu-x", {"main": None, "logger": []})
    dra_pod["spec"]["containers"][1]["resources"] = {}  # logger names no claim
    claims = [claim("share-pod-egpu-x", [("gpu", "gpu-a", "8Gi", "30")])]
    [view] = cluster_view([node()], [extender, dra_pod], claims=claims)
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores, a.dra_booked_mib, a.dra_booked_cores) == (
        8000 + 8192, 20 + 30, 8192, 30)
    assert (b.booked_mib, b.booked_cores, b.shares) == (0, 0, [])
    old, new = a.shares
    assert (old.path, old.claim, old.priority, old.compute_policy) == (
        "extender", "", "high", "strict")
    assert (new.namespace, new.pod, new.container, new.init, new.memory_mib, new.cores) == (
        "ml", "share-pod", "main", False, 8192, 30)
    assert (new.path, new.claim, new.priority, new.compute_policy) == (
        "dra", "share-pod-egpu-x", "low", "elastic")
    assert view.problems == []
    text = format_views([view])
    assert "16192" in text and " 2 (DRA 8192 MiB, 30%)" in text
    assert ("ml/share-pod/main: 8192 MiB, 30% cores, priority low, elastic, "
            "DRA claim share-pod-egpu-x") in text
    assert "ns/ocr/ocr: 8000 MiB, 20% cores, priority high, strict\n" in text


def test_the_webhooks_init_headroom_books_the_larger_share_and_each_container_its_own() -> None:
    """FC-07 on the DRA path: the webhook's plan gives the app container its request and the
    init container that request plus a headroom on the same card: the card books
    max(12000, 8000) MiB as on the extender path, the init container shows 12000 MiB."""
    from egpu.dra.claims import plan_claims
    from egpu.requests import read_pod

    spec = {"initContainers": [{"name": "compile", **limits(12000, 100)}],
            "containers": [{"name": "serve", **limits(8000, 20)}]}
    request = read_pod({"metadata": {"name": "p", "namespace": "ml"}, "spec": spec}).request
    assert request is not None
    plan = plan_claims(request)
    requests = plan.template_in("ml")["spec"]["spec"]["devices"]["requests"]
    asked = {r["name"]: r["exactly"]["capacity"]["requests"] for r in requests}
    placed = claim("p-egpu-x", [(name, "gpu-b", a["memory"], a.get("cores", "0"))
                                for name, a in asked.items()], config=None)
    the_pod = claim_pod("p", "p-egpu-x", {"serve": list(plan.requests_of("serve"))},
                        init={"compile": list(plan.requests_of("compile"))})
    [view] = cluster_view([node()], [the_pod], claims=[placed])
    b = view.cards[1]
    assert (b.booked_mib, b.booked_cores) == (12000, 100)
    assert [(s.container, s.init, s.memory_mib, s.cores, s.priority, s.compute_policy)
            for s in b.shares] == [("compile", True, 12000, 100, "high", "strict"),
                                   ("serve", False, 8000, 20, "high", "strict")]


def test_a_claim_that_no_active_pod_uses_still_books_its_card() -> None:
    done = claim_pod("done", "done-egpu-x", {"main": None}, phase="Succeeded")
    claims = [claim("done-egpu-x", [("gpu", "gpu-a", "4Gi", "10")]),
              claim("hand-made", [("gpu", "gpu-a", "1Gi", "0")], namespace="other")]
    [view] = cluster_view([node()], [done], claims=claims)
    a = view.cards[0]
    assert (a.booked_mib, a.booked_cores) == (5120, 10)
    assert [(s.namespace, s.pod, s.claim, s.memory_mib) for s in a.shares] == [
        ("ml", "", "done-egpu-x", 4096), ("other", "", "hand-made", 1024)]
    assert "ml/claim done-egpu-x (no pod): 4096 MiB, 10% cores, priority low" in (
        format_views([view]))


def test_a_pod_asking_egpu_io_gpu_through_the_extended_resource_shows_its_whole_card() -> None:
    whole = {"metadata": {"name": "w", "namespace": "ml"},
             "spec": {"nodeName": "n1", "containers": [
                 {"name": "c", "resources": {"limits": {"egpu.io/gpu": "1"}}}]},
             "status": {"phase": "Running", "extendedResourceClaimStatus": {
                 "resourceClaimName": "w-extended-resources-abc",
                 "requestMappings": [{"containerName": "c", "resourceName": "egpu.io/gpu",
                                      "requestName": "container-0-request-0"}]}}}
    placed = claim("w-extended-resources-abc",
                   [("container-0-request-0", "gpu-b", "23028Mi", "0")], config=None)
    [view] = cluster_view([node()], [whole], claims=[placed])
    [share] = view.cards[1].shares
    assert (share.pod, share.container, share.memory_mib, share.cores, share.path) == (
        "w", "c", 23028, 0, "dra")


def test_bad_claims_are_problems_and_other_claims_are_not_egpus() -> None:
    claims = [
        claim("bad-config", [("gpu", "gpu-a", "1Gi", "5")], config={**SHARE_CONFIG,
                                                                    "priority": "urgent"}),
        claim("gone-card", [("gpu", "gpu-zzz", "1Gi", "5")]),
        claim("half-mib", [("gpu", "gpu-b", "1.5Mi", "5")]),
        claim("elsewhere", [("gpu", "gpu-a", "1Gi", "5")], pool="cpu-node"),
        {"metadata": {"name": "pending", "namespace": "ml"}, "status": {}},
        {"metadata": {"name": "nic", "namespace": "ml"}, "status": {"allocation": {"devices": {
            "results": [{"request": "r", "driver": "net.example.com", "pool": "n1",
                         "device": "eth0"}]}}}},
    ]
    both = claim_pod("both", "bad-config", {"main": None})
    both["metadata"]["annotations"] = {"egpu.io/allocation": Allocation((), "n1").encode()}
    [view] = cluster_view([node(), {"metadata": {"name": "cpu-node"}}], [both], claims=claims)
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores, b.booked_mib) == (1024, 5, 0)  # bad-config books
    assert [(s.claim, s.priority, s.compute_policy) for s in a.shares] == [
        ("bad-config", "?", "")]  # shown without its pod: the pod is refused below
    problems = "\n".join(view.problems)
    assert "ResourceClaim ml/bad-config: ShareConfig.priority: 'urgent'" in problems
    assert "ResourceClaim ml/gone-card result 0 (device 'gpu-zzz'): no such card" in problems
    assert "ResourceClaim ml/half-mib result 0" in problems and "whole number of MiB" in problems
    assert "pod ml/both has both an egpu.io/allocation" in problems
    assert len(view.problems) == 4


def test_kubectl_egpu_prints_dra_shares_and_says_when_it_cannot_list_claims(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from cli import top_cmd

    dra_pod = claim_pod("share-pod", "share-pod-egpu-x", {"main": None})
    claims = [claim("share-pod-egpu-x", [("gpu", "gpu-a", "8Gi", "30")])]
    answers = [([node()], [dra_pod], claims, None, None),
               ([node()], [dra_pod], [], "cannot list resourceclaims (resource.k8s.io/v1): "
                                         "not allowed (403); DRA shares ...", None)]
    monkeypatch.setattr(top_cmd, "fetch", lambda *_: answers.pop(0))
    args = argparse.Namespace(kubeconfig=None, context=None, node=None, output="text",
                              egpu_namespace="egpu-system")
    assert top_cmd.run(args) == 0
    out, err = capsys.readouterr()
    assert "ml/share-pod/main: 8192 MiB, 30% cores, priority low, elastic" in out and not err
    assert top_cmd.run(args) == 0
    out, err = capsys.readouterr()
    assert "egpu top: cannot list resourceclaims" in err and "share-pod" not in out


def test_kubectl_egpu_says_which_config_each_node_agent_runs_against_the_configmap() -> None:
    """The bug it would catch: a config change that never reached a node (its agent not
    rolled, or on its last good config) looks applied from `kubectl egpu`."""
    from egpu.config import config_generation

    wanted = config_generation("sharesPerCard: 8\n")
    nodes = []
    for name, config in (("current", f"{wanted} file"), ("rolling", "0123456789ab file"),
                         ("kept", "0123456789ab last-good"), ("old-agent", None)):
        n = node(name)
        if config:
            n["metadata"]["annotations"]["egpu.io/config"] = config
        nodes.append(n)
    text = format_views(cluster_view(nodes, []), wanted)
    lines = {line.split()[0]: line for line in text.splitlines() if " config " in line}
    assert lines["current"].split(None, 1)[1] == f"config {wanted} (file)"
    assert lines["rolling"].endswith(f"ConfigMap {wanted}: not applied yet")
    assert lines["kept"].endswith(f"ConfigMap {wanted}: the ConfigMap is bad, last good kept")
    assert "old-agent" not in lines  # an agent that does not say: no line, no guess
    # without the ConfigMap (not allowed to read it): the generation alone
    assert "rolling        config 0123456789ab (file)" in format_views(
        cluster_view(nodes, []), None).splitlines()


def test_kubectl_egpu_reads_the_config_of_the_namespace_egpu_is_installed_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--egpu-namespace`` (the chart's namespace.name). Bug caught: `kubectl egpu` and
    `kubectl egpu advise` read egpu-system's ConfigMaps whatever the install's namespace, and
    lost the config generation and the configured Prometheus without a word."""
    import argparse

    from cli import top_cmd

    asked: list[str] = []

    class Core:
        def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Any:
            asked.append(f"{namespace}/{name}")
            return argparse.Namespace(data={"config.yaml": "sharesPerCard: 4\n"})

    assert top_cmd.fetch_config_generation(Core(), "gpu-share") == config_generation(
        "sharesPerCard: 4\n")
    assert asked == ["gpu-share/egpu-config"]
    parser = argparse.ArgumentParser()
    top_cmd.add_arguments(parser)
    assert parser.parse_args([]).egpu_namespace == "egpu-system"
    # the option reaches the reads: `kubectl egpu` and `kubectl egpu advise`
    fetched: list[str] = []
    monkeypatch.setattr(top_cmd, "fetch", lambda kubeconfig, context, namespace: (
        fetched.append(namespace), ([], [], [], None, None))[1])
    assert top_cmd.run(parser.parse_args(["--egpu-namespace", "gpu-share"])) == 0
    assert fetched == ["gpu-share"]
    from cli import advise_cmd

    configs: list[str] = []
    monkeypatch.setattr(advise_cmd, "cluster_config", lambda kubeconfig, context, namespace: (
        configs.append(namespace), Config())[1])
    monkeypatch.setattr(advise_cmd, "configured_prometheus",
                        lambda kubeconfig, context, namespace: configs.append(namespace))
    monkeypatch.setattr(advise_cmd, "fetch_agent_windows", lambda *_: {})
    advise = argparse.ArgumentParser()
    advise_cmd.add_arguments(advise)
    advise_cmd.run(advise.parse_args(["--egpu-namespace", "gpu-share"]), say=lambda _: None)
    assert configs and set(configs) == {"gpu-share"}, configs


def test_an_admin_access_claim_is_a_problem_and_books_nothing() -> None:
    """The node agent refuses to prepare it (kube-scheduler books nothing for it either)."""
    admin = claim("admin", [("gpu", "gpu-a", "23028Mi", "100")])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    [view] = cluster_view([node()], [], claims=[admin])
    assert (view.cards[0].booked_mib, view.cards[0].booked_cores) == (0, 0)
    assert len(view.problems) == 1 and "admin access is not supported" in view.problems[0]
