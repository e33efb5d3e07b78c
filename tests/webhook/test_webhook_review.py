"""The webhook's pure core on AdmissionReview JSON: every mutation and denial rule."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import jsonpatch
import pytest

from egpu.config import Config, load_config
from webhook.review import InvalidReview, review
from webhook.reviews import AdmissionReview

from .support import admission_review, admitted, answer, container, decoded_patch, make_pod

GPU = {"egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000"}
ENV_HIGH = [
    {"name": "EGPU_PRIORITY", "value": "high"},
    {"name": "EGPU_COMPUTE_POLICY", "value": "strict"},
    {"name": "EGPU_MEMORY_OVERSUBSCRIPTION", "value": "false"},
]
OLD_VOLUME = {"name": "egpu-runtime", "hostPath": {"path": "/var/run/egpu",
                                                   "type": "DirectoryOrCreate"}}


def second_pass(pod: dict[str, Any], config: Config | None = None) -> dict[str, Any]:
    """The answer for the admitted pod (reinvocation)."""
    return answer(admitted(pod, config), config)


# --- the envelope ---------------------------------------------------------------------


def test_uid_echoed_and_api_version_kind_set() -> None:
    result = review(admission_review(make_pod(container(limits=GPU)), uid="abc-123"), Config())
    assert result["apiVersion"] == "admission.k8s.io/v1"
    assert result["kind"] == "AdmissionReview"
    assert result["response"]["uid"] == "abc-123"
    assert "request" not in result


def test_patch_is_base64_json_patch_with_patch_type() -> None:
    response = answer(make_pod(container(limits=GPU)))
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(ops, list) and all({"op", "path"} <= set(op) for op in ops)
    assert "status" not in response and "warnings" not in response


def test_no_patch_no_patch_type() -> None:
    response = answer(make_pod(container(limits={"cpu": "1"})))
    assert response == {"uid": "uid-1", "allowed": True}


def test_denial_has_status_and_no_patch() -> None:
    response = answer(make_pod(container(limits={"egpu.io/gpu-cores": "150"})))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
    assert "patch" not in response and "patchType" not in response


def test_v1beta1_answered_in_kind() -> None:
    body = admission_review(make_pod(container(limits=GPU)))
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    assert review(body, Config())["apiVersion"] == "admission.k8s.io/v1beta1"


@pytest.mark.parametrize(("body", "needle"), [
    ([], "body"), ("x", "body"), (None, "body"),
    ({"apiVersion": "v1", "kind": "AdmissionReview", "request": {}}, "apiVersion"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {}}, "kind"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}, "request"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
      "request": {"operation": "CREATE"}}, "request.uid"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
      "request": {"uid": "", "operation": "CREATE"}}, "request.uid"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
      "request": {"uid": 5, "operation": "CREATE"}}, "request.uid"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
      "request": {"uid": "u", "operation": "CREATE"}}, "request.kind"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
      "request": {"uid": "u", "kind": {"group": "", "kind": "Pod"}}}, "request.operation"),
])
def test_not_an_admission_review_is_invalid_naming_the_field(body: Any, needle: str) -> None:
    with pytest.raises(InvalidReview, match=needle.replace(".", r"\.")):
        review(body, Config())


def test_create_without_object_is_invalid() -> None:
    body = admission_review(None)
    with pytest.raises(InvalidReview, match=r"request\.object"):
        review(body, Config())


# --- what is left alone ----------------------------------------------------------------


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_other_operations_allowed_untouched(operation: str) -> None:
    pod = make_pod(container(limits={"egpu.io/gpu-cores": "150"}), nodeName="n1")
    assert answer(pod, operation=operation) == {"uid": "uid-1", "allowed": True}


def test_other_kinds_and_subresources_allowed_untouched() -> None:
    pod = make_pod(container(limits=GPU))
    body = admission_review(pod, kind="Deployment")
    assert review(body, Config())["response"] == {"uid": "uid-1", "allowed": True}
    body = admission_review(pod, sub_resource="ephemeralcontainers")
    assert review(body, Config())["response"] == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize("namespace", ["kube-system", "egpu-system"])
def test_ignored_namespaces_allowed_untouched(namespace: str) -> None:
    pod = make_pod(container(limits={"egpu.io/gpu-cores": "150"}), namespace=namespace)
    assert answer(pod) == {"uid": "uid-1", "allowed": True}
    pod = make_pod(container(limits=GPU), namespace=namespace)
    assert answer(pod) == {"uid": "uid-1", "allowed": True}


def test_ignored_namespaces_from_config() -> None:
    config = load_config("ignoredNamespaces: [batch]")
    assert answer(make_pod(container(limits=GPU), namespace="batch"), config) == {
        "uid": "uid-1", "allowed": True}
    assert "patch" in answer(make_pod(container(limits=GPU), namespace="kube-system"), config)


def test_non_egpu_pod_with_egpu_annotations_allowed_untouched() -> None:
    pod = make_pod(container(limits={"nvidia.com/gpu": "1"}),
                   annotations={"egpu.io/priority": "urgent", "egpu.io/gpu-policy": "x"},
                   nodeName="n1")
    assert answer(pod) == {"uid": "uid-1", "allowed": True}


def test_dry_run_answered_the_same() -> None:
    pod = make_pod(container(limits=GPU))
    assert answer(pod, dry_run=True) == answer(pod)
    bad = make_pod(container(limits={"egpu.io/gpu": "0"}))
    assert answer(bad, dry_run=True) == answer(bad)


# --- FC-08: routing ---------------------------------------------------------------------


def test_fc08a_default_scheduler_rewritten_to_egpu_scheduler() -> None:
    pod = make_pod(container(limits={"egpu.io/gpu-memory": "3000"}),
                   schedulerName="default-scheduler")
    response = answer(pod)
    assert {"op": "replace", "path": "/spec/schedulerName",
            "value": "egpu-scheduler"} in decoded_patch(response)
    assert "warnings" not in response


@pytest.mark.parametrize("given", [None, ""])
def test_fc08a_absent_or_empty_scheduler_set(given: str | None) -> None:
    spec = {} if given is None else {"schedulerName": given}
    assert admitted(make_pod(container(limits=GPU), **spec))["spec"]["schedulerName"] == (
        "egpu-scheduler")


def test_fc08a_configured_scheduler_name() -> None:
    config = load_config("schedulerName: gpu-share")
    pod = make_pod(container(limits=GPU), schedulerName="default-scheduler")
    assert admitted(pod, config)["spec"]["schedulerName"] == "gpu-share"


def test_other_scheduler_kept_with_a_warning() -> None:
    pod = make_pod(container(limits=GPU), schedulerName="volcano")
    response = answer(pod)
    assert response["allowed"]
    assert admitted(pod)["spec"]["schedulerName"] == "volcano"
    assert len(response["warnings"]) == 1
    assert "volcano" in response["warnings"][0] and "egpu-scheduler" in response["warnings"][0]


def test_fc08c_second_pass_changes_nothing() -> None:
    pod = make_pod(container("a", limits={"volcano.sh/vgpu-memory": "3000"}),
                   init=(container("i", limits=GPU),),
                   annotations={"egpu.io/priority": "low"}, schedulerName="default-scheduler")
    once = admitted(pod)
    assert once != pod
    response = answer(once)
    assert response == {"uid": "uid-1", "allowed": True}


def test_fc08c_second_pass_keeps_warning_but_no_patch() -> None:
    response = second_pass(make_pod(container(limits=GPU), schedulerName="volcano"))
    assert "patch" not in response and response["warnings"]


def test_fc08d_cpu_and_memory_only_no_patch() -> None:
    pod = make_pod(container(limits={"cpu": "500m", "memory": "256Mi"}),
                   schedulerName="default-scheduler")
    assert answer(pod) == {"uid": "uid-1", "allowed": True}


# --- the mutation -----------------------------------------------------------------------


def test_label_and_env_added_but_no_volume() -> None:
    """F1: the node's /var/run/egpu is never mounted into a pod (the hook mounts only the
    container's own folder and card files)."""
    pod = admitted(make_pod(container(limits=GPU), container("cpu", limits={"cpu": "1"})))
    assert pod["metadata"]["labels"] == {"egpu.io/priority": "high"}
    gpu, cpu = pod["spec"]["containers"]
    assert gpu["env"] == ENV_HIGH and "volumeMounts" not in gpu
    assert "env" not in cpu and "volumeMounts" not in cpu
    assert "volumes" not in pod["spec"]


