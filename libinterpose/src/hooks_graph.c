/* hooks_graph.c: graph memory nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync while a
 * stream captures; CUDA programming guide, "Graph Memory Nodes").
 *
 * The driver gives an allocation node its address when the node is made, and takes the
 * memory behind it from the device's graph memory pool for the executable graph: at its
 * launch (or upload), kept between launches until the executable graph is destroyed or the
 * device's graph memory is trimmed (cuDeviceGraphMemTrim). An allocation the graph does not
 * free stays allocated after the launch, and after cuGraphExecDestroy too, until it is freed
 * (cuMemFree, cuMemFreeAsync, or a free node of another graph); its memory then stays in the
 * pool until a trim gives the pool's unused memory back.
 *
 * The share is charged, per device, what the graph memory pool holds
 * (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), as the stream-ordered pools follow their reserve
 * (hooks_pool.c), and, as an up-front reservation, what the live executable graphs may map:
 * when a graph is instantiated (cuGraphInstantiate*), the sum of its allocation nodes (child
 * graphs included, each node rounded up to the allocation granularity, as the driver maps it)
 * is booked against the cap BEFORE the driver is called (over the cap:
 * CUDA_ERROR_OUT_OF_MEMORY, and no executable graph). See gm_dev for how the two combine.
 * A launch or upload that could grow the pool past what is charged is charged its growth
 * first; where the cap cannot hold it, the device's graph memory is trimmed and, if it still
 * does not fit, the launch is refused with CUDA_ERROR_OUT_OF_MEMORY (nothing runs).
 * A graph the walk cannot see whole (child graphs nested deeper than CHILD_GRAPH_DEPTH_MAX,
 * or a driver that cannot hand out a child graph node's graph) is refused with
 * CUDA_ERROR_NOT_SUPPORTED: allocation nodes are allowed in child graphs moved into their
 * node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE), and an unseen one would be booked as 0 bytes. */
#define _GNU_SOURCE
#include <stdlib.h>
#include "egpu_log.h"
#include "compute_core.h" /* u64max */
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

/* ---- the graph memory pools' charge -------------------------------------------------
 * Per device, under gm_mu:
 *   reserve: the graph memory pool's CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT as last read:
 *            memory mapped to executable graphs, held by allocations graphs left live (their
 *            executable graph destroyed or not), and cached unused until a trim;
 *   booked:  the sum of the live executable graphs' bookings (their allocation nodes);
 *   charged: what the share is charged for graph memory, max(reserve, booked).
 * How the two combine: a launched graph's memory is both in the reserve and in its booking,
 * so their sum would count it twice; the maximum counts each byte once and is never less than
 * either: what the pool holds now, what the live executable graphs may map. The booking does
 * not cover what the pool holds besides them (allocations left live by destroyed executable
 * graphs, cached memory), so a launch or upload is checked first (gm_run_check_locked): it
 * can grow the reserve to at most max(reserve, used + B_e) (used: USED_MEM_CURRENT; B_e: the
 * graph's booking, counted only where it may not be mapped now), and `charged` is raised to
 * max(that, booked) before the driver is called, then settles on the reserve after it.
 * epoch counts the trims that unmapped something on the device: an executable graph whose map
 * entry's aux is epoch + 1 was launched or uploaded since, so it is still mapped.
 *
 * A launch or upload of a graph mapped on each of its devices cannot grow the pools (it is
 * charged nothing first), so it runs without gm_mu: it holds gm_mapped for reading from its
 * check of the epochs to the driver's return, and a trim (the one thing that unmaps) takes it
 * for writing, so no trim falls between the check and the launch. Without gm_mapped the
 * launch could find its graph mapped, a trim unmap it, and the driver map it again past the
 * cap, uncharged. The launch reads its graph's map entries again under gm_mapped, and
 * instantiate and destroy put and take entries under it (for writing, within gm_mu, which
 * they hold across their driver calls): a launch whose entries vanished between its first
 * read and the locked one (destroyed, the handle perhaps reused by a new executable graph not
 * yet entered) takes the checked path under gm_mu, where an instantiation is whole. A graph
 * with no entry (no allocation nodes) is launched without gm_mapped. Writers go first: a
 * stream of launches cannot hold a trim off; no writer holds gm_mapped across a driver call
 * but the trim, so an instantiation never stalls the mapped launches. Lock order: gm_mu, then
 * gm_mapped; a reader takes gm_mu only after letting gm_mapped go. */
