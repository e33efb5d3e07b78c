"""The fake GPU itself: the driver's error codes, CUDA_VISIBLE_DEVICES, the simulated timeline,
card-wide accounting across processes, NVML through pynvml, XID injection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.probes import wait_for_hold

from .conftest import FAKE, GRAPH_ALLOC_PRELUDE, LIB, MIB, one


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
    wait_for_hold(p)
    try:
        rows = rig.probe("nvml", preload=False)
        assert one(rows, "nvml")["used"] == 1000 * MIB
    finally:
        p.kill()
        p.wait()
    assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 0  # dead pid reclaimed


def _hold_in_own_pid_namespace(rig, mib: int) -> subprocess.Popen:
    """A process holding ``mib`` MiB on card 0 as PID 1 of a PID namespace of its own, as a
    container's main process is (unshare: it dies with its unshare parent)."""
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", str(LIB / "cuprobe"), "init", "primary",
         "alloc", str(mib), "hold"],
        env=rig.base_env(False), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_hold(p)
    return p


def _kill_holder(unshare: subprocess.Popen) -> None:
    """SIGKILL the holder itself (unshare's child, PID 1 of its namespace) and wait until it
    is reaped: unshare --fork exits only after waiting for its child. (Killing unshare would
    leave the holder to die of --kill-child's signal some time after unshare is reaped: a
    probe in between still saw it alive; the lanes run of 13:24 did.)"""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
    assert len(children) == 1, children
    os.kill(int(children[0]), signal.SIGKILL)
    unshare.wait(timeout=60)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="PID namespaces need root")


@needs_root
def test_a_killed_pid_1_of_another_pid_namespace_gives_its_memory_back(rig):
    """Bug caught: the fake judged a process alive by kill(pid, 0) with the pid the process
    saw in its own namespace, so a container's killed PID 1 looked alive (the host's init)
    and its memory stayed charged for ever, where the driver frees it at once (bench/
    node_restarts.py read fake_leaked_mib=1744)."""
    holder = _hold_in_own_pid_namespace(rig, 1000)
    assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 1000 * MIB
    _kill_holder(holder)
    assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 0


@needs_root
def test_two_pid_1s_of_two_namespaces_keep_their_own_memory(rig):
    """Bug caught: processes found by pid shared one row when two containers' processes had
    the same pid, so one's death took the other's memory back (or kept its own)."""
    first = _hold_in_own_pid_namespace(rig, 1000)
    second = _hold_in_own_pid_namespace(rig, 3000)
    try:
        assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 4000 * MIB
        _kill_holder(first)
        assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 3000 * MIB
    finally:
        for holder in (first, second):
            if holder.poll() is None:
                _kill_holder(holder)
    assert one(rig.probe("nvml", preload=False), "nvml")["used"] == 0


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


