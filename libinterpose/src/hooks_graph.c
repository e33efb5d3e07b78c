/* hooks_graph.c: graph memory nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync while a
 * stream captures; CUDA programming guide, "Graph Memory Nodes").
 *
 * The driver gives an allocation node its address when the node is made, and takes the
 * memory behind it for the executable graph: at its launch (or upload), kept between
 * launches until the executable graph is destroyed or the device's graph memory is trimmed.
 * The share books it earlier and for longer, so that no launch can take the share past its
 * cap: when a graph is instantiated, the sum of its allocation nodes (child graphs included,
 * each node rounded up to the allocation granularity, as the driver maps it) is charged
 * against the cap BEFORE the driver is called (over the cap: CUDA_ERROR_OUT_OF_MEMORY, and no
 * executable graph), and given back at cuGraphExecDestroy. The sum is an upper bound: the
 * driver may reuse one physical range for allocations that are never live together.
 * A graph the walk cannot see whole (child graphs nested deeper than CHILD_GRAPH_DEPTH_MAX,
 * or a driver that cannot hand out a child graph node's graph) is refused with
 * CUDA_ERROR_NOT_SUPPORTED: allocation nodes are allowed in child graphs moved into their
 * node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE), and an unseen one would be booked as 0 bytes. */
#define _GNU_SOURCE
#include <stdlib.h>
#include "egpu_log.h"
#include "share.h"

/* child graph levels the walk follows (the top graph is level 0); deeper than any framework
 * builds, and a bound on the walk's stack. A deeper graph is refused, never booked short. */
#define CHILD_GRAPH_DEPTH_MAX 16

static uint64_t gexec_key(CUgraphExec e, int dev) { return (uint64_t)(uintptr_t)e ^ ((uint64_t)dev << 56); }

static uint64_t granularity(int dev)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return vmm_granularity(&prop);
}

/* Adds the bytes of graph g's allocation nodes to mem[device]. The driver's error, if it
 * cannot be asked, or CUDA_ERROR_NOT_SUPPORTED where a child graph cannot be followed (the
 * caller then refuses: a graph not seen whole would be booked short). */
static CUresult graph_mem(CUgraph g, uint64_t mem[EGPU_MAX_DEVS], int depth)
{
    size_t n = 0;
    CUresult r = R.cuGraphGetNodes(g, NULL, &n);
    if (r != CUDA_SUCCESS || !n) return r;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t got = n;
    r = R.cuGraphGetNodes(g, nodes, &got);
    if (got < n) n = got;
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        CUgraphNodeType type;
        if (!nodes[i] || (r = R.cuGraphNodeGetType(nodes[i], &type)) != CUDA_SUCCESS) continue;
        if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            if ((r = R.cuGraphMemAllocNodeGetParams(nodes[i], &p)) != CUDA_SUCCESS) break;
            int dev = p.poolProps.location.id;
            if (p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || dev < 0 || dev >= S->ndev) continue;
            uint64_t gran = granularity(dev);
            uint64_t bytes = p.bytesize > UINT64_MAX - gran ? UINT64_MAX : (p.bytesize + gran - 1) / gran * gran;
            mem[dev] = mem[dev] > UINT64_MAX - bytes ? UINT64_MAX : mem[dev] + bytes; /* saturating */
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
            if (!R.cuGraphChildGraphNodeGetGraph) {
                EGPU_ERR("graph instantiation refused: the driver cannot show a child graph's "
                         "memory nodes (no cuGraphChildGraphNodeGetGraph)");
                r = CUDA_ERROR_NOT_SUPPORTED;
            } else if (depth >= CHILD_GRAPH_DEPTH_MAX) {
                EGPU_ERR("graph instantiation refused: child graphs nested deeper than %d levels; "
                         "their memory nodes cannot be booked", CHILD_GRAPH_DEPTH_MAX);
                r = CUDA_ERROR_NOT_SUPPORTED;
            } else {
                CUgraph child = NULL;
                if ((r = R.cuGraphChildGraphNodeGetGraph(nodes[i], &child)) == CUDA_SUCCESS)
                    r = graph_mem(child, mem, depth + 1);
            }
        }
    }
    free(nodes);
    return r;
}

