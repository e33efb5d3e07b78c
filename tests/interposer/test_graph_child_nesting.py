"""Graph allocation nodes in child graphs: the share books what a graph's allocation nodes
take however they are nested, and refuses a graph it cannot see whole."""

from __future__ import annotations

from .conftest import GRAPH_ALLOC_PRELUDE
from .test_fakegpu import _py

NOT_SUPPORTED, OUT_OF_MEMORY, INVALID_VALUE = 801, 2, 1
CHILD_GRAPH_DEPTH_MAX = 16  # hooks_graph.c: child graph levels the booking walk follows

NESTED_GRAPHS = GRAPH_ALLOC_PRELUDE + """
    import sys
    class NodeParams(C.Structure):  # CUgraphNodeParams with CUDA_CHILD_GRAPH_NODE_PARAMS
        _fields_ = [("type", C.c_int), ("reserved0", C.c_int * 3), ("graph", C.c_void_p),
                    ("ownership", C.c_int), ("pad", C.c_ubyte * 220), ("reserved2", C.c_longlong)]
    assert C.sizeof(NodeParams) == 256
    GRAPH, MOVE = 4, 1  # CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE
    def alloc_graph(mib):
        g, n = C.c_void_p(), C.c_void_p()
        cuda.cuGraphCreate(C.byref(g), 0)
        p = params(mib * MIB)
        assert cuda.cuGraphAddMemAllocNode(C.byref(n), g, None, 0, C.byref(p)) == 0
        return g
    def nested(levels, mib):
        # the allocation node `levels` child graphs down, each moved into its parent's node
        g = alloc_graph(mib)
        for _ in range(levels):
            parent, n = C.c_void_p(), C.c_void_p()
            cuda.cuGraphCreate(C.byref(parent), 0)
            p = NodeParams(type=GRAPH, graph=g, ownership=MOVE)
            assert cuda.cuGraphAddNode(C.byref(n), parent, None, 0, C.byref(p)) == 0
            g = parent
        return g
    out = {"init": cuda.cuInit(0)}
    ctx = C.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    levels, mib = int(sys.argv[1]), int(sys.argv[2])
    g, e = nested(levels, mib), C.c_void_p()
    before = free_mib()
    out["instantiate"] = cuda.cuGraphInstantiateWithFlags(C.byref(e), g, C.c_ulonglong(0))
    out["booked_mib"] = before - free_mib()
    if out["instantiate"] == 0:
        out["exec_destroy"] = cuda.cuGraphExecDestroy(e)
        out["booked_after_destroy_mib"] = before - free_mib()
    # as the driver: a cloned child graph may hold no memory nodes
    n = C.c_void_p()
    out["clone_with_alloc_node"] = cuda.cuGraphAddChildGraphNode(C.byref(n), g, None, 0,
                                                                 alloc_graph(2))
    print(json.dumps(out))
"""


def _nested(rig, levels, mib):
    code = NESTED_GRAPHS.replace("int(sys.argv[1]), int(sys.argv[2])", f"{levels}, {mib}")
    return _py(rig, code, preload=True, EGPU_MEMORY_LIMIT_MIB=1024)


def test_allocation_nodes_nested_past_the_walk_refuse_the_instantiation(rig):
    """The bug: allocation nodes nested 17 child graphs deep (moved child graphs may hold them)
    were booked as 0 bytes at instantiation, so the graph's launch took memory the share never
    counted. Now such a graph is refused with CUDA_ERROR_NOT_SUPPORTED and nothing booked."""
    r = _nested(rig, CHILD_GRAPH_DEPTH_MAX + 1, 64)
    assert r["instantiate"] == NOT_SUPPORTED and r["booked_mib"] == 0, r


def test_allocation_nodes_in_nested_child_graphs_are_booked_at_instantiation(rig):
    """Within the walk's depth a nested allocation node is booked (64 MiB) until the
    executable graph is destroyed, and past the cap the instantiation is OUT_OF_MEMORY; a
    cloned child graph with memory nodes is refused as by the driver (INVALID_VALUE)."""
    r = _nested(rig, CHILD_GRAPH_DEPTH_MAX, 64)
    assert r["instantiate"] == 0 and r["booked_mib"] == 64, r
    assert r["exec_destroy"] == 0 and r["booked_after_destroy_mib"] == 0, r
    assert r["clone_with_alloc_node"] == INVALID_VALUE, r
    over = _nested(rig, 3, 2048)
    assert over["instantiate"] == OUT_OF_MEMORY and over["booked_mib"] == 0, over
