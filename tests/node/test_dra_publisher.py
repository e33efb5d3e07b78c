"""The node agent's ResourceSlices (node_agent/dra.py, ``egpu-node-agent --dra``): what the
agent publishes for its cards through the API edge. The devices themselves are tested in
tests/unit/test_dra_slices.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from egpu.config import Config
from egpu.dra.slices import CAPACITY_SHARES, ResourceSlice
from node_agent.dra import DraPublisher
from tests.dra_objects import CARDS, NODE


class FakeStore:
    """``egpu.dra.slices.SliceStore`` in memory."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.slices.values() if s["spec"]["nodeName"] == node]

    def create_slice(self, body: ResourceSlice) -> None:
        self.slices[body["metadata"]["name"]] = dict(body)

    def update_slice(self, body: ResourceSlice) -> None:
        self.slices[body["metadata"]["name"]] = dict(body)

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)


class FakeCoreV1:
    """What DraPublisher reads of the CoreV1Api: the Node's UID."""

    api_client = object()

    def read_node(self, name: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-of-{name}"))


def publisher(**kwargs: Any) -> tuple[DraPublisher, FakeStore]:
    out = DraPublisher(FakeCoreV1(), NODE, **kwargs)
    store = FakeStore()
    out.store = store  # type: ignore[assignment]
    return out, store


def published_shares(store: FakeStore) -> list[str]:
    return [d["capacity"][CAPACITY_SHARES]["value"]
            for s in store.slices.values() for d in s["spec"]["devices"]]


def test_each_card_takes_as_many_shares_as_the_configs_shares_per_card() -> None:
    """Bug caught: the agent published memory and cores alone, and the kube-scheduler put more
    claims on a card than its roster holds (the 33rd container never started)."""
    agent, store = publisher(shares_per_card=Config(shares_per_card=4).shares_per_card)
    done = agent.publish(CARDS)
    assert done.generation == 1 and len(done.create) == 1
    assert published_shares(store) == ["4", "4"]
    assert not agent.publish(CARDS).changed


def test_a_publisher_needs_its_shares_per_card() -> None:
    """No default: a wiring that forgot the config's value fails at once (the roster's 32 was
    the default, and a forgotten argument published 32 shares a card unnoticed)."""
    with pytest.raises(TypeError, match="shares_per_card"):
        DraPublisher(FakeCoreV1(), NODE)  # type: ignore[call-arg]


def test_the_agent_publishes_the_shares_per_card_of_its_config_file(
        tmp_path: Any, monkeypatch: Any) -> None:
    """Through node_agent.main's wiring (``egpu-node-agent --dra --config <file>``, one beat):
    a card's ``shares`` capacity is the config file's sharesPerCard (4, neither the config's
    default 10 nor the roster's 32). Bug caught: the agent's wiring not passing the config
    file's sharesPerCard to its DraPublisher (a dropped or wrong argument), so that every card
    offered another number of shares than the cluster's config says."""
    import signal

    from node_agent import discovery, dra, inventory
    from node_agent import main as agent_main

    config = tmp_path / "config.yaml"
    config.write_text("sharesPerCard: 4\n")
    assert Config().shares_per_card not in (4, 32)  # the file, not a default, decides
    store = FakeStore()
    handlers: dict[int, Any] = {}

    class Core(FakeCoreV1):
        def read_node(self, name: str) -> Any:  # one beat: stop as SIGTERM does
            handlers[signal.SIGTERM]()
            return super().read_node(name)

    class NoHealthWatch:
        def __init__(self, *_: Any) -> None: ...

        def start(self, stop: Any) -> None: ...

    monkeypatch.setattr(discovery, "discover", lambda: CARDS)
    monkeypatch.setattr(discovery, "with_driver_limits", lambda cards: cards)
    monkeypatch.setattr(discovery, "write_driver_limits", lambda *_: None)
    monkeypatch.setattr(agent_main, "_core_v1", lambda _: Core())
    monkeypatch.setattr(agent_main, "missing_card_nodes", lambda *_: {})
    monkeypatch.setattr(agent_main, "HealthWatcher", NoHealthWatch)
    monkeypatch.setattr(agent_main, "list_node_pods", lambda *_: lambda: [])
    monkeypatch.setattr(agent_main, "watch_pods", lambda *_: None)
    monkeypatch.setattr(inventory, "publish", lambda *_: None)
    monkeypatch.setattr(dra, "KubeSliceStore", lambda _: store)
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.__setitem__(sig, handler))
    status = agent_main.run([
        "--node-name", NODE, "--config", str(config), "--dra", "--no-device-plugin",
        "--cdi-spec-dir", "", "--metrics-port", "0", "--kubeconfig", "unused",
        "--private-dir", str(tmp_path / "private"), "--runtime-dir", str(tmp_path / "run"),
        "--dev-root", str(tmp_path / "dev"), "--heartbeat-seconds", "0"])
    assert status == 0
    assert published_shares(store) == ["4", "4"]