static void unbook(const uint64_t mem[EGPU_MAX_DEVS])
{
    for (int d = 0; d < S->ndev; d++)
        if (mem[d]) uncharge(d, mem[d]);
}

/* Charges mem[] on every device, all or nothing. */
static CUresult book(const uint64_t mem[EGPU_MAX_DEVS])
{
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        CUresult r = charge(d, mem[d]);
        if (r == CUDA_SUCCESS) continue;
        while (--d >= 0)
            if (mem[d]) uncharge(d, mem[d]);
        return r;
    }
    return CUDA_SUCCESS;
}

typedef CUresult (*instantiate_call)(void *args);

/* The common path of every instantiation entry point: book the graph's memory, call the
 * driver (args), remember what the executable graph *pe booked. */
static CUresult booked_instantiate(CUgraphExec *pe, CUgraph g, instantiate_call call, void *args)
{
    if (!pe || !g || !R.cuGraphGetNodes || !R.cuGraphNodeGetType || !R.cuGraphMemAllocNodeGetParams)
        return call(args); /* the driver reports, or has no memory nodes (CUDA < 11.4) */
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!devs_ready()) return call(args);
    uint64_t mem[EGPU_MAX_DEVS] = {0};
    CUresult r = graph_mem(g, mem, 0);
    if (r != CUDA_SUCCESS) return r;
    if ((r = book(mem)) != CUDA_SUCCESS) return r;
    r = call(args);
    if (r != CUDA_SUCCESS) {
        unbook(mem);
        return r;
    }
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        egpu_map_ent e = {gexec_key(*pe, d), mem[d], 0, 0, d, MAP_GEXEC};
        egpu_map_put_ent(&S->map, &e);
    }
    return r;
}

struct inst_log {
    CUresult (*fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    CUgraphExec *pe; CUgraph g; CUgraphNode *err; char *log; size_t n;
};
static CUresult call_inst_log(void *a)
{
    struct inst_log *i = a;
    return i->fn(i->pe, i->g, i->err, i->log, i->n);
}

CUresult cuGraphInstantiate(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiate);
    struct inst_log a = {R.cuGraphInstantiate, pe, g, err, log, n};
    return booked_instantiate(pe, g, call_inst_log, &a);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiate_v2);
    struct inst_log a = {R.cuGraphInstantiate_v2, pe, g, err, log, n};
    return booked_instantiate(pe, g, call_inst_log, &a);
}

struct inst_flags { CUgraphExec *pe; CUgraph g; unsigned long long flags; };
static CUresult call_inst_flags(void *a)
{
    struct inst_flags *i = a;
    return R.cuGraphInstantiateWithFlags(i->pe, i->g, i->flags);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiateWithFlags);
    struct inst_flags a = {pe, g, flags};
    return booked_instantiate(pe, g, call_inst_flags, &a);
}

struct inst_params {
    CUresult (*fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
    CUgraphExec *pe; CUgraph g; CUDA_GRAPH_INSTANTIATE_PARAMS *p;
};
static CUresult call_inst_params(void *a)
{
    struct inst_params *i = a;
    return i->fn(i->pe, i->g, i->p);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiateWithParams);
    struct inst_params a = {R.cuGraphInstantiateWithParams, pe, g, p};
    return booked_instantiate(pe, g, call_inst_params, &a);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiateWithParams_ptsz);
    struct inst_params a = {R.cuGraphInstantiateWithParams_ptsz, pe, g, p};
    return booked_instantiate(pe, g, call_inst_params, &a);
}

CUresult cuGraphExecDestroy(CUgraphExec e)
{
    REAL_OR_UNSUPPORTED(cuGraphExecDestroy);
    CUresult r = R.cuGraphExecDestroy(e);
    if (r != CUDA_SUCCESS || !e) return r;
    for (int d = 0; d < S->ndev; d++) {
        egpu_map_ent m;
        if (egpu_map_take_ent(&S->map, MAP_GEXEC, gexec_key(e, d), &m) == 0) uncharge(d, m.bytes);
    }
    return r;
}
