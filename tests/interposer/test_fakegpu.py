"""The fake GPU itself: the driver's error codes, CUDA_VISIBLE_DEVICES, the simulated timeline,
card-wide accounting across processes, NVML through pynvml, XID injection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from .conftest import FAKE, MIB, one


def test_errors_before_init_and_without_context(rig):
    rows = rig.probe(
        "alloc",
        1,
        "meminfo",
        "init",
        "meminfo",
        "alloc",
        1,
        "primary",
        "meminfo_null",
        preload=False,
    )
    assert [r["rc"] for r in rows] == [3, 3, 0, 201, 201, 0, 1]


def test_visible_devices_subset_and_reorder(rig):
    rig.fake_config(
        [
            ("GPU-aaaaaaaa-0000-0000-0000-000000000000", 1000),
            ("GPU-bbbbbbbb-0000-0000-0000-000000000000", 2000),
        ]
    )
    rows = rig.probe(
        "init", "totalmem", 0, "totalmem", 1, preload=False, CUDA_VISIBLE_DEVICES="1,0"
    )
    assert [r.get("total") for r in rows[1:]] == [2000 * MIB, 1000 * MIB]
    rows = rig.probe(
        "init",
        "totalmem",
        0,
        "totalmem",
        1,
        preload=False,
        CUDA_VISIBLE_DEVICES="GPU-bbbbbbbb-0000-0000-0000-000000000000",
    )
    assert [r["rc"] for r in rows] == [0, 0, 101]
    rows = rig.probe("init", preload=False, CUDA_VISIBLE_DEVICES="")
    assert rows[0]["rc"] == 100  # no device


def test_simulated_kernel_timeline(rig):
    rows = rig.probe(
        "init", "primary", "launch", 20, "ctxsync", preload=False, FAKEGPU_KERNEL_US=5000
    )
    assert 80_000 <= one(rows, "ctxsync")["waited_us"] <= 200_000


def test_card_memory_shared_between_processes(rig):
    p = rig.spawn("init", "primary", "alloc", 1000, "hold", LD_PRELOAD="")
    while not p.stdout.readline().startswith("hold"):
        pass
    try:
        rows = rig.probe("nvml", preload=False)
        assert one(rows, "nvml")["used"] == 1000 * MIB
    finally:
        p.kill()
        p.wait()
    assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 0  # dead pid reclaimed


def _py(rig, code, preload=False, **extra):
    env = rig.base_env(preload, **extra)
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


PYNVML = """
    import json, warnings
    warnings.simplefilter("ignore")
    import pynvml as N
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    m = N.nvmlDeviceGetMemoryInfo(h)
    name = N.nvmlDeviceGetName(h)
    uuid = N.nvmlDeviceGetUUID(h)
    out = dict(count=N.nvmlDeviceGetCount(), index=N.nvmlDeviceGetIndex(h), total=m.total,
               used=m.used, name=name.decode() if isinstance(name, bytes) else name,
               uuid=uuid.decode() if isinstance(uuid, bytes) else uuid)
    print(json.dumps(out))
"""


def test_pynvml_on_the_fake(rig):
    out = _py(rig, PYNVML)
    assert out == dict(
        count=1,
        index=0,
        total=24576 * MIB,
        used=0,
        name="NVIDIA Fake GPU",
        uuid="GPU-00000000-0000-0000-0000-000000000000",
    )


def test_pynvml_through_the_interposer(rig):
    out = _py(rig, PYNVML, preload=True, EGPU_MEMORY_LIMIT_MIB=4096)
    assert out["total"] == 4096 * MIB


def test_xid_event_injection(rig):
    code = """
        import json, os, threading, time, warnings
        warnings.simplefilter("ignore")
        import pynvml as N
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        s = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, s)
        def inject():
            time.sleep(0.1)
            with open(os.path.join(os.environ["FAKEGPU_STATE_DIR"], "xid"), "a") as f:
                f.write("GPU-00000000-0000-0000-0000-000000000000 79\\n")
        threading.Thread(target=inject).start()
        d = N.nvmlEventSetWait_v2(s, 5000)
        print(json.dumps(dict(xid=d.eventData, type=d.eventType)))
    """
    os.makedirs(rig.tmp / "fakegpu", exist_ok=True)
    assert _py(rig, code) == dict(xid=79, type=8)
    assert (FAKE / "libnvidia-ml.so.1").exists()
