"""CPU unit tests of the accounting and config (C), and a subset of the paths under
AddressSanitizer + UndefinedBehaviorSanitizer."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import LIB, ROOT, one

ASAN_LIB = ROOT / "libinterpose" / "build-asan"


def test_unit_accounting_and_config():
    p = subprocess.run([str(LIB / "unit_account")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ", 0 failures" in p.stdout


@pytest.fixture(scope="module")
def asan():
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "libinterpose"), "asan"], check=True, capture_output=True
    )
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    return libasan


def _asan_env(rig, libasan, **extra):
    return dict(
        LD_PRELOAD=f"{libasan} {ASAN_LIB / 'libegpu_interpose.so'}",
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1",
        **extra,
    )


def _run(rig, prog, libasan, *args, **extra):
    env = rig.base_env(True, **_asan_env(rig, libasan, **extra))
    p = subprocess.run(
        [str(ASAN_LIB / prog), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "runtime error" not in p.stderr and "AddressSanitizer" not in p.stderr, p.stderr
    return p.stdout


def test_asan_unit(asan):
    p = subprocess.run(
        [str(ASAN_LIB / "unit_account")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"ASAN_OPTIONS": "detect_leaks=0"},
    )
    assert p.returncode == 0 and "runtime error" not in p.stderr, p.stdout + p.stderr


def test_asan_paths(rig, asan):
    from .conftest import parse

    out = _run(
        rig,
        "cuprobe",
        asan,
        "init",
        "primary",
        "alloc",
        100,
        "pitch",
        1000,
        "1000",
        "managed",
        10,
        "async",
        10,
        "freeasync",
        "sync",
        "pool_create",
        "pool_alloc",
        10,
        "freeasync",
        "pool_destroy",
        "vmm",
        64,
        "dev",
        0,
        "vmm_map",
        "vmm_unmap",
        "vmm_release",
        "thread_vmm",
        64,
        0,
        "array",
        64,
        64,
        "array_destroy",
        "mipmap",
        64,
        64,
        3,
        "array_destroy",
        "ctx",
        "alloc",
        9000,
        "meminfo",
        "nvml",
        "nvml2",
        "freeall",
        EGPU_MEMORY_LIMIT_MIB=4096,
    )
    rows = parse(out)
    assert [r["step"] for r in rows if r["rc"] != 0] == ["alloc"]
    assert one(rows, "meminfo")["total"] == 4096 << 20


def test_asan_fc06_and_getproc(rig, asan):
    assert "ALL-OK" in _run(rig, "fc06_paths", asan, EGPU_MEMORY_LIMIT_MIB=1024)
    from .conftest import DATA

    out = _run(
        rig,
        "getproc_check",
        asan,
        DATA / "cudart-13.0-getprocaddress.tsv",
        EGPU_MEMORY_LIMIT_MIB=1024,
    )
    assert len(out.splitlines()) == 440


def test_asan_config_file(rig, asan):
    rig.egpu_config([("GPU-00000000-0000-0000-0000-000000000000", 2048)])
    rows = __import__("tests.interposer.conftest", fromlist=["parse"]).parse(
        _run(rig, "cuprobe", asan, "init", "primary", "alloc", 4096, "meminfo")
    )
    assert one(rows, "alloc")["rc"] == 2 and one(rows, "meminfo")["total"] == 2048 << 20


def test_asan_review_fixes(rig, asan, tmp_path):
    """The paths added for the review findings (F4 VMM handles/mappings, F7 pool race, F9
    context destroy and array overflow, F5 region files) under ASan + UBSan."""
    from .conftest import parse

    rows = parse(
        _run(
            rig,
            "cuprobe",
            asan,
            "init",
            "ctx",
            "vmm",
            64,
            "dev",
            0,
            "vmm_map",
            "vmm_retain",
            "vmm_release",
            "vmm_release",
            "vmm_unmap",
            "vmm",
            64,
            "dev",
            0,
            "vmm_share",
            "vmm_map_part",
            32,
            "vmm_unmap",
            "vmm_release",
            "vmm_release",
            "alloc",
            64,
            "array",
            64,
            64,
            "array3d",
            1 << 20,
            1 << 20,
            1 << 20,
            4,
            "ctx_destroy",
            "primary",
            "meminfo",
            EGPU_MEMORY_LIMIT_MIB=4096,
            EGPU_CONTEXT_OVERHEAD_MIB=0,
        )
    )
    assert [r["step"] for r in rows if r["rc"] != 0] == ["array3d"], rows
    assert one(rows, "meminfo")["used"] == 0
    out = _run(
        rig, "pool_race", asan, 50, EGPU_MEMORY_LIMIT_MIB=1536, FAKEGPU_POOL_ALLOC_DELAY_US=200
    )
    assert "both=0" in out, out
    import os

    (tmp_path / "empty").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "short").write_bytes(b"\0" * 100)
    p = subprocess.run(
        [
            str(ASAN_LIB / "region_check"),
            "card",
            str(tmp_path / "cards" / "GPU-new"),
            "card",
            str(tmp_path / "empty"),
            "card",
            str(tmp_path / "fifo"),
            "card",
            str(tmp_path / "short"),
            "acct",
            str(tmp_path / "fifo"),
            "acct",
            str(tmp_path / "a" / "region"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"ASAN_OPTIONS": "detect_leaks=0"},
    )
    assert [r["rc"] for r in parse(p.stdout)] == [0, 1, 1, 1, 1, 0], p.stdout + p.stderr
    assert "runtime error" not in p.stderr and "AddressSanitizer" not in p.stderr, p.stderr
