"""The env copies of a pod's policies (``EGPU_PRIORITY``, ``EGPU_COMPUTE_POLICY``,
``EGPU_MEMORY_OVERSUBSCRIPTION``, written by the webhook on each container with a share) are
informational: they say what the record says, and changing them in a container changes
nothing egpu enforces. The share travels as the record (``egpu.io/allocation`` -> the
allocation file -> ``/run/egpu/config.json``): the node agent, the runtime hook and the
interposer under the node's config file never read these variables (libinterpose reads them
only where no config file exists: a raw node, ``egpu run``). docs/design.md, "The data
path"; ../shared/CONTRACT.md section 2 ("for reading; the authoritative copy is the config
file")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonpatch
import pytest

from egpu.config import Config
from egpu.records import Allocation, PodShares
from egpu.requests import read_pod
from node_agent.pods import pod_shares
from runtime_hook.plan import Apply, Inputs, decide
from tests.node.test_pod_registry import _pod as _k8s_pod
from tests.probes import wait_for_hold
from tests.runtime_hook.test_hook_startup import _pod as _file_body
from webhook.review import decide_pod, informational_env

ROOT = Path(__file__).resolve().parents[2]
ANN = {"io.kubernetes.cri.sandbox-uid": "uid-1", "io.kubernetes.cri.container-name": "main"}
ENV_NAMES = ("EGPU_PRIORITY", "EGPU_COMPUTE_POLICY", "EGPU_MEMORY_OVERSUBSCRIPTION")


def _env(priority: str, policy: str, oversubscription: bool) -> dict[str, str]:
    return dict(zip(ENV_NAMES, (priority, policy, "true" if oversubscription else "false"),
                    strict=True))


# --- what the webhook writes: the resolved policies, the label's and the record's ----------
def test_the_webhook_writes_the_env_copies_of_the_resolved_policies() -> None:
    pod = {"metadata": {"name": "p", "annotations": {
        "egpu.io/priority": "low", "egpu.io/compute-policy": "elastic",
        "egpu.io/memory-oversubscription": "true"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"egpu.io/gpu": 1}},
                                 "env": [{"name": "EGPU_PRIORITY", "value": "high"}]}]}}
    decision = decide_pod(pod, Config())
    assert decision.allowed
    patched = jsonpatch.apply_patch(pod, decision.patch)
    assert patched["metadata"]["labels"] == {"egpu.io/priority": "low"}
    written = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
    assert written == _env("low", "elastic", True)  # a pod's own value is replaced
    request = read_pod(pod).request
    assert request is not None and informational_env(request) == written
    assert all(type(v) is str for v in written.values())  # plain strings on the wire


# --- nobody reads them back ------------------------------------------------------------------
def test_the_node_agent_takes_the_policies_from_the_record_never_the_env() -> None:
    pod = _k8s_pod(priority="low")
    pod["spec"]["containers"][0]["env"] = [{"name": k, "value": v}
                                           for k, v in _env("high", "elastic", True).items()]
    record = Allocation.decode(pod["metadata"]["annotations"]["egpu.io/allocation"])
    placed = record.replace(priority="low", compute_policy="strict",
                            memory_oversubscription=False)
    for allocation in (record, placed):  # an older extender's record, and a complete one
        pod["metadata"]["annotations"]["egpu.io/allocation"] = allocation.encode()
        shares = pod_shares(pod, Config())
        assert shares is not None
        assert (shares.priority, shares.compute_policy, shares.memory_oversubscription) == (
            "low", "strict", False)


@pytest.mark.parametrize("env", [_env("high", "strict", False), _env("low", "elastic", True),
                                 {"EGPU_PRIORITY": "urgent", "EGPU_COMPUTE_POLICY": ""}])
def test_the_hook_writes_the_files_policies_whatever_the_containers_env(
        env: dict[str, str]) -> None:
    shares = PodShares.decode(json.dumps(_file_body()))  # low, elastic, oversubscription
    base = {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    plain = decide(Inputs("c", base, ANN, shares))
    changed = decide(Inputs("c", {**base, **env}, ANN, shares))
    assert isinstance(changed, Apply) and changed == plain and changed.config is not None
    assert (changed.config.priority, changed.config.compute_policy,
            changed.config.memory_oversubscription) == ("low", "elastic", True)


# --- libinterpose: the node's file, never the container's env ------------------------------
CARD_MIB = 24576  # tests.compute.conftest.Node's cards
CAP_MIB = 40000  # the share's booking: beyond the card, so oversubscription shows in its total


def _probe(tmp_path: Path, node_file: dict | None, env_policies: dict[str, str]
           ) -> tuple[int, str, str]:
    """Run cuprobe (init, ctx, totalmem, hold) under the interposer in a private mount
    namespace whose /run/egpu/config.json is ``node_file`` (as the runtime hook binds it;
    None: no config file, the interposer reads its env), with ``env_policies`` in its
    environment: (the card's total MiB as the process sees it, the priority and the compute
    policy its slot in the card region holds: what the compute gate enforces)."""
    from tests.compute import cardregion
    from tests.compute.conftest import LIB, Node

    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)
    node = Node(tmp_path)
    env = node.env("s", [0], memory_mib=CAP_MIB, **(node_file or {}))
    cfg = json.loads(Path(env["EGPU_CONFIG_PATH"]).read_text())
    setup = "mount -t tmpfs tmpfs /run"
    if node_file is None:
        env["EGPU_CONFIG_PATH"] = str(tmp_path / "absent.json")
        env["EGPU_MEMORY_LIMIT_MIB"] = str(CAP_MIB)
    else:
        (tmp_path / "node.json").write_text(json.dumps(cfg))
        setup += f" && mkdir /run/egpu && cp {tmp_path / 'node.json'} /run/egpu/config.json"
    env.update(env_policies)
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f'{setup} && exec "$@"', "sh", str(LIB / "cuprobe"), "init", "ctx",
                          "totalmem", "hold"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        total = -1
        for line in wait_for_hold(p, every_ok=True):
            if line.startswith("totalmem"):
                total = int(line.split("total=")[1]) >> 20
        _, slots = cardregion.read(node.region(0))
        assert [s.pids for s in slots] == [[p.pid]]
        return total, slots[0].priority, slots[0].policy
    finally:
        p.kill()
        p.wait()


def _unshare_ok() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.parametrize(("policies", "flipped"), [
    ({"priority": "low", "policy": "elastic", "oversubscription": False},
     _env("high", "strict", True)),
    ({"priority": "high", "policy": "strict", "oversubscription": True},
     _env("low", "elastic", False)),
], ids=["low-elastic", "high-strict-oversubscribed"])
def test_the_interposer_enforces_the_node_file_not_the_env_copies(
        tmp_path: Path, policies: dict, flipped: dict[str, str]) -> None:
    """The container flips all three variables: the card region's slot keeps the file's
    priority and compute policy, and the card's total keeps the file's oversubscription
    (the cap beyond the card with it, the card without)."""
    assert _unshare_ok(), "needs a private mount namespace: run `make test` as root (README)"
    total, priority, policy = _probe(tmp_path, policies, flipped)
    assert (priority, policy) == (policies["priority"], policies["policy"])
    assert total == (CAP_MIB if policies["oversubscription"] else CARD_MIB)


def test_without_a_config_file_the_interposer_reads_the_env(tmp_path: Path) -> None:
    """The control (a raw node, ``egpu run``): where no config file exists the same probe
    sees the env's policies, so the test above would see them if the interposer read them."""
    assert _unshare_ok(), "needs a private mount namespace: run `make test` as root (README)"
    assert _probe(tmp_path, None, _env("low", "elastic", True)) == (CAP_MIB, "low", "elastic")
    (tmp_path / "b").mkdir()
    assert _probe(tmp_path / "b", None, _env("high", "strict", False)) == (
        CARD_MIB, "high", "strict")
