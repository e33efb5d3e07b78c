"""A context's limits that take device memory (cuCtxSetLimit) are charged against the share.

CUDA's programming guide: the device-side malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE, 8 MiB by
default) is allocated on the device in addition to cuMemAlloc memory, and each thread's stack
(CU_LIMIT_STACK_SIZE) is local memory reserved for every thread the device can hold resident.
The fake takes both from the card when the limit is set (fakegpu/src/fake_cuda.c).

Bug caught (review, MEDIUM): cuCtxSetLimit was not hooked, so a tenant on a 1024 MiB share set
a 2048 MiB heap (or a stack of several GiB) that the share never counted; the fake stubbed
cuCtxSetLimit as NOT_SUPPORTED, which hid it."""

from __future__ import annotations

import json

from .conftest import MIB, one

SHARE_MIB = 1024
CTX_MIB = 256  # EGPU_CONTEXT_OVERHEAD_MIB's default
HEAP_DEFAULT = 8 * MIB  # the driver's default malloc heap (the fake's too)
STACK_DEFAULT = 1024  # bytes a thread, the driver's default
RESIDENT_THREADS = 80 * 2048  # the fake card: SMs x resident threads a SM
CARD_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
CARD_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def _used(rows, step="nvml", nth=0):
    return one(rows, step, nth)["used"]


def test_a_malloc_heap_past_the_share_is_refused(rig):
    """A heap the share cannot hold answers CUDA_ERROR_OUT_OF_MEMORY (one of cuCtxSetLimit's
    documented codes) and leaves the limit as it was; a heap that fits is charged its growth
    over the default, lowering it gives that back, and so does the context going (destroy,
    or the primary context's reset)."""
    rows = rig.probe(
        "init", "ctx", "nvml",
        "setlimit", "heap", 2048 * MIB, "getlimit", "heap", "nvml",
        "setlimit", "heap", 512 * MIB, "getlimit", "heap", "nvml", "held",
        "alloc", 600,  # 256 + 504 + 600 > 1024: the heap's charge counts against the cap
        "setlimit", "heap", 8 * MIB, "nvml", "held",
        "setlimit", "heap", 512 * MIB, "ctx_destroy", "nvml", "held",
        "primary", "setlimit", "heap", 512 * MIB, "nvml", "primary_reset", "nvml", "held",
        EGPU_MEMORY_LIMIT_MIB=SHARE_MIB,
    )  # fmt: skip
    ctx = CTX_MIB * MIB
    assert one(rows, "setlimit", 0)["rc"] == 2, rows  # CUDA_ERROR_OUT_OF_MEMORY
    assert one(rows, "getlimit", 0)["value"] == HEAP_DEFAULT, rows  # unchanged
    assert _used(rows, "nvml", 1) == ctx, rows
    assert one(rows, "setlimit", 1)["rc"] == 0 and one(rows, "getlimit", 1)["value"] == 512 * MIB
    assert _used(rows, "nvml", 2) == ctx + 512 * MIB - HEAP_DEFAULT, rows
    assert one(rows, "held", 0)["used"] == 512 * MIB - HEAP_DEFAULT, rows  # the driver took it
    assert one(rows, "alloc")["rc"] == 2, rows
    assert _used(rows, "nvml", 3) == ctx, rows  # lowered: given back
    assert one(rows, "held", 1)["used"] == 0, rows
    assert _used(rows, "nvml", 4) == 0, rows  # the context went with its heap
    assert one(rows, "held", 2)["used"] == 0, rows
    assert _used(rows, "nvml", 5) == ctx + 512 * MIB - HEAP_DEFAULT, rows
    assert _used(rows, "nvml", 6) == ctx, rows  # reset: the heap is back to its default
    assert one(rows, "held", 3)["used"] == 0, rows


def test_a_stack_for_every_resident_thread_is_charged(rig):
    """CU_LIMIT_STACK_SIZE is charged its growth times the threads the device holds resident
    (SMs x threads a SM): a stack the share cannot hold is out of memory, one that fits is
    charged what the driver takes."""
    rows = rig.probe(
        "init", "ctx",
        "setlimit", "stack", 8192, "getlimit", "stack",
        "setlimit", "stack", 4096, "nvml", "held",
        "setlimit", "stack", STACK_DEFAULT, "nvml",
        EGPU_MEMORY_LIMIT_MIB=SHARE_MIB,
    )  # fmt: skip
    grown = (4096 - STACK_DEFAULT) * RESIDENT_THREADS  # 480 MiB
    assert one(rows, "setlimit", 0)["rc"] == 2, rows  # 1120 MiB more: past the share
    assert one(rows, "getlimit")["value"] == STACK_DEFAULT, rows
    assert one(rows, "setlimit", 1)["rc"] == 0, rows
    assert _used(rows, "nvml", 0) == CTX_MIB * MIB + grown, rows
    assert one(rows, "held")["used"] == grown, rows
    assert _used(rows, "nvml", 1) == CTX_MIB * MIB, rows


def test_a_stack_limit_asks_the_device_once_a_device(rig, tmp_path):
    """Setting the stack asks the device's SM count and resident threads a SM once for each
    device, not on every call (the fake driver's call counts): they never change for a
    device, so three stack limits on card 0 ask 2 attributes and card 1 asks its own 2. The
    hook asked 2 a call (12 here). The charge is as before."""
    rig.fake_config([(CARD_A, 24576), (CARD_B, 24576)])
    counts = tmp_path / "calls.jsonl"
    rows = rig.probe(
        "init", "ctx", 0,
        "setlimit", "stack", 2048, "setlimit", "stack", 4096, "setlimit", "stack", 3072, "held", 0,
        "ctx", 1, "setlimit", "stack", 2048, "setlimit", "stack", 4096, "setlimit", "stack", 3072,
        "held", 1,
        EGPU_MEMORY_LIMIT_MIB=SHARE_MIB, FAKEGPU_CALL_COUNTS=counts,
    )  # fmt: skip
    [calls] = [json.loads(line) for line in counts.read_text().splitlines()]
    assert all(r["rc"] == 0 for r in rows if r["step"] == "setlimit"), rows
    for card in (0, 1):
        assert one(rows, "held", card)["used"] == (3072 - STACK_DEFAULT) * RESIDENT_THREADS, rows
    assert calls["device_attribute"] == 2 * 2, calls  # 2 attributes x 2 devices, asked once
