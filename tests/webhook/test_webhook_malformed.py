"""Malformed pods: every field egpu reads, of any JSON type, gives the normal answer or a
denial naming the field (its JSON path), the value and what is allowed; never an error.

A pod with an egpu resource fails closed (any wrongly typed field egpu reads is denied); a
pod without one is allowed untouched however malformed (the API server refuses it itself).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu.config import Config
from egpu.podshape import (
    MAP_FIELDS,
    MAX_INTEGER_DIGITS,
    LongNumber,
    check_pod,
    decode_int,
    path_pattern,
)
from egpu.requests import read_pod
from webhook.review import MAX_PROBLEMS_SHOWN, review
from webhook.server import Settings, create_app

from .support import admission_review, container, decoded_patch, make_pod
from .test_webhook_properties import json_values, pods

GPU = {"egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000"}
CONFIG = Config(priority_classes={"batch-low": "low"})

# Where a denial names its field: a JSON path from the pod, a container, an annotation or a
# volume, at the start of each problem.
NAMED = re.compile(
    r"^(spec\b|metadata\b|pod\b|container ['\"]|pod annotation |volume ['\"]|and \d+ more)")
MORE = re.compile(r"^and \d+ more problems$")

# The fields egpu reads ("#": any list index, "*": any map key), with their JSON type.
READ_FIELDS: dict[tuple[str, ...], str] = {
    ("metadata",): "object", ("metadata", "name"): "string",
    ("metadata", "namespace"): "string",
    ("metadata", "labels"): "object", ("metadata", "labels", "*"): "string",
    ("metadata", "annotations"): "object", ("metadata", "annotations", "*"): "string",
    ("spec",): "object",
    ("spec", "schedulerName"): "string", ("spec", "priorityClassName"): "string",
    ("spec", "nodeName"): "string", ("spec", "hostPID"): "boolean",
    ("spec", "hostIPC"): "boolean",
    ("spec", "volumes"): "list", ("spec", "volumes", "#"): "object",
    ("spec", "volumes", "#", "name"): "string", ("spec", "volumes", "#", "hostPath"): "object",
    ("spec", "volumes", "#", "hostPath", "path"): "string",
}
for _kind in ("containers", "initContainers"):
    READ_FIELDS.update({
        ("spec", _kind): "list", ("spec", _kind, "#"): "object",
        ("spec", _kind, "#", "name"): "string", ("spec", _kind, "#", "restartPolicy"): "string",
        ("spec", _kind, "#", "resources"): "object",
        ("spec", _kind, "#", "resources", "limits"): "object",
        ("spec", _kind, "#", "resources", "limits", "*"): "quantity",
        ("spec", _kind, "#", "resources", "requests"): "object",
        ("spec", _kind, "#", "resources", "requests", "*"): "quantity",
        ("spec", _kind, "#", "env"): "list", ("spec", _kind, "#", "env", "#"): "object",
        ("spec", _kind, "#", "env", "#", "name"): "string",
        ("spec", _kind, "#", "env", "#", "value"): "string",
        ("spec", _kind, "#", "securityContext"): "object",
        ("spec", _kind, "#", "securityContext", "privileged"): "boolean",
    })

# Values of the wrong JSON type for each type (null is absent, so never wrong for a field).
WRONG: dict[str, list[Any]] = {
    "object": [5, True, "x", [1], 1.5, LongNumber("9" * 2000)],
    "list": [5, False, "x", {"a": 1}, -1.0e300],
    "string": [5, True, [], {"a": "b"}, 1.5, float("nan"), LongNumber("9" * 2000)],
    "boolean": ["true", 1, [], {}],
    "quantity": [[1], {"a": 1}],
}



def _json_path(path: tuple[str | int, ...]) -> str:
    """``spec.containers[0].resources.limits["egpu.io/gpu"]`` for a path of keys."""
    text = ""
    for index, part in enumerate(path):
        if isinstance(part, int):
            text += f"[{part}]"
        elif index and path[index - 1] in MAP_FIELDS:
            text += f"[{json.dumps(part)}]"
        else:
            text += f".{part}" if text else part
    return text


def _read_paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """The paths in ``value`` of fields egpu reads."""
    out = [path] if path and path_pattern(path) in READ_FIELDS else []
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        items = ()
    for key, item in items:
        out += _read_paths(item, (*path, key))
    return out


def _set(pod: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of ``pod`` with the field at ``path`` set to ``value``."""
    new = json.loads(json.dumps(pod))
    parent = new
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return new


