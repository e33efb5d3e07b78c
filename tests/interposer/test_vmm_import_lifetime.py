"""An imported VMM allocation keeps its memory, and its charge, for as long as the import
lives. CUDA's cuMemRelease: the memory is freed only when every handle to it, imported and
shareable ones included, is released.

Bug caught (review, HIGH): an import whose descriptor matched no export of the container (a
second export of the allocation, another open file, or any import where kcmp is denied, as
under Docker's and containerd's default seccomp) was charged the 2 MiB granularity, and the
exporter's release gave the whole allocation back: 1000 MiB a round held on the card while
the share's free memory stayed full. The fake driver hid it: it freed the memory at the
exporter's release although an imported handle still held it."""

from __future__ import annotations

from .conftest import MIB, one

SHARE_MIB = 1024
ALLOC_MIB = 400


def test_an_unmatched_import_is_charged_its_whole_size_and_keeps_it_after_the_exporter_lets_go(rig):
    rows = rig.probe(
        "init", "ctx",
        "vmm", ALLOC_MIB, "dev", 0, "vmm_share_foreign", "meminfo",  # both hold it: charged to each
        "vmm_release_prev", "meminfo", "held",  # the creator lets go: the import keeps it all
        "vmm", ALLOC_MIB, "dev", 0, "vmm_share_foreign",  # 400 + 400 + 400 > 1024: refused
        "vmm_release", "vmm_release", "meminfo", "held",
        EGPU_MEMORY_LIMIT_MIB=SHARE_MIB, EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert one(rows, "vmm_share_foreign")["rc"] == 0, rows
    used = [r["used"] for r in rows if r["step"] == "meminfo"]
    assert used[:2] == [2 * ALLOC_MIB * MIB, ALLOC_MIB * MIB], rows
    assert one(rows, "held")["used"] == ALLOC_MIB * MIB, rows  # the driver still holds it
    assert one(rows, "vmm_share_foreign", 1)["rc"] == 2, rows  # CUDA_ERROR_OUT_OF_MEMORY
    assert used[2] == 0 and one(rows, "held", 1)["used"] == 0, rows


def test_repeated_export_import_release_rounds_cannot_hold_more_than_the_share(rig):
    """The reviewer's attack in one process: create, export, import another open file of it,
    release the creator; again. Before the fix each round left 1000 MiB held for 2 MiB."""
    rows = rig.probe(
        "init", "ctx",
        "loop", 4, "vmm", ALLOC_MIB, "dev", 0, "vmm_share_foreign", "vmm_release_prev", ";",
        "meminfo", "held",
        EGPU_MEMORY_LIMIT_MIB=SHARE_MIB, EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    held = one(rows, "held")["used"]
    # a loop prints only its failed steps: fewer refusals than rounds means an export and
    # import went through, and the rounds really held memory
    refused = [r for r in rows if r["step"] == "vmm_share_foreign" and r["rc"] != 0]
    assert len(refused) < 4 and held >= ALLOC_MIB * MIB, rows
    assert one(rows, "meminfo")["used"] == held, rows  # every held byte is charged
    assert held <= SHARE_MIB * MIB, rows


def test_fake_driver_keeps_imported_memory_after_the_exporter_releases(rig):
    """The fake, without the interposer, as the driver: the import holds the memory."""
    rows = rig.probe(
        "init", "ctx", "vmm", ALLOC_MIB, "dev", 0, "vmm_share_foreign", "vmm_release_prev", "held",
        "vmm_release", "held",
        preload=False,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert [r["used"] for r in rows if r["step"] == "held"] == [ALLOC_MIB * MIB, 0], rows
