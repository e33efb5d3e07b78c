"""The memory patterns of frameworks, made with NVIDIA's driver bindings (cuda-bindings 13),
run by a client environment's Python (tests/clients/test_memory_patterns.py). Prints one JSON
object.

    python patterns_probe.py SHARE_MIB expandable|vllm|graph|multicast|nccl

- ``expandable``: PyTorch's expandable segments. One large virtual range is reserved
  (cuMemAddressReserve, 64 GiB: more than any card here), and physical chunks are created
  (cuMemCreate), mapped at its end and made accessible as the segment grows, until creating
  one fails; then the last half is unmapped and released (the segment shrinks), one chunk
  grows it again, and everything is given back.
- ``vllm``: vLLM's startup profile. Free and total are read, the weights are loaded
  (cuMemAlloc of a quarter of the total) and a warm-up's activations allocated and freed;
  free and total are read again and the KV cache is sized as
  ``gpu_memory_utilization x total - (total - free)`` and allocated in one piece; then what
  is left, plus one MiB, is asked for. Then, as vLLM does after its KV cache, a CUDA graph
  is captured whose memory nodes (cuMemAllocAsync in the capture) take half of what is left,
  and a second one that asks for more than is left.
- ``graph``: CUDA graph memory nodes. A capture allocates and frees 256 and 128 MiB on its
  stream (allocation and free nodes), the graph is instantiated, launched, the device's graph
  memory trimmed and the graph launched again; then a graph built node by node
  (cuGraphAddMemAllocNode, cuGraphAddMemFreeNode) asks for more than is free; everything is
  destroyed.
- ``nccl``: NCCL's buffers shared between processes. A 3000 MiB allocation is made with
  cuMemCreate for POSIX file-descriptor export, mapped, exported, and its fd passed (over a
  socket, SCM_RIGHTS) to a process of another share (its own region), then to a process of
  the same share; each imports and maps it; the exporter lets go of it while the second still
  holds it, then the second does.
- ``multicast``: NCCL's NVLS buffers. The device's multicast attribute is read and a
  multicast object of 512 MiB asked for (cuMulticastCreate); on a card without NVSwitch the
  driver answers NOT_SUPPORTED (NCCL goes on without it). With NVSwitch: the device is added,
  512 MiB made with cuMemCreate and bound to the object (cuMulticastBindMem; refused before
  the device is added), the object mapped, the memory unbound and bound again by its mapped
  address (cuMulticastBindAddr), its mapping and handle released while it is bound, then the
  object unmapped and released (its binding goes with it).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cuda.bindings import driver as d

MIB = 1 << 20
GIB = 1 << 30
RESERVE = 64 * GIB
CHUNK_MIB = 64  # a segment's growth step (PyTorch grows by its allocation's rounded size)
UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
LIMIT = 4096  # chunks: far beyond any card here


def ok(result: Any) -> Any:
    """The values of a call that must succeed (raises with its CUresult otherwise)."""
    result = result if isinstance(result, tuple) else (result,)
    if int(result[0]) != 0:
        raise RuntimeError(f"CUresult {int(result[0])}")
    values = result[1:]
    return values[0] if len(values) == 1 else (values or None)


def free_mib() -> int:
    free, _ = ok(d.cuMemGetInfo())
    return int(free) // MIB


def expandable(out: dict[str, Any]) -> None:
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    access = d.CUmemAccessDesc()
    access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    gran = ok(d.cuMemGetAllocationGranularity(
        prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    chunk = max(gran, CHUNK_MIB * MIB // gran * gran)
    out["chunk_mib"] = chunk // MIB
    out["free_start_mib"] = free_mib()
    base = ok(d.cuMemAddressReserve(RESERVE, 0, 0, 0))
    out["free_after_reserve_mib"] = free_mib()
    chunks: list[Any] = []
    steps = []  # free MiB each mapped chunk took
    out["refusal"] = None
    for _ in range(LIMIT):
        before = free_mib()
        rc, handle = d.cuMemCreate(chunk, prop, 0)
        if int(rc) != 0:
            out["refusal"] = int(rc)
            break
        va = int(base) + len(chunks) * chunk
        ok(d.cuMemMap(va, chunk, 0, handle, 0))
        ok(d.cuMemSetAccess(va, chunk, [access], 1))
        chunks.append(handle)
        steps.append(before - free_mib())
    out["chunks"] = len(chunks)
    out["steps_mib"] = sorted(set(steps))
    out["free_full_mib"] = free_mib()
    keep = len(chunks) // 2
    for i in range(len(chunks) - 1, keep - 1, -1):  # shrink: the segment's tail goes back
        ok(d.cuMemUnmap(int(base) + i * chunk, chunk))
        ok(d.cuMemRelease(chunks.pop()))
    out["released"] = out["chunks"] - keep
    out["free_shrunk_mib"] = free_mib()
    handle = ok(d.cuMemCreate(chunk, prop, 0))  # grow again into the same range
    ok(d.cuMemMap(int(base) + keep * chunk, chunk, 0, handle, 0))
    chunks.append(handle)
    out["free_regrown_mib"] = free_mib()
    for i in range(len(chunks) - 1, -1, -1):
        ok(d.cuMemUnmap(int(base) + i * chunk, chunk))
        ok(d.cuMemRelease(chunks[i]))
    ok(d.cuMemAddressFree(base, RESERVE))
    out["free_end_mib"] = free_mib()


def launched_capture(sizes_mib: list[int]) -> tuple[Any, Any, Any, str | None, int]:
    """A stream captures allocations of sizes_mib and their frees (a graph of memory nodes);
    the graph is instantiated and launched. (stream, graph, exec or None, the step that
    failed or None, its CUresult)."""
    stream = ok(d.cuStreamCreate(0))
    ok(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ptrs = [ok(d.cuMemAllocAsync(mib * MIB, stream)) for mib in sizes_mib]
    for ptr in reversed(ptrs):
        ok(d.cuMemFreeAsync(ptr, stream))
    graph = ok(d.cuStreamEndCapture(stream))
    return (stream, graph, *launch(graph, stream))


def launch(graph: Any, stream: Any) -> tuple[Any, str | None, int]:
    """Instantiates and launches graph: (exec or None, the step that failed or None, CUresult)."""
    rc, exe = d.cuGraphInstantiate(graph, 0)
    if int(rc) != 0:
        return None, "instantiate", int(rc)
    rc = int(d.cuGraphLaunch(exe, stream)[0])
    if rc != 0:
        return exe, "launch", rc
    ok(d.cuStreamSynchronize(stream))
    return exe, None, 0


def graph(out: dict[str, Any]) -> None:
    out["free_start_mib"] = free_mib()
    stream, g, exe, failed, rc = launched_capture([256, 128])
    out["launch"] = [failed, rc]
    out["free_launched_mib"] = free_mib()
    ok(d.cuDeviceGraphMemTrim(ok(d.cuDeviceGet(0))))
    out["free_trimmed_mib"] = free_mib()
    out["relaunch"] = int(d.cuGraphLaunch(exe, stream)[0])
    ok(d.cuStreamSynchronize(stream))
    out["free_relaunched_mib"] = free_mib()
    # a graph built node by node that asks for more than is free
    big = ok(d.cuGraphCreate(0))
    params = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    params.bytesize = (free_mib() + 2) * MIB
    node = ok(d.cuGraphAddMemAllocNode(big, None, 0, params))
    ok(d.cuGraphAddMemFreeNode(big, [node], 1, params.dptr))
    big_exe, failed, rc = launch(big, stream)
    out["over"] = [failed, rc]
    out["free_refused_mib"] = free_mib()
    if big_exe is not None:
        ok(d.cuGraphExecDestroy(big_exe))
    ok(d.cuGraphDestroy(big))
    ok(d.cuGraphExecDestroy(exe))
    ok(d.cuGraphDestroy(g))
    ok(d.cuStreamDestroy(stream))
    out["free_end_mib"] = free_mib()


NCCL_MIB = 3000
MULTICAST_MIB = 512
POSIX_FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def primary_context() -> None:
    ok(d.cuInit(0))
    ok(d.cuCtxSetCurrent(ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))))


def vmm_prop(handle_types: Any = 0) -> Any:
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    if handle_types:
        prop.requestedHandleTypes = handle_types
    return prop


def nccl_peer(conn: Any, size: int) -> None:
    """The importing process (started with multiprocessing's spawn: a fresh interpreter)."""
    from multiprocessing.reduction import recv_handle

    primary_context()
    fd = recv_handle(conn)
    first: dict[str, Any] = {"free_before_mib": free_mib()}
    rc, handle = d.cuMemImportFromShareableHandle(fd, POSIX_FD)
    first["import"] = int(rc)
    va = ok(d.cuMemAddressReserve(size, 0, 0, 0))
    first["map"] = int(d.cuMemMap(va, size, 0, handle, 0)[0]) if first["import"] == 0 else None
    first["free_mapped_mib"] = free_mib()
    conn.send(first)
    conn.recv()  # the exporter has let go (or, for another share, need not)
    then: dict[str, Any] = {"free_exporter_gone_mib": free_mib()}
    if first["map"] == 0:
        ok(d.cuMemUnmap(va, size))
    if first["import"] == 0:
        ok(d.cuMemRelease(handle))
    ok(d.cuMemAddressFree(va, size))
    os.close(fd)
    then["free_released_mib"] = free_mib()
    conn.send(then)


def nccl(out: dict[str, Any]) -> None:
    import multiprocessing as mp
    from multiprocessing.reduction import send_handle

    size = NCCL_MIB * MIB
    access = d.CUmemAccessDesc()
    access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    out["free_start_mib"] = free_mib()
    handle = ok(d.cuMemCreate(size, vmm_prop(POSIX_FD), 0))
    va = ok(d.cuMemAddressReserve(size, 0, 0, 0))
    ok(d.cuMemMap(va, size, 0, handle, 0))
    ok(d.cuMemSetAccess(va, size, [access], 1))
    out["free_created_mib"] = free_mib()
    fd = int(ok(d.cuMemExportToShareableHandle(handle, POSIX_FD, 0)))
    spawn = mp.get_context("spawn")
    own_region = os.environ.get("EGPU_CONTAINER_REGION")
    for share in ("other", "same"):
        if share == "other":  # a process of another container: a region of its own
            os.environ["EGPU_CONTAINER_REGION"] = os.path.join(
                os.environ["EGPU_RUNTIME_DIR"], "containers", "other-share", "region")
        elif own_region is None:
            os.environ.pop("EGPU_CONTAINER_REGION")
        else:
            os.environ["EGPU_CONTAINER_REGION"] = own_region
        conn, peer_conn = spawn.Pipe()
        peer = spawn.Process(target=nccl_peer, args=(peer_conn, size))
        peer.start()
        send_handle(conn, fd, peer.pid)
        out[share] = conn.recv()
        out[share]["exporter_free_mib"] = free_mib()
        if share == "same":  # the exporter lets go while the peer holds it
            ok(d.cuMemUnmap(va, size))
            ok(d.cuMemRelease(handle))
            out["exporter_let_go_free_mib"] = free_mib()
        conn.send("go")
        out[share] |= conn.recv()
        peer.join(60)
        out[share]["exit"] = peer.exitcode
    os.close(fd)
    ok(d.cuMemAddressFree(va, size))
    out["free_end_mib"] = free_mib()


def multicast(out: dict[str, Any]) -> None:
    out["free_start_mib"] = free_mib()
    attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
    out["supported"] = int(ok(d.cuDeviceGetAttribute(attr, ok(d.cuDeviceGet(0)))))
    prop = d.CUmulticastObjectProp()
    prop.numDevices = 1
    prop.size = MULTICAST_MIB * MIB
    rc, mc = d.cuMulticastCreate(prop)
    out["create"] = int(rc)
    if int(rc) == 0:
        size, dev = prop.size, ok(d.cuDeviceGet(0))
        out["free_created_mib"] = free_mib()
        mem = ok(d.cuMemCreate(size, vmm_prop(), 0))
        out["free_mem_mib"] = free_mib()
        out["bind_before_device"] = int(d.cuMulticastBindMem(mc, 0, mem, 0, size, 0)[0])
        ok(d.cuMulticastAddDevice(mc, dev))
        ok(d.cuMulticastBindMem(mc, 0, mem, 0, size, 0))
        va = ok(d.cuMemAddressReserve(size, 0, 0, 0))
        ok(d.cuMemMap(va, size, 0, mc, 0))
        out["free_mapped_mib"] = free_mib()
        ok(d.cuMulticastUnbind(mc, dev, 0, size))
        mem_va = ok(d.cuMemAddressReserve(size, 0, 0, 0))  # bound again, by its address
        ok(d.cuMemMap(mem_va, size, 0, mem, 0))
        ok(d.cuMulticastBindAddr(mc, 0, mem_va, size, 0))
        ok(d.cuMemUnmap(mem_va, size))
        ok(d.cuMemAddressFree(mem_va, size))
        ok(d.cuMemRelease(mem))  # unmapped and released, but bound: still there
        out["free_mem_released_mib"] = free_mib()
        ok(d.cuMemUnmap(va, size))
        ok(d.cuMemRelease(mc))  # the object goes, and its binding
        ok(d.cuMemAddressFree(va, size))
    out["free_end_mib"] = free_mib()


def vllm(out: dict[str, Any]) -> None:
    free, total = ok(d.cuMemGetInfo())
    out["total_mib"], out["free_start_mib"] = int(total) // MIB, int(free) // MIB
    weights = ok(d.cuMemAlloc(int(total) // 4 // MIB * MIB))
    activations = ok(d.cuMemAlloc(int(total) // 8 // MIB * MIB))  # the warm-up's peak
    ok(d.cuMemFree(activations))
    free, total_again = ok(d.cuMemGetInfo())
    out["total_after_mib"] = int(total_again) // MIB
    budget = int(UTILIZATION * int(total_again))
    kv_bytes = (budget - (int(total_again) - int(free))) // MIB * MIB
    out["kv_mib"] = kv_bytes // MIB
    rc, kv = d.cuMemAlloc(kv_bytes)
    out["kv_alloc"] = int(rc)
    left = free_mib()
    out["left_mib"] = left
    out["budget_left_mib"] = (int(total_again) - budget) // MIB
    rc, _ = d.cuMemAlloc((left + 1) * MIB)
    out["over_alloc"] = int(rc)
    # CUDA graphs captured after the KV cache: their memory nodes come out of what is left
    out["graph_mib"] = left // 4 * 2  # half of it, in 2 MiB steps
    stream, g, exe, failed, rc = launched_capture([out["graph_mib"]])
    out["graph_launch"] = [failed, rc]
    out["left_after_graph_mib"] = free_mib()
    stream2, g2, exe2, failed, rc = launched_capture([out["left_after_graph_mib"] + 2])
    out["graph_over"] = [failed, rc]
    for e in (exe, exe2):
        if e is not None:
            ok(d.cuGraphExecDestroy(e))
    for gr, st in ((g, stream), (g2, stream2)):
        ok(d.cuGraphDestroy(gr))
        ok(d.cuStreamDestroy(st))
    ok(d.cuMemFree(kv))
    ok(d.cuMemFree(weights))
    out["free_end_mib"] = free_mib()


def main() -> None:
    out: dict[str, Any] = {"share_mib": int(sys.argv[1])}
    primary_context()
    patterns = {"expandable": expandable, "vllm": vllm, "graph": graph, "multicast": multicast,
                "nccl": nccl}
    patterns[sys.argv[2]](out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
