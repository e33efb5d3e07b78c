"""Every driver function the fake defines is reachable through its cuGetProcAddress (issue 25).

NVIDIA's bindings (cuda-bindings) and the CUDA runtime never call the exported names: they ask
cuGetProcAddress for each. A function the fake defines but its table (fakegpu/procs.def,
made by gen_procs.py) does not name is one no such client can call: cuCtxDestroy was one.
"""

from __future__ import annotations

import re
from pathlib import Path

FAKE = Path(__file__).resolve().parents[2] / "fakegpu"
ENTRY = re.compile(r"^P\(\s*([^,]+),\s*\d+,\s*([^,]+),\s*([^)]+)\)", re.M)
# the lookup itself, and the table a runtime reads privately
NOT_LOOKED_UP = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"}


def test_every_function_the_fake_defines_is_in_its_proc_table() -> None:
    defined = set(re.findall(r"FG_EXPORT CUresult (cu\w+)\(", (FAKE / "src" / "fake_cuda.c")
                             .read_text()))
    table = {sym.strip() for entry in ENTRY.findall((FAKE / "procs.def").read_text())
             for sym in entry[1:]}
    assert defined - NOT_LOOKED_UP - table == set()
