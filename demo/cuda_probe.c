/* cuda_probe: what a CUDA program sees inside a container (egpu node tests).
 *
 * Usage: cuda_probe [--clearenv] MIB [hold]
 *   --clearenv: re-exec itself with an empty environment first (FC-05).
 *   hold: after printing, keep the allocation until a signal ends the process (a co-tenant
 *   of the same share meanwhile sees it charged).
 * Prints one line of key=value pairs: the environment size, cuInit's result, the device
 * count, cuMemGetInfo's total/free (MiB), the result of cuMemAlloc_v2(MIB), and the errno of
 * opening /run/egpu/config.json and /etc/ld.so.preload for writing (0 = writable), and how
 * many mounts cover /etc/ld.so.preload. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "egpu_cuda.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d);
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);

extern char **environ;

static int count_mounts(const char *needle)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    int n = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

static int write_errno(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND);
    if (fd < 0) return errno;
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--clearenv")) {
        char *args[] = {argv[0], argv[2], NULL};
        char *empty[] = {NULL};
        execve("/proc/self/exe", args, empty);
        perror("execve");
        return 99;
    }
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
    int nenv = 0;
    for (char **e = environ; *e; e++) nenv++;
    int count = -1;
    size_t free_b = 0, total_b = 0;
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    int rc_init = cuInit(0);
    int rc_alloc = -1, rc_info = -1;
    if (rc_init == CUDA_SUCCESS) {
        cuDeviceGetCount(&count);
        cuDeviceGet(&dev, 0);
        cuCtxCreate_v2(&ctx, 0, dev);
        rc_info = cuMemGetInfo_v2(&free_b, &total_b);
        rc_alloc = cuMemAlloc_v2(&ptr, mib << 20);
    }
    printf("env=%d init=%d count=%d info=%d total_mib=%zu free_mib=%zu alloc_mib=%zu alloc=%d "
           "config_write_errno=%d preload_write_errno=%d preload_mounts=%d\n",
           nenv, rc_init, count, rc_info, total_b >> 20, free_b >> 20, mib, rc_alloc,
           write_errno("/run/egpu/config.json"), write_errno("/etc/ld.so.preload"),
           count_mounts(" /etc/ld.so.preload "));
    if (argc > 2 && !strcmp(argv[2], "hold")) {
        fflush(stdout);
        pause();
    }
    return 0;
}