MODULES_AND_COPIES = """
    import ctypes as C, json
    cuda = C.CDLL("libcuda.so.1")
    MIB = 1 << 20
    out = {"init": cuda.cuInit(0)}
    dev, ctx = C.c_int(), C.c_void_p()
    cuda.cuDeviceGet(C.byref(dev), 0)
    out["ctx"] = cuda.cuCtxCreate_v2(C.byref(ctx), 0, dev)
    p = C.c_uint64()
    cuda.cuMemAlloc_v2(C.byref(p), C.c_size_t(MIB))
    host = C.create_string_buffer(MIB + 1)
    d = C.c_uint64
    out["htod_inside"] = cuda.cuMemcpyHtoD_v2(d(p.value + 4096), host, C.c_size_t(MIB - 4096))
    out["htod_past_end"] = cuda.cuMemcpyHtoD_v2(p, host, C.c_size_t(MIB + 1))
    out["dtoh_unallocated"] = cuda.cuMemcpyDtoH_v2(host, d(p.value + 64 * MIB), C.c_size_t(1))
    out["dtod_async"] = cuda.cuMemcpyDtoDAsync_v2(p, p, C.c_size_t(16), None)
    out["memset_past_end"] = cuda.cuMemsetD8_v2(d(p.value + 1), C.c_ubyte(0), C.c_size_t(MIB))
    mod, f = C.c_void_p(), C.c_void_p()
    out["load_empty"] = cuda.cuModuleLoadData(C.byref(mod), b"\\0")
    out["load"] = cuda.cuModuleLoadData(C.byref(mod), b"// PTX\\n")
    out["function"] = cuda.cuModuleGetFunction(C.byref(f), mod, b"kernel")
    threads = C.c_int()
    out["attribute"] = cuda.cuFuncGetAttribute(C.byref(threads), 0, f)
    out["max_threads"] = threads.value
    out["launch"] = cuda.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, None, None, None)
    out["unload"] = cuda.cuModuleUnload(mod)
    out["function_after_unload"] = cuda.cuModuleGetFunction(C.byref(f), mod, b"kernel")
    lib, k, kf = C.c_void_p(), C.c_void_p(), C.c_void_p()
    out["library"] = cuda.cuLibraryLoadData(C.byref(lib), b"// PTX\\n", None, None, 0, None,
                                            None, 0)
    out["kernel"] = cuda.cuLibraryGetKernel(C.byref(k), lib, b"kernel")
    out["kernel_function"] = cuda.cuKernelGetFunction(C.byref(kf), k)
    out["module_handle_as_library"] = cuda.cuLibraryGetKernel(C.byref(k), mod, b"kernel")
    print(json.dumps(out))
"""


def test_modules_load_and_copies_check_their_device_ranges(rig):
    """Issue 25 (numba-cuda): the fake keeps no bytes and runs no code, but answers as the
    driver does: a copy or memset reaching past its allocation, or into none, is
    CUDA_ERROR_INVALID_VALUE (1); an empty image CUDA_ERROR_INVALID_IMAGE (200); a function
    of an unloaded module, or a module handle used as a library, CUDA_ERROR_INVALID_HANDLE
    (400). A fake that accepted any copy would hide a client's out-of-bounds transfer."""
    r = _py(rig, MODULES_AND_COPIES)
    assert r == {"init": 0, "ctx": 0, "htod_inside": 0, "htod_past_end": 1,
                 "dtoh_unallocated": 1, "dtod_async": 0, "memset_past_end": 1,
                 "load_empty": 200, "load": 0, "function": 0, "attribute": 0,
                 "max_threads": 1024, "launch": 0, "unload": 0,
                 "function_after_unload": 400, "library": 0, "kernel": 0,
                 "kernel_function": 0, "module_handle_as_library": 400}, r


