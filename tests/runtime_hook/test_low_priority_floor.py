"""The low-priority floor (lowPriorityFloorPercent): a pod cannot set or raise it, files of
older agents read as 0, bad values are refused naming the field (egpu.records, the one
decoder of the allocation file, the hook's too), and libinterpose's parser (src/config.c) and
its setup (src/hooks_compute.c) take the node's value and never the pod's environment."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from egpu.config import Config
from egpu.records import ContainerConfig as RecordConfig
from egpu.records import PodShares, RecordError
from node_agent.pods import PodRegistry, pod_shares
from runtime_hook.plan import Apply, Inputs, decide
from tests.node.test_pod_registry import _pod as _k8s_pod
from tests.probes import wait_for_hold
from tests.runtime_hook.test_hook_startup import _pod as _file_body

ROOT = Path(__file__).resolve().parents[2]
ANN = {"io.kubernetes.cri.sandbox-uid": "uid-1", "io.kubernetes.cri.container-name": "main"}
LOOKALIKES = {k: "90" for k in (
    "low_priority_floor", "lowPriorityFloorPercent", "egpu.io/low-priority-floor",
    "egpu.io/lowPriorityFloorPercent", "egpu.io/low_priority_floor", "EGPU_LOW_PRIORITY_FLOOR")}


# --- a pod has no say ---------------------------------------------------------------------
@pytest.mark.parametrize("floor", [0, 7])
def test_pod_annotations_labels_and_env_named_like_the_floor_are_ignored(floor: int) -> None:
    pod = _k8s_pod()
    pod["metadata"]["annotations"].update(LOOKALIKES)
    pod["metadata"]["labels"].update({"egpu.io/low-priority-floor": "90",
                                      "lowPriorityFloorPercent": "90"})
    pod["spec"]["containers"][0]["env"] = [{"name": k, "value": "90"} for k in LOOKALIKES
                                           if "/" not in k]
    shares = pod_shares(pod, Config(low_priority_floor_percent=floor))
    assert shares is not None and shares.low_priority_floor == floor


def test_the_hook_ignores_env_and_oci_annotations_named_like_the_floor() -> None:
    text = json.dumps(_file_body(low_priority_floor=3))
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", **LOOKALIKES}
    decision = decide(Inputs("c", env, {**ANN, **LOOKALIKES}, PodShares.decode(text)))
    assert isinstance(decision, Apply) and decision.config is not None
    assert json.loads(decision.config.encode())["low_priority_floor"] == 3


# --- the Python decoder ---------------------------------------------------------------------
def _with(literal: str, key: str = "low_priority_floor") -> str:
    """The allocation file with ``key`` set to the raw JSON ``literal``."""
    return json.dumps(_file_body(**{key: "@@"})).replace('"@@"', literal)


ACCEPTED = {"0": 0, "-0": 0, "100": 100, "15": 15}
REFUSED = ["10.0", "1e1", "1E1", "-0.0", "100.0", "101", "-1", "1e400", "-1e400", "NaN",
           "Infinity", "-Infinity", "100000000000000000000", '"10"', "true", "false", "null",
           "[10]", '{"v": 10}', "1" * 5000]


@pytest.mark.parametrize(("literal", "value"), list(ACCEPTED.items()))
def test_the_floor_is_an_integer_0_to_100(literal: str, value: int) -> None:
    assert PodShares.decode(_with(literal)).low_priority_floor == value


@pytest.mark.parametrize("literal", REFUSED, ids=lambda s: s[:12])
def test_other_floors_are_refused_naming_the_field(literal: str) -> None:
    with pytest.raises(RecordError) as refused:
        PodShares.decode(_with(literal))
    if len(literal) < 100:  # a 5000-digit integer is refused by json itself (not valid JSON)
        assert "pod-shares.low_priority_floor" in str(refused.value)


@pytest.mark.parametrize(("first", "last"), [("50", "0"), ("0", "50"), ('"x"', "5"),
                                             ("5", '"x"')])
def test_of_duplicate_floor_keys_the_last_one_wins(first: str, last: str) -> None:
    body = json.dumps(_file_body(low_priority_floor="@1"))
    text = body.replace('"low_priority_floor": "@1"',
                        f'"low_priority_floor": {first}, "low_priority_floor": {last}')
    assert text.count("low_priority_floor") == 2
    if last.startswith('"'):
        with pytest.raises(RecordError):
            PodShares.decode(text)
    else:
        assert PodShares.decode(text).low_priority_floor == int(last)


def test_older_files_read_as_zero_and_the_container_config_too() -> None:
    text = json.dumps(_file_body(low_priority_floor=KeyError))
    assert "low_priority_floor" not in text
    assert PodShares.decode(text).low_priority_floor == 0
    config = json.loads(RecordConfig("n", "p", "u", "c", "low", "strict", False, "/r").encode())
    del config["low_priority_floor"]
    assert RecordConfig.decode(json.dumps(config)).low_priority_floor == 0
    config["low_priority_floor"] = 10.0
    with pytest.raises(RecordError, match=r"config\.low_priority_floor"):
        RecordConfig.decode(json.dumps(config))


# --- the C parser ---------------------------------------------------------------------------
HARNESS = r"""
#include <stdio.h>
#include "egpu_config.h"
int main(void) {
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf, stdin);
    egpu_config c; char err[512];
    if (egpu_config_parse_json(buf, n, &c, err, sizeof err)) { printf("err %s\n", err); return 0; }
    printf("ok %d\n", c.low_priority_floor);
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_parse(tmp_path_factory: pytest.TempPathFactory):
    if not shutil.which("cc"):
        pytest.fail("no C compiler (README: gcc)")
    d = tmp_path_factory.mktemp("cparse")
    (d / "h.c").write_text(HARNESS)
    subprocess.run(["cc", "-O1", f"-I{ROOT / 'libinterpose' / 'include'}", str(d / "h.c"),
                    str(ROOT / "libinterpose" / "src" / "config.c"), "-lm", "-o", str(d / "h")],
                   check=True, capture_output=True)

    def parse(text: str) -> str:
        return subprocess.run([str(d / "h")], input=text, capture_output=True, text=True,
                              check=True).stdout.strip()

    return parse


