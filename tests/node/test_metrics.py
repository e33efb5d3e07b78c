"""node_agent.metrics: the accounting-region reader and the Prometheus collector."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from node_fixtures import MIB, region_bytes, write_regions
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from egpu.contract import (
    METRIC_CARD_CORES_BOOKED,
    METRIC_CARD_MEMORY_BOOKED,
    METRIC_CARD_MEMORY_TOTAL,
    METRIC_CONTAINER_CORES_LIMIT,
    METRIC_CONTAINER_MEMORY_LIMIT,
    METRIC_CONTAINER_MEMORY_USED,
)
from egpu.records import Card
from node_agent.metrics.collector import EgpuCollector, Sources, regions_under
from node_agent.metrics.region import RegionError, parse_region, read_region, split_dir_name

UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"]
CARDS = (Card(UUIDS[0], 0, "NVIDIA A10", 24576), Card(UUIDS[1], 1, "NVIDIA A10", 24576))


def test_region_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "region"
    path.write_bytes(region_bytes([(UUIDS[0], 4096 * MIB, 100 * MIB), ("", 0, 0)]))
    usage = read_region(str(path))
    assert [(c.uuid, c.limit_bytes, c.used_bytes) for c in usage.cards] == \
        [(UUIDS[0], 4096 * MIB, 100 * MIB)]


def test_region_rejects_other_layouts() -> None:
    good = bytearray(region_bytes([]))
    with pytest.raises(RegionError):
        parse_region(bytes(good[:100]))
    bad = bytearray(good)
    bad[0] ^= 0xFF
    with pytest.raises(RegionError):
        parse_region(bytes(bad))
    bad = bytearray(good)
    bad[8] = 2  # version
    with pytest.raises(RegionError):
        parse_region(bytes(bad))


def test_dir_names_split_at_the_last_underscore() -> None:
    assert split_dir_name("0a-b_main") == ("0a-b", "main")
    assert split_dir_name("noname") == ("", "noname")


def scrape(tmp_path: Path, count: int) -> tuple[str, float]:
    shares = write_regions(str(tmp_path), count, UUIDS)
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("node-1", lambda: CARDS, lambda: shares,
                                            regions_under(str(tmp_path)),
                                            lambda u: 5 * MIB, lambda u: 42)))
    started = time.perf_counter()
    text = generate_latest(registry).decode()
    return text, (time.perf_counter() - started) * 1000


def test_scrape_with_100_containers(tmp_path: Path) -> None:
    text, _ = scrape(tmp_path, 100)  # how long it takes: bench/node.py's scrape_ms
    families = {f.name: f for f in text_string_to_metric_families(text)}
    limits = families[METRIC_CONTAINER_MEMORY_LIMIT].samples
    assert len(limits) == 100
    sample = next(s for s in families[METRIC_CONTAINER_MEMORY_USED].samples
                  if s.labels["pod"] == "pod-7")
    assert sample.value == 7 * MIB
    assert sample.labels == {"gpu": "1", "UUID": UUIDS[1], "modelName": "NVIDIA A10",
                             "Hostname": "node-1", "namespace": "team", "pod": "pod-7",
                             "container": "main"}
    assert len(families[METRIC_CONTAINER_CORES_LIMIT].samples) == 100
    booked = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_MEMORY_BOOKED].samples}
    assert booked == {UUIDS[0]: 50 * 1024 * MIB, UUIDS[1]: 50 * 1024 * MIB}
    cores = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_CORES_BOOKED].samples}
    assert cores == {UUIDS[0]: 500, UUIDS[1]: 500}
    assert families[METRIC_CARD_MEMORY_TOTAL].samples[0].value == 24576 * MIB


def test_a_claims_shared_folder_is_one_share_booked_once(tmp_path: Path) -> None:
    """Issue 24: two pods' containers draw on one claim's folder: one row (the namespace's;
    no pod or container would be right), and the card books the claim's 3000 MiB once, not
    per container (the bug: 6000 MiB booked on a 3000 MiB claim)."""
    from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

    folder = "claim-c1a1_gpu"
    (tmp_path / "containers" / folder).mkdir(parents=True)
    (tmp_path / "containers" / folder / "region").write_bytes(
        region_bytes([(UUIDS[0], 3000 * MIB, 2000 * MIB)]))
    card = (CardShare(UUIDS[0], 0, 3000, 25),)
    shares = {uid: PodShares("team", f"pod-{uid}", uid, "high", "strict", False, Allocation(
        (ContainerAllocation("main", False, card, share=folder),))) for uid in ("a", "b")}
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("node-1", lambda: CARDS, lambda: shares,
                                            regions_under(str(tmp_path)),
                                            lambda u: None, lambda u: None)))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    (used,) = families[METRIC_CONTAINER_MEMORY_USED].samples
    assert (used.labels["namespace"], used.labels["pod"], used.labels["container"],
            used.value) == ("team", "", "", 2000 * MIB)
    booked = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_MEMORY_BOOKED].samples}
    assert booked[UUIDS[0]] == 3000 * MIB
    cores = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_CORES_BOOKED].samples}
    assert cores[UUIDS[0]] == 25


def test_a_shares_peak_and_refused_allocations_are_exported_as_the_region_holds_them(
        tmp_path: Path) -> None:
    """Issue 26: right-sizing reads the share's peak (a gauge) and its refused allocations (a
    counter, ``_total``). Bugs caught: the families left out or under other names than
    egpu.contract's, the counter exported as a gauge (rate() and increase() in the rules
    need a counter), the peak taken from the used field."""
    from egpu.contract import METRIC_CONTAINER_MEMORY_PEAK, METRIC_CONTAINER_MEMORY_REFUSED

    shares = write_regions(str(tmp_path), 1, UUIDS)
    (folder,) = (tmp_path / "containers").iterdir()
    (folder / "region").write_bytes(region_bytes([(UUIDS[0], 1024 * MIB, 100 * MIB,
                                                   900 * MIB, 7)]))
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("node-1", lambda: CARDS, lambda: shares,
                                            regions_under(str(tmp_path)),
                                            lambda u: None, lambda u: None)))
    text = generate_latest(registry).decode()
    assert f"# TYPE {METRIC_CONTAINER_MEMORY_REFUSED} counter" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (peak,) = families[METRIC_CONTAINER_MEMORY_PEAK].samples
    (refused,) = families[METRIC_CONTAINER_MEMORY_REFUSED.removesuffix("_total")].samples
    assert (peak.value, refused.name, refused.value) == (
        900 * MIB, METRIC_CONTAINER_MEMORY_REFUSED, 7)
    assert peak.labels["pod"] == refused.labels["pod"] == "pod-0"