GRAPH_MEMORY_NODES = GRAPH_ALLOC_PRELUDE + """
    def reserved():
        v = C.c_uint64()
        cuda.cuDeviceGetGraphMemAttribute(0, 2, C.byref(v))  # RESERVED_MEM_CURRENT
        return v.value // MIB
    out = {"init": cuda.cuInit(0)}
    ctx, s, g, e, n, n2 = (C.c_void_p() for _ in range(6))
    cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    cuda.cuStreamCreate(C.byref(s), 0)
    plain = C.c_uint64()
    cuda.cuMemAlloc_v2(C.byref(plain), C.c_size_t(MIB))
    cuda.cuStreamBeginCapture_v2(s, 0)
    a = C.c_uint64()
    out["captured_alloc"] = cuda.cuMemAllocAsync(C.byref(a), C.c_size_t(3 * MIB), s)
    f = C.c_void_p(1)
    out["launch"] = cuda.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, None, None)
    out["captured_free_of_plain"] = cuda.cuMemFreeAsync(plain, s)
    out["captured_free"] = cuda.cuMemFreeAsync(a, s)
    out["captured_free_again"] = cuda.cuMemFreeAsync(a, s)
    out["end"] = cuda.cuStreamEndCapture(s, C.byref(g))
    count = C.c_size_t(0)
    cuda.cuGraphGetNodes(g, None, C.byref(count))
    out["nodes"] = count.value
    nodes = (C.c_void_p * 5)()
    count = C.c_size_t(5)
    cuda.cuGraphGetNodes(g, nodes, C.byref(count))
    types = []
    for i in range(3):
        t = C.c_int()
        cuda.cuGraphNodeGetType(C.c_void_p(nodes[i]), C.byref(t))
        types.append(t.value)
    out["types"], out["past_last"] = types, [nodes[3], nodes[4]]
    got = AllocParams()
    out["get_params"] = cuda.cuGraphMemAllocNodeGetParams(C.c_void_p(nodes[0]), C.byref(got))
    out["same_node"] = [got.bytesize == 3 * MIB, got.dptr == a.value]
    free_node = C.c_void_p(nodes[2])
    out["params_of_free_node"] = cuda.cuGraphMemAllocNodeGetParams(free_node, C.byref(got))
    out["zero_bytes"] = cuda.cuGraphAddMemAllocNode(C.byref(n), g, None, 0, C.byref(params(0)))
    out["bad_device"] = cuda.cuGraphAddMemAllocNode(C.byref(n), g, None, 0, C.byref(params(MIB, 7)))
    out["free_node_unknown"] = cuda.cuGraphAddMemFreeNode(C.byref(n2), g, None, 0, plain)
    out["reserved_before"] = reserved()
    out["instantiate"] = cuda.cuGraphInstantiateWithFlags(C.byref(e), g, C.c_ulonglong(0))
    out["reserved_instantiated"] = reserved()
    out["graph_launch"] = cuda.cuGraphLaunch(e, s)
    out["reserved_launched"] = reserved()  # 3 MiB: a whole 2 MiB granule more
    cuda.cuStreamSynchronize(s)
    out["trim"] = cuda.cuDeviceGraphMemTrim(0)
    out["reserved_trimmed"] = reserved()
    cuda.cuGraphLaunch(e, s)
    out["reserved_relaunched"] = reserved()
    out["exec_destroy"] = cuda.cuGraphExecDestroy(e)
    out["reserved_end"] = reserved()
    print(json.dumps(out))
"""


def test_graph_memory_nodes_take_memory_at_launch_and_give_it_back_when_trimmed_or_destroyed(rig):
    """Issue 25 (vLLM's graphs): as the driver, a capture's cuMemAllocAsync is an allocation
    node (its address now, no memory), cuMemFreeAsync of it a free node; freeing in a capture
    what is no allocation of the graph, or twice, is CUDA_ERROR_INVALID_VALUE (1); a launch
    kernel is a kernel node. cuGraphGetNodes says how many and NULLs past the last. The
    memory is reserved at the first launch (whole 2 MiB granules), given back by a trim
    while idle, taken again by the next launch, and given back when the executable graph is
    destroyed. A fake that charged the capture or never the graph would hide both bugs the
    interposer's graph tests catch."""
    r = _py(rig, GRAPH_MEMORY_NODES)
    assert r == {"init": 0, "captured_alloc": 0, "launch": 0, "captured_free_of_plain": 1,
                 "captured_free": 0, "captured_free_again": 1, "end": 0, "nodes": 3,
                 "types": [10, 0, 11], "past_last": [None, None], "get_params": 0,
                 "same_node": [True, True], "params_of_free_node": 1, "zero_bytes": 1,
                 "bad_device": 101, "free_node_unknown": 1, "reserved_before": 0,
                 "instantiate": 0, "reserved_instantiated": 0, "graph_launch": 0,
                 "reserved_launched": 4, "trim": 0, "reserved_trimmed": 0,
                 "reserved_relaunched": 4, "exec_destroy": 0, "reserved_end": 0}, r
