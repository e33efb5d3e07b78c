"""The interposer under NVIDIA's own driver bindings (issue 25): cuda-bindings 12.x and 13.x
(and cuda.core on 13.x),
each resolving every driver function through cuGetProcAddress with its own CUDA version, run
against the fake driver without and with the interposer (a 4096 MiB share).

What each case checks (tests/clients/driver_probe.py makes the calls):
- every call succeeds, except those that ask for more than is free: one MiB past cuMemAlloc of
  the free figure, a second stream-ordered allocation past half the free figure (the default
  pool and a custom pool), a cuMemCreate past it: CUDA_ERROR_OUT_OF_MEMORY;
- the views: cuMemGetInfo's and cuDeviceTotalMem's total, a created context's, and NVML's
  through the bindings' own module are the card's without the interposer and the share with
  it; a VMM allocation mapped in is charged its size; everything freed gives it all back.
The bug each would catch: a hook the bindings cannot reach (they never call the exported
names: a function missing from cuGetProcAddress's answers runs unhooked, or fails), a view
that shows the card, a path that allocates past the share.

Found by this tier when it was written: the fake driver's cuGetProcAddress did not know
cuCtxDestroy (no recorded runtime trace destroys a context), so the bindings' cuCtxDestroy
failed with "function cuCtxDestroy_v2 is not found".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed import clients

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "fakegpu" / "build"
INTERPOSER = REPO / "libinterpose" / "build" / "libegpu_interpose.so"
PROBE = Path(__file__).with_name("driver_probe.py")
CARD_MIB = 24576
SHARE_MIB = 4096
SUCCESS, OUT_OF_MEMORY = 0, 2
# the calls that ask for more than is free
OVER = ("alloc_one_more_mib", "async_default_pool_over", "async_custom_pool_over",
        "vmm_create_over")


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(REPO / d)], check=True, capture_output=True)


def probe(client: str, tmp: Path, share_mib: int, script: Path = PROBE,
          cores: int = 0, args: tuple[str, ...] = (), card_ini: str = "") -> dict[str, Any]:
    """``script``'s figures in client environment ``client`` (share 0: no interposer; ``cores``:
    the share's compute cap in %, 0 none; ``args``: after the share's MiB; ``card_ini``: more
    lines of the fake card's config section)."""
    ini = tmp / "fakegpu.ini"
    ini.write_text("[card]\nuuid = GPU-c1c1c1c1-0000-4000-8000-000000000000\n"
                   f"name = NVIDIA A10\nmemory_mib = {CARD_MIB}\n{card_ini}")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(FAKE), "FAKEGPU_CONFIG": str(ini),
           "FAKEGPU_STATE_DIR": str(tmp / "fakegpu"), "EGPU_RUNTIME_DIR": str(tmp / "egpu")}
    (tmp / "fakegpu").mkdir(exist_ok=True)
    if share_mib:
        env |= {"LD_PRELOAD": str(INTERPOSER), "EGPU_MEMORY_LIMIT_MIB": str(share_mib)}
    if cores:
        env["EGPU_CORES"] = str(cores)
    env["HOME"] = str(tmp)  # numba's caches
    proc = subprocess.run([str(clients.python(client)), str(script), str(share_mib), *args],
                          env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
@pytest.mark.parametrize("client", sorted(c for c in clients.CLIENTS
                                           if c.startswith("cuda-bindings")))
def test_nvidias_driver_bindings_see_and_get_the_share(client: str, share_mib: int,
                                                       tmp_path: Path) -> None:
    r = probe(client, tmp_path, share_mib)
    calls = {k: v for k, v in r.items()
             if isinstance(v, int) and not k.endswith("_mib") and k != "nvml_module"}
    wrong = {k: v for k, v in calls.items() if v != (OUT_OF_MEMORY if k in OVER else SUCCESS)}
    assert not wrong, (wrong, r)
    view = share_mib or CARD_MIB
    assert r["total_mib"] == r["device_total_mib"] == r["ctx_total_mib"] == view, r
    assert r["nvml_total_mib"] == view, r
    assert 0 < r["free_mib"] <= view, r
    assert r["free_after_free_mib"] == r["free_mib"] == r["free_end_mib"], r  # all given back
    assert r["vmm_charged_mib"] == r["vmm_size_mib"] > 0, r  # mapped memory is charged


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_cuda_core_buffers_stop_at_the_share_and_come_back_when_collected(
        share_mib: int, tmp_path: Path) -> None:
    """cuda.core (on cuda-bindings 13): its device memory resource, a stream-ordered pool,
    gives 1 GiB buffers until the share (or the card) is full, then refuses with the driver's
    OUT_OF_MEMORY; buffers freed by garbage collection are reused (as many again). Found by
    this test: the fake had no cuCtxGetStreamPriorityRange, and cuda.core could not make a
    stream."""
    r = probe("cuda-bindings-13", tmp_path, share_mib, Path(__file__).with_name("core_probe.py"))
    view = share_mib or CARD_MIB
    assert r["meminfo"] == SUCCESS and r["total_mib"] == view, r
    assert r["buffers"] == r["free_mib"] // 1024 == r["buffers_again"], r
    assert "ERROR CODE: 2" in str(r["refusal"]), r  # CUDA_ERROR_OUT_OF_MEMORY
