/* hook_proc_check: what the hook table's own lookup (egpu_hook_by_proc, the fallback of
 * cuGetProcAddress when the driver's address is not one of its exported symbols) names for
 * each "base<TAB>cudaVersion<TAB>flags" row of stdin: one line "base ver flags hook", hook
 * being the hooked function chosen or "-" (none: the driver's own function is kept).
 * hook_table.c is built in with stub hooks, so no driver and no preload are needed. */
#include <stdio.h>
#include <string.h>
#include "../src/hook_table.c"

#pragma GCC diagnostic ignored "-Wunused-parameter"
#define STUB_CU(name, base, ver, pt, params) CUresult name params { return CUDA_SUCCESS; }
#define STUB_NVML(name, base, ver, pt, params) nvmlReturn_t name params { return NVML_SUCCESS; }
EGPU_CU_HOOKS(STUB_CU)
EGPU_NVML_HOOKS(STUB_NVML)
egpu_state egpu_g;

int main(void)
{
    char line[512], base[256];
    int ver;
    unsigned long long flags;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "%255s %d %llu", base, &ver, &flags) != 3) continue;
        const egpu_hook_ent *h = egpu_hook_by_proc(base, ver, flags);
        printf("%s\t%d\t%llu\t%s\n", base, ver, flags, h ? h->name : "-");
    }
    return 0;
}
