"""The hook table's own cuGetProcAddress lookup (egpu_hook_by_proc, used when the driver hands
back an address that is not one of its exported symbols) names the function cuda.h means at
every version: the bug it catches is cuGraphInstantiate at cudaVersion >= 12000 resolving to
the 5-argument cuGraphInstantiate_v2 hook while CUDA 12's cuGraphInstantiate is the 3-argument
cuGraphInstantiateWithFlags (the caller's flags were read as an error-node pointer)."""

from __future__ import annotations

import re
import subprocess

from .conftest import ROOT

PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
PER_THREAD_SINCE = 7000  # CUDA 7.0: the first per-thread default stream (_ptsz/_ptds PFNs)


def lookups(tmp_path, rows):
    """egpu_hook_by_proc for each (base, version, flags): the hooked name or '-'."""
    build = tmp_path / "build"  # fresh: the probe compiles hook_table.c in
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "libinterpose"), f"B={build}", f"{build}/hook_proc_check"],
        check=True,
        capture_output=True,
    )
    stdin = "".join(f"{b}\t{v}\t{f}\n" for b, v, f in rows)
    out = subprocess.run(
        [str(build / "hook_proc_check")], input=stdin, capture_output=True, text=True, check=True
    ).stdout
    return [line.split("\t")[3] for line in out.splitlines()]


def test_table_lookup_names_the_versioned_function_cuda_h_means(tmp_path):
    # procs.def: cuda.h's version breakpoints, P(base, version, symbol, per-thread symbol)
    procs = re.findall(
        r"^P\((\w+), (\d+), (\w+), (\w+)\)", (ROOT / "fakegpu/procs.def").read_text(), re.M
    )
    hooks = (ROOT / "libinterpose/include/egpu_hooks.h").read_text()
    hooked = set(re.findall(r"X\((\w+), \w+, \d+, [01],", hooks))
    rows, want = [], []
    for base, ver, sym, pt_sym in procs:
        for flags in (0, PER_THREAD):
            if flags and int(ver) < PER_THREAD_SINCE:
                continue  # procs.def gives the per-thread name from a base's first version
            rows.append((base, int(ver), flags))
            name = pt_sym if flags else sym
            want.append(name if name in hooked else "-")  # "-": the driver's own is kept
    got = lookups(tmp_path, rows)
    wrong = [(r, w, g) for r, w, g in zip(rows, want, got, strict=True) if w != g]
    assert not wrong, wrong
    by = dict(zip(rows, got, strict=True))
    assert by[("cuGraphInstantiate", 12000, 0)] == "cuGraphInstantiateWithFlags"
    assert by[("cuGraphInstantiate", 11000, 0)] == "cuGraphInstantiate_v2"
    assert by[("cuCtxCreate", 12050, 0)] == "cuCtxCreate_v4"
    assert lookups(tmp_path, [("cuGraphInstantiate", 13000, PER_THREAD)]) == [
        "cuGraphInstantiateWithFlags"
    ]
