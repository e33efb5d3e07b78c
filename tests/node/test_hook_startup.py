"""The hook's light startup path: its JSON, its reading of the records, its command line and
the installed one-file build (runtime_hook.bundle) agree with what they replace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egpu.records import (
    Allocation,
    CardShare,
    ContainerAllocation,
    PodShares,
    RecordError,
)
from runtime_hook import bundle, fastjson
from runtime_hook.main import parse_args
from runtime_hook.plan import Apply, Inputs, decide
from runtime_hook.shares import ShareError, decode_pod_shares

HEAVY = {"typing", "dataclasses", "inspect", "json", "re", "enum", "argparse", "ctypes",
         "collections", "contextlib", "runpy", "egpu.records"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12)


@given(json_values)
def test_fastjson_reads_and_writes_as_json_does(value: object) -> None:
    text = json.dumps(value)
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text.encode())
    assert fastjson.dumps_indented(value) == json.dumps(value, indent=1)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "[1,]", "\ufeff{}", b"\xff{}",
                                  '{"a": NaN}', " \n[1, 2] \t", b'\xef\xbb\xbf{"a": 1}',
                                  '"\\ud800"', "Infinity"])
def test_fastjson_errors_and_corner_cases_are_json_s(text: str | bytes) -> None:
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            fastjson.loads(text)
        assert str(got.value) == str(exc)
    else:
        result = fastjson.loads(text)
        assert repr(result) == repr(expected)


def _pod(**changes: object) -> dict:
    entry = ContainerAllocation("main", False, (CardShare("GPU-a", 0, 4096, 30),
                                                CardShare("GPU-b", 1, 2048, 0)))
    body = json.loads(PodShares("ns", "p", "uid-1", "low", "elastic", True,
                                Allocation(containers=(entry,), node="n1")).encode())
    for path, value in changes.items():
        target = body
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last = keys[-1]
        if value is KeyError:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return body


CORRUPTIONS = [
    {"version": 2}, {"priority": "urgent"}, {"compute_policy": 1}, {"allocation": []},
    {"namespace": KeyError}, {"memory_oversubscription": "yes"}, {"allocation__version": None},
    {"allocation__containers": {}}, {"allocation__containers__0": "main"},
    {"allocation__containers__0__cards": []},
    {"allocation__containers__0__cards__0__cores": 101},
    {"allocation__containers__0__cards__0__cores": True},
    {"allocation__containers__0__cards__1__memory_mib": 0},
    {"allocation__containers__0__cards__1__index": -1},
    {"allocation__containers__0__cards__1__uuid": "GPU-a"},
    {"allocation__containers__0__cards__1": 7},
    {"allocation__containers__0__name": KeyError}, {"allocation__containers__0__init": 0},
    {"allocation__node": 3}, {"pod_uid": None},
    {"low_priority_floor": 101}, {"low_priority_floor": -1}, {"low_priority_floor": True},
    {"low_priority_floor": "10"},
]


@pytest.mark.parametrize("change", CORRUPTIONS, ids=lambda c: next(iter(c)))
def test_the_hook_refuses_what_records_refuses_with_the_same_words(change: dict) -> None:
    text = json.dumps(_pod(**change))
    with pytest.raises(RecordError) as expected:
        PodShares.decode(text)
    with pytest.raises(ShareError) as got:
        decode_pod_shares(text)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("text", ["not json", "[]", '{"version": 1}'])
def test_unreadable_files_are_refused_by_both(text: str) -> None:
    with pytest.raises(RecordError):
        PodShares.decode(text)
    with pytest.raises(ShareError):
        decode_pod_shares(text)


@pytest.mark.parametrize("floor", [None, 0, 15], ids=["absent", "0", "15"])
def test_the_hook_writes_the_config_records_writes(floor: int | None) -> None:
    text = json.dumps(_pod(low_priority_floor=KeyError if floor is None else floor))
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"}
    ann = {"io.kubernetes.cri.sandbox-uid": "uid-1", "io.kubernetes.cri.container-name": "main"}
    ours = decide(Inputs("c", env, ann, decode_pod_shares(text)))
    theirs = decide(Inputs("c", env, ann, PodShares.decode(text)))
    assert isinstance(ours, Apply) and isinstance(theirs, Apply)
    assert ours.config is not None and theirs.config is not None
    from egpu.records import ConfigCard, ContainerConfig

    reference = ContainerConfig(**{k: getattr(ours.config, k) for k in (
        "namespace", "pod", "pod_uid", "container", "priority", "compute_policy",
        "memory_oversubscription", "container_region")}, cards=tuple(
        ConfigCard(c.uuid, c.memory_mib, c.cores, c.card_region) for c in ours.config.cards),
        low_priority_floor=floor or 0)
    assert ours.config.encode() == theirs.config.encode() == reference.encode()
    assert json.loads(ours.config.encode())["low_priority_floor"] == (floor or 0)
    assert ContainerConfig.decode(ours.config.encode()) == reference


def test_command_line_reads_as_argparse_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGPU_HOOK_LOG", "/tmp/x.log")
    args = parse_args(["prestart", "--runtime-dir", "/r", "--private-dir=/p", "--interp", "/i"])
    assert (args.stage, args.runtime_dir, args.private_dir, args.interposer, args.log) == (
        "prestart", "/r", "/p", "/i", "/tmp/x.log")
    assert parse_args([]).stage == "createRuntime"
    for bad in (["--nope"], ["a", "b"], ["--log"], ["--runtime-dir", "--log", "x"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(bad)
        assert exit_.value.code == 2


def _hook(tmp_path: Path) -> Path:
    return bundle.build(str(tmp_path / "egpu-hook"), f"{sys.executable} -IS")


def _imports(hook: Path, args: list[str], state: bytes) -> tuple[int, set[str], str]:
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(hook), *args],
                          input=state, capture_output=True)
    err = proc.stderr.decode()
    names = {line.split("|")[-1].strip() for line in err.splitlines()
             if line.startswith("import time:")}
    return proc.returncode, names, err


def test_installed_hook_imports_nothing_heavy_for_containers_without_a_share(
        tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    private = tmp_path / "private"
    (private / "allocations").mkdir(parents=True)
    (private / "allocations" / "uid-1.json").write_text(json.dumps(_pod()))
    args = ["createRuntime", "--private-dir", str(private), "--runtime-dir", str(tmp_path / "r")]
    cases = {
        "plain": ({"io.kubernetes.cri.sandbox-uid": "uid-2",
                   "io.kubernetes.cri.container-name": "web"}, ["HOME=/"], 0, set()),
        "sandbox": ({"io.kubernetes.cri.container-type": "sandbox"}, [], 0, set()),
        "refused": ({"io.kubernetes.cri.sandbox-uid": "uid-1",
                     "io.kubernetes.cri.container-name": "main"},
                    ["NVIDIA_VISIBLE_DEVICES=GPU-x", "EGPU_DEVICES=x::0"], 1,
                    {"runtime_hook.shares"}),
    }
    for name, (ann, env, status, expected) in cases.items():
        bundle_dir = tmp_path / name
        (bundle_dir / "rootfs").mkdir(parents=True)
        (bundle_dir / "config.json").write_text(json.dumps({
            "root": {"path": "rootfs"}, "process": {"env": env}, "annotations": ann}))
        state = json.dumps({"id": name, "pid": 0, "bundle": str(bundle_dir),
                            "annotations": ann}).encode()
        code, imported, err = _imports(hook, args, state)
        assert code == status, err
        assert not imported & HEAVY, (name, sorted(imported & HEAVY))
        assert expected <= imported, name
        assert ("runtime_hook.shares" in imported) == bool(expected), name


def test_installed_hook_help_and_source_fallback(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    out = subprocess.run([str(hook), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: egpu-hook" in out.stdout
    text = hook.read_text().replace("_MAGIC = b", "_MAGIC = b'other' + b", 1)
    hook.write_text(text)  # another interpreter version: the sources are compiled
    out = subprocess.run([str(hook), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: egpu-hook" in out.stdout
