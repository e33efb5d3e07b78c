"""The interposer under numba-cuda (issue 25): a kernel compiled to PTX on the host, linked by
nvJitLink and loaded through cuda.core (cuLibraryLoadData, cuLibraryGetKernel,
cuKernelGetFunction, cuFuncGetAttribute), launched under a compute cap, device arrays copied in
and out, numba's memory info, and device arrays allocated until OUT_OF_MEMORY; against the
fake driver without and with the interposer (a 4096 MiB, 30% share).

Found by this tier: the fake driver had no copies, no module or library loading and no
function attributes (numba stopped at its first cuMemcpyHtoD with NOT_SUPPORTED); it now
accepts them as docs/interposer.md says (it keeps no device bytes and runs no code).
The bugs these would catch: numba's view of the card instead of the share, arrays allocated
past the share, a launch path the gate does not let through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.test_cuda_bindings import CARD_MIB, OUT_OF_MEMORY, SHARE_MIB, probe

CHUNK_MIB = 256


@pytest.mark.parametrize("share_mib", [0, SHARE_MIB], ids=["no-interposer", "share-4096"])
def test_numba_kernels_run_and_its_arrays_stop_at_the_share(share_mib: int,
                                                             tmp_path: Path) -> None:
    r = probe("numba-cuda", tmp_path, share_mib, Path(__file__).with_name("numba_probe.py"),
              cores=30 if share_mib else 0)
    assert r["available"] and r["launched"] and r["copied_back"] == 1024, r
    view = share_mib or CARD_MIB
    assert r["total_mib"] == view and 0 < r["free_mib"] < view, r
    assert r["refusal"] == OUT_OF_MEMORY, r
    # every array that fits what was free, and not one more
    assert r["arrays"] == r["free_mib"] // CHUNK_MIB, r