def _config_text(literal: str | None) -> str:
    body = json.loads(RecordConfig("n", "p", "u", "c", "low", "strict", False, "/r/region")
                      .encode())
    body["cards"] = [{"uuid": "GPU-a", "memory_mib": 1, "cores": 0, "card_region": "/r/c"}]
    if literal is None:
        del body["low_priority_floor"]
        return json.dumps(body)
    body["low_priority_floor"] = "@@"
    return json.dumps(body).replace('"@@"', literal)


@pytest.mark.parametrize("floor", [0, 1, 50, 100])
def test_c_reads_what_the_hook_writes(c_parse, floor: int) -> None:
    from egpu.records import ConfigCard

    text = RecordConfig("n", "p", "u", "c", "low", "strict", False, "/r/region",
                        (ConfigCard("GPU-a", 1, 0, "/r/c"),), floor).encode()
    assert text == RecordConfig.decode(text).encode()  # read back, byte for byte
    assert c_parse(text) == f"ok {floor}"


def test_c_agrees_on_absent_integers_ranges_types_and_duplicates(c_parse) -> None:
    assert c_parse(_config_text(None)) == "ok -1"  # absent: the file does not say
    for literal, value in ACCEPTED.items():
        assert c_parse(_config_text(literal)) == f"ok {value}", literal
    for literal in ["101", "-1", "1e400", "-1e400", "100000000000000000000", '"10"', "true",
                    "null", "[10]", '{"v": 10}', "100.5"]:
        out = c_parse(_config_text(literal))
        assert out.startswith("err") and "low_priority_floor" in out, (literal, out)
    for literal in ["NaN", "Infinity", "1" * 80]:  # not JSON for C: refused as malformed
        assert c_parse(_config_text(literal)).startswith("err config: malformed JSON")
    # Held, and harmless: C takes an integral float (as for cores and memory_mib) where the
    # Python decoder refuses it; only the hook writes the file, always as an integer.
    for literal in ["10.0", "1e1", "1E1"]:
        assert c_parse(_config_text(literal)) == "ok 10"
    twice = _config_text("50").replace('"low_priority_floor": 50',
                                       '"low_priority_floor": 50, "low_priority_floor": 0')
    assert c_parse(twice) == "ok 0"  # last one wins, as in Python


# --- libinterpose: the node's file wins over the pod's environment ------------------------
def _unshare_ok() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.parametrize(("node_floor", "want"), [(7, 7), (None, 0)], ids=["7", "absent"])
def test_the_node_file_floor_wins_over_the_pods_env_and_config_path(
        tmp_path: Path, node_floor: int | None, want: int) -> None:
    """/run/egpu/config.json (in a private mount namespace) holds the floor; the pod sets
    EGPU_LOW_PRIORITY_FLOOR=90 and EGPU_CONFIG_PATH to a file with 90: the card region's slot
    (what the gate reads) holds the node's value."""
    from tests.compute import cardregion
    from tests.compute.conftest import LIB, Node

    assert _unshare_ok(), "needs a private mount namespace: run `make test` as root (README)"
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)
    node = Node(tmp_path)
    env = node.env("lo", [0], priority="low", low_priority_floor=90,
                   EGPU_LOW_PRIORITY_FLOOR=90)
    cfg = json.loads(Path(env["EGPU_CONFIG_PATH"]).read_text())
    del cfg["low_priority_floor"]
    if node_floor is not None:
        cfg["low_priority_floor"] = node_floor
    (tmp_path / "node.json").write_text(json.dumps(cfg))
    script = (f"mount -t tmpfs tmpfs /run && mkdir /run/egpu && "
              f"cp {tmp_path / 'node.json'} /run/egpu/config.json && exec \"$@\"")
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                          str(LIB / "cuprobe"), "init", "ctx", "hold"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_hold(p, every_ok=True)
        _, shares = cardregion.read(node.region(0))
        assert [(s.pids, s.raw["floor_pct"]) for s in shares] == [([p.pid], want)]
    finally:
        p.kill()
        p.wait()


# --- the node agent after a change of lowPriorityFloorPercent -----------------------------
def test_a_changed_floor_does_not_blame_the_pods_annotation(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dirs = (str(tmp_path / "private"), str(tmp_path / "run"))
    assert PodRegistry("n1", Config(), *dirs).update(_k8s_pod()) is not None
    restarted = PodRegistry("n1", Config(low_priority_floor_percent=10), *dirs)
    with caplog.at_level(logging.WARNING, logger="node_agent.pods"):
        shares = restarted.update(_k8s_pod())
    assert shares is not None and shares.low_priority_floor == 0  # the file is kept: fine
    assert not [r for r in caplog.records if "annotation" in r.getMessage()], caplog.text
