/* getproc_check: for every row "name<TAB>cudaVersion<TAB>flags" of a recorded runtime trace,
 * ask cuGetProcAddress and cuGetProcAddress_v2 and print what came back:
 *   name ver flags rc rc2 symbol library
 * where symbol/library come from dladdr on the returned pointer (the versioned name chosen). */
#include <string.h>
#include "probe_util.h"

static void describe(void *fn, const char **sym, const char **lib)
{
    Dl_info di;
    *sym = "-";
    *lib = "-";
    if (fn && dladdr(fn, &di)) {
        *sym = di.dli_sname ? di.dli_sname : "?";
        const char *slash = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        *lib = slash ? slash + 1 : (di.dli_fname ? di.dli_fname : "?");
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: getproc_check FILE.tsv\n"); return 2; }
    load_cuda();
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 2; }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char name[512] = "";
        int ver = 0;
        unsigned long long flags = 0;
        char *t1 = strchr(line, '\t');
        if (!t1) continue;
        *t1 = 0;
        snprintf(name, sizeof name, "%s", line);
        if (sscanf(t1 + 1, "%d\t%llu", &ver, &flags) != 2) continue;
        void *fn = (void *)1, *fn2 = (void *)1;
        CUdriverProcAddressQueryResult st = 99;
        CUresult r = p_cuGetProcAddress(name, &fn, ver, flags);
        CUresult r2 = p_cuGetProcAddress_v2(name, &fn2, ver, flags, &st);
        const char *sym, *lib, *sym2, *lib2;
        describe(fn, &sym, &lib);
        describe(fn2, &sym2, &lib2);
        int same = fn == fn2;
        printf("%s\t%d\t%llu\t%d\t%d\t%d\t%s\t%s\t%d\t%s\n", name[0] ? name : "<empty>", ver, flags, r, r2, (int)st, sym, lib,
               same, fn == NULL ? "null" : "set");
    }
    fclose(f);
    return 0;
}
