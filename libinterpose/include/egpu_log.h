/* egpu_log.h: stderr logging, level from EGPU_LOG_LEVEL (error|warn|info|debug). */
#ifndef EGPU_LOG_H
#define EGPU_LOG_H
enum { EGPU_LOG_ERROR = 0, EGPU_LOG_WARN = 1, EGPU_LOG_INFO = 2, EGPU_LOG_DEBUG = 3 };
void egpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define EGPU_ERR(...) egpu_log(EGPU_LOG_ERROR, __VA_ARGS__)
#define EGPU_WARN(...) egpu_log(EGPU_LOG_WARN, __VA_ARGS__)
#define EGPU_INFO(...) egpu_log(EGPU_LOG_INFO, __VA_ARGS__)
#define EGPU_DBG(...) egpu_log(EGPU_LOG_DEBUG, __VA_ARGS__)
#endif
