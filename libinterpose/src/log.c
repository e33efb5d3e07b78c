/* log.c: one line per message on stderr, "egpu: <level>: ...". */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "egpu_log.h"

static int log_level(void)
{
    static int level = -1; /* benign race: every thread computes the same value */
    if (level < 0) {
        const char *e = getenv("EGPU_LOG_LEVEL");
        int l = EGPU_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) l = EGPU_LOG_ERROR;
            else if (!strcmp(e, "info")) l = EGPU_LOG_INFO;
            else if (!strcmp(e, "debug")) l = EGPU_LOG_DEBUG;
        }
        level = l;
    }
    return level;
}

void egpu_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (level > log_level()) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "egpu: %s: %s\n", names[level], buf);
}
