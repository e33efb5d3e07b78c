"""The real node's configuration files and the fake GPU's container toolkit (pure parts)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import yaml

from devcluster import fake_toolkit, realnode

CARDS = (
    ("GPU-a", "NVIDIA H100 80GB HBM3", 81559, 0),
    ("GPU-b", "NVIDIA A100-SXM4-80GB", 81920, 1),
)


def test_node_addresses_come_from_the_benchmark_range_never_private_ones() -> None:
    for index in range(4):
        assert realnode.node_ip(index).startswith("198.18.0.")
        assert realnode.pod_cidr(index).startswith(f"198.18.{16 + index}.")
    assert realnode.HOST_LINK_IP == "198.18.0.1"


def test_containerd_config_is_version_3_with_cdi_dirs_and_both_egpu_routes() -> None:
    config = tomllib.loads(realnode.containerd_config(Path("/n"), "egpu.local/pause:3.10"))
    assert config["version"] == 3
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert "enable_cdi" not in runtime  # an unknown key in containerd 2.x: CDI is always on
    assert runtime["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert runtime["restrict_oom_score_adj"] is True
    runtimes = runtime["containerd"]["runtimes"]
    assert runtime["containerd"]["default_runtime_name"] == "nvidia"
    assert runtimes["nvidia"]["options"]["BinaryName"].endswith("nvidia-container-runtime")
    assert runtimes["egpu-hook"]["base_runtime_spec"].endswith("egpu-base-spec.json")
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "egpu.local/pause:3.10"


def test_kubelet_config_names_this_machines_settings() -> None:
    config = yaml.safe_load(realnode.kubelet_config("egpu-real-0", 0, Path("/pki/ca.crt")))
    assert config["kind"] == "KubeletConfiguration"
    assert config["failCgroupV1"] is False and config["failSwapOn"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/egpu-node-0-egpu-real-0/pods"
    assert config["address"] == "198.18.0.10"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"]["enabled"] is False


def test_cni_conflist_routes_the_nodes_pod_range_without_masquerade() -> None:
    conf = json.loads(realnode.cni_conflist(2))
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "198.18.18.0/24"}]]


def test_kube_proxy_config_leaves_machine_wide_conntrack_alone() -> None:
    config = yaml.safe_load(realnode.kube_proxy_config("n", Path("/k")))
    assert config["mode"] == "nftables"
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["clusterCIDR"] == realnode.CLUSTER_POD_CIDR


def test_toolkit_gives_a_container_only_its_visible_cards(tmp_path: Path) -> None:
    ini = realnode.cards_ini(CARDS)
    assert fake_toolkit.visible_cards_ini(ini, "GPU-b").count("[card]") == 1
    assert "GPU-b" in fake_toolkit.visible_cards_ini(ini, "GPU-b")
    assert fake_toolkit.visible_cards_ini(ini, "all").count("[card]") == 2
    assert "GPU-a" in fake_toolkit.visible_cards_ini(ini, "0")
    assert fake_toolkit.visible_cards_ini(ini, "GPU-zzz") == ""


def test_toolkit_adds_the_fake_driver_only_when_cards_are_asked_for(tmp_path: Path) -> None:
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "cards.ini").write_text(realnode.cards_ini(CARDS))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for value in ("", "void", "none"):
        spec = {"process": {"env": [f"NVIDIA_VISIBLE_DEVICES={value}"]}, "mounts": []}
        assert fake_toolkit.edit_spec(spec, driver, bundle) is False
        assert spec["mounts"] == []
    spec = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a"]}, "mounts": []}
    assert fake_toolkit.edit_spec(spec, driver, bundle) is True
    targets = {m["destination"] for m in spec["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in targets
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in targets
    assert fake_toolkit.CARDS_IN_CONTAINER in targets
    assert "FAKEGPU_CONFIG=/etc/fakegpu/cards.ini" in spec["process"]["env"]
    assert "GPU-b" not in (bundle / "fakegpu-cards.ini").read_text()


def test_toolkit_finds_the_bundle_of_a_runc_create_command_line() -> None:
    args = ["--root", "/r", "create", "--bundle", "/b/x", "--pid-file", "/p", "id"]
    assert fake_toolkit.bundle_of(args) == Path("/b/x")
    assert fake_toolkit.bundle_of(["create", "-b=/y", "id"]) == Path("/y")


def test_guard_drops_every_destination_outside_loopback_and_the_benchmark_range() -> None:
    rules = realnode.guard_ruleset()
    assert "ip daddr != { 127.0.0.0/8, 198.18.0.0/15 } reject" in rules
    assert rules.count("reject") + rules.count("drop") >= 3
