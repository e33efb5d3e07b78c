"""Properties: for any pod the patch applies and a second pass yields none; for any body the
HTTP edge answers without a 5xx (through the aiohttp test client)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import jsonpatch
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu.config import Config
from egpu.requests import read_pod
from webhook.review import has_share, mutate_pod, review
from webhook.server import Settings, create_app

from .support import admission_review, decoded_patch

RESOURCE_NAMES = [
    "egpu.io/gpu", "egpu.io/gpu-memory", "egpu.io/gpu-memory-percentage", "egpu.io/gpu-cores",
    "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores",
    "volcano.sh/vgpu-memory-percentage", "cpu", "memory", "nvidia.com/gpu",
]
QUANTITIES = st.one_of(
    st.sampled_from(["1", "2", "50", "100", "3000", "0", "101", "17", "24Gi", "1.5", "-1", ""]),
    st.integers(-5, 200))
ENV_NAMES = ["EGPU_PRIORITY", "EGPU_COMPUTE_POLICY", "EGPU_MEMORY_OVERSUBSCRIPTION", "HOME"]
ANNOTATION_VALUES = {
    "egpu.io/priority": ["high", "low", "urgent"],
    "egpu.io/compute-policy": ["strict", "elastic", "x"],
    "egpu.io/memory-oversubscription": ["true", "false", "yes"],
    "egpu.io/gpu-policy": ["binpack", "spread"],
    "egpu.io/use-gpu-type": ["A10", "H100,A100", ","],
    "other.io/x": ["y"],
}

env_entries = st.lists(st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(ENV_NAMES),
              st.sampled_from(["high", "low", "strict", "true", "false", ""])),
    st.builds(lambda n: {"name": n, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
              st.sampled_from(ENV_NAMES)),
), max_size=4)
mounts = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["egpu-runtime", "data", "cache"]),
     "mountPath": st.sampled_from(["/var/run/egpu", "/var/run/egpu/", "/data", "/cache"])},
    optional={"readOnly": st.booleans(), "subPath": st.sampled_from(["", "x"])}), max_size=3)
volumes = st.lists(st.one_of(
    st.builds(lambda n: {"name": n, "emptyDir": {}},
              st.sampled_from(["egpu-runtime", "data", "cache"])),
    st.builds(lambda p, t: {"name": "egpu-runtime", "hostPath": {"path": p, "type": t}},
              st.sampled_from(["/var/run/egpu", "/tmp"]),
              st.sampled_from(["DirectoryOrCreate", "Directory", ""])),
), max_size=3)


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> dict[str, Any]:
    limits = draw(st.dictionaries(st.sampled_from(RESOURCE_NAMES), QUANTITIES, max_size=4))
    out: dict[str, Any] = {"name": f"{prefix}{draw(st.integers(0, 3))}", "image": "busybox"}
    resources: dict[str, Any] = {}
    if limits or draw(st.booleans()):
        resources["limits"] = limits
    if draw(st.booleans()):
        resources["requests"] = draw(st.sampled_from([dict(limits), {}, {"cpu": "1"}]))
    if resources:
        out["resources"] = resources
    if draw(st.booleans()):
        out["env"] = draw(env_entries)
    if draw(st.booleans()):
        out["volumeMounts"] = draw(mounts)
    if draw(st.integers(0, 5)) == 0:
        out["securityContext"] = {"privileged": draw(st.booleans())}
    if prefix == "i" and draw(st.booleans()):
        out["restartPolicy"] = "Always"
    return out


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": draw(st.sampled_from(
        ["team", "kube-system", "default"]))}
    if draw(st.booleans()):
        metadata["labels"] = draw(st.dictionaries(
            st.sampled_from(["app", "egpu.io/priority", "a/b~c"]),
            st.sampled_from(["x", "high", "low"]), max_size=2))
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(sorted(ANNOTATION_VALUES)), max_size=3,
                             unique=True))
        metadata["annotations"] = {k: draw(st.sampled_from(ANNOTATION_VALUES[k])) for k in keys}
    spec: dict[str, Any] = {"containers": draw(st.lists(containers("c"), min_size=1,
                                                        max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers("i"), max_size=2))
    if draw(st.booleans()):
        spec["volumes"] = draw(volumes)
    choice = draw(st.sampled_from([None, "", "default-scheduler", "egpu-scheduler", "volcano"]))
    if choice is not None:
        spec["schedulerName"] = choice
    if draw(st.integers(0, 9)) == 0:
        spec["nodeName"] = "node-1"
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(st.sampled_from(["", "batch-low", "x"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


CONFIG = Config(priority_classes={"batch-low": "low"})


def _shares(pod: dict[str, Any]) -> Any:
    request = read_pod(pod, CONFIG).request
    assert request is not None
    return replace(request, containers=tuple(replace(c, uses_aliases=False)
                                             for c in request.containers))


@settings(max_examples=300)
@given(pods())
def test_patch_applies_and_second_pass_gives_no_patch(pod: dict[str, Any]) -> None:
    before = json.dumps(pod, sort_keys=True)
    response = review(admission_review(pod), CONFIG)["response"]
    assert json.dumps(pod, sort_keys=True) == before  # the input is never changed
    if not response["allowed"]:
        assert "patch" not in response and response["status"]["message"]
        return
    ops = decoded_patch(response)
    assert ("patchType" in response) == bool(ops)
    once = jsonpatch.apply_patch(pod, ops)
    request = read_pod(pod, CONFIG).request
    if request is not None and ops:  # the patch does exactly what mutate_pod does
        assert once == mutate_pod(pod, request, CONFIG)[0]
    again = review(admission_review(once), CONFIG)["response"]
    assert again["allowed"] and "patch" not in again, (ops, again)
    if ops:  # an egpu pod: the contract's shape holds
        spec = once["spec"]
        assert spec["schedulerName"] in ("egpu-scheduler", "volcano")
        assert once["metadata"]["labels"]["egpu.io/priority"] in ("high", "low")
        assert _shares(once) == _shares(pod)  # the same request, in egpu.io names
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            limits = c.get("resources", {}).get("limits", {})
            assert not any(k.startswith("volcano.sh/") for k in limits)
            if has_share(c, CONFIG):
                names = [e["name"] for e in c["env"]]
                assert {"EGPU_PRIORITY", "EGPU_COMPUTE_POLICY",
                        "EGPU_MEMORY_OVERSUBSCRIPTION"} <= set(names)
        before_all = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
        after_all = [*spec.get("initContainers", []), *spec["containers"]]
        for b, a in zip(before_all, after_all, strict=True):  # the hook mounts, not egpu
            assert a.get("volumeMounts") == b.get("volumeMounts")
        assert spec.get("volumes") == pod["spec"].get("volumes")
        assert not any(v.get("hostPath", {}).get("path") == "/var/run/egpu"
                       for v in spec.get("volumes", [])), spec  # such pods are denied


# --- the HTTP edge never answers 5xx ------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


def _mangled_reviews() -> st.SearchStrategy[bytes]:
    """Valid reviews with one part replaced by random JSON."""
    def mangle(pod: dict[str, Any], where: str, value: Any) -> bytes:
        body = admission_review(pod)
        if where == "object.spec":
            body["request"]["object"]["spec"] = value
        elif where == "object.metadata":
            body["request"]["object"]["metadata"] = value
        elif where == "container":
            body["request"]["object"]["spec"]["containers"][0] = value
        elif where == "resources":
            body["request"]["object"]["spec"]["containers"][0]["resources"] = value
        else:
            body["request"][where] = value
        return json.dumps(body).encode()

    return st.builds(mangle, pods(), st.sampled_from(
        ["object.spec", "object.metadata", "container", "resources", "uid", "kind",
         "operation", "namespace", "object"]), json_values)


bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    _mangled_reviews(),
    pods().map(lambda p: json.dumps(admission_review(p)).encode()),
)


def test_any_body_never_yields_a_5xx() -> None:
    loop = asyncio.new_event_loop()
    client = TestClient(TestServer(create_app(Settings())), loop=loop)
    loop.run_until_complete(client.start_server())
    try:
        @settings(max_examples=300)
        @given(bodies)
        def check(body: bytes) -> None:
            async def post() -> tuple[int, Any]:
                async with client.post("/mutate", data=body) as resp:
                    return resp.status, await resp.json(content_type=None)

            status, payload = loop.run_until_complete(asyncio.wait_for(post(), 10))
            assert status < 500, payload
            if status == 200:
                assert payload["kind"] == "AdmissionReview" and "uid" in payload["response"]
            else:
                assert status == 400 and payload["reason"]

        check()
    finally:
        loop.run_until_complete(client.close())
        loop.close()