def test_label_key_escaped_as_json_pointer_and_maps_created() -> None:
    ops = decoded_patch(answer(make_pod(container(limits=GPU), labels={"app": "x"})))
    assert {"op": "add", "path": "/metadata/labels/egpu.io~1priority", "value": "high"} in ops
    ops = decoded_patch(answer(make_pod(container(limits=GPU))))
    assert {"op": "add", "path": "/metadata/labels",
            "value": {"egpu.io/priority": "high"}} in ops


def test_resolved_priority_from_annotation_and_priority_class() -> None:
    pod = make_pod(container(limits=GPU), annotations={"egpu.io/priority": "low",
                                                       "egpu.io/compute-policy": "elastic",
                                                       "egpu.io/memory-oversubscription": "true"})
    admitted_pod = admitted(pod)
    assert admitted_pod["metadata"]["labels"]["egpu.io/priority"] == "low"
    assert admitted_pod["spec"]["containers"][0]["env"] == [
        {"name": "EGPU_PRIORITY", "value": "low"},
        {"name": "EGPU_COMPUTE_POLICY", "value": "elastic"},
        {"name": "EGPU_MEMORY_OVERSUBSCRIPTION", "value": "true"},
    ]
    config = load_config("priorityClasses: {batch-low: low}")
    pod = make_pod(container(limits=GPU), priorityClassName="batch-low")
    assert admitted(pod, config)["metadata"]["labels"]["egpu.io/priority"] == "low"


