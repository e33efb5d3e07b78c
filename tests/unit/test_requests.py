"""The shared core's reading of pod requests: every rule of CONTRACT.md section 1."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu.config import Config, load_config
from egpu.requests import ContainerKind, Share, model_matches, read_pod


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": list(containers), "initContainers": list(init), **spec},
    }


def c(name: str = "c", limits: dict[str, Any] | None = None,
      requests: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "resources": resources, **extra}


def test_cpu_only_pod_is_not_ours_even_with_bad_annotations() -> None:
    reading = read_pod(pod(c(limits={"cpu": "1"}), annotations={"egpu.io/priority": "urgent"}))
    assert reading.request is None and not reading.errors and not reading.is_egpu_pod


def test_native_nvidia_gpu_is_not_ours() -> None:
    assert not read_pod(pod(c(limits={"nvidia.com/gpu": 1}))).is_egpu_pod


def test_defaults_whole_memory_no_cores_one_card() -> None:
    request = read_pod(pod(c(limits={"egpu.io/gpu-cores": 20}))).request
    assert request is not None
    assert request.containers[0].share == Share(1, None, 100, 20)
    assert request.priority == "high" and request.compute_policy == "strict"
    request = read_pod(pod(c(limits={"egpu.io/gpu": "2"}))).request
    assert request is not None and request.containers[0].share == Share(2, None, 100, 0)


@pytest.mark.parametrize(("resource", "value"), [
    ("egpu.io/gpu-memory-percentage", 0), ("egpu.io/gpu-memory-percentage", 101),
    ("egpu.io/gpu-memory-percentage", 150), ("egpu.io/gpu-memory", 0),
    ("egpu.io/gpu-cores", 150), ("egpu.io/gpu-cores", 0), ("egpu.io/gpu", 17),
    ("egpu.io/gpu", 0), ("egpu.io/gpu-memory", "24Gi"), ("egpu.io/gpu-memory", "1.5"),
    ("egpu.io/gpu-memory", -5),
])
def test_fc09_out_of_range_names_container_resource_value_and_range(resource: str,
                                                                    value: Any) -> None:
    limits = {"egpu.io/gpu": 1, resource: value} if resource != "egpu.io/gpu" else {resource: value}
    reading = read_pod(pod(c("worker", limits=limits)))
    assert reading.request is None and len(reading.errors) == 1
    message = reading.errors[0].message
    assert "'worker'" in message and resource in message and str(value) in message
    assert "allowed:" in message


def test_memory_and_percentage_together_is_an_error() -> None:
    reading = read_pod(pod(c(limits={"egpu.io/gpu-memory": 4000,
                                     "egpu.io/gpu-memory-percentage": 50})))
    assert "egpu.io/gpu-memory=4000 is given too" in reading.errors[0].message
    assert "not both" in reading.errors[0].message


def test_requests_must_equal_limits() -> None:
    reading = read_pod(pod(c(limits={"egpu.io/gpu-memory": 4000},
                             requests={"egpu.io/gpu-memory": 3000})))
    assert "requests must equal limits" in reading.errors[0].message
    reading = read_pod(pod(c(requests={"egpu.io/gpu-memory": 3000})))
    assert "limits" in reading.errors[0].message
    ok = read_pod(pod(c(limits={"egpu.io/gpu-memory": 4000},
                        requests={"egpu.io/gpu-memory": "4000"})))
    assert ok.request is not None


@pytest.mark.parametrize(("limit", "requested", "mib"),
                         [("2e3", "2k", 2000), ("2k", 2000, 2000), ("3000", "3e3", 3000)])
def test_requests_equal_to_limits_in_another_notation_are_accepted(limit: str, requested: Any,
                                                                   mib: int) -> None:
    """The API server keeps each quantity's notation and holds ``2e3`` equal to ``2k``. Bug
    caught: requests and limits compared as text, so a pod Kubernetes accepts was refused with
    "requests must equal limits"."""
    reading = read_pod(pod(c(limits={"egpu.io/gpu-memory": limit},
                             requests={"egpu.io/gpu-memory": requested})))
    assert not reading.errors and reading.request is not None
    assert reading.request.containers[0].share.memory_mib == mib


def test_aliases_mean_the_same_and_cannot_be_mixed() -> None:
    volcano = read_pod(pod(c(limits={"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 3000,
                                     "volcano.sh/vgpu-cores": 30})))
    assert volcano.request is not None
    assert volcano.request.containers[0].share == Share(1, 3000, None, 30)
    assert volcano.request.containers[0].uses_aliases
    mixed = read_pod(pod(c(limits={"volcano.sh/vgpu-number": 1, "egpu.io/gpu-memory": 3000})))
    assert mixed.errors and "mixes" in mixed.errors[0].message


def test_configured_aliases_replace_the_defaults() -> None:
    config = load_config("resourceAliases: {example.com/vgpu: egpu.io/gpu}")
    assert read_pod(pod(c(limits={"example.com/vgpu": 1})), config).request is not None
    assert not read_pod(pod(c(limits={"volcano.sh/vgpu-number": 1})), config).is_egpu_pod


def test_init_and_sidecar_containers_count() -> None:
    reading = read_pod(pod(
        c("app", limits={"egpu.io/gpu-memory": 8000}),
        init=(c("warmup", limits={"egpu.io/gpu-memory": 12000}),
              c("proxy", limits={"egpu.io/gpu-memory": 1000}, restartPolicy="Always"))))
    assert reading.request is not None
    kinds = {x.name: x.kind for x in reading.request.containers}
    assert kinds == {"warmup": ContainerKind.INIT, "proxy": ContainerKind.SIDECAR,
                     "app": ContainerKind.APP}


def test_fc07_gpu_only_in_init_container_is_an_egpu_pod() -> None:
    reading = read_pod(pod(c("app", limits={"cpu": 1}),
                           init=(c("warmup", limits={"egpu.io/gpu-memory": 12000}),)))
    assert reading.request is not None and reading.request.containers[0].name == "warmup"


def test_priority_from_annotation_priority_class_and_default() -> None:
    config = load_config("priorityClasses: {batch: low}\ndefaults: {priority: high}")
    share = c(limits={"egpu.io/gpu": 1})
    assert read_pod(pod(share, priorityClassName="batch"), config).request.priority == "low"  # type: ignore[union-attr]
    assert read_pod(pod(share), config).request.priority == "high"  # type: ignore[union-attr]
    annotated = pod(share, annotations={"egpu.io/priority": "high"}, priorityClassName="batch")
    assert read_pod(annotated, config).request.priority == "high"  # type: ignore[union-attr]


@pytest.mark.parametrize(("key", "value"), [
    ("egpu.io/priority", "urgent"), ("egpu.io/compute-policy", "loose"),
    ("egpu.io/memory-oversubscription", "yes"), ("egpu.io/gpu-policy", "fill"),
    ("egpu.io/node-policy", ""), ("egpu.io/use-gpu-type", "A10,,T4"),
])
def test_bad_annotations_are_named(key: str, value: str) -> None:
    reading = read_pod(pod(c(limits={"egpu.io/gpu": 1}), annotations={key: value}))
    assert reading.errors and key in reading.errors[0].message


def test_memory_on_a_card_from_percentage_rounds_down() -> None:
    share = Share(1, None, 25, 10)
    assert share.memory_on(81559) == 20389 and share.memory_on(15360) == 3840
    assert Share(1, 4000, None, 0).memory_on(15360) == 4000


@pytest.mark.parametrize(("model", "names", "expected"), [
    ("NVIDIA A10", ("A10",), True),
    ("NVIDIA A100-SXM4-80GB", ("A10",), False),
    ("NVIDIA A100-SXM4-40GB", ("H100", "A100"), True),
    ("NVIDIA H100 80GB HBM3", ("h100",), True),
    ("Tesla T4", ("tesla t4",), True),
    ("Tesla T4", ("T",), False),
])
def test_model_token_rule(model: str, names: tuple[str, ...], expected: bool) -> None:
    assert model_matches(model, names) is expected


def test_malformed_input_never_raises() -> None:
    for thing in (None, 1, "x", {"spec": 5}, {"spec": {"containers": [5, None, {"resources": 3}]}},
                  {"spec": {"containers": [{"resources": {"limits": {"egpu.io/gpu": None}}}]}}):
        read_pod(thing, Config())  # type: ignore[arg-type]


# --- F9: quantities too long to print never raise --------------------------------------------


def _pod_with(value: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {
        "limits": {"egpu.io/gpu": "1", "egpu.io/gpu-cores": value,
                   "egpu.io/gpu-memory": value}}}]}}


@settings(max_examples=60, deadline=None)
@given(digits=st.integers(41, 20000), suffix=st.sampled_from(["", "k", "E", "e9", ".0", "e-5"]),
       lead=st.sampled_from(["1", "9", "+1", "0"]), as_int=st.booleans())
def test_huge_quantities_are_refused_never_raise(digits: int, suffix: str, lead: str,
                                                 as_int: bool) -> None:
    text = lead + "7" * (digits - len(lead)) + suffix
    value: Any = int(text) if as_int and not suffix and lead != "+1" and digits < 4300 else text
    if as_int and not isinstance(value, int):
        value = 10 ** digits  # an int too long for str() (beyond 4300 digits)
    reading = read_pod(_pod_with(value))
    assert reading.request is None and len(reading.errors) == 2
    for error in reading.errors:
        message = error.message  # never raises (ValueError: int string conversion limit)
        assert "not a whole number" in message and len(message) < 400, message


def test_a_5000_digit_quantity_gets_a_clear_truncated_message() -> None:
    reading = read_pod(_pod_with("1" * 5000))
    assert reading.errors[0].message == (
        f"container 'c': egpu.io/gpu-cores='{'1' * 40}...' is not allowed (not a whole number "
        "(longer than 40 characters)); allowed: an integer 1..100 (%)")
    reading = read_pod(_pod_with(10**5000))
    assert reading.errors[0].message.startswith(
        "container 'c': egpu.io/gpu-cores='<an integer of about 5001 digits>' is not allowed "
        "(not a whole number (longer than 40 characters))")


@pytest.mark.parametrize("value", ["1" * 40, "100", 10**39, "1" * 38 + "e1"])
def test_quantities_up_to_40_characters_still_parse(value: Any) -> None:
    reading = read_pod(_pod_with(value))
    assert all("not a whole number" not in e.message for e in reading.errors)


def test_a_misspelled_egpu_resource_is_refused_naming_the_allowed_names() -> None:
    """Otherwise the pod is admitted untouched and waits forever for a resource no node
    offers."""
    pod = {"metadata": {"name": "p", "namespace": "d"},
           "spec": {"containers": [{"name": "c", "image": "x",
                                    "resources": {"limits": {"egpu.io/gpu-memry": "4000"}}}]}}
    reading = read_pod(pod)
    assert reading.is_egpu_pod and reading.request is None
    [error] = reading.errors
    assert "egpu.io/gpu-memry='4000' is not allowed (not an egpu resource)" in error.message
    assert "egpu.io/gpu-memory" in error.message
