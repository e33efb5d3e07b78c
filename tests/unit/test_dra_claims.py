"""Claims from pod specs (egpu.dra.claims): the pure core of the webhook's DRA mode.

FC-07 (init containers and sidecars), FC-11 (several cards, several containers), the type and
UUID filters as CEL (evaluated here by a small CEL reading of the expressions egpu writes is
not attempted: the e2e tests run them in the real API server; here their text and the token
rule are checked), the ShareConfig through its one decoder, the template name, the errors.
"""

from __future__ import annotations

from typing import Any

import pytest

from egpu.config import Config, ConfigError, load_config
from egpu.contract import DEVICE_CLASS_SHARE, DEVICE_CLASS_WHOLE, DRA_DRIVER
from egpu.dra.claims import (
    MAX_SUBREQUESTS,
    UUID_ATTRIBUTE,
    ClaimPlanError,
    cel_string,
    model_expression,
    needs_card_sizes,
    plan_claims,
    same_template_spec,
)
from egpu.dra.shareconfig import ShareConfig
from egpu.requests import PodRequest, read_pod


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "annotations": annotations or {}}, "spec": spec}


def _c(name: str, **limits: Any) -> dict[str, Any]:
    names = {"gpu": "egpu.io/gpu", "memory": "egpu.io/gpu-memory",
             "pct": "egpu.io/gpu-memory-percentage", "cores": "egpu.io/gpu-cores"}
    extra = limits.pop("restart", None)
    container: dict[str, Any] = {"name": name, "resources": {"limits": {
        names[k]: v for k, v in limits.items()}}}
    if extra:
        container["restartPolicy"] = extra
    return container


def _request(pod: dict[str, Any]) -> PodRequest:
    reading = read_pod(pod, Config())
    assert reading.request is not None, [e.message for e in reading.errors]
    return reading.request


def _devices(pod: dict[str, Any], sizes: tuple[int, ...] = ()) -> dict[str, Any]:
    return plan_claims(_request(pod), sizes).template["spec"]["spec"]["devices"]


def _by_name(devices: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in devices["requests"]}


# --- one container ---------------------------------------------------------------------------

def test_a_share_in_mib_is_one_request_of_its_capacity() -> None:
    devices = _devices(_pod([_c("server", gpu=1, memory=24000, cores=50)]))
    [request] = devices["requests"]
    assert request == {"name": "server", "exactly": {
        "deviceClassName": DEVICE_CLASS_SHARE, "count": 1,
        "capacity": {"requests": {"memory": "24000Mi", "cores": "50"}}}}
    assert "constraints" not in devices


def test_memory_is_written_as_the_api_server_writes_it_back() -> None:
    [request] = _devices(_pod([_c("c", memory=8192)]))["requests"]
    assert request["exactly"]["capacity"] == {"requests": {"memory": "8Gi"}}  # no cores: none


def test_whole_memory_with_cores_asks_no_memory_and_gpu_alone_is_a_whole_card() -> None:
    [share] = _devices(_pod([_c("c", gpu=1, cores=30)]))["requests"]
    assert share["exactly"] == {"deviceClassName": DEVICE_CLASS_SHARE, "count": 1,
                                "capacity": {"requests": {"cores": "30"}}}
    [whole] = _devices(_pod([_c("c", gpu=2)]))["requests"]
    assert whole["exactly"] == {"deviceClassName": DEVICE_CLASS_WHOLE, "count": 2}


def test_several_cards_of_one_container_are_distinct_cards() -> None:
    devices = _devices(_pod([_c("trainer", gpu=2, memory=30000, cores=30)]))
    assert _by_name(devices)["trainer"]["exactly"]["count"] == 2
    assert devices["constraints"] == [
        {"requests": ["trainer"], "distinctAttribute": f"{DRA_DRIVER}/uuid"}]