def _response(pod: dict[str, Any], config: Config = CONFIG) -> dict[str, Any]:
    return dict(review(admission_review(pod, namespace="team"), config)["response"])


def _problems(response: dict[str, Any]) -> list[str]:
    """The problems of a denial, one per field: the message split at "; ", each piece that
    says no "is not allowed" (a problem's own "; allowed: ..." or "; remove it") joined back
    to the problem before it."""
    problems: list[str] = []
    for piece in response["status"]["message"].split("; "):
        if problems and " is not allowed" not in piece and not MORE.match(piece):
            problems[-1] += "; " + piece
        else:
            problems.append(piece)
    return problems


def _assert_sound(pod: dict[str, Any], response: dict[str, Any]) -> None:
    """Allowed: the patch applies and a second pass changes nothing. Denied: every problem
    names its field, and the message is short enough to read."""
    json.dumps(response).encode("ascii")  # the answer is plain JSON text
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403)
        for problem in _problems(response):
            assert NAMED.match(problem), problem
            assert len(problem) < 1000, problem
        return
    once = jsonpatch.apply_patch(pod, decoded_patch(response))
    again = _response(once)
    assert again["allowed"] and "patch" not in again, again


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod from the properties' strategy with a share in one app and one init container."""
    pod = draw(pods())
    pod["spec"]["containers"].append(container("gpu", GPU))
    pod["spec"].setdefault("initContainers", []).append(container("warm", GPU))
    return pod