def test_existing_label_with_wrong_priority_replaced() -> None:
    pod = make_pod(container(limits=GPU), labels={"egpu.io/priority": "low"})
    ops = decoded_patch(answer(pod))
    assert {"op": "replace", "path": "/metadata/labels/egpu.io~1priority", "value": "high"} in ops


def test_env_updated_when_wrong_added_when_missing_others_kept() -> None:
    env = [
        {"name": "HOME", "value": "/root"},
        {"name": "EGPU_PRIORITY", "value": "low"},
        {"name": "EGPU_COMPUTE_POLICY",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    pod = admitted(make_pod(container(limits=GPU, env=env)))
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "HOME", "value": "/root"},
        {"name": "EGPU_PRIORITY", "value": "high"},
        {"name": "EGPU_COMPUTE_POLICY", "value": "strict"},
        {"name": "EGPU_MEMORY_OVERSUBSCRIPTION", "value": "false"},
    ]


def test_correct_env_and_authors_mounts_left_as_written() -> None:
    pod = make_pod(container(limits=GPU, env=list(reversed(ENV_HIGH)),
                             volumeMounts=[{"name": "data", "mountPath": "/data"},
                                           {"name": "mine", "mountPath": "/var/run/mine"}]),
                   labels={"egpu.io/priority": "high"}, schedulerName="egpu-scheduler",
                   volumes=[{"name": "mine", "emptyDir": {}}, {"name": "data", "emptyDir": {}}])
    assert answer(pod) == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize("path", [
    "/var/run/egpu", "/var/run/egpu/", "/var/run/egpu/cards", "/run/egpu/containers/x",
    "/var/run/egpu-node", "/run/egpu-node/allocations", "/var/run", "/run", "/var", "/",
    "//", "/var/run/../run/egpu", "/var/./run/egpu", "//var/run/egpu", "//run/egpu-node",
    "///var/run/egpu", "//var", "/proc", "/proc/self/root/var/run/egpu-node",
    "/proc/1/root", "/usr/local/egpu", "/usr/local/egpu/lib", "/usr/local", "//usr/local/egpu"])
