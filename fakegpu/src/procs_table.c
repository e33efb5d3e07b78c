/* fakegpu: the cuGetProcAddress table, built from procs.def. Every symbol is declared here
 * only to take its address (a separate translation unit, so no prototype clashes with the
 * real signatures in fake_cuda.c); nothing is called through these declarations. */
#include <stddef.h>

typedef struct { const char *base; int ver; const char *sym; void *fn; const char *ptsym; void *ptfn; } fg_proc_ent;

#define P(b, v, s, p) extern void s(void); extern void p(void);
#include "../procs.def"
#undef P

extern const fg_proc_ent fg_procs[];
extern const int fg_nprocs;
const fg_proc_ent fg_procs[] = {
#define P(b, v, s, p) {#b, v, #s, (void *)s, #p, (void *)p},
#include "../procs.def"
#undef P
};
const int fg_nprocs = (int)(sizeof fg_procs / sizeof fg_procs[0]);
