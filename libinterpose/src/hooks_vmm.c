/* hooks_vmm.c: virtual memory management (cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap,
 * cuMemRetainAllocationHandle, cuMemImportFromShareableHandle). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include "share.h"

/* ---- virtual memory management -----------------------------------------------------
 * Physical memory is charged at cuMemCreate to the device named in its properties (not the
 * calling thread's context, which may not exist: FC-01); host-located memory is not charged.
 * Reserving address ranges costs nothing. As the driver (cuMemRelease, cuMemUnmap): the
 * memory is freed only when every handle to it is released AND every mapping of it is
 * unmapped, so the charge is given back then, not at cuMemRelease of a still-mapped handle
 * (the documented create-map-release pattern). Handles: cuMemCreate, each
 * cuMemRetainAllocationHandle and each cuMemImportFromShareableHandle take one; mappings:
 * cuMemMap/cuMemUnmap ranges. An imported allocation that matches no export of this
 * container is charged to the importing container at its whole size: the imported handle
 * alone keeps all of it alive (cuMemRelease: the memory goes only when every handle, imported
 * and shareable ones included, is released), and the exporter may let go of it first. No
 * API gives a handle's size, so it is found by trial mappings (import_size_locked); an import
 * larger than the share's room is refused with OUT_OF_MEMORY. All under vmm_mu, held across
 * the driver call so that the bookkeeping follows the driver's order of events.
 *
 * Within one container an allocation is charged once however many of its processes hold it
 * (NCCL: cuMemExportToShareableHandle as a POSIX fd, passed over a socket, imported by a
 * peer process). At export, the allocation's charge moves from the exporter's process slot
 * to a shared slot of the region (egpu_region.h, EGPU_PROC_F_SHARED) that lives while any
 * process of the container holds the allocation: an import whose fd is the same open file as
 * that export (kcmp) holds the shared slot and is charged nothing; the charge goes back when
 * the last holder releases it (or dies). Every later export of a shared allocation leaves
 * the charge there. An import that matches no export of this container (another container
 * exported it, the exporter let go of it before, it is a second export's open file, or kcmp
 * is denied, as under Docker's and containerd's default seccomp profiles) is charged to the
 * importer at its whole size, as above: it keeps the memory alive, so its container pays for
 * all of it (within one container that counts the allocation twice while both hold it: never
 * less than what is held). */
static int loc_is_device(const CUmemAllocationProp *p) { return p && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE; }

/* (clang-format reads "(aux) &" as a cast) */
/* clang-format off */
#define VMM_REFS(aux) ((aux) & 0xffffffffull)
#define VMM_NMAPS(aux) (((aux) >> 32) & 0x0fffffffull) /* below the flags */
#define VMM_IMPORTED (1ull << 63)
#define VMM_SHARED (1ull << 62) /* charged in a shared slot: ctx = the slot + 1 */
#define VMM_MULTICAST (1ull << 61) /* a multicast object: no memory of its own, bytes 0 */
#define VMM_FLAGS(aux) ((aux) & (VMM_IMPORTED | VMM_SHARED | VMM_MULTICAST))
#define VMM_AUX(refs, nmaps, flags) ((uint64_t)(refs) | ((uint64_t)(nmaps) << 32) | (flags))
/* clang-format on */

/* vmm_mu held: put the handle record back, or give its charge back when it has no handle and
 * no mapping left (a shared one: this process's hold of the shared slot ends). */
static void mc_unbind_all_locked(CUmemGenericAllocationHandle mc);