def test_host_path_reaching_egpu_folders_denied(path: str) -> None:
    """F1: a pod that can write the node's egpu folders can plant links for the hook or
    rewrite other shares' regions (an old pod spec's egpu-runtime volume included). Bugs
    caught since: ``//var/run/egpu`` (posixpath.normpath keeps a leading ``//``; containerd
    resolves it to /run/egpu), /proc/<pid>/root (every host folder) and egpu's install folder
    (the hook runs from it as root) were admitted."""
    pod = make_pod(container(limits=GPU, volumeMounts=[{"name": "rt", "mountPath": "/x"}]),
                   volumes=[{"name": "rt", "hostPath": {"path": path}}])
    out = answer(pod)
    assert out["allowed"] is False and out["status"]["code"] == 403
    assert out["status"]["message"] == (
        f"volume 'rt': hostPath.path={path!r} is not allowed in a pod with an egpu share (it "
        "reaches egpu's node folders /proc, /run/egpu, /run/egpu-node, /usr/local/egpu, "
        "/var/run/egpu, /var/run/egpu-node; the runtime hook mounts each container's own "
        "accounting folder and card regions itself); allowed: a hostPath outside them (or "
        "allowPrivileged: true in the egpu config)")
    assert answer(make_pod(container(limits=GPU), volumes=[OLD_VOLUME]))["allowed"] is False
    assert answer(pod, load_config("allowPrivileged: true"))["allowed"] is True
    # a pod without a share is not egpu's to judge
    assert answer(make_pod(container(limits={"cpu": "1"}), volumes=[OLD_VOLUME]))["allowed"]


@pytest.mark.parametrize(("path", "reserved"), [
    ("/etc/ld.so.preload", "/etc/ld.so.preload"), ("/usr/lib/egpu", "/usr/lib/egpu"),
    ("/usr/lib/egpu/libegpu_interpose.so", "/usr/lib/egpu"),
    ("/run/egpu/config.json", "/run/egpu"), ("/run/egpu/", "/run/egpu"),
    ("/var/run/egpu", "/var/run/egpu"), ("/var/run/egpu/containers/x", "/var/run/egpu"),
    ("/usr/lib/../lib/egpu/libegpu_interpose.so", "/usr/lib/egpu"),
    ("//etc/ld.so.preload", "/etc/ld.so.preload"), ("///run/egpu/config.json", "/run/egpu")])
def test_a_volume_mounted_where_the_runtime_hook_mounts_is_denied(path: str,
                                                                   reserved: str) -> None:
    """Bug caught: a configMap subPath at /etc/ld.so.preload or the interposer's path, or a
    volume at the share's config, was admitted, and the runtime hook took the pod's mount
    for its own and skipped it: the container ran without its interposer, or with limits it
    wrote itself. The hook now covers such a mount; admission says why first, whatever
    allowPrivileged says."""
    pod = make_pod(container(limits=GPU, volumeMounts=[{"name": "cfg", "mountPath": path,
                                                        "subPath": "x"}]),
                   volumes=[{"name": "cfg", "configMap": {"name": "mine"}}])
    out = answer(pod)
    assert out["allowed"] is False and out["status"]["code"] == 403
    assert out["status"]["message"] == (
        f"container 'c': volumeMounts 'cfg' mountPath={path!r} is not allowed with an egpu "
        f"share (egpu's runtime hook mounts {reserved} there: the interposer, its preload "
        "list, the share's config and accounting); allowed: a mountPath outside "
        "/etc/ld.so.preload, /run/egpu, /usr/lib/egpu, /var/run/egpu"), out
    assert answer(pod, load_config("allowPrivileged: true"))["allowed"] is False
    # a container without a share, and mounts beside the reserved paths, are not refused
    assert answer(make_pod(container(limits={"cpu": "1"}, volumeMounts=[
        {"name": "cfg", "mountPath": path}]), volumes=[{"name": "cfg", "emptyDir": {}}]))[
            "allowed"]
    for beside in ("/etc", "/run", "/usr/lib", "/usr/lib/egpux", "/etc/ld.so.preload.d"):
        assert answer(make_pod(container(limits=GPU, volumeMounts=[
            {"name": "cfg", "mountPath": beside}]), volumes=[{"name": "cfg", "emptyDir": {}}]))[
                "allowed"], beside


@pytest.mark.parametrize("path", ["/var/run/egpux", "/data", "/var/lib/kubelet", "/run/egp",
                                  "relative"])
def test_other_host_paths_allowed(path: str) -> None:
    pod = make_pod(container(limits=GPU), volumes=[{"name": "d", "hostPath": {"path": path}}])
    assert answer(pod)["allowed"] is True


