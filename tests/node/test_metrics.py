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
    container_region_path,
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
    region = Path(container_region_path(folder, str(tmp_path)))
    region.parent.mkdir(parents=True)
    region.write_bytes(
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


def _scrape(tmp_path: Path, shares: dict) -> dict:
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("node-1", lambda: CARDS, lambda: shares,
                                            regions_under(str(tmp_path)),
                                            lambda u: None, lambda u: None)))
    return {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}


def test_a_share_reporting_another_card_or_a_limit_of_its_own_is_not_believed(
        tmp_path: Path) -> None:
    """The region file is the tenant's own. Bugs caught (found by review): its card UUIDs and
    limit were exported as written, so a share could report its use under a co-tenant's card
    (that card's sums wrong), hide over-cap use behind a 1 PiB limit, or invent a new UUID at
    every scrape (series without bound)."""
    from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

    folder = tmp_path / "containers" / "uid-a_main"
    folder.mkdir(parents=True)
    folder.joinpath("region").write_bytes(region_bytes([
        (UUIDS[0], 1 << 50, 5000 * MIB), (UUIDS[1], 1 << 50, 100 * MIB),
        ("GPU-rotating-0001", 1 << 50, 1 * MIB)]))
    shares = {"uid-a": PodShares("team", "a", "uid-a", "high", "strict", False, Allocation(
        (ContainerAllocation("main", False, (CardShare(UUIDS[0], 0, 3000, 25),)),)))}
    families = _scrape(tmp_path, shares)
    (limit,) = families[METRIC_CONTAINER_MEMORY_LIMIT].samples
    (used,) = families[METRIC_CONTAINER_MEMORY_USED].samples
    assert (limit.labels["UUID"], limit.value) == (UUIDS[0], 3000 * MIB)
    assert (used.labels["UUID"], used.value) == (UUIDS[0], 5000 * MIB)  # over its cap: seen


def test_an_unknown_folder_reports_only_the_nodes_cards(tmp_path: Path) -> None:
    folder = tmp_path / "containers" / "raw_batch"  # egpu run: no allocation to compare with
    folder.mkdir(parents=True)
    folder.joinpath("region").write_bytes(region_bytes([
        (UUIDS[1], 2048 * MIB, 100 * MIB), ("GPU-rotating-0002", 1 << 50, 1 * MIB)]))
    (limit,) = _scrape(tmp_path, {})[METRIC_CONTAINER_MEMORY_LIMIT].samples
    assert (limit.labels["UUID"], limit.value) == (UUIDS[1], 2048 * MIB)


def test_an_init_containers_share_is_booked_by_the_booking_rule(tmp_path: Path) -> None:
    """Bug caught (found by review): the card's booked figures summed every container, so a
    pod with an init container of 12000 MiB and an app container of 8000 MiB on one card
    read 20000 MiB booked where the extender books (and `egpu top` shows) 12000."""
    from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

    shares = {"uid-a": PodShares("team", "a", "uid-a", "high", "strict", False, Allocation((
        ContainerAllocation("warm", True, (CardShare(UUIDS[0], 0, 12000, 50),), kind="init"),
        ContainerAllocation("main", False, (CardShare(UUIDS[0], 0, 8000, 30),),
                            kind="container"))))}
    families = _scrape(tmp_path, shares)
    booked = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_MEMORY_BOOKED].samples}
    cores = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_CORES_BOOKED].samples}
    assert (booked[UUIDS[0]], cores[UUIDS[0]]) == (12000 * MIB, 50)


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


def test_the_agents_usage_window_is_served_and_read_back_by_advise(tmp_path: Path) -> None:
    """Issue 26: the agent samples its container series into its window, serves it at
    /usage-history on the metrics listener, and `kubectl egpu advise`'s decoder
    (egpu.usage_history.add_agent_window) reads it: samples, peak and a refusal of a share
    that appeared after the window began. Old samples leave the window. Bugs caught: the
    window served in a shape the decoder misreads (one decoder for Prometheus and the agent),
    a share's first refusals lost, a window that grows without bound."""
    import json
    import urllib.request

    from devcluster.net import free_port
    from egpu.advise import summarize
    from egpu.usage_history import add_agent_window
    from node_agent.metrics import http
    from node_agent.metrics.window import UsageWindow

    now = [1000.0]
    folder = tmp_path / "containers"
    shares = write_regions(str(tmp_path), 1, UUIDS)
    (region,) = folder.glob("*/region")
    region.unlink()  # no share yet at the first sample
    collector = EgpuCollector(Sources("node-1", lambda: CARDS, lambda: shares,
                                      regions_under(str(tmp_path)), lambda u: None,
                                      lambda u: None))
    window = UsageWindow(collector, window_s=60, step_s=15, clock=lambda: now[0])
    window.sample()
    for used, peak, refused in ((100, 100, 1), (300, 900, 1), (200, 900, 3), (50, 900, 3),
                                (60, 900, 3), (70, 900, 3)):
        now[0] += 15
        region.write_bytes(region_bytes([(UUIDS[0], 1024 * MIB, used * MIB, peak * MIB,
                                          refused)]))
        window.sample()
        if refused == 1 and used == 100:  # the share's first sample: refused once already
            first: dict = {}
            add_agent_window(first, window.document())
            (only,) = first.values()
            assert summarize([], refused=[[v for _, v in only.refused[UUIDS[0]]]]).refused == 1
    port = free_port()
    http.serve(port, lambda: True, host="127.0.0.1", usage_history=window.document)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/usage-history", timeout=10) as got:
        document = json.loads(got.read())
    history: dict = {}
    add_agent_window(history, document)
    ((key, container),) = history.items()
    assert key == ("team", "pod-0", "main")
    memory = container.memory[UUIDS[0]]
    assert [v for _, v in memory] == [300, 200, 50, 60, 70]  # 60 s window: the first left
    usage = summarize(memory, peaks_mib=[v for _, v in container.peak[UUIDS[0]]],
                      refused=[[v for _, v in container.refused[UUIDS[0]]]])
    # in the last 60 s: 1 -> 3 (the first refusal fell out of the window with its sample)
    assert (usage.peak_mib, usage.refused) == (900, 2)