typedef struct { uint64_t reserve, booked, charged, epoch; } gm_dev;
static gm_dev gm[EGPU_MAX_DEVS];
static pthread_mutex_t gm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t gm_mapped = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static int gm_active; /* atomic: a graph with allocation nodes was booked in this process */


/* The device's graph memory pool figure a (0 when the driver cannot say). */
static uint64_t gm_attr(int d, CUgraphMem_attribute a)
{
    cuuint64_t v = 0;
    if (!R.cuDeviceGetGraphMemAttribute || R.cuDeviceGetGraphMemAttribute(d, a, &v) != CUDA_SUCCESS) return 0;
    return v;
}

/* gm_mu held: device d charged up to target (never down). 0, or -1 where the cap cannot hold it. */
static int gm_raise_locked(int d, uint64_t target)
{
    if (target <= gm[d].charged) return 0;
    if (charge(d, target - gm[d].charged) != CUDA_SUCCESS) return -1;
    gm[d].charged = target;
    return 0;
}

/* gm_mu held: device d's charge settles on max(reserve, booked), the reserve read now. Growth
 * the cap cannot hold (a driver that grew the pool more than a launch's check allowed for) is
 * forced: the driver holds that memory, so it is counted and nothing more passes meanwhile. */
static void gm_settle_locked(int d)
{
    gm[d].reserve = gm_attr(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    uint64_t target = u64max(gm[d].reserve, gm[d].booked);
    if (target < gm[d].charged) {
        uncharge(d, gm[d].charged - target);
        gm[d].charged = target;
    } else if (gm_raise_locked(d, target) != 0) {
        EGPU_ERR("device %d's graph memory pool holds %llu bytes the share's cap has no room for; they stay charged",
                 d, (unsigned long long)(target - gm[d].charged));
        force(d, target - gm[d].charged);
        gm[d].charged = target;
    }
}

/* gm_mu held: cuDeviceGraphMemTrim(d), then the charge settles on what the pool kept. A trim
 * that lowered the pool's use (or whose effect cannot be read) unmapped some executable graph:
 * each one on d then counts as unmapped (epoch). */
static CUresult gm_trim_locked(int d)
{
    pthread_rwlock_wrlock(&gm_mapped); /* no launch that counts on a mapping is in the driver */
    uint64_t used = gm_attr(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
    CUresult r = R.cuDeviceGraphMemTrim(d);
    if (r == CUDA_SUCCESS &&
        !(R.cuDeviceGetGraphMemAttribute && gm_attr(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= used))
        gm[d].epoch++;
    pthread_rwlock_unlock(&gm_mapped);
    gm_settle_locked(d);
    return r;
}

/* gm_mu held: before a launch or upload of a graph whose allocation nodes book mem[d] on each
 * device (aux[d]: its map entry's, 0 for one not made yet), charge what it may grow the pools
 * by (see above). Where the cap cannot hold it, the device's graph memory is trimmed and the
 * check made again; CUDA_ERROR_OUT_OF_MEMORY when it still does not fit (what was raised
 * settles back). */
static CUresult gm_run_check_locked(const uint64_t mem[EGPU_MAX_DEVS], const uint64_t aux[EGPU_MAX_DEVS])
{
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        for (int trimmed = 0;; trimmed = 1) {
            gm_settle_locked(d);
            uint64_t grown = gm[d].reserve;
            if (!aux[d] || aux[d] != gm[d].epoch + 1) /* may not be mapped: it may map all of mem */
                grown = u64max(grown, sat_add(gm_attr(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), mem[d]));
            if (gm_raise_locked(d, u64max(grown, gm[d].booked)) == 0) break;
            if (trimmed || !R.cuDeviceGraphMemTrim) {
                for (int k = 0; k <= d; k++)
                    if (mem[k]) gm_settle_locked(k);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            gm_trim_locked(d);
        }
    }
    return CUDA_SUCCESS;
}

/* gm_mu held: book mem[] on every device, all or nothing: booked grows, and charged with it
 * where it passes the reserve. */
static CUresult gm_book_locked(const uint64_t mem[EGPU_MAX_DEVS])
{
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        gm_settle_locked(d);
        gm[d].booked = sat_add(gm[d].booked, mem[d]);
        if (gm_raise_locked(d, u64max(gm[d].reserve, gm[d].booked)) == 0) continue;
        for (int k = d; k >= 0; k--) {
            if (!mem[k]) continue;
            gm[k].booked -= mem[k];
            gm_settle_locked(k);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* gm_mu held: every device's charge settles. */
static void gm_settle_all_locked(void)
{
    for (int d = 0; d < S->ndev; d++) gm_settle_locked(d);
}

void graph_mem_refresh(void)
{
    if (!__atomic_load_n(&gm_active, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&gm_mu);
    gm_settle_all_locked();
    pthread_mutex_unlock(&gm_mu);
}

typedef CUresult (*instantiate_call)(void *args);

/* The common path of every instantiation entry point: book the graph's memory, call the
 * driver (args), remember what the executable graph *pe booked. upload: the call uploads the
 * graph too (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD), so it is checked as a launch. */
static CUresult booked_instantiate(CUgraphExec *pe, CUgraph g, instantiate_call call, void *args, int upload)
{
    if (!pe || !g || !R.cuGraphGetNodes || !R.cuGraphNodeGetType || !R.cuGraphMemAllocNodeGetParams)
        return call(args); /* the driver reports, or has no memory nodes (CUDA < 11.4) */
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!devs_ready()) return call(args);
    uint64_t mem[EGPU_MAX_DEVS] = {0}, aux[EGPU_MAX_DEVS] = {0};
    CUresult r = graph_mem(g, mem, 0);
    if (r != CUDA_SUCCESS) return r;
    int any = 0;
    for (int d = 0; d < S->ndev; d++) any |= mem[d] != 0;
    if (!any) return call(args);
    __atomic_store_n(&gm_active, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&gm_mu);
    if ((r = gm_book_locked(mem)) != CUDA_SUCCESS) goto out;
    if (upload) r = gm_run_check_locked(mem, aux);
    if (r == CUDA_SUCCESS) {
        r = call(args);
        if (r == CUDA_SUCCESS) {
            /* the entries appear together for a launch's locked read (gm_mapped, above) */
            pthread_rwlock_wrlock(&gm_mapped);
            for (int d = 0; d < S->ndev; d++) {
                if (!mem[d]) continue;
                egpu_map_ent e = {gexec_key(*pe, d), mem[d], upload ? gm[d].epoch + 1 : 0, 0, d, MAP_GEXEC};
                egpu_map_put_ent(&S->map, &e);
            }
            pthread_rwlock_unlock(&gm_mapped);
        }
    }
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        if (r != CUDA_SUCCESS) gm[d].booked -= mem[d];
        gm_settle_locked(d);
    }
out:
    pthread_mutex_unlock(&gm_mu);
    return r;
}

/* The graph memory executable graph e booked on each device (mem[], aux[]: its map entries',
 * 0 where none); 0 when it booked none (no allocation nodes, or destroyed). Read-only: a
 * concurrent reader never finds an entry missing. What it reads with gm_mu or gm_mapped held
 * stays true while the lock is (every MAP_GEXEC put and take holds both, gm_mapped for
 * writing). */
static int gexec_mem(CUgraphExec e, uint64_t mem[EGPU_MAX_DEVS], uint64_t aux[EGPU_MAX_DEVS])
{
    int any = 0;
    for (int d = 0; d < S->ndev; d++) {
        egpu_map_ent m;
        mem[d] = aux[d] = 0;
        if (egpu_map_get_ent(&S->map, MAP_GEXEC, gexec_key(e, d), &m) != 0) continue;
        mem[d] = m.bytes;
        aux[d] = m.aux;
        any = 1;
    }
    return any;
}

CUresult egpu_graph_run(CUresult (*fn)(CUgraphExec, CUstream), CUgraphExec e, CUstream s)
{
    if (!e || !__atomic_load_n(&gm_active, __ATOMIC_ACQUIRE)) return fn(e, s);
    uint64_t mem[EGPU_MAX_DEVS], aux[EGPU_MAX_DEVS];
    /* no allocation nodes: nothing to check, and no gm_mapped (a launch of a plain graph
     * never waits behind a trim that waits for a mapped graph's launch) */
    if (!gexec_mem(e, mem, aux)) return fn(e, s);
    /* read again under gm_mapped, held across the driver call: what the first read said may
     * belong to a graph destroyed since, whose handle a new one reuses (mapped by that read,
     * the new graph would skip the check) */
    pthread_rwlock_rdlock(&gm_mapped);
    /* none now: destroyed meanwhile, the handle perhaps reused by a graph being instantiated
     * (its entries not in yet): the checked path, under gm_mu (above) */
    int mapped = gexec_mem(e, mem, aux);
    /* mapped on every device in its current epoch: no check, no gm_mu across the driver
     * (gm_mapped, above); the charge settles after, as a launch's does */
    for (int d = 0; d < S->ndev; d++) mapped &= !mem[d] || aux[d] == gm[d].epoch + 1;
    if (mapped) {
        CUresult r = fn(e, s);
        pthread_rwlock_unlock(&gm_mapped);
        pthread_mutex_lock(&gm_mu);
        for (int d = 0; d < S->ndev; d++)
            if (mem[d]) gm_settle_locked(d);
        pthread_mutex_unlock(&gm_mu);
        return r;
    }
    pthread_rwlock_unlock(&gm_mapped);
    /* it may map memory: checked, and gm_mu held across the driver call, so that no settle
     * drops the growth charged for it before the driver has taken it */
    pthread_mutex_lock(&gm_mu);
    if (!gexec_mem(e, mem, aux)) { /* destroyed meanwhile: the driver answers (under gm_mu:
                                     * no graph with allocation nodes takes the handle first) */
        CUresult r = fn(e, s);
        pthread_mutex_unlock(&gm_mu);
        return r;
    }
    CUresult r = gm_run_check_locked(mem, aux);
    if (r == CUDA_SUCCESS) r = fn(e, s);
    for (int d = 0; d < S->ndev; d++) {
        if (!mem[d]) continue;
        gm_settle_locked(d);
        /* mapped now: gm_mu keeps the epoch and the entry as they are (a reader that sees
         * the mark under gm_mapped is right: the driver did map it) */
        if (r == CUDA_SUCCESS) egpu_map_set_aux(&S->map, MAP_GEXEC, gexec_key(e, d), gm[d].epoch + 1);
    }
    pthread_mutex_unlock(&gm_mu);
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
    return booked_instantiate(pe, g, call_inst_log, &a, 0);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiate_v2);
    struct inst_log a = {R.cuGraphInstantiate_v2, pe, g, err, log, n};
    return booked_instantiate(pe, g, call_inst_log, &a, 0);
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
    return booked_instantiate(pe, g, call_inst_flags, &a, 0);
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
    return booked_instantiate(pe, g, call_inst_params, &a, p && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    REAL_OR_UNSUPPORTED(cuGraphInstantiateWithParams_ptsz);
    struct inst_params a = {R.cuGraphInstantiateWithParams_ptsz, pe, g, p};
    return booked_instantiate(pe, g, call_inst_params, &a, p && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
}

/* The executable graph's booking goes; the charge settles on what the graph memory pool
 * still holds (allocations the graph left live stay charged until they are freed and the
 * pool's memory is trimmed). */
CUresult cuGraphExecDestroy(CUgraphExec e)
{
    REAL_OR_UNSUPPORTED(cuGraphExecDestroy);
    if (!e || !__atomic_load_n(&gm_active, __ATOMIC_ACQUIRE)) return R.cuGraphExecDestroy(e);
    pthread_mutex_lock(&gm_mu);
    egpu_map_ent m[EGPU_MAX_DEVS];
    int had[EGPU_MAX_DEVS] = {0};
    CUresult r = R.cuGraphExecDestroy(e);
    /* the entries go together for a launch's locked read (gm_mapped, above); gm_mu, held,
     * keeps an instantiation from reusing the handle before they are gone */
    if (r == CUDA_SUCCESS) {
        pthread_rwlock_wrlock(&gm_mapped);
        for (int d = 0; d < S->ndev; d++)
            had[d] = egpu_map_take_ent(&S->map, MAP_GEXEC, gexec_key(e, d), &m[d]) == 0;
        pthread_rwlock_unlock(&gm_mapped);
    }
    for (int d = 0; r == CUDA_SUCCESS && d < S->ndev; d++) {
        if (!had[d]) continue;
        gm[d].booked -= m[d].bytes < gm[d].booked ? m[d].bytes : gm[d].booked;
        gm_settle_locked(d);
    }
    pthread_mutex_unlock(&gm_mu);
    return r;
}

CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuGraphUpload);
    return egpu_graph_run(R.cuGraphUpload, e, s);
}

CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuGraphUpload_ptsz);
    return egpu_graph_run(R.cuGraphUpload_ptsz, e, s);
}

/* What the trim gave back is given back to the share too. */
CUresult cuDeviceGraphMemTrim(CUdevice d)
{
    REAL_OR_UNSUPPORTED(cuDeviceGraphMemTrim);
    if (!__atomic_load_n(&gm_active, __ATOMIC_ACQUIRE) || d < 0 || d >= S->ndev) return R.cuDeviceGraphMemTrim(d);
    pthread_mutex_lock(&gm_mu);
    CUresult r = gm_trim_locked(d);
    pthread_mutex_unlock(&gm_mu);
    return r;
}