def test_aliases_rewritten_in_limits_and_requests() -> None:
    limits = {"cpu": "1", "volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000",
              "volcano.sh/vgpu-cores": "30"}
    c = container(limits=limits)
    c["resources"]["requests"] = dict(limits)
    resources = admitted(make_pod(c))["spec"]["containers"][0]["resources"]
    expected = {"cpu": "1", "egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000",
                "egpu.io/gpu-cores": "30"}
    assert resources == {"limits": expected, "requests": expected}


def test_configured_alias_rewritten() -> None:
    config = load_config("resourceAliases: {example.com/vmem: egpu.io/gpu-memory}")
    out = admitted(make_pod(container(limits={"example.com/vmem": "2000"})), config)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"egpu.io/gpu-memory": "2000",
                                                                  "egpu.io/gpu": "1"}
    # with this config the Volcano names are not ours any more
    assert answer(make_pod(container(limits={"volcano.sh/vgpu-memory": "1"})), config) == {
        "uid": "uid-1", "allowed": True}


def test_sidecar_counts() -> None:
    sidecar = container("proxy", limits=GPU, restartPolicy="Always")
    pod = admitted(make_pod(container("app", limits={"cpu": "1"}), init=(sidecar,)))
    assert pod["spec"]["initContainers"][0]["env"] == ENV_HIGH
    assert pod["spec"]["schedulerName"] == "egpu-scheduler"


# --- FC-07: a GPU only in an init container ------------------------------------------------


def test_fc07_init_container_gpu_routed_and_mutated() -> None:
    init = container("compile", limits={"egpu.io/gpu": "1", "egpu.io/gpu-memory": "12000",
                                        "egpu.io/gpu-cores": "100"})
    app = container("ocr", limits={"egpu.io/gpu": "1", "egpu.io/gpu-memory": "8000"})
    pod = admitted(make_pod(app, init=(init,)))
    assert pod["spec"]["schedulerName"] == "egpu-scheduler"
    for c in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        assert c["env"] == ENV_HIGH and "volumeMounts" not in c


def test_fc07_variant_app_container_without_gpu() -> None:
    init = container("warmup", limits={"egpu.io/gpu-memory": "12000"})
    pod = admitted(make_pod(container("server", limits={"cpu": "2"}), init=(init,)))
    assert pod["spec"]["schedulerName"] == "egpu-scheduler"
    assert pod["metadata"]["labels"]["egpu.io/priority"] == "high"
    assert pod["spec"]["initContainers"][0]["env"] == ENV_HIGH
    assert "env" not in pod["spec"]["containers"][0]
    assert "volumes" not in pod["spec"]


# --- FC-09 and other denials ----------------------------------------------------------------


@pytest.mark.parametrize(("limits", "needle"), [
    ({"egpu.io/gpu": "1", "egpu.io/gpu-memory-percentage": "0"},
     "egpu.io/gpu-memory-percentage='0'"),
    ({"egpu.io/gpu": "1", "egpu.io/gpu-memory-percentage": "101"},
     "egpu.io/gpu-memory-percentage='101'"),
    ({"egpu.io/gpu": "1", "egpu.io/gpu-memory-percentage": "150"},
     "egpu.io/gpu-memory-percentage='150'"),
    ({"egpu.io/gpu": "1", "egpu.io/gpu-memory": "0"}, "egpu.io/gpu-memory='0'"),
    ({"egpu.io/gpu": "1", "egpu.io/gpu-cores": "150"}, "egpu.io/gpu-cores='150'"),
])
def test_fc09_out_of_range_denied_naming_container_resource_value_range(
        limits: dict[str, str], needle: str) -> None:
    response = answer(make_pod(container("trainer", limits=limits)))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "container 'trainer'" in message and needle in message
    assert "allowed: an integer 1.." in message or "allowed: an integer >= 1" in message


def test_all_request_errors_joined_in_one_message() -> None:
    pod = make_pod(container("a", limits={"egpu.io/gpu-cores": "150"}),
                   container("b", limits={"egpu.io/gpu": "0"}),
                   annotations={"egpu.io/priority": "urgent"})
    message = answer(pod)["status"]["message"]
    assert message.count("; ") >= 2
    assert "container 'a'" in message and "container 'b'" in message and "urgent" in message


