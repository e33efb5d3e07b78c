"""Fixtures for the interposer tests: build the fake GPU and the interposer once, and run
the C probe programs under LD_PRELOAD against the fake driver (LD_LIBRARY_PATH)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from egpu.contract import container_region_path

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "fakegpu" / "build"
LIB = ROOT / "libinterpose" / "build"
INTERPOSER = LIB / "libegpu_interpose.so"
DATA = Path(os.environ.get("EGPU_SHARED_DATA", ROOT.parent / "shared" / "data"))
MIB = 1 << 20

# The start of the inline Python programs that build graphs with allocation nodes against the
# fake driver (run with _py in test_fakegpu.py): the driver, cuGraphAddMemAllocNode's
# CUDA_MEM_ALLOC_NODE_PARAMS as ctypes structures, params() to fill one for a device and
# free_mib() (cuMemGetInfo's free MiB). Indented as the program strings it starts.
GRAPH_ALLOC_PRELUDE = """
    import ctypes as C, json
    cuda = C.CDLL("libcuda.so.1")
    MIB = 1 << 20
    class Loc(C.Structure):
        _fields_ = [("type", C.c_int), ("id", C.c_int)]
    class PoolProps(C.Structure):
        _fields_ = [("allocType", C.c_int), ("handleTypes", C.c_int), ("location", Loc),
                    ("win32", C.c_void_p), ("maxSize", C.c_size_t), ("usage", C.c_ushort),
                    ("reserved", C.c_ubyte * 54)]
    class AllocParams(C.Structure):
        _fields_ = [("poolProps", PoolProps), ("accessDescs", C.c_void_p),
                    ("accessDescCount", C.c_size_t), ("bytesize", C.c_size_t),
                    ("dptr", C.c_uint64)]
    def params(nbytes, dev=0):
        p = AllocParams()
        p.poolProps.allocType, p.poolProps.location.type, p.poolProps.location.id = 1, 1, dev
        p.bytesize = nbytes
        return p
    def free_mib():
        f, t = C.c_size_t(), C.c_size_t()
        cuda.cuMemGetInfo_v2(C.byref(f), C.byref(t))
        return f.value // MIB
"""


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)


def parse(out: str) -> list[dict]:
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if not parts or "=" not in "".join(parts[1:2]):
            continue
        row: dict = {"step": parts[0]}
        for kv in parts[1:]:
            k, _, v = kv.partition("=")
            row[k] = int(v) if v.lstrip("-").isdigit() else v
        rows.append(row)
    return rows


@dataclass
class Rig:
    """One fake node: a fake GPU state dir, an egpu runtime dir, the env to run probes."""

    tmp: Path
    env: dict = field(default_factory=dict)

    def base_env(self, preload: bool = True, **extra: str) -> dict:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(FAKE),
            "FAKEGPU_STATE_DIR": str(self.tmp / "fakegpu"),
            "EGPU_RUNTIME_DIR": str(self.tmp / "egpu"),
        }
        if preload:
            env["LD_PRELOAD"] = str(INTERPOSER)
        env.update(self.env)
        env.update({k: str(v) for k, v in extra.items()})
        return {k: v for k, v in env.items() if v is not None and v != "__unset__"}

    def run(
        self,
        prog: str,
        *args: str,
        preload: bool = True,
        check_rc: bool = True,
        timeout: float = 60,
        **extra: str,
    ) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [str(LIB / prog), *map(str, args)],
            env=self.base_env(preload, **extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check_rc and p.returncode != 0:
            raise AssertionError(f"{prog} {args} rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def probe(self, *steps, preload: bool = True, **extra) -> list[dict]:
        return parse(self.run("cuprobe", *map(str, steps), preload=preload, **extra).stdout)

    def spawn(self, *steps, **extra) -> subprocess.Popen:
        return subprocess.Popen(
            [str(LIB / "cuprobe"), *map(str, steps)],
            env=self.base_env(True, **extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def fake_config(self, cards: list[tuple[str, int]]) -> Path:
        path = self.tmp / "fakegpu.ini"
        path.write_text(
            "".join(
                f"[card]\nuuid = {u}\nname = NVIDIA Fake GPU\nmemory_mib = {m}\n\n"
                for u, m in cards
            )
        )
        self.env["FAKEGPU_CONFIG"] = str(path)
        return path

    def egpu_config(self, cards: list[tuple[str, int]], **top) -> Path:
        path = self.tmp / "config.json"
        doc = {
            "version": 1,
            "namespace": "ns",
            "pod": "p",
            "pod_uid": "uid",
            "container": "c",
            "container_region": container_region_path("uid_c", str(self.tmp / "egpu")),
            "cards": [{"uuid": u, "memory_mib": m, "cores": 0} for u, m in cards],
            **top,
        }
        path.write_text(json.dumps(doc, indent=2))
        self.env["EGPU_CONFIG_PATH"] = str(path)
        return path


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path)
    r.env["EGPU_CONFIG_PATH"] = str(tmp_path / "no-config.json")  # never the node's real file
    return r


def one(rows: list[dict], step: str, nth: int = 0) -> dict:
    return [r for r in rows if r["step"] == step][nth]
