"""NVML's process lists show a container only its own share's processes.

Bug caught (review, LOW-MEDIUM): nvmlDeviceGetComputeRunningProcesses (v1, _v2, _v3) and the
Graphics and MPS variants were not hooked: a co-tenant's process holding 3000 MiB showed, with
its pid and its memory, inside another tenant's container."""

from __future__ import annotations

from tests.probes import wait_for_hold

from .conftest import one

LISTS = ("compute", "compute_v2", "compute_v3", "graphics", "graphics_v2", "graphics_v3",
         "mps", "mps_v2", "mps_v3")  # fmt: skip


def test_nvml_lists_only_the_shares_own_processes(rig):
    """A co-tenant (another share's region) holds 3000 MiB and a peer of this share 100 MiB:
    each list shows this share's two processes and not the co-tenant, through dlsym and the
    exported names alike; a buffer too small for them answers NVML_ERROR_INSUFFICIENT_SIZE
    with the share's count, not the card's. Without the interposer the driver lists all
    three (the fake's figure)."""
    other = rig.spawn("init", "primary", "alloc", 3000, "hold", EGPU_MEMORY_LIMIT_MIB=4096,
                      EGPU_CONTAINER_REGION=str(rig.tmp / "other" / "region"))  # fmt: skip
    peer = rig.spawn("init", "primary", "alloc", 100, "hold", EGPU_MEMORY_LIMIT_MIB=4096)
    try:
        wait_for_hold(other)
        wait_for_hold(peer)
        steps = ["init", "primary", "alloc", 10]
        for name in LISTS:
            steps += ["procs", name, 0]
        for name, room in (("compute_v3", 1), ("compute", 0), ("compute_v2", 2)):
            steps += ["procs", name, 0, room]  # room for 1, for 0, for exactly the share's 2
        rows = rig.probe(*steps, EGPU_MEMORY_LIMIT_MIB=4096)
        raw = rig.probe("init", "primary", "alloc", 10, "procs", "compute_v3", 0, preload=False)
    finally:
        for p in (other, peer):
            p.kill()
            p.wait()
    assert str(other.pid) in str(one(raw, "procs")["pids"]).split(","), raw  # the driver sees it
    for k, name in enumerate(LISTS):
        row = one(rows, "procs", k)
        assert row["rc"] == 0, (name, row)
        if name.startswith("compute"):
            pids = str(row["pids"]).split(",")
            assert row["count"] == 2 and row["mine"] == 1 and str(peer.pid) in pids, (name, row)
            assert str(other.pid) not in pids, (name, row)
        else:  # the fake has no graphics clients and no MPS server
            assert row["count"] == 0, (name, row)
    for k in (9, 10):  # room for 1, then 0: the share's two, not the card's three
        assert one(rows, "procs", k)["rc"] == 7 and one(rows, "procs", k)["count"] == 2, rows
    assert one(rows, "procs", 11)["rc"] == 0 and one(rows, "procs", 11)["count"] == 2, rows