def test_a_percentage_is_one_alternative_per_card_size() -> None:
    pod = _pod([_c("jupyter", pct=25, cores=10)])
    assert needs_card_sizes(_request(pod))
    [request] = _devices(pod, (15360, 81559, 15360))["requests"]
    alternatives = request["firstAvailable"]
    assert [a["name"] for a in alternatives] == ["mib-81559", "mib-15360"]
    assert alternatives[0]["capacity"] == {"requests": {"memory": "20389Mi", "cores": "10"}}
    assert alternatives[1]["capacity"] == {"requests": {"memory": "3840Mi", "cores": "10"}}
    assert alternatives[1]["selectors"] == [{"cel": {
        "expression": 'device.attributes["gpu.egpu.io"].memoryMiB == 15360'}}]
    assert all(a["deviceClassName"] == DEVICE_CLASS_SHARE for a in alternatives)


def test_a_percentage_without_card_sizes_or_with_too_many_is_an_error_that_says_why() -> None:
    request = _request(_pod([_c("jupyter", pct=25)]))
    with pytest.raises(ClaimPlanError, match=r"'jupyter'.*25%.*no gpu.egpu.io device"):
        plan_claims(request, ())
    sizes = tuple(range(1000, 1000 + MAX_SUBREQUESTS + 1))
    with pytest.raises(ClaimPlanError, match=r"9 sizes.*more than the 8"):
        plan_claims(request, sizes)
    assert not needs_card_sizes(_request(_pod([_c("c", pct=100, cores=5)])))


# --- FC-11: several containers ----------------------------------------------------------------

def test_fc11_each_app_container_has_its_own_request_so_bookings_add_up() -> None:
    pod = _pod([_c("embedding", gpu=1, memory=4000, cores=10),
                _c("reranker", gpu=1, memory=6000, cores=10)])
    plan = plan_claims(_request(pod))
    requests = _by_name(plan.template["spec"]["spec"]["devices"])
    assert requests["embedding"]["exactly"]["capacity"]["requests"]["memory"] == "4000Mi"
    assert requests["reranker"]["exactly"]["capacity"]["requests"]["memory"] == "6000Mi"
    assert plan.requests_of("embedding") == ("embedding",)
    assert plan.requests_of("reranker") == ("reranker",)
    assert plan.requests_of("no-share") == ()


# --- FC-07: init containers and sidecars ------------------------------------------------------

def test_fc07_an_init_container_shares_the_app_card_and_books_only_the_difference() -> None:
    pod = _pod([_c("ocr", gpu=1, memory=8000, cores=20)],
               init=[_c("compile-engine", gpu=1, memory=12000, cores=100)])
    plan = plan_claims(_request(pod))
    devices = plan.template["spec"]["spec"]["devices"]
    requests = _by_name(devices)
    assert set(requests) == {"ocr", "compile-engine"}
    # booked on the one card: 8000 + 4000 = max(12000, 8000) MiB, 20 + 80 = max(100, 20) %
    assert requests["compile-engine"]["exactly"]["capacity"] == {
        "requests": {"memory": "4000Mi", "cores": "80"}}
    assert devices["constraints"] == [
        {"requests": ["ocr", "compile-engine"], "matchAttribute": UUID_ATTRIBUTE}]
    assert plan.requests_of("compile-engine") == ("ocr", "compile-engine")
    assert plan.requests_of("ocr") == ("ocr",)


def test_fc07_an_init_container_no_bigger_than_the_app_books_nothing_more() -> None:
    pod = _pod([_c("app", gpu=1, memory=8000, cores=20)],
               init=[_c("warm", gpu=1, memory=6000, cores=20)])
    plan = plan_claims(_request(pod))
    assert [r["name"] for r in plan.template["spec"]["spec"]["devices"]["requests"]] == ["app"]
    assert plan.requests_of("warm") == ("app",)


def test_fc07_more_cores_but_less_memory_books_1_mib_beside_the_cores() -> None:
    pod = _pod([_c("app", gpu=1, memory=8000, cores=20)],
               init=[_c("warm", gpu=1, memory=6000, cores=50)])
    requests = _by_name(_devices(pod))
    assert requests["warm"]["exactly"]["capacity"] == {
        "requests": {"memory": "1Mi", "cores": "30"}}


