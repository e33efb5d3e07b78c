/* egpu_fsutil.h: file helpers shared by the two region files (container accounting, card).
 * Static inline: card_region.c is also built alone into CPU tests. No CUDA calls. */
#ifndef EGPU_FSUTIL_H
#define EGPU_FSUTIL_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* Create the folders above the file `path` (0755). 0 ok; -1 when the last one cannot be made. */
static inline int egpu_mkdirs_for(const char *path)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp) return 0;
    *slash = 0;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(tmp, 0755);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* flock(LOCK_EX) with a bound of `ms` milliseconds: a process that holds the file's flock
 * forever must not hang us. 0 ok; -1 with errno (ETIMEDOUT on the bound). */
static inline int egpu_flock_bounded(int fd, int ms)
{
    for (int i = 0; i <= ms; i++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        usleep(1000);
    }
    errno = ETIMEDOUT;
    return -1;
}

#endif
