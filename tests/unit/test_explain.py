"""`egpu explain` over the real workloads of ../shared/inputs/pods."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import main
from egpu.config import Config
from egpu.requests import read_pod


def explain_json(capsys: Any, *paths: Path) -> tuple[int, list[dict[str, Any]]]:
    status = main(["explain", "--output", "json", *map(str, paths)])
    return status, json.loads(capsys.readouterr().out)


def test_every_valid_input_reads_as_its_comment_says(shared_dir: Path, capsys: Any) -> None:
    pods = sorted((shared_dir / "inputs" / "pods").glob("0*.yaml"))
    status, reports = explain_json(capsys, *pods)
    assert status == 0
    by_object = {r["object"]: r for r in reports}
    vllm = by_object["Deployment ml-serving/chat-serving"]
    assert vllm["priority"] == "high" and vllm["filters"] == {"use_gpu_types": ["H100", "A100"]}
    assert (vllm["containers"][0]["memory_mib"], vllm["containers"][0]["cores"]) == (24000, 50)
    train = by_object["Job ml-training/lora-finetune"]
    assert (train["priority"], train["compute_policy"]) == ("low", "elastic")
    assert train["containers"][0]["gpus"] == 2
    assert by_object["Pod research/notebook-ana"]["containers"][0]["memory_percentage"] == 25
    assert len(by_object["Pod ml-serving/retrieval"]["containers"]) == 2
    assert by_object["Pod ml-serving/tts-day"]["memory_oversubscription"] is True
    ocr = by_object["Pod ml-serving/ocr-with-warmup"]["containers"]
    assert [(x["kind"], x["memory_mib"]) for x in ocr] == [("init", 12000), ("container", 8000)]
    mt = by_object["Pod ml-serving/translate-small"]["containers"][0]
    assert (mt["gpus"], mt["memory_mib"], mt["cores"]) == (1, 3000, 30)
    assert not by_object["Pod web/api-gateway"]["egpu"]
    assert not by_object["Pod research/benchmark-whole-card"]["egpu"]


def test_the_four_mistakes_are_explained(shared_dir: Path, capsys: Any) -> None:
    status, reports = explain_json(capsys, shared_dir / "inputs/pods/10-bad-requests.yaml")
    assert status == 1
    errors = {r["object"]: r["errors"] for r in reports}
    assert errors["Pod research/bad-cores"] == [
        "container 'c': egpu.io/gpu-cores='150' is not allowed (out of range); "
        "allowed: an integer 1..100 (%)"]
    assert errors["Pod research/bad-both-memory"] == [
        "container 'c': egpu.io/gpu-memory-percentage='50' is not allowed (egpu.io/gpu-memory=4000 "
        "is given too); allowed: egpu.io/gpu-memory alone (MiB) or "
        "egpu.io/gpu-memory-percentage alone (% of the card), not both"]
    assert "egpu.io/gpu-memory-percentage='0'" in errors["Pod research/bad-zero-percentage"][0]
    assert "egpu.io/priority='urgent'" in errors["Pod research/bad-priority"][0]
    assert "high, low" in errors["Pod research/bad-priority"][0]


def test_text_output_and_unreadable_file(shared_dir: Path, capsys: Any, tmp_path: Path) -> None:
    assert main(["explain", str(shared_dir / "inputs/pods/07-volcano-names.yaml")]) == 0
    assert "1 card x (3000 MiB, 30% cores)" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "missing.yaml")]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [")
    assert main(["explain", str(bad)]) == 2


RESOURCE_NAMES = ["egpu.io/gpu", "egpu.io/gpu-memory", "egpu.io/gpu-memory-percentage",
                  "egpu.io/gpu-cores", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory",
                  "nvidia.com/gpu", "cpu"]
values = st.one_of(st.integers(-5, 200), st.text(max_size=6), st.none(), st.floats(), st.booleans(),
                   st.lists(st.integers(), max_size=2))
containers = st.fixed_dictionaries(
    {"name": st.text(max_size=5)},
    optional={"resources": st.fixed_dictionaries(
        {}, optional={"limits": st.dictionaries(st.sampled_from(RESOURCE_NAMES), values),
                      "requests": st.dictionaries(st.sampled_from(RESOURCE_NAMES), values)}),
        "restartPolicy": st.sampled_from(["Always", "Never", None]),
        "securityContext": st.one_of(st.none(), st.fixed_dictionaries({"privileged": values}))})
pods = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({}, optional={"annotations": st.dictionaries(
        st.sampled_from(["egpu.io/priority", "egpu.io/compute-policy", "egpu.io/use-gpu-type",
                         "egpu.io/memory-oversubscription", "other"]), values)}),
    "spec": st.fixed_dictionaries({}, optional={
        "containers": st.lists(containers, max_size=3),
        "initContainers": st.lists(containers, max_size=2)}),
})


@settings(max_examples=300)
@given(pods)
def test_random_pod_specs_never_crash_the_parser(spec: dict[str, Any]) -> None:
    reading = read_pod(spec, Config())
    assert not (reading.request is not None and reading.errors)
    for error in reading.errors:
        assert error.message
    if reading.request is not None:
        for container in reading.request.containers:
            share = container.share
            assert 1 <= share.gpus <= 16 and 0 <= share.cores <= 100
            assert (share.memory_mib is None) != (share.memory_percentage is None)
            assert share.memory_on(random.randint(1, 200000)) >= 1
