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

- NCCL's NVLS probe: a card without NVSwitch says multicast is unsupported and
  cuMulticastCreate answers NOT_SUPPORTED, with and without the interposer, taking nothing
  (the bug: the name not found through cuGetProcAddress, which NCCL treats as a broken
  driver, or a multicast object charged: its memory is what each device binds to it, made
  with cuMemCreate and charged there).

Not yet here: NCCL's exported handles (a second process of the same share importing a
handle is charged again: each process's accounting holds what it maps; docs/interposer.md).
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