def test_fc07_several_init_containers_share_one_headroom_of_the_largest_need() -> None:
    pod = _pod([_c("app", gpu=1, memory=8000, cores=20)],
               init=[_c("a", gpu=1, memory=12000, cores=30), _c("b", gpu=1, memory=9000,
                                                                  cores=90)])
    plan = plan_claims(_request(pod))
    requests = _by_name(plan.template["spec"]["spec"]["devices"])
    assert set(requests) == {"app", "a"}
    assert requests["a"]["exactly"]["capacity"] == {
        "requests": {"memory": "4000Mi", "cores": "70"}}
    assert plan.requests_of("a") == plan.requests_of("b") == ("app", "a")


def test_fc07_sidecars_are_summed_with_the_app_containers() -> None:
    pod = _pod([_c("app", gpu=1, memory=8000)],
               init=[_c("proxy", gpu=1, memory=1000, restart="Always")])
    plan = plan_claims(_request(pod))
    assert set(_by_name(plan.template["spec"]["spec"]["devices"])) == {"proxy", "app"}
    assert plan.requests_of("proxy") == ("proxy",)
    assert "constraints" not in plan.template["spec"]["spec"]["devices"]


def test_fc07_an_init_container_never_pairs_with_a_sidecar_that_runs_beside_it() -> None:
    """Bug caught (found by review): a sidecar declared before an init container could be the
    partner whose booking the init container reuses; both run at once, so the claim booked
    8000 + 4000 MiB (or, for a 6000 MiB init container, 8000 alone) where 8000 + 12000 ran,
    and the card could be booked past its memory."""
    pod = _pod([{"name": "app"}],
               init=[_c("proxy", gpu=1, memory=8000, restart="Always"),
                     _c("warm", gpu=1, memory=12000)])
    plan = plan_claims(_request(pod))
    requests = _by_name(plan.template["spec"]["spec"]["devices"])
    assert plan.requests_of("warm") == ("warm",) and plan.requests_of("proxy") == ("proxy",)
    assert (requests["proxy"]["exactly"]["capacity"]["requests"]["memory"],
            requests["warm"]["exactly"]["capacity"]["requests"]["memory"]) == (
                "8000Mi", "12000Mi")
    # with an app container it pairs with the app, and the sidecar keeps its own request
    pod = _pod([_c("app", gpu=1, memory=4000)],
               init=[_c("proxy", gpu=1, memory=8000, restart="Always"),
                     _c("warm", gpu=1, memory=6000)])
    plan = plan_claims(_request(pod))
    assert plan.requests_of("warm") == ("app", "warm")
    assert plan.requests_of("proxy") == ("proxy",)


def test_fc07_an_init_only_gpu_pod_or_a_multi_card_init_gets_its_own_request() -> None:
    alone = plan_claims(_request(_pod([{"name": "app"}],
                                      init=[_c("warm", gpu=1, memory=6000)])))
    assert alone.requests_of("warm") == ("warm",)
    multi = plan_claims(_request(_pod([_c("app", gpu=1, memory=8000)],
                                      init=[_c("warm", gpu=2, memory=6000)])))
    assert multi.requests_of("warm") == ("warm",)
    assert multi.template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["warm"], "distinctAttribute": UUID_ATTRIBUTE}]


# --- filters, config, name --------------------------------------------------------------------

def test_type_and_uuid_filters_become_one_selector_each_on_every_request() -> None:
    pod = _pod([_c("a", memory=1000), _c("b", memory=2000)], annotations={
        "egpu.io/use-gpu-type": "H100,A100", "egpu.io/nouse-gpu-type": "A10",
        "egpu.io/use-gpu-uuid": "GPU-1,GPU-2", "egpu.io/nouse-gpu-uuid": "GPU-3"})
    for request in _devices(pod)["requests"]:
        expressions = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
        assert expressions == [
            model_expression(("H100", "A100")), f"!{model_expression(('A10',))}",
            'device.attributes["gpu.egpu.io"].uuid in ["GPU-1", "GPU-2"]',
            '!(device.attributes["gpu.egpu.io"].uuid in ["GPU-3"])']


