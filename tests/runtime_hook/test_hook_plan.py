"""runtime_hook.plan: which containers get a share, which are refused, which pass untouched."""

from __future__ import annotations

from egpu.contract import (
    ENV_ALLOCATION_ERROR,
    ENV_CONTAINER,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_POD_UID,
)
from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares
from runtime_hook.plan import Apply, Inputs, Refuse, Skip, decide, identify, preload_text

U0, U1 = "GPU-aaaa", "GPU-bbbb"
ANN = {"io.kubernetes.cri.sandbox-uid": "uid-a", "io.kubernetes.cri.container-name": "main",
       "io.kubernetes.cri.sandbox-name": "pa", "io.kubernetes.cri.sandbox-namespace": "ns"}


def shares(*cards: str, container: str = "main", uid: str = "uid-a") -> PodShares:
    entry = ContainerAllocation(container, False, tuple(
        CardShare(u, i, 4096, 30) for i, u in enumerate(cards)))
    return PodShares("ns", "pa", uid, "high", "strict", False,
                     Allocation(containers=(entry,), node="n1"))


def test_named_container_with_matching_devices_gets_its_config() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": f"{U1},{U0}", ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0, U1)))
    assert isinstance(result, Apply)
    assert result.dir_name == "uid-a_main"
    assert result.config is not None
    assert [c.uuid for c in result.config.cards] == [U0, U1]
    assert result.config.container_region == "/var/run/egpu/containers/uid-a_main/region"
    assert result.config.cards[0].card_region == f"/var/run/egpu/cards/{U0}"
    assert result.config.cards[0].memory_mib == 4096


def test_cri_o_annotations_name_the_container_too() -> None:
    ann = {"io.kubernetes.pod.uid": "uid-a", "io.kubernetes.container.name": "main"}
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0}, ann, shares(U0)))
    assert isinstance(result, Apply)


def test_wrong_cards_are_refused_never_another_share() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": U1, ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0)))
    assert isinstance(result, Refuse)
    assert "does not match its allocation" in result.message and U0 in result.message


def test_allocation_error_from_the_device_plugin_is_refused_with_its_message() -> None:
    env = {ENV_ALLOCATION_ERROR: "no pod bound waits for a share on cards X", ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0)))
    assert isinstance(result, Refuse) and "no pod bound waits" in result.message


def test_devices_without_any_identity_are_ambiguous_and_refused() -> None:
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x"}, {}))
    assert isinstance(result, Refuse) and "ambiguous" in result.message


def test_device_plugin_env_names_the_container_when_annotations_are_missing() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x", ENV_POD_UID: "uid-a",
           ENV_CONTAINER: "main"}
    assert identify(env, {}) == ("uid-a", "main")
    assert isinstance(decide(Inputs("c1", env, {}, shares(U0))), Apply)


def test_devices_but_no_allocation_file_is_refused() -> None:
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x"}, ANN, None))
    assert isinstance(result, Refuse) and "node-agent" in result.message


def test_container_without_share_is_untouched() -> None:
    assert isinstance(decide(Inputs("c1", {"PATH": "/bin"}, ANN, None)), Skip)
    other = {**ANN, "io.kubernetes.cri.container-name": "sidecar"}
    assert isinstance(decide(Inputs("c1", {}, other, shares(U0))), Skip)
    assert isinstance(decide(Inputs("c1", {}, {})), Skip)


def test_sandbox_is_untouched() -> None:
    ann = {**ANN, "io.kubernetes.cri.container-type": "sandbox"}
    assert isinstance(decide(Inputs("c1", {ENV_DEVICES: "x"}, ann, shares(U0))), Skip)


def test_unreadable_allocation_file_is_refused() -> None:
    result = decide(Inputs("c1", {}, ANN, None, "bad json"))
    assert isinstance(result, Refuse) and "bad json" in result.message


def test_raw_share_from_env_has_no_config_file() -> None:
    result = decide(Inputs("abc", {ENV_MEMORY_LIMIT_MIB: "1024"}, {}))
    assert isinstance(result, Apply) and result.config is None and result.dir_name == "abc_raw"


def test_pod_name_mismatch_is_refused() -> None:
    ann = {**ANN, "io.kubernetes.cri.sandbox-name": "other"}
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0}, ann, shares(U0)))
    assert isinstance(result, Refuse)


def test_preload_keeps_image_entries_and_adds_ours_once() -> None:
    ours = "/usr/lib/egpu/libegpu_interpose.so"
    assert preload_text(None) == f"{ours}\n".encode()
    text = preload_text(b"/lib/libfoo.so\n")
    assert text == f"/lib/libfoo.so\n{ours}\n".encode()
    assert preload_text(text) == text
