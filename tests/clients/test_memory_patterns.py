"""The memory patterns users report as broken in peers (issue 25), made with NVIDIA's driver
bindings (cuda-bindings 13; tests/clients/patterns_probe.py) against the fake driver without
and with the interposer (a 4096 MiB share).

- PyTorch's expandable segments: a 64 GiB virtual reservation is charged nothing (the bug:
  charging the reservation, which refuses it on any share, or lets a share reserve past its
  cap unnoticed); each mapped chunk is charged exactly its size; chunks stop at the share;
  releasing the segment's tail gives exactly that back; everything released gives all back.
- vLLM's startup profile: total is the share before and after the warm-up; the KV cache sized
  as 0.9 x total - used fits, and asking for what is left plus one MiB is OUT_OF_MEMORY (the
  bug: a total that shows the card makes vLLM size its KV cache for the card, and its first
  allocation fails or a co-tenant's does).

- CUDA graph memory nodes (cuMemAllocAsync in a stream capture, cuGraphAddMemAllocNode): a
  capture takes nothing; the graph's memory is charged once it is instantiated (the share books
  it then; the driver takes it at the launch) and kept across launches; a graph asking for more
  than is free is refused with OUT_OF_MEMORY (by the share at instantiation, by the driver at
  the launch) and takes nothing; destroying the executable graph gives it all back. The bugs:
  charging the capture's allocations as plain allocations (a share near its cap cannot
  capture; the charge is never given back, since the graph frees them), or never charging
  the graph (its launch takes the card past the share: vLLM's graphs after its KV cache).
  Also in vLLM's profile: graphs captured after the KV cache take what is left, never more.

- NCCL's NVLS buffers (multicast objects): a card without NVSwitch says multicast is
  unsupported and cuMulticastCreate answers NOT_SUPPORTED, with and without the interposer,
  taking nothing (the bug: the name not found through cuGetProcAddress, which NCCL treats as
  a broken driver). With NVSwitch the object itself takes nothing; the memory bound to it is
  charged at its cuMemCreate to the share that made it, and stays charged while bound, even
  after its handle is released, until the object goes (the bugs: the object charged as memory,
  which is then counted twice; or the bound memory given back at its handle's release while
  the binding keeps it alive on the card: a share's way past its cap).

- NCCL's buffers shared between processes (cuMemCreate for POSIX fd export, the fd passed
  over a socket): a process of the same share imports and maps it and is charged nothing more
  (the bug: charged twice, so that a 3000 MiB buffer on a 4096 MiB share cannot be mapped by
  its peer); the exporter letting go leaves it charged while the peer holds it (the bug: the
  memory alive and charged to nobody), and the peer's release gives it back. A process of
  another share is charged what it maps, on its own share (the bug: memory another share
  keeps alive for free).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.test_cuda_bindings import CARD_MIB, OUT_OF_MEMORY, SHARE_MIB, probe

SCRIPT = Path(__file__).with_name("patterns_probe.py")
CLIENT = "cuda-bindings-13"


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_expandable_segments_are_charged_by_what_is_mapped_never_by_the_reservation(
        share_mib: int, tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, share_mib, SCRIPT, args=("expandable",))
    chunk = r["chunk_mib"]
    assert r["free_after_reserve_mib"] == r["free_start_mib"], r  # the 64 GiB range: nothing
    assert r["steps_mib"] == [chunk], r  # each mapped chunk: exactly its size
    assert r["refusal"] == OUT_OF_MEMORY, r
    assert r["chunks"] == r["free_start_mib"] // chunk, r  # as many as fit, not one more
    assert r["free_full_mib"] < chunk, r
    assert r["free_shrunk_mib"] == r["free_full_mib"] + r["released"] * chunk, r
    assert r["free_regrown_mib"] == r["free_shrunk_mib"] - chunk, r
    assert r["free_end_mib"] == r["free_start_mib"], r
    assert r["free_start_mib"] <= (share_mib or CARD_MIB), r


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_vllms_startup_profile_sizes_its_kv_cache_within_the_share(
        share_mib: int, tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, share_mib, SCRIPT, args=("vllm",))
    view = share_mib or CARD_MIB
    assert r["total_mib"] == r["total_after_mib"] == view, r
    assert r["kv_alloc"] == 0 and r["kv_mib"] > 0, r
    # what is left is the 10% vLLM leaves, to the MiB (the KV cache was rounded down to one)
    assert r["budget_left_mib"] <= r["left_mib"] <= r["budget_left_mib"] + 1, r
    assert r["over_alloc"] == OUT_OF_MEMORY, r
    # the graphs captured after the KV cache: half of what was left, then no more than is left
    assert r["graph_launch"] == [None, 0], r
    assert r["left_after_graph_mib"] == r["left_mib"] - r["graph_mib"], r
    assert r["graph_over"] == ["launch" if not share_mib else "instantiate", OUT_OF_MEMORY], r
    assert r["free_end_mib"] == r["free_start_mib"], r


GRAPH_MIB = 256 + 128  # the capture's two allocation nodes (whole granules)


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_graph_memory_nodes_are_charged_while_the_executable_graph_lives(
        share_mib: int, tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, share_mib, SCRIPT, args=("graph",))
    start = r["free_start_mib"]
    assert start <= (share_mib or CARD_MIB), r
    assert r["launch"] == [None, 0], r
    assert r["free_launched_mib"] == start - GRAPH_MIB, r
    # trimmed while idle, the driver gives the graph's memory back until its next launch; the
    # share keeps its booking until the executable graph is destroyed
    assert r["free_trimmed_mib"] == (start - GRAPH_MIB if share_mib else start), r
    assert r["relaunch"] == 0 and r["free_relaunched_mib"] == start - GRAPH_MIB, r
    assert r["over"] == ["launch" if not share_mib else "instantiate", OUT_OF_MEMORY], r
    assert r["free_refused_mib"] == start - GRAPH_MIB, r
    assert r["free_end_mib"] == start, r


NOT_SUPPORTED = 801


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_multicast_is_unsupported_without_nvswitch_and_takes_nothing(
        share_mib: int, tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, share_mib, SCRIPT, args=("multicast",))
    assert (r["supported"], r["create"]) == (0, NOT_SUPPORTED), r
    assert r["free_end_mib"] == r["free_start_mib"], r


MULTICAST_MIB = 512  # patterns_probe.MULTICAST_MIB
INVALID_VALUE = 1


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_multicast_memory_is_the_bound_allocation_charged_to_its_maker_while_bound(
        share_mib: int, tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, share_mib, SCRIPT, args=("multicast",),
              card_ini="multicast = 1\n")
    start = r["free_start_mib"]
    assert (r["supported"], r["create"], r["bind_before_device"]) == (1, 0, INVALID_VALUE), r
    assert r["free_created_mib"] == start, r  # the object: nothing
    assert r["free_mem_mib"] == start - MULTICAST_MIB, r
    assert r["free_mapped_mib"] == start - MULTICAST_MIB, r  # its mapping: nothing more
    assert r["free_mem_released_mib"] == start - MULTICAST_MIB, r  # bound: still there
    assert r["free_end_mib"] == start, r


NCCL_MIB = 3000  # patterns_probe.NCCL_MIB
CONTEXT_MIB = 256  # the interposer's charge per context (EGPU_CONTEXT_OVERHEAD_MIB default)


def test_nccls_exported_buffer_is_charged_once_per_share_while_any_of_its_processes_holds_it(
        tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, SHARE_MIB, SCRIPT, args=("nccl",))
    start = r["free_start_mib"]
    created = start - NCCL_MIB
    assert r["free_created_mib"] == created, r
    other, same = r["other"], r["same"]
    # another share: its own 4096 MiB, charged what it maps
    assert (other["import"], other["map"], other["exit"]) == (0, 0, 0), r
    assert other["free_mapped_mib"] == other["free_before_mib"] - NCCL_MIB, r
    assert other["free_released_mib"] == other["free_before_mib"], r
    assert other["exporter_free_mib"] == created, r  # the exporter's share is not charged for it
    # the same share: one charge (the peer's context only), kept while the peer holds it
    assert (same["import"], same["map"], same["exit"]) == (0, 0, 0), r
    assert same["free_before_mib"] == created - CONTEXT_MIB, r
    assert same["free_mapped_mib"] == same["free_before_mib"], r
    assert r["exporter_let_go_free_mib"] == same["free_before_mib"], r
    assert same["free_exporter_gone_mib"] == same["free_before_mib"], r
    assert same["free_released_mib"] == same["free_before_mib"] + NCCL_MIB, r
    assert r["free_end_mib"] == start, r


def test_nccls_exported_buffer_works_without_the_interposer(tmp_path: Path) -> None:
    r = probe(CLIENT, tmp_path, 0, SCRIPT, args=("nccl",))
    for share in ("other", "same"):
        assert (r[share]["import"], r[share]["map"], r[share]["exit"]) == (0, 0, 0), r
    assert r["free_created_mib"] == r["free_start_mib"] - NCCL_MIB, r
    assert r["free_end_mib"] == r["free_start_mib"], r