def test_the_model_expression_follows_the_token_rule() -> None:
    text = model_expression(("A10", "Tesla T4"))
    assert text == (
        '(device.attributes["gpu.egpu.io"].model.lowerAscii() in ["a10", "tesla t4"] || '
        'device.attributes["gpu.egpu.io"].model.lowerAscii().replace("-", " ")'
        '.replace("_", " ").split(" ").exists(t, t in ["a10", "tesla t4"]))')


def test_cel_strings_are_escaped() -> None:
    assert cel_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'


def test_the_share_config_is_the_pods_and_reads_back_through_its_decoder() -> None:
    pod = _pod([_c("c", memory=1000)], annotations={
        "egpu.io/priority": "low", "egpu.io/compute-policy": "elastic",
        "egpu.io/memory-oversubscription": "true"})
    [config] = _devices(pod)["config"]
    assert config["opaque"]["driver"] == DRA_DRIVER
    assert ShareConfig.decode(config["opaque"]["parameters"]) == ShareConfig(
        "low", "elastic", memory_oversubscription=True)


def test_the_template_is_named_by_its_spec_and_labelled() -> None:
    one = plan_claims(_request(_pod([_c("c", memory=1000)])))
    same = plan_claims(_request(_pod([_c("c", memory=1000)])))
    other = plan_claims(_request(_pod([_c("c", memory=1001)])))
    assert one.template == same.template
    assert one.template_name.startswith("egpu-") and len(one.template_name) == 15
    assert one.template_name != other.template_name
    labels = one.template["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "egpu-webhook"
    assert one.template["spec"]["metadata"]["labels"] == labels
    placed = one.template_in("ns")
    assert placed["metadata"]["namespace"] == "ns" and "namespace" not in one.template[
        "metadata"]


def test_a_template_read_back_with_defaults_and_other_quantities_is_the_same() -> None:
    written = plan_claims(_request(_pod([_c("c", memory=8192, cores=5)]))).template["spec"]
    read = {"metadata": written["metadata"], "spec": {"devices": {
        "requests": [{"name": "c", "exactly": {
            "deviceClassName": DEVICE_CLASS_SHARE, "count": 1, "allocationMode": "ExactCount",
            "capacity": {"requests": {"memory": "8192Mi", "cores": "5"}}}}],
        "config": written["spec"]["devices"]["config"]}}}
    assert same_template_spec(read, written)
    read["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["cores"] = "6"
    assert not same_template_spec(read, written)


# --- the config switch ------------------------------------------------------------------------

def test_the_allocation_mode_is_the_pods_then_its_namespaces_then_the_configs() -> None:
    config = load_config("allocationMode: dra\nnamespaceAllocationModes: {old: extender}\n")
    assert config.allocation_mode_for("new") == "dra"
    assert config.allocation_mode_for("old") == "extender"
    assert config.allocation_mode_for("old", "dra") == "dra"
    assert Config().allocation_mode_for("any") == "extender"


@pytest.mark.parametrize(("text", "message"), [
    ("allocationMode: claims", r"allocationMode: 'claims' is not allowed; allowed: extender, dra"),
    ("namespaceAllocationModes: {a: x}", r"namespaceAllocationModes.a: 'x' is not allowed"),
    ("namespaceAllocationModes: [a]", r"namespaceAllocationModes: expected a mapping"),
])
def test_bad_allocation_modes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(text)


def test_a_bad_allocation_mode_annotation_is_a_request_error() -> None:
    reading = read_pod(_pod([_c("c", memory=1000)], annotations={
        "egpu.io/allocation-mode": "claims"}))
    assert [e.message for e in reading.errors] == [
        "pod annotation egpu.io/allocation-mode='claims' is not allowed; allowed: extender, dra"]