static void vmm_settle_locked(egpu_map_ent *h, uint64_t refs, uint64_t nmaps)
{
    if (refs == 0 && nmaps == 0) {
        if (h->aux & VMM_MULTICAST) { /* the object goes, and its bindings with it */
            mc_unbind_all_locked(h->key);
            return;
        }
        if (!(h->aux & VMM_SHARED)) {
            uncharge(h->dev, h->bytes);
            return;
        }
        int dupfd = egpu_acct_share_drop(&S->acct, (int)h->ctx - 1);
        if (dupfd >= 0) close(dupfd);
        return;
    }
    h->aux = VMM_AUX(refs, nmaps, VMM_FLAGS(h->aux));
    egpu_map_put_ent(&S->map, h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMemCreate);
    if (!handle || !size || !loc_is_device(prop)) return R.cuMemCreate(handle, size, prop, flags);
    int dev = prop->location.id;
    CUresult r = charge(dev, size);
    if (r == CUDA_ERROR_INVALID_DEVICE || r == CUDA_ERROR_NOT_INITIALIZED)
        return R.cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) return r;
    r = R.cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        uncharge(dev, size);
        return r;
    }
    egpu_map_ent e = {*handle, size, VMM_AUX(1, 0, 0ull), 0, dev, MAP_VMM};
    pthread_mutex_lock(&S->vmm_mu);
    egpu_map_put_ent(&S->map, &e);
    pthread_mutex_unlock(&S->vmm_mu);
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL_OR_UNSUPPORTED(cuMemRelease);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemRelease(handle);
    egpu_map_ent h;
    if (r == CUDA_SUCCESS && egpu_map_take_ent(&S->map, MAP_VMM, handle, &h) == 0) {
        uint64_t refs = VMM_REFS(h.aux);
        vmm_settle_locked(&h, refs ? refs - 1 : 0, VMM_NMAPS(h.aux));
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

uint64_t vmm_granularity(const CUmemAllocationProp *prop)
{
    size_t g = 0;
    if (!R.cuMemGetAllocationGranularity ||
        R.cuMemGetAllocationGranularity(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
        g = VMM_GRANULARITY_FALLBACK_BYTES;
    return g;
}

/* vmm_mu held: the size of the allocation behind an imported handle, found by bisection
 * over trial mappings of whole granules (cuMemMap of [0, size) succeeds iff size fits in the
 * allocation), up to `most` bytes + one granule. *size: the size, or UINT64_MAX when the
 * allocation is larger than `most`. The driver's error when no trial can be made. */
static CUresult import_size_locked(CUmemGenericAllocationHandle handle, uint64_t g, uint64_t most, uint64_t *size)
{
    if (!R.cuMemAddressReserve || !R.cuMemAddressFree || !R.cuMemMap || !R.cuMemUnmap) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t hi = most / g + 1; /* granules: one past the most we would charge */
    CUdeviceptr va = 0;
    CUresult r = R.cuMemAddressReserve(&va, hi * g, 0, 0, 0);
    if (r != CUDA_SUCCESS) return r;
    uint64_t lo = 0; /* granules known to fit */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (R.cuMemMap(va, mid * g, 0, handle, 0) == CUDA_SUCCESS) {
            R.cuMemUnmap(va, mid * g);
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    R.cuMemAddressFree(va, (most / g + 1) * g);
    if (lo == 0) return CUDA_ERROR_INVALID_VALUE; /* not even one granule maps */
    *size = lo > most / g ? UINT64_MAX : lo * g;
    return CUDA_SUCCESS;
}

/* vmm_mu held, h taken from the map: an import charged to this container pays for the
 * largest extent any mapping or multicast binding of it reaches (see above): the part of
 * [offset, offset + size) beyond what it paid is charged now, in *extra (give it back if the
 * driver call fails). */
static CUresult import_extent_charge_locked(const egpu_map_ent *h, CUmemGenericAllocationHandle handle, uint64_t offset,
                                            uint64_t size, uint64_t *extra)
{
    *extra = 0;
    if (!(h->aux & VMM_IMPORTED) || (h->aux & VMM_SHARED) || !size || offset > UINT64_MAX - size) return CUDA_SUCCESS;
    CUmemAllocationProp prop;
    uint64_t g = R.cuMemGetAllocationPropertiesFromHandle &&
                         R.cuMemGetAllocationPropertiesFromHandle(&prop, handle) == CUDA_SUCCESS
                     ? vmm_granularity(&prop)
                     : VMM_GRANULARITY_FALLBACK_BYTES;
    uint64_t end = offset + size;
    end = end > UINT64_MAX - (g - 1) ? end : (end + g - 1) / g * g;
    if (end <= h->bytes) return CUDA_SUCCESS;
    CUresult c = charge(h->dev, end - h->bytes);
    if (c == CUDA_SUCCESS) *extra = end - h->bytes;
    return c;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMemMap);
    pthread_mutex_lock(&S->vmm_mu);
    egpu_map_ent h;
    int had = egpu_map_take_ent(&S->map, MAP_VMM, handle, &h) == 0;
    uint64_t extra = 0;
    if (had) {
        CUresult c = import_extent_charge_locked(&h, handle, offset, size, &extra);
        if (c != CUDA_SUCCESS) {
            egpu_map_put_ent(&S->map, &h);
            pthread_mutex_unlock(&S->vmm_mu);
            return c;
        }
    }
    CUresult r = R.cuMemMap(ptr, size, offset, handle, flags);
    if (had) {
        if (r == CUDA_SUCCESS) {
            h.bytes += extra;
            h.aux = VMM_AUX(VMM_REFS(h.aux), VMM_NMAPS(h.aux) + 1, VMM_FLAGS(h.aux));
            egpu_map_ent m = {ptr, size, handle, 0, h.dev, MAP_VMAP};
            egpu_map_put_ent(&S->map, &m);
        } else if (extra) {
            uncharge(h.dev, extra);
        }
        egpu_map_put_ent(&S->map, &h);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_UNSUPPORTED(cuMemUnmap);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemUnmap(ptr, size);
    /* the range is whole mappings, contiguous: walk them from its start */
    for (uint64_t a = ptr, end = ptr + size; r == CUDA_SUCCESS && a < end && end > ptr;) {
        egpu_map_ent m, h;
        if (egpu_map_take_ent(&S->map, MAP_VMAP, a, &m) != 0 || !m.bytes) break;
        if (egpu_map_take_ent(&S->map, MAP_VMM, m.aux, &h) == 0) {
            uint64_t n = VMM_NMAPS(h.aux);
            vmm_settle_locked(&h, VMM_REFS(h.aux), n ? n - 1 : 0);
        }
        a += m.bytes;
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* Another handle to memory we already track: no new charge, one more reference. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL_OR_UNSUPPORTED(cuMemRetainAllocationHandle);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemRetainAllocationHandle(handle, addr);
    egpu_map_ent h;
    if (r == CUDA_SUCCESS && handle && egpu_map_take_ent(&S->map, MAP_VMM, *handle, &h) == 0) {
        h.aux = VMM_AUX(VMM_REFS(h.aux) + 1, VMM_NMAPS(h.aux), VMM_FLAGS(h.aux));
        egpu_map_put_ent(&S->map, &h);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType type)
{
    REAL_OR_UNSUPPORTED(cuMemImportFromShareableHandle);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemImportFromShareableHandle(handle, osHandle, type);
    egpu_map_ent h;
    CUmemAllocationProp prop;
    int slot;
    if (r != CUDA_SUCCESS || !handle) {
        /* the driver's answer */
    } else if (egpu_map_take_ent(&S->map, MAP_VMM, *handle, &h) == 0) {
        /* an allocation this process already holds: one more reference */
        h.aux = VMM_AUX(VMM_REFS(h.aux) + 1, VMM_NMAPS(h.aux), VMM_FLAGS(h.aux));
        egpu_map_put_ent(&S->map, &h);
    } else if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && devs_ready() &&
               (slot = egpu_acct_share_find(&S->acct, (int)(intptr_t)osHandle)) >= 0) {
        /* exported by a process of this container: held, charged once (see above) */
        int dev = R.cuMemGetAllocationPropertiesFromHandle &&
                          R.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS && loc_is_device(&prop)
                      ? prop.location.id
                      : -1; /* (multicast bindings find it by device) */
        egpu_map_ent e = {*handle, 0, VMM_AUX(1, 0, VMM_IMPORTED | VMM_SHARED), (uint64_t)slot + 1, dev, MAP_VMM};
        egpu_map_put_ent(&S->map, &e);
    } else if (R.cuMemGetAllocationPropertiesFromHandle &&
               R.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS && loc_is_device(&prop) &&
               devs_ready() && prop.location.id >= 0 && prop.location.id < S->ndev) {
        /* matched by no export: it pays for all it keeps alive (see above) */
        int dev = prop.location.id;
        uint64_t g = vmm_granularity(&prop), size = 0;
        CUresult c = import_size_locked(*handle, g, S->dev[dev].limit, &size);
        if (c == CUDA_SUCCESS) c = size == UINT64_MAX ? CUDA_ERROR_OUT_OF_MEMORY : charge(dev, size);
        if (c != CUDA_SUCCESS) {
            R.cuMemRelease(*handle);
            r = c;
        } else {
            egpu_map_ent e = {*handle, size, VMM_AUX(1, 0, VMM_IMPORTED), 0, dev, MAP_VMM};
            egpu_map_put_ent(&S->map, &e);
        }
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* The first POSIX fd export of an allocation this process created: its charge moves to a
 * shared slot (see above), found by the fd's open file through a private duplicate. */
#define EXPORT_DUP_FD_MIN 512 /* above the descriptors programs number by hand */
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMemExportToShareableHandle);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
    egpu_map_ent h;
    if (r == CUDA_SUCCESS && shareableHandle && handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        egpu_map_take_ent(&S->map, MAP_VMM, handle, &h) == 0) {
        int card = h.dev >= 0 && h.dev < S->ndev ? S->dev[h.dev].slot : -1;
        int dupfd = -1, slot = -1;
        if (!VMM_FLAGS(h.aux) && card >= 0 && (dupfd = fcntl(*(int *)shareableHandle, F_DUPFD_CLOEXEC, EXPORT_DUP_FD_MIN)) >= 0 &&
            (slot = egpu_acct_share_out(&S->acct, card, h.bytes, dupfd)) >= 0) {
            h.aux |= VMM_SHARED;
            h.ctx = (uint64_t)slot + 1;
        } else if (dupfd >= 0) {
            close(dupfd);
        }
        egpu_map_put_ent(&S->map, &h);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* ---- multicast objects (NVSwitch; CUDA driver API, "Multicast Object Management") ------
 * A multicast object holds no memory of its own (charged nothing): each device binds its own
 * cuMemCreate memory to it, charged at cuMemCreate to the container that made it. A binding
 * keeps that memory alive like a mapping (a release of the handle while it is bound frees
 * nothing), so it counts as one until cuMulticastUnbind, or until the object itself goes (its
 * handles released and its mappings unmapped). */
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop)
{
    REAL_OR_UNSUPPORTED(cuMulticastCreate);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMulticastCreate(mc, prop);
    if (r == CUDA_SUCCESS && mc) {
        egpu_map_ent e = {*mc, 0, VMM_AUX(1, 0, VMM_MULTICAST), 0, -1, MAP_VMM};
        egpu_map_put_ent(&S->map, &e);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* vmm_mu held: one more mapping-like hold of mem (when this process tracks it). */
static void mc_bind_locked(CUmemGenericAllocationHandle mc, CUmemGenericAllocationHandle mem, uint64_t mc_offset,
                           uint64_t size)
{
    egpu_map_ent h;
    if (egpu_map_take_ent(&S->map, MAP_VMM, mem, &h) != 0) return;
    if (S->n_mc_binds == S->cap_mc_binds) {
        int cap = S->cap_mc_binds ? 2 * S->cap_mc_binds : 16;
        egpu_mc_bind *grown = realloc(S->mc_binds, (size_t)cap * sizeof *grown);
        if (!grown) { /* cannot remember it: the handle keeps its charge until the process ends */
            h.aux = VMM_AUX(VMM_REFS(h.aux) + 1, VMM_NMAPS(h.aux), VMM_FLAGS(h.aux));
            egpu_map_put_ent(&S->map, &h);
            return;
        }
        S->mc_binds = grown;
        S->cap_mc_binds = cap;
    }
    S->mc_binds[S->n_mc_binds++] = (egpu_mc_bind){mc, mem, h.dev, mc_offset, size};
    h.aux = VMM_AUX(VMM_REFS(h.aux), VMM_NMAPS(h.aux) + 1, VMM_FLAGS(h.aux));
    egpu_map_put_ent(&S->map, &h);
}

/* vmm_mu held: binding i goes; its memory's hold with it. */
static void mc_unbind_locked(int i)
{
    egpu_mc_bind b = S->mc_binds[i];
    S->mc_binds[i] = S->mc_binds[--S->n_mc_binds];
    egpu_map_ent h;
    if (egpu_map_take_ent(&S->map, MAP_VMM, b.mem, &h) == 0) {
        uint64_t n = VMM_NMAPS(h.aux);
        vmm_settle_locked(&h, VMM_REFS(h.aux), n ? n - 1 : 0);
    }
}

static void mc_unbind_all_locked(CUmemGenericAllocationHandle mc)
{
    for (int i = S->n_mc_binds - 1; i >= 0; i--)
        if (S->mc_binds[i].mc == mc) mc_unbind_locked(i);
}

/* vmm_mu held: an import bound from memOffset pays for that extent first (as a mapping). */
static CUresult mc_bind_extent_locked(CUmemGenericAllocationHandle mem, uint64_t mem_offset, uint64_t size,
                                      uint64_t *extra, int *dev)
{
    egpu_map_ent h;
    *extra = 0;
    if (egpu_map_take_ent(&S->map, MAP_VMM, mem, &h) != 0) return CUDA_SUCCESS;
    CUresult c = import_extent_charge_locked(&h, mem, mem_offset, size, extra);
    h.bytes += *extra;
    *dev = h.dev;
    egpu_map_put_ent(&S->map, &h);
    return c;
}

static void mc_bind_extent_undo_locked(CUmemGenericAllocationHandle mem, uint64_t extra, int dev)
{
    egpu_map_ent h;
    if (!extra || egpu_map_take_ent(&S->map, MAP_VMM, mem, &h) != 0) return;
    h.bytes -= extra;
    uncharge(dev, extra);
    egpu_map_put_ent(&S->map, &h);
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                            size_t memOffset, size_t size, unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMulticastBindMem);
    pthread_mutex_lock(&S->vmm_mu);
    uint64_t extra = 0;
    int dev = -1;
    CUresult r = mc_bind_extent_locked(memHandle, memOffset, size, &extra, &dev);
    if (r == CUDA_SUCCESS) r = R.cuMulticastBindMem(mc, mcOffset, memHandle, memOffset, size, flags);
    if (r == CUDA_SUCCESS) mc_bind_locked(mc, memHandle, mcOffset, size);
    else mc_bind_extent_undo_locked(memHandle, extra, dev);
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mcOffset, CUdeviceptr memptr, size_t size,
                             unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMulticastBindAddr);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMulticastBindAddr(mc, mcOffset, memptr, size, flags);
    CUmemGenericAllocationHandle mem = 0;
    /* the handle of the memory mapped there (the driver's own calls: no bookkeeping) */
    if (r == CUDA_SUCCESS && R.cuMemRetainAllocationHandle &&
        R.cuMemRetainAllocationHandle(&mem, (void *)(uintptr_t)memptr) == CUDA_SUCCESS) {
        R.cuMemRelease(mem);
        mc_bind_locked(mc, mem, mcOffset, size);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mcOffset, size_t size)
{
    REAL_OR_UNSUPPORTED(cuMulticastUnbind);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMulticastUnbind(mc, dev, mcOffset, size);
    for (int i = S->n_mc_binds - 1; r == CUDA_SUCCESS && i >= 0; i--) {
        egpu_mc_bind *b = &S->mc_binds[i];
        if (b->mc == mc && b->dev == dev && b->mc_offset == mcOffset && b->size == size) {
            mc_unbind_locked(i);
            break;
        }
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}