def test_node_name_denied() -> None:
    response = answer(make_pod(container(limits=GPU), nodeName="gpu-node-1"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert "spec.nodeName='gpu-node-1'" in response["status"]["message"]


def test_node_name_with_request_errors_is_a_400_naming_both() -> None:
    response = answer(make_pod(container(limits={"egpu.io/gpu": "0"}), nodeName="n"))
    assert response["status"]["code"] == 400
    assert "nodeName" in response["status"]["message"]
    assert "egpu.io/gpu='0'" in response["status"]["message"]


def test_privileged_container_with_share_denied_unless_allowed() -> None:
    priv = {"privileged": True}
    pod = make_pod(container("gpu", limits=GPU, securityContext=priv))
    response = answer(pod)
    assert response["allowed"] is False and "container 'gpu'" in response["status"]["message"]
    assert "privileged" in response["status"]["message"]
    assert answer(pod, replace(Config(), allow_privileged=True))["allowed"] is True
    # a privileged container without a share does not matter
    pod = make_pod(container("gpu", limits=GPU),
                   container("net", limits={"cpu": "1"}, securityContext=priv))
    assert answer(pod)["allowed"] is True


def test_response_is_json_serializable_typed_dict() -> None:
    result: AdmissionReview = review(admission_review(make_pod(container(limits=GPU))), Config())
    assert json.loads(json.dumps(result)) == result


def test_patch_applies_to_the_original_object() -> None:
    pod = make_pod(container(limits=GPU))
    ops = decoded_patch(answer(pod))
    jsonpatch.JsonPatch(ops).apply(pod)  # raises if any op does not apply


@pytest.mark.parametrize(("written", "mib"), [("3k", 3000), ("24k", 24000), ("3e3", 3000),
                                              ("1500", 1500), ("1M", 1_000_000)])
def test_api_server_canonical_quantities_are_whole_numbers(written: str, mib: int) -> None:
    """The API server stores 3000 as "3k": the webhook sees canonical quantities."""
    from egpu.requests import read_pod

    pod = make_pod(container(limits={"egpu.io/gpu": "1", "egpu.io/gpu-memory": written}))
    assert answer(pod)["allowed"] is True
    request = read_pod(pod).request
    assert request is not None and request.containers[0].share.memory_mib == mib


@pytest.mark.parametrize("written", ["24Gi", "1.5", "500m", "1.5k1"])
def test_binary_suffixes_and_fractions_still_denied(written: str) -> None:
    response = answer(make_pod(container(limits={"egpu.io/gpu-memory": written})))
    assert response["allowed"] is False and f"egpu.io/gpu-memory='{written}'" in (
        response["status"]["message"])


@pytest.mark.parametrize("limits", [GPU, {"cpu": "1"}])
def test_a_pod_created_with_an_allocation_annotation_is_denied(limits: dict[str, str]) -> None:
    """F2: only the egpu scheduler writes egpu.io/allocation (in its Binding); a hand-written one
    would book cards (or, edited later, shrink or lift a share)."""
    text = ('{"version":1,"node":"n1","containers":[{"name":"c","init":false,"cards":'
            '[{"uuid":"GPU-0","index":0,"memory_mib":1,"cores":0}]}]}')
    pod = make_pod(container(limits=limits), annotations={"egpu.io/allocation": text})
    response = answer(pod)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"] == (
        "pod annotation egpu.io/allocation is not allowed at creation: it is set by the egpu "
        "scheduler at bind time; remove it")
    assert answer(make_pod(container(limits=limits),
                           annotations={"egpu.io/allocation": ""}))["allowed"] is False
    # updates are the ValidatingAdmissionPolicy's (manifests/webhook); ignored namespaces too
    pod["metadata"]["namespace"] = "kube-system"
    assert answer(pod)["allowed"] is True


@pytest.mark.parametrize("cap", ["SYS_ADMIN", "CAP_SYS_ADMIN", "sys_ptrace", "SYS_MODULE",
                                 "ALL", "all", "SYS_RAWIO", "DAC_READ_SEARCH", "cap_bpf",
                                 "PERFMON", "MAC_ADMIN", "MAC_OVERRIDE"])
def test_dangerous_capabilities_with_a_share_denied_unless_allowed(cap: str) -> None:
    """F8: SYS_ADMIN unmounts the interposer or its config, SYS_PTRACE reaches other
    processes' accounting, SYS_MODULE loads kernel code, ALL holds them all. Bug caught since:
    SYS_RAWIO, DAC_READ_SEARCH (open_by_handle_at through the share's host mounts), BPF,
    PERFMON and MAC_* were admitted."""
    context = {"capabilities": {"add": ["NET_ADMIN", cap]}}
    pod = make_pod(container("gpu", limits=GPU, securityContext=context))
    response = answer(pod)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        f"container 'gpu': securityContext.capabilities.add={cap!r} is not allowed with an "
        "egpu share (it can unmount the interposer or its read-only config, or reach other "
        "processes' memory or host files); allowed: any capability but SYS_ADMIN, "
        "SYS_PTRACE, SYS_MODULE, SYS_RAWIO, DAC_READ_SEARCH, BPF, PERFMON, MAC_ADMIN, "
        "MAC_OVERRIDE, ALL (or allowPrivileged: true in the egpu config)")
    assert answer(pod, replace(Config(), allow_privileged=True))["allowed"] is True
    # a container without a share may add what it likes; harmless capabilities pass
    assert answer(make_pod(container("gpu", limits=GPU),
                           container("net", limits={"cpu": "1"}, securityContext=context),
                           ))["allowed"] is True
    assert answer(make_pod(container("gpu", limits=GPU, securityContext={
        "capabilities": {"add": ["NET_ADMIN", "SYS_NICE"], "drop": ["ALL"]}})))["allowed"]


