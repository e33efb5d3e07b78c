"""Every cuGetProcAddress call recorded from the CUDA 11.8, 12.9 and 13.0 runtimes resolves
to the right versioned entry point: through the fake driver alone, and through the
interposer (our hook where we interpose, the driver's own function everywhere else)."""

from __future__ import annotations

import pytest

from .conftest import DATA

TRACES = ["11.8", "12.9", "13.0"]


def rows_of(rig, trace, preload, tsv=None):
    path = tsv or DATA / f"cudart-{trace}-getprocaddress.tsv"
    out = rig.run("getproc_check", path, preload=preload, EGPU_MEMORY_LIMIT_MIB=1024).stdout
    rows = []
    for line in out.splitlines():
        name, ver, flags, rc, rc2, st, sym, lib, same, isnull = line.split("\t")
        rows.append(
            dict(
                name=name,
                ver=int(ver),
                flags=int(flags),
                rc=int(rc),
                rc2=int(rc2),
                st=int(st),
                sym=sym,
                lib=lib,
                same=same == "1",
                null=isnull == "null",
            )
        )
    return rows


@pytest.mark.parametrize("trace", TRACES)
def test_getprocaddress_trace_fake_alone(rig, trace):
    rows = rows_of(rig, trace, preload=False)
    assert len(rows) == len((DATA / f"cudart-{trace}-getprocaddress.tsv").read_text().splitlines())
    for r in rows:
        if r["name"] == "<empty>":  # the runtime probing that cuGetProcAddress exists
            assert r["rc"] == r["rc2"] == 500 and r["null"]
            continue
        assert r["rc"] == r["rc2"] == 0 and r["st"] == 0 and r["same"], r
        assert r["lib"] == "libcuda.so.1" and r["sym"].startswith(r["name"]), r
        if r["flags"] & 2 and r["sym"] != r["name"]:
            assert r["sym"].endswith(("_ptsz", "_ptds")) or r["sym"].startswith(
                "cuGraphInstantiate"
            ), r


def test_getprocaddress_known_versioned_names(rig):
    got = {
        (r["name"], r["ver"], r["flags"]): r["sym"]
        for t in TRACES
        for r in rows_of(rig, t, preload=False)
    }
    assert got[("cuMemAlloc", 3020, 0)] == "cuMemAlloc_v2"
    assert got[("cuGetProcAddress", 11030, 0)] == "cuGetProcAddress"
    assert got[("cuGetProcAddress", 12000, 0)] == "cuGetProcAddress_v2"
    assert got[("cuLaunchKernel", 7000, 2)] == "cuLaunchKernel_ptsz"
    assert got[("cuMemcpyHtoD", 7000, 2)] == "cuMemcpyHtoD_v2_ptds"
    assert got[("cuMemAllocAsync", 11020, 2)] == "cuMemAllocAsync_ptsz"
    assert got[("cuStreamGetCaptureInfo", 12030, 2)] == "cuStreamGetCaptureInfo_v3_ptsz"
    assert got[("cuCtxCreate", 3020, 0)] == "cuCtxCreate_v2"
    assert got[("cuDevicePrimaryCtxRelease", 7000, 0)] == "cuDevicePrimaryCtxRelease"
    assert got[("cuEventElapsedTime", 12080, 0)] == "cuEventElapsedTime_v2"


@pytest.mark.parametrize("trace", TRACES)
def test_getprocaddress_trace_through_interposer(rig, trace):
    alone = rows_of(rig, trace, preload=False)
    ours = rows_of(rig, trace, preload=True)
    hooked = 0
    for a, o in zip(alone, ours, strict=True):
        assert (a["rc"], a["rc2"], a["sym"]) == (o["rc"], o["rc2"], o["sym"]), (a, o)
        if a["name"] == "<empty>":
            continue
        assert not o["null"] and o["same"]
        if o["lib"] == "libegpu_interpose.so":
            hooked += 1
        else:
            assert o["lib"] == "libcuda.so.1", o
    assert hooked >= 15
    by = {(o["name"], o["ver"], o["flags"]): o["lib"] for o in ours}
    assert by[("cuMemAlloc", 3020, 0)] == "libegpu_interpose.so"
    assert by[("cuGetProcAddress", 11030, 0)] == "libegpu_interpose.so"
    # issue 8: launches go through the compute gate
    assert by[("cuLaunchKernel", 4000, 0)] == "libegpu_interpose.so"
    assert by[("cuMemcpyHtoD", 3020, 0)] == "libcuda.so.1"


@pytest.mark.parametrize("preload", [False, True])
def test_getprocaddress_not_found(rig, tmp_path, preload):
    tsv = tmp_path / "odd.tsv"
    tsv.write_text("cuNoSuchFunction\t12000\t0\ncuMemCreate\t9000\t0\ncuMemCreate\t10020\t0\n")
    unknown, too_old, ok = rows_of(rig, None, preload, tsv=tsv)
    assert unknown["rc"] == unknown["rc2"] == 500 and unknown["null"] and unknown["st"] == 1
    assert too_old["rc"] == too_old["rc2"] == 500 and too_old["null"] and too_old["st"] == 2
    assert ok["rc"] == 0 and ok["sym"] == "cuMemCreate"
