"""The hook's startup: what the installed one-file build (runtime_hook.bundle) imports (its
speed is bench/node.py's), how it refuses malformed allocation files (egpu.records, the one decoder
of the file), the config it writes, and its command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from egpu.records import (
    Allocation,
    CardShare,
    ContainerAllocation,
    PodShares,
    RecordError,
)
from runtime_hook import bundle
from runtime_hook.main import load_shares, parse_args
from runtime_hook.plan import Apply, Inputs, Refuse, decide

# Never on the hook's path: what costs its startup most (typing, dataclasses, inspect,
# argparse: milliseconds each on a busy node), ctypes (only to mount a share), and the parts of
# the core it has no use for.
HEAVY = {"typing", "dataclasses", "inspect", "argparse", "ctypes", "contextlib", "runpy",
         "egpu.node_records", "egpu.requests", "egpu.config", "egpu.policies", "egpu.kube",
         "yaml"}
# How long the imports take is bench/node.py's (hook_p50_ms <= 50: the whole run), not a
# test's: a busy host moves it (a 30 ms budget failed under a concurrent test run).


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


# New fields of the allocation record, malformed: refused as the older ones are.
CORRUPTIONS += [
    {"allocation__priority": "urgent"}, {"allocation__compute_policy": 1},
    {"allocation__memory_oversubscription": "no"}, {"allocation__containers__0__kind": "app"},
    {"allocation__containers__0__kind": "init"},  # an init container with init false
]


def _write(tmp_path: Path, text: str, uid: str = "uid-1") -> Path:
    private = tmp_path / "private"
    (private / "allocations").mkdir(parents=True, exist_ok=True)
    (private / "allocations" / f"{uid}.json").write_text(text)
    return private


ENV = {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"}
ANN = {"io.kubernetes.cri.sandbox-uid": "uid-1", "io.kubernetes.cri.container-name": "main"}


@pytest.mark.parametrize("change", CORRUPTIONS, ids=lambda c: f"{next(iter(c))}={c[next(iter(c))]}")
def test_the_hook_refuses_a_malformed_allocation_file_naming_the_field(
        tmp_path: Path, change: dict[str, object]) -> None:
    text = json.dumps(_pod(**change))
    with pytest.raises(RecordError) as expected:
        PodShares.decode(text)
    field = str(expected.value).split(":")[0]
    private = _write(tmp_path, text)
    shares, reason = load_shares(str(private), "uid-1")
    assert shares is None and reason == f"{private}/allocations/uid-1.json: {expected.value}"
    decision = decide(Inputs("c", ENV, ANN, shares, reason))
    assert isinstance(decision, Refuse) and field in decision.message


@pytest.mark.parametrize("text", ["not json", "[]", '{"version": 1}', "\ufeff{}", "{"])
def test_unreadable_allocation_files_are_refused(tmp_path: Path, text: str) -> None:
    shares, reason = load_shares(str(_write(tmp_path, text)), "uid-1")
    assert shares is None and reason is not None and "uid-1.json: " in reason


def test_an_absent_allocation_file_is_no_error(tmp_path: Path) -> None:
    assert load_shares(str(tmp_path), "uid-1") == (None, None)
    assert load_shares(str(tmp_path), "../x")[1] == "bad pod uid '../x'"


@pytest.mark.parametrize("floor", [None, 0, 15], ids=["absent", "0", "15"])
def test_the_hook_writes_the_config_of_the_allocation_file(tmp_path: Path,
                                                           floor: int | None) -> None:
    text = json.dumps(_pod(low_priority_floor=KeyError if floor is None else floor))
    shares, reason = load_shares(str(_write(tmp_path, text)), "uid-1")
    assert reason is None and shares == PodShares.decode(text)
    decision = decide(Inputs("c", ENV, ANN, shares))
    assert isinstance(decision, Apply) and decision.config is not None
    from egpu.records import ConfigCard, ContainerConfig

    reference = ContainerConfig(
        "ns", "p", "uid-1", "main", "low", "elastic", True,
        "/var/run/egpu/containers/uid-1_main/region",
        (ConfigCard("GPU-a", 4096, 30, "/var/run/egpu/cards/GPU-a"),
         ConfigCard("GPU-b", 2048, 0, "/var/run/egpu/cards/GPU-b")), floor or 0)
    assert decision.config == reference
    assert json.loads(decision.config.encode())["low_priority_floor"] == (floor or 0)
    assert ContainerConfig.decode(decision.config.encode()) == reference


def test_an_allocation_file_with_the_placement_facts_reads_the_same(tmp_path: Path) -> None:
    """A file whose allocation carries kinds and policies (an extender that writes them):
    the hook reads the top-level policies, as in files without them."""
    body = _pod()
    body["allocation"].update(priority="low", compute_policy="elastic",
                              memory_oversubscription=True)
    body["allocation"]["containers"][0]["kind"] = "container"
    shares, reason = load_shares(str(_write(tmp_path, json.dumps(body))), "uid-1")
    assert reason is None and shares is not None and shares.allocation.complete
    plain, _ = load_shares(str(_write(tmp_path / "old", json.dumps(_pod()))), "uid-1")
    assert plain is not None and not plain.allocation.complete
    ours, theirs = (decide(Inputs("c", ENV, ANN, s)) for s in (shares, plain))
    assert isinstance(ours, Apply) and ours == theirs


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


def _imports(hook: Path, args: list[str], state: bytes
             ) -> tuple[int, set[str], str, dict[str, tuple[int, int]]]:
    """Run the installed hook under ``-X importtime``: its exit status, the modules it
    imported, its stderr, and module -> (self, cumulative) import time in microseconds."""
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(hook), *args],
                          input=state, capture_output=True)
    err = proc.stderr.decode()
    times: dict[str, tuple[int, int]] = {}
    for line in err.splitlines():
        if line.startswith("import time:") and not line.endswith("imported package"):
            own, total, name = line.removeprefix("import time:").split("|")
            times[name.strip()] = (int(own), int(total))
    return proc.returncode, set(times), err, times


def _cases(tmp_path: Path) -> tuple[list[str], dict[str, tuple[bytes, int, set[str]]]]:
    """The hook's arguments, and per case: its state on stdin, its exit status and the core
    modules it must import (a pod with an allocation file: egpu.records)."""
    private = _write(tmp_path, json.dumps(_pod()))
    args = ["createRuntime", "--private-dir", str(private), "--runtime-dir", str(tmp_path / "r")]
    cases = {
        "plain": ({"io.kubernetes.cri.sandbox-uid": "uid-2",
                   "io.kubernetes.cri.container-name": "web"}, ["HOME=/"], 0, set()),
        "sandbox": ({"io.kubernetes.cri.container-type": "sandbox"}, [], 0, set()),
        "refused": ({"io.kubernetes.cri.sandbox-uid": "uid-1",
                     "io.kubernetes.cri.container-name": "main"},
                    ["NVIDIA_VISIBLE_DEVICES=GPU-x", "EGPU_DEVICES=x::0"], 1,
                    {"egpu.records"}),
    }
    out = {}
    for name, (ann, env, status, expected) in cases.items():
        bundle_dir = tmp_path / name
        (bundle_dir / "rootfs").mkdir(parents=True)
        (bundle_dir / "config.json").write_text(json.dumps({
            "root": {"path": "rootfs"}, "process": {"env": env}, "annotations": ann}))
        state = json.dumps({"id": name, "pid": 0, "bundle": str(bundle_dir),
                            "annotations": ann}).encode()
        out[name] = (state, status, expected)
    return args, out


def test_installed_hook_imports_nothing_heavy_for_containers_without_a_share(
        tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    args, cases = _cases(tmp_path)
    for name, (state, status, expected) in cases.items():
        code, imported, err, _ = _imports(hook, args, state)
        assert code == status and "Traceback" not in err, err  # all it imports is bundled
        assert not imported & HEAVY, (name, sorted(imported & HEAVY))
        assert expected <= imported, name
        assert ("egpu.records" in imported) == bool(expected), name


def test_installed_hook_help_and_source_fallback(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    out = subprocess.run([str(hook), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: egpu-hook" in out.stdout
    text = hook.read_text().replace("_MAGIC = b", "_MAGIC = b'other' + b", 1)
    hook.write_text(text)  # another interpreter version: the sources are compiled
    out = subprocess.run([str(hook), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: egpu-hook" in out.stdout


SHARE_PATH = """
import sys
from runtime_hook import hostfs, mounts, rootfs
from runtime_hook.plan import card_shares, raw_share
from egpu import card_roster
shares = card_shares(raw_share("c", {"EGPU_MEMORY_LIMIT_MIB": "1",
                                     "NVIDIA_VISIBLE_DEVICES": "GPU-a"}, ()))