def test_an_init_container_with_a_share_is_checked_too() -> None:
    init = container("warm", limits=GPU, securityContext={"capabilities": {"add": ["ALL"]}})
    response = answer(make_pod(container("app", limits={"cpu": "1"}), init=(init,)))
    assert response["allowed"] is False and "container 'warm'" in response["status"]["message"]


@pytest.mark.parametrize("field", ["hostPID", "hostIPC"])
def test_host_pid_and_ipc_with_a_share_denied_unless_allowed(field: str) -> None:
    """F8: hostPID reaches every process of the node (/proc/<pid>/root, their regions);
    hostIPC their shared memory."""
    pod = make_pod(container("gpu", limits=GPU), **{field: True})
    response = answer(pod)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        f"spec.{field}=true is not allowed for a pod with an egpu share (it reaches other "
        "pods' processes and shared memory, their accounting and their CUDA contexts); "
        "allowed: false (or allowPrivileged: true in the egpu config)")
    assert answer(pod, replace(Config(), allow_privileged=True))["allowed"] is True
    assert answer(make_pod(container("gpu", limits=GPU), **{field: False}))["allowed"] is True
    assert answer(make_pod(container("cpu", limits={"cpu": "1"}), **{field: True}))["allowed"]


@pytest.mark.parametrize("limits", [
    {"egpu.io/gpu-memory": "4000"}, {"egpu.io/gpu-memory-percentage": "25"},
    {"egpu.io/gpu-cores": "10"}, {"egpu.io/gpu-memory-percentage": "25", "egpu.io/gpu-cores": "10"},
])
def test_a_share_without_a_card_count_gets_one_card_so_the_kubelet_allocates_it(
        limits: dict[str, str]) -> None:
    """Found on the real kubelet: without egpu.io/gpu the kubelet never calls Allocate, and
    the container starts with no card and no share."""
    c = container(limits=limits)
    c["resources"]["requests"] = dict(limits)  # as the API server's defaulting leaves it
    resources = admitted(make_pod(c))["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {**limits, "egpu.io/gpu": "1"}
    assert resources["requests"] == {**limits, "egpu.io/gpu": "1"}


def test_an_explicit_card_count_is_kept() -> None:
    limits = {"egpu.io/gpu": "2", "egpu.io/gpu-memory": "4000"}
    resources = admitted(make_pod(container(limits=limits)))["spec"]["containers"][0]["resources"]
    assert resources["limits"] == limits
