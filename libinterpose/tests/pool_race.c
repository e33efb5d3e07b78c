/* pool_race ROUNDS: two threads allocate 1 GiB each from one pool at the same instant, with
 * 1 GiB already cached in the pool, ROUNDS times. Under a 1536 MiB share at most one may
 * succeed each round. Prints "pool_race rc=0 rounds=N both=B" (B must be 0). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include "probe_util.h"

#define MIB (1ull << 20)
static CUmemoryPool pool;
static CUcontext ctx;
static atomic_int go, ready;
static CUdeviceptr ptr[2];
static CUresult rc[2];

static void *th(void *a)
{
    long i = (long)a;
    p_cuCtxSetCurrent(ctx);
    atomic_fetch_add(&ready, 1);
    while (!atomic_load(&go)) {}
    rc[i] = p_cuMemAllocFromPoolAsync(&ptr[i], 1024 * MIB, pool, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    load_cuda();
    if (p_cuInit(0) || p_cuCtxCreate_v2(&ctx, 0, 0)) { printf("pool_race rc=1\n"); return 1; }
    CUmemPoolProps pr;
    memset(&pr, 0, sizeof pr);
    pr.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pr.location.id = 0;
    p_cuMemPoolCreate(&pool, &pr);
    cuuint64_t thr = ~0ull;
    p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
    CUdeviceptr p;
    if (p_cuMemAllocFromPoolAsync(&p, 1024 * MIB, pool, NULL)) { printf("pool_race rc=2\n"); return 1; }
    p_cuMemFreeAsync(p, NULL);
    p_cuStreamSynchronize(NULL);
    int rounds = argc > 1 ? atoi(argv[1]) : 1000, both = 0, one = 0;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&go, 0);
        atomic_store(&ready, 0);
        pthread_t t[2];
        for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, th, (void *)i);
        while (atomic_load(&ready) < 2) {}
        atomic_store(&go, 1);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        if (!rc[0] && !rc[1]) both++;
        else if (!rc[0] || !rc[1]) one++;
        for (int i = 0; i < 2; i++)
            if (!rc[i]) p_cuMemFreeAsync(ptr[i], NULL);
        p_cuMemPoolTrimTo(pool, 1024 * MIB);
        p_cuStreamSynchronize(NULL);
    }
    size_t f = 0, t = 0;
    p_cuMemGetInfo_v2(&f, &t);
    printf("pool_race rc=0 rounds=%d both=%d one=%d used=%zu\n", rounds, both, one, t - f);
    return 0;
}
