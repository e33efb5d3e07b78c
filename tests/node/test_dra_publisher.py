"""The node agent's ResourceSlices (node_agent/dra.py, ``egpu-node-agent --dra``): what the
agent publishes for its cards through the API edge. The devices themselves are tested in
tests/unit/test_dra_slices.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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


def test_without_a_config_a_card_takes_what_its_roster_holds() -> None:
    agent, store = publisher()
    agent.publish(CARDS)
    assert published_shares(store) == ["32", "32"]