assert shares[0][1].owner == card_roster.owner_id("/var/run/egpu/containers/c_raw/region")
print(card_roster.__spec__.origin)
"""


def test_the_share_path_takes_the_roster_codec_from_the_bundle_and_nothing_heavy(
        tmp_path: Path) -> None:
    """A container with a share: the installed file registers it in the card's roster with
    egpu.card_roster, which it carries (the node's python3 has no egpu package), and which
    adds no typing, dataclasses or contextlib to the hook's imports (ctypes: the mounts)."""
    text = bundle.render(f"{sys.executable} -IS")
    tail = "from runtime_hook.main import main  # noqa: E402\n\nmain()"
    assert tail in text
    hook = tmp_path / "share-path"
    hook.write_text(text.replace(tail, SHARE_PATH))
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(hook)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "egpu-hook:egpu.card_roster"  # carried by the file
    imported = {line.split("|")[2].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and not line.endswith("imported package")}
    assert "egpu.card_roster" in imported
    assert not imported & (HEAVY - {"ctypes"}), sorted(imported & HEAVY)


def _egpu_imports(module: str) -> set[str]:
    """The egpu and runtime_hook modules ``module``'s source imports, at any depth of its
    code (the hook imports most of them inside functions, on the path that needs them)."""
    import ast

    tree = ast.parse(Path(bundle._source_path(module)).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            # ``from egpu import safefile`` names a module, ``from egpu.x import y`` does not
            found |= {f"{node.module}.{alias.name}" for alias in node.names
                      if node.module in bundle.PACKAGES}
    return {name for name in found if name.split(".")[0] in bundle.PACKAGES
            and (name in bundle.PACKAGES or Path(bundle._source_path(name)).exists())}


def test_every_module_the_hook_imports_is_carried_by_its_file() -> None:
    """The installed hook runs as ``python3 -IS`` on a node without the egpu package: a module
    its code imports on some path (driver limits, a held region) that the file does not carry
    fails that path with ImportError, after the container was already half set up. The bug
    this catches: egpu.driver_limits missing, so every container on a node whose driver takes
    per-container memory limits failed to start."""
    carried = set(bundle.MODULES)
    # egpu.records loads the node annotations' records lazily (module __getattr__), which the
    # hook never reads
    never_on_the_hooks_path = {"egpu.node_records"}
    missing = {f"{name} (imported by {module})" for module in carried
               for name in _egpu_imports(module) - never_on_the_hooks_path
               if name not in carried}
    assert not missing, sorted(missing)