@st.composite
def cpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod with no egpu resource or alias anywhere (and no egpu annotation)."""
    limits = draw(st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
                                  st.sampled_from(["1", "2Gi", 3]), max_size=3))
    pod = make_pod(container("a", limits), container("b"), labels={"app": "x"},
                   annotations={"team": "ml"})
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = [container("i", dict(limits))]
    if draw(st.booleans()):
        pod["spec"]["volumes"] = [{"name": "v", "hostPath": {"path": "/var/run/egpu"}}]
    return pod


@st.composite
def broken(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]
           ) -> tuple[dict[str, Any], tuple[str | int, ...]]:
    """A pod with one field egpu reads set to a value of the wrong JSON type, and its path."""
    pod = draw(base)
    paths = [p for p in _read_paths(pod) if p != ("spec",)]
    path = draw(st.sampled_from(paths))
    value = draw(st.sampled_from(WRONG[READ_FIELDS[path_pattern(path)]]))
    return _set(pod, path, value), path


# --- the reported bug ------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["containers", "initContainers"])
@pytest.mark.parametrize("value", [7, 0, True, False, 2.5, "c", {"name": "c"}])
def test_containers_of_the_wrong_type_in_a_gpu_pod_are_denied_naming_the_field(
        field: str, value: Any) -> None:
    pod = make_pod(container("main", GPU), init=(container("warm", GPU),))
    pod["spec"][field] = value
    response = _response(pod)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
    message = response["status"]["message"]
    assert message.startswith(f"spec.{field}=")
    assert "allowed: a list of objects (containers)" in message
    assert "internal error" not in message


@pytest.mark.parametrize("value", [7, True, "c", {"name": "c"}])
def test_containers_of_the_wrong_type_in_a_cpu_pod_are_allowed_untouched(value: Any) -> None:
    pod = make_pod(container("main", {"cpu": "1"}))
    pod["spec"]["containers"] = value
    assert _response(pod) == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize("limits", [
    [{"egpu.io/gpu": "1"}], "egpu.io/gpu: 1", {"egpu.io/gpu": [1]},
    {"volcano.sh/vgpu-memory": {"value": 3000}}])
def test_malformed_resources_that_name_an_egpu_resource_fail_closed(limits: Any) -> None:
    pod = make_pod(container("main", {"cpu": "1"}))
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    response = _response(pod)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.containers[0].resources.limits")


def test_a_whole_container_list_that_names_an_egpu_resource_fails_closed() -> None:
    pod = make_pod(container("main"))
    pod["spec"]["containers"] = {"main": {"resources": {"limits": GPU}}}
    message = _response(pod)["status"]["message"]
    assert message == ("spec.containers={...} is not allowed (an object with 1 key); "
                       "allowed: a list of objects (containers)")


# --- every field egpu reads --------------------------------------------------------------


@settings(max_examples=300)
@given(broken(gpu_pods()))
def test_any_read_field_of_the_wrong_type_in_a_gpu_pod_is_denied_naming_its_path(
        case: tuple[dict[str, Any], tuple[str | int, ...]]) -> None:
    pod, path = case
    response = _response(pod)
    assert response["allowed"] is False, (path, response)
    assert response["status"]["code"] == 400
    problems = _problems(response)
    where = _json_path(path)
    mine = [p for p in problems if p.startswith(where + "=")]
    assert mine, (where, problems)
    assert " is not allowed (" in mine[0] and "; allowed: " in mine[0]
    _assert_sound(pod, response)


@settings(max_examples=200)
@given(broken(cpu_pods()))
def test_any_read_field_of_the_wrong_type_in_a_cpu_pod_is_allowed_untouched(
        case: tuple[dict[str, Any], tuple[str | int, ...]]) -> None:
    pod, _path = case
    assert _response(pod) == {"uid": "uid-1", "allowed": True}


@settings(max_examples=200)
@given(gpu_pods(), st.data())
def test_null_reads_as_an_absent_field(pod: dict[str, Any], data: st.DataObject) -> None:
    paths = [p for p in _read_paths(pod) if p != ("spec",) and not isinstance(p[-1], int)
             and p[-2:-1] not in {(name,) for name in MAP_FIELDS}]  # fields, not entries
    path = data.draw(st.sampled_from(paths))
    nulled = _set(pod, path, None)
    removed = json.loads(json.dumps(pod))
    parent = removed
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]
    with_null, without = _response(nulled), _response(removed)
    assert with_null["allowed"] == without["allowed"]
    assert with_null.get("status") == without.get("status")
    _assert_sound(nulled, with_null)


# --- any value anywhere --------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = "egpu.io/gpu"
    for index in range(depth):
        value = [value] if index % 2 else {"k": value}
    return value


ODD_VALUES = st.one_of(
    json_values,
    st.sampled_from([
        None, "", "\ud800", "\x00\x01", "NaN", "Infinity", "-0", "1e400", "9" * 5000,
        float("nan"), float("inf"), -float("inf"), 1e308, 2**64, -(10**4000), True,
        LongNumber("1" * 5000), "x" * 100_000, [None] * 50, {"egpu.io/gpu": None},
        {"limits": GPU}, [{"name": "c", "resources": {"limits": GPU}}]]),
    st.integers(10, 200).map(_nested),
)


def _any_paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out = [path] if path else []
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        items = ()
    for key, item in items:
        out += _any_paths(item, (*path, key))
    return out


@settings(max_examples=400)
@given(st.one_of(gpu_pods(), cpu_pods(), pods()), st.data())
def test_any_value_anywhere_gives_the_normal_answer_or_a_named_denial(
        pod: dict[str, Any], data: st.DataObject) -> None:
    pod = json.loads(json.dumps(pod))  # strategies share objects (GPU); change a copy
    paths = _any_paths(pod)  # of the pod as drawn: never inside a value put in below
    changed: list[tuple[str | int, ...]] = []
    for path in data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
        if any(path[:len(done)] == done for done in changed):
            continue  # inside a value already replaced
        parent: Any = pod
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = data.draw(ODD_VALUES)
        changed.append(path)
    _assert_sound(pod, _response(pod))


def test_a_deeply_nested_field_egpu_does_not_read_does_not_stop_a_gpu_pod() -> None:
    pod = make_pod(container("main", GPU))
    pod["spec"]["affinity"] = _nested(5000)  # deeper than Python's recursion limit
    pod["spec"]["containers"][0]["env"] = [
        {"name": "EGPU_PRIORITY", "valueFrom": _nested(5000)}]
    response = _response(pod)
    assert response["allowed"] is True
    assert sorted((op["op"], op["path"]) for op in decoded_patch(response)) == [
        ("add", "/metadata/labels"), ("add", "/spec/containers/0/env/0/value"),
        ("add", "/spec/containers/0/env/1"), ("add", "/spec/containers/0/env/2"),
        ("add", "/spec/schedulerName"), ("remove", "/spec/containers/0/env/0/valueFrom")]


def test_long_names_and_values_are_cut_in_messages() -> None:
    pod = make_pod(container("n" * 10_000, {"egpu.io/gpu": "7" * 100_000}),
                   annotations={"egpu.io/priority": "p" * 100_000}, nodeName="x" * 100_000)
    message = _response(pod)["status"]["message"]
    assert len(message) < 2000, len(message)
    assert "n" * 61 not in message and "x" * 61 not in message and "p" * 61 not in message


def test_a_denial_lists_at_most_the_first_problems_and_counts_the_rest() -> None:
    pod = make_pod(*[container(f"c{i}", {"egpu.io/gpu": "99"}) for i in range(500)])
    problems = _problems(_response(pod))
    assert len(problems) == MAX_PROBLEMS_SHOWN + 1
    assert problems[-1] == f"and {500 - MAX_PROBLEMS_SHOWN} more problems"


def test_non_string_keys_from_yaml_are_named() -> None:
    pod = make_pod(container("main", {"egpu.io/gpu": 1, 7: 2}), labels={True: "x"})
    messages = [e.message for e in read_pod(pod).errors]
    assert messages == [
        "metadata.labels: key true is not allowed (a boolean); allowed: a string",
        "spec.containers[0].resources.limits: key 7 is not allowed (a number); "
        "allowed: a string"]


def test_the_view_keeps_only_well_typed_read_fields_and_never_raises() -> None:
    checked = check_pod({"metadata": {"labels": {"a": None, "b": 5}}, "spec": {
        "containers": [None, {"name": 3, "ports": [1], "resources": {"limits": {"x": "1"}}}]}})
    assert checked.view == {"metadata": {"labels": {"a": ""}},
                            "spec": {"containers": [{"resources": {"limits": {"x": "1"}}}]}}
    assert [e.path for e in checked.errors] == [
        'metadata.labels["b"]', "spec.containers[0]", "spec.containers[1].name"]
    for thing in (None, 1, "x", [], {"spec": 5}, {"metadata": [], "spec": "egpu.io/gpu"}):
        check_pod(thing)


def test_integer_literals_too_long_to_convert_are_kept_as_text() -> None:
    assert decode_int("12") == 12 and type(decode_int("12")) is int
    digits = "9" * (MAX_INTEGER_DIGITS + 1)
    assert decode_int(digits) == digits and isinstance(decode_int(digits), LongNumber)


# --- over HTTP ---------------------------------------------------------------------------


def _post_all(bodies: list[bytes]) -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        async with TestClient(TestServer(create_app(Settings()))) as client:
            out = []
            for body in bodies:
                async with client.post("/mutate", data=body) as resp:
                    out.append((resp.status, await resp.json(content_type=None)))
            return out

    return asyncio.run(run())


def test_over_http_odd_numbers_and_strings_get_named_denials_or_answers() -> None:
    gpu = json.dumps(admission_review(make_pod(container("main", GPU),
                                               init=(container("warm", GPU),))))
    huge = gpu.replace('"egpu.io/gpu": "1"', '"egpu.io/gpu": ' + "9" * 10_000)
    nan = gpu.replace('"egpu.io/gpu": "1"', '"egpu.io/gpu": NaN')
    surrogate = gpu.replace('"main"', '"ma\\ud800in"')
    containers = gpu.replace('"containers": [', '"containers": 7, "x": [')
    answers = _post_all([b.encode() for b in (huge, nan, surrogate, containers)])
    assert all(status == 200 for status, _ in answers), answers
    huge_answer, nan_answer, surrogate_answer, containers_answer = (
        body["response"] for _, body in answers)
    assert "container 'main': egpu.io/gpu='99999" in huge_answer["status"]["message"]
    assert "longer than 40 characters" in huge_answer["status"]["message"]
    assert "egpu.io/gpu='nan' is not allowed (not a whole number)" in (
        nan_answer["status"]["message"])
    assert surrogate_answer["allowed"] is True and surrogate_answer["patch"]
    assert containers_answer["status"]["message"].startswith("spec.containers=7 is not allowed")
