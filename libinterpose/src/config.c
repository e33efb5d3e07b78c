/* config.c: the interposer's configuration: a v1 JSON file (authoritative), else EGPU_*
 * environment variables, else refuse. A small hand-written JSON parser: whitespace and key
 * order do not matter, unknown keys are ignored, anything malformed is refused. */
#define _GNU_SOURCE
#include "egpu_config.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1ull << 20)

/* ---- JSON --------------------------------------------------------------------------- */
typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct jnode {
    jtype t;
    int b;
    double n;
    char *s;          /* J_STR value */
    char *key;        /* member name inside an object */
    struct jnode *child, *next;
} jnode;

#define J_MAX_NODES 2048
#define J_MAX_DEPTH 32
typedef struct {
    const char *p, *end;
    jnode nodes[J_MAX_NODES];
    int nn;
    char *strbuf;
    size_t strcap, strlen_;
    const char *err;
} jparser;

static void ws(jparser *j) { while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++; }

static jnode *newnode(jparser *j, jtype t)
{
    if (j->nn >= J_MAX_NODES) { j->err = "document too large"; return NULL; }
    jnode *n = &j->nodes[j->nn++];
    memset(n, 0, sizeof *n);
    n->t = t;
    return n;
}

static int putc_s(jparser *j, char c)
{
    if (j->strlen_ >= j->strcap) { j->err = "strings too long"; return -1; }
    j->strbuf[j->strlen_++] = c;
    return 0;
}

static char *parse_string(jparser *j)
{
    if (j->p >= j->end || *j->p != '"') { j->err = "expected a string"; return NULL; }
    j->p++;
    char *start = j->strbuf + j->strlen_;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) { j->err = "control character in string"; return NULL; }
        if (c != '\\') { if (putc_s(j, (char)c)) return NULL; continue; }
        if (j->p >= j->end) break;
        char e = *j->p++;
        switch (e) {
        case '"': case '\\': case '/': if (putc_s(j, e)) return NULL; break;
        case 'b': if (putc_s(j, '\b')) return NULL; break;
        case 'f': if (putc_s(j, '\f')) return NULL; break;
        case 'n': if (putc_s(j, '\n')) return NULL; break;
        case 'r': if (putc_s(j, '\r')) return NULL; break;
        case 't': if (putc_s(j, '\t')) return NULL; break;
        case 'u': {
            if (j->end - j->p < 4) { j->err = "bad \\u escape"; return NULL; }
            unsigned v = 0;
            for (int i = 0; i < 4; i++) {
                char h = j->p[i];
                if (!isxdigit((unsigned char)h)) { j->err = "bad \\u escape"; return NULL; }
                v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            j->p += 4;
            if (v < 0x80) { if (putc_s(j, (char)v)) return NULL; }
            else if (v < 0x800) { if (putc_s(j, (char)(0xC0 | (v >> 6))) || putc_s(j, (char)(0x80 | (v & 0x3F)))) return NULL; }
            else if (putc_s(j, (char)(0xE0 | (v >> 12))) || putc_s(j, (char)(0x80 | ((v >> 6) & 0x3F))) || putc_s(j, (char)(0x80 | (v & 0x3F)))) return NULL;
            break;
        }
        default: j->err = "bad escape in string"; return NULL;
        }
    }
    if (j->p >= j->end) { j->err = "unterminated string"; return NULL; }
    j->p++;
    if (putc_s(j, 0)) return NULL;
    return start;
}

static jnode *parse_value(jparser *j, int depth);

static jnode *parse_container(jparser *j, int depth, int obj)
{
    jnode *n = newnode(j, obj ? J_OBJ : J_ARR), **tail;
    if (!n) return NULL;
    tail = &n->child;
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == (obj ? '}' : ']')) { j->p++; return n; }
    for (;;) {
        char *key = NULL;
        ws(j);
        if (obj) {
            if (!(key = parse_string(j))) return NULL;
            ws(j);
            if (j->p >= j->end || *j->p != ':') { j->err = "expected ':'"; return NULL; }
            j->p++;
        }
        jnode *v = parse_value(j, depth + 1);
        if (!v) return NULL;
        v->key = key;
        *tail = v;
        tail = &v->next;
        ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == (obj ? '}' : ']')) { j->p++; return n; }
        j->err = obj ? "expected ',' or '}'" : "expected ',' or ']'";
        return NULL;
    }
}

static jnode *parse_value(jparser *j, int depth)
{
    if (depth > J_MAX_DEPTH) { j->err = "nesting too deep"; return NULL; }
    ws(j);
    if (j->p >= j->end) { j->err = "unexpected end of document"; return NULL; }
    char c = *j->p;
    if (c == '{' || c == '[') return parse_container(j, depth, c == '{');
    if (c == '"') {
        char *s = parse_string(j);
        if (!s) return NULL;
        jnode *n = newnode(j, J_STR);
        if (n) n->s = s;
        return n;
    }
    static const struct { const char *w; jtype t; int b; } lits[] = {{"true", J_BOOL, 1}, {"false", J_BOOL, 0}, {"null", J_NULL, 0}};
    for (size_t i = 0; i < 3; i++) {
        size_t l = strlen(lits[i].w);
        if ((size_t)(j->end - j->p) >= l && !strncmp(j->p, lits[i].w, l)) {
            j->p += l;
            jnode *n = newnode(j, lits[i].t);
            if (n) n->b = lits[i].b;
            return n;
        }
    }
    if (c == '-' || isdigit((unsigned char)c)) {
        /* JSON number grammar, checked by hand; strtod does the conversion. */
        const char *q = j->p;
        if (*q == '-') q++;
        if (q >= j->end || !isdigit((unsigned char)*q)) { j->err = "bad number"; return NULL; }
        if (*q == '0' && q + 1 < j->end && isdigit((unsigned char)q[1])) { j->err = "bad number (leading zero)"; return NULL; }
        while (q < j->end && isdigit((unsigned char)*q)) q++;
        if (q < j->end && *q == '.') { q++; if (q >= j->end || !isdigit((unsigned char)*q)) { j->err = "bad number"; return NULL; } while (q < j->end && isdigit((unsigned char)*q)) q++; }
        if (q < j->end && (*q == 'e' || *q == 'E')) {
            q++;
            if (q < j->end && (*q == '+' || *q == '-')) q++;
            if (q >= j->end || !isdigit((unsigned char)*q)) { j->err = "bad number"; return NULL; }
            while (q < j->end && isdigit((unsigned char)*q)) q++;
        }
        char tmp[64];
        size_t l = (size_t)(q - j->p);
        if (l >= sizeof tmp) { j->err = "number too long"; return NULL; }
        memcpy(tmp, j->p, l);
        tmp[l] = 0;
        j->p = q;
        jnode *n = newnode(j, J_NUM);
        if (n) n->n = strtod(tmp, NULL);
        return n;
    }
    j->err = "unexpected character";
    return NULL;
}

static const jnode *member(const jnode *obj, const char *key)
{
    const jnode *found = NULL;
    for (const jnode *m = obj->child; m; m = m->next)
        if (m->key && !strcmp(m->key, key)) found = m; /* last one wins, as in most parsers */
    return found;
}

/* ---- config ------------------------------------------------------------------------- */
static int get_str(const jnode *o, const char *key, char *out, size_t outlen, int required, char *err, size_t errlen)
{
    const jnode *v = member(o, key);
    if (!v) {
        if (required) { snprintf(err, errlen, "config: \"%s\" is required", key); return -1; }
        return 0;
    }
    if (v->t != J_STR) { snprintf(err, errlen, "config: \"%s\" must be a string", key); return -1; }
    if (strlen(v->s) >= outlen) { snprintf(err, errlen, "config: \"%s\" is too long", key); return -1; }
    snprintf(out, outlen, "%s", v->s);
    return 0;
}

static int get_int(const jnode *o, const char *key, long long lo, long long hi, long long *out, int required, char *err, size_t errlen)
{
    const jnode *v = member(o, key);
    if (!v) {
        if (required) { snprintf(err, errlen, "config: \"%s\" is required", key); return -1; }
        return 0;
    }
    if (v->t != J_NUM || v->n != floor(v->n) || v->n < (double)lo || v->n > (double)hi) {
        snprintf(err, errlen, "config: \"%s\" must be an integer in %lld..%lld", key, lo, hi);
        return -1;
    }
    *out = (long long)v->n;
    return 0;
}

static int get_enum(const jnode *o, const char *key, const char *a, const char *b, int *out, char *err, size_t errlen)
{
    char buf[32] = "";
    if (get_str(o, key, buf, sizeof buf, 0, err, errlen)) return -1;
    if (!buf[0] && !member(o, key)) return 0;
    if (!strcmp(buf, a)) *out = 0;
    else if (!strcmp(buf, b)) *out = 1;
    else { snprintf(err, errlen, "config: \"%s\" must be \"%s\" or \"%s\", not \"%s\"", key, a, b, buf); return -1; }
    return 0;
}

static uint64_t overhead_from_env(void)
{
    const char *e = getenv(ENV_CONTEXT_OVERHEAD_MIB);
    char *end;
    if (e && *e) {
        unsigned long long v = strtoull(e, &end, 10);
        if (!*end && v < (1ull << 20)) return v * MIB;
    }
    return (uint64_t)EGPU_CONTEXT_OVERHEAD_MIB_DEFAULT * MIB;
}

int egpu_config_parse_json(const char *text, size_t len, egpu_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    jparser *j = calloc(1, sizeof *j);
    if (!j) { snprintf(err, errlen, "config: out of memory"); return -1; }
    j->strcap = len + 16;
    j->strbuf = malloc(j->strcap);
    int rc = -1;
    if (!j->strbuf) { snprintf(err, errlen, "config: out of memory"); goto out; }
    j->p = text;
    j->end = text + len;
    jnode *root = parse_value(j, 0);
    if (root) { ws(j); if (j->p != j->end) { j->err = "trailing characters after the document"; root = NULL; } }
    if (!root) { snprintf(err, errlen, "config: malformed JSON at byte %ld: %s", (long)(j->p - text), j->err ? j->err : "?"); goto out; }
    if (root->t != J_OBJ) { snprintf(err, errlen, "config: the document must be an object"); goto out; }
    long long ver = 0;
    if (get_int(root, "version", 0, 1000, &ver, 1, err, errlen)) goto out;
    if (ver != EGPU_CONFIG_VERSION) { snprintf(err, errlen, "config: version %lld is not supported (expected %d)", ver, EGPU_CONFIG_VERSION); goto out; }
    if (get_str(root, "namespace", c->ns, sizeof c->ns, 0, err, errlen) ||
        get_str(root, "pod", c->pod, sizeof c->pod, 0, err, errlen) ||
        get_str(root, "pod_uid", c->pod_uid, sizeof c->pod_uid, 0, err, errlen) ||
        get_str(root, "container", c->container, sizeof c->container, 0, err, errlen) ||
        get_str(root, "container_region", c->container_region, sizeof c->container_region, 1, err, errlen) ||
        get_enum(root, "priority", "high", "low", &c->priority, err, errlen) ||
        get_enum(root, "compute_policy", "strict", "elastic", &c->compute_policy, err, errlen))
        goto out;
    if (!c->container_region[0]) { snprintf(err, errlen, "config: \"container_region\" is empty"); goto out; }
    const jnode *os = member(root, "memory_oversubscription");
    if (os && os->t != J_BOOL) { snprintf(err, errlen, "config: \"memory_oversubscription\" must be true or false"); goto out; }
    c->oversubscription = os ? os->b : 0;
    long long floor_pct = -1; /* optional (-1: absent): the node's lowPriorityFloorPercent */
    if (get_int(root, "low_priority_floor", 0, 100, &floor_pct, 0, err, errlen)) goto out;
    c->low_priority_floor = (int)floor_pct;
    const jnode *cards = member(root, "cards");
    if (!cards || cards->t != J_ARR || !cards->child) { snprintf(err, errlen, "config: \"cards\" must be a non-empty list"); goto out; }
    for (const jnode *k = cards->child; k; k = k->next) {
        if (c->ncards >= EGPU_REGION_MAX_CARDS) { snprintf(err, errlen, "config: more than %d cards", EGPU_REGION_MAX_CARDS); goto out; }
        if (k->t != J_OBJ) { snprintf(err, errlen, "config: cards[%d] must be an object", c->ncards); goto out; }
        egpu_card_cfg *cc = &c->cards[c->ncards];
        long long mib = 0, pct = 0, cores = 0;
        /* memory_mib, or memory_percentage (a raw container's share: the hook does not know
         * the card's size): exactly one of them */
        int by_pct = member(k, "memory_percentage") != NULL;
        if (get_str(k, "uuid", cc->uuid, sizeof cc->uuid, 1, err, errlen) ||
            (by_pct ? get_int(k, "memory_percentage", 1, 100, &pct, 1, err, errlen)
                    : get_int(k, "memory_mib", 1, 1ll << 40, &mib, 1, err, errlen)) ||
            get_int(k, "cores", 0, 100, &cores, 0, err, errlen) ||
            get_str(k, "card_region", cc->card_region, sizeof cc->card_region, 0, err, errlen))
            goto out;
        if (by_pct && member(k, "memory_mib")) {
            snprintf(err, errlen, "config: cards[%d]: set memory_mib or memory_percentage, not both", c->ncards);
            goto out;
        }
        if (!cc->uuid[0]) { snprintf(err, errlen, "config: cards[%d].uuid is empty", c->ncards); goto out; }
        for (int i = 0; i < c->ncards; i++)
            if (!strcmp(c->cards[i].uuid, cc->uuid)) { snprintf(err, errlen, "config: card %s listed twice", cc->uuid); goto out; }
        cc->memory_bytes = (uint64_t)mib * MIB;
        cc->memory_percent = (int)pct;
        cc->cores = (int)cores;
        c->ncards++;
    }
    c->source = EGPU_SRC_FILE;
    c->context_overhead = overhead_from_env();
    rc = 0;
out:
    free(j->strbuf);
    free(j);
    return rc;
}

static int env_int(const char *name, long long lo, long long hi, long long *out, int *present, char *err, size_t errlen)
{
    const char *e = getenv(name);
    *present = e && *e;
    if (!*present) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(e, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        snprintf(err, errlen, "%s=%s: must be an integer in %lld..%lld", name, e, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int env_choice(const char *name, const char *a, const char *b, int *out, char *err, size_t errlen)
{
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    if (!strcmp(e, a)) *out = 0;
    else if (!strcmp(e, b)) *out = 1;
    else { snprintf(err, errlen, "%s=%s: must be %s or %s", name, e, a, b); return -1; }
    return 0;
}

static int load_env(egpu_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    long long mib = 0, pct = 0, cores = 0;
    int has_mib, has_pct, has_cores;
    if (env_int(ENV_MEMORY_LIMIT_MIB, 1, 1ll << 40, &mib, &has_mib, err, errlen) ||
        env_int(ENV_MEMORY_PERCENTAGE, 1, 100, &pct, &has_pct, err, errlen) ||
        env_int(ENV_CORES, 0, 100, &cores, &has_cores, err, errlen))
        return -1;
    if (!has_mib && !has_pct) {
        snprintf(err, errlen, "no share configured: neither %s nor %s/%s is set, so CUDA stays off "
                 "(egpu never runs a process unlimited by accident)", EGPU_CONTAINER_CONFIG_PATH,
                 ENV_MEMORY_LIMIT_MIB, ENV_MEMORY_PERCENTAGE);
        return -1;
    }
    if (has_mib && has_pct) {
        snprintf(err, errlen, "set one of %s and %s, not both", ENV_MEMORY_LIMIT_MIB, ENV_MEMORY_PERCENTAGE);
        return -1;
    }
    c->env_limit_bytes = has_mib ? (uint64_t)mib * MIB : 0;
    c->env_percent = has_pct ? (int)pct : 0;
    c->env_cores = (int)cores;
    /* Read only here, where no config file exists (raw node, egpu run): in a pod the webhook's
     * EGPU_PRIORITY / _COMPUTE_POLICY / _MEMORY_OVERSUBSCRIPTION are informational copies and
     * the node's file decides (tests/runtime_hook/test_env_policies.py). */
    if (env_choice(ENV_PRIORITY, "high", "low", &c->priority, err, errlen) ||
        env_choice(ENV_COMPUTE_POLICY, "strict", "elastic", &c->compute_policy, err, errlen) ||
        env_choice(ENV_MEMORY_OVERSUBSCRIPTION, "false", "true", &c->oversubscription, err, errlen))
        return -1;
    const char *region = getenv(ENV_CONTAINER_REGION);
    if (region && *region) {
        snprintf(c->container_region, sizeof c->container_region, "%s", region);
    } else {
        const char *dir = getenv(ENV_RUNTIME_DIR);
        snprintf(c->container_region, sizeof c->container_region, "%s/%s/local-uid%u/%s",
                 dir && *dir ? dir : EGPU_RUNTIME_DIR_DEFAULT, EGPU_CONTAINERS_SUBDIR, (unsigned)getuid(),
                 EGPU_CONTAINER_REGION_FILE);
    }
    c->source = EGPU_SRC_ENV;
    c->context_overhead = overhead_from_env();
    return 0;
}

/* Which file is the config. /run/egpu/config.json, when it exists (whatever it is: a file, a
 * dangling link, something unreadable), is ALWAYS the config: the runtime hook put it there and
 * nothing in the container may override it. EGPU_CONFIG_PATH (tests, raw nodes) is honoured
 * only where that file does not exist, so setting it inside a pod cannot lift the share. */
static const char *config_path(void)
{
    struct stat st;
    if (lstat(EGPU_CONTAINER_CONFIG_PATH, &st) == 0 || errno != ENOENT) return EGPU_CONTAINER_CONFIG_PATH;
    const char *path = getenv(ENV_CONFIG_PATH);
    return path && *path ? path : EGPU_CONTAINER_CONFIG_PATH;
}

int egpu_config_load(egpu_config *c, char *err, size_t errlen)
{
    const char *path = config_path();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return load_env(c, err, errlen);
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(65536);
    ssize_t n = buf ? read(fd, buf, 65536) : -1;
    close(fd);
    if (n < 0 || n >= 65536) {
        free(buf);
        snprintf(err, errlen, "cannot read %s (unreadable or larger than 64 KiB)", path);
        return -1;
    }
    char sub[400];
    int rc = egpu_config_parse_json(buf, (size_t)n, c, sub, sizeof sub);
    free(buf);
    if (rc) {
        snprintf(err, errlen, "%s: %s", path, sub);
        return rc;
    }
    if (!strcmp(path, EGPU_CONTAINER_CONFIG_PATH)) {
        /* The node's file: the pod's environment must not change the share (it could set
         * the context overhead to 0 and hold contexts' memory uncharged). */
        c->node_file = 1;
        c->context_overhead = (uint64_t)EGPU_CONTEXT_OVERHEAD_MIB_DEFAULT * MIB;
    }
    return 0;
}

uint64_t egpu_config_limit(const egpu_config *c, const char *uuid, uint64_t total)
{
    if (c->source == EGPU_SRC_ENV)
        return c->env_limit_bytes ? c->env_limit_bytes : (total / MIB) * (uint64_t)c->env_percent / 100 * MIB; /* whole MiB, as booked */
    for (int i = 0; i < c->ncards; i++)
        if (!strcmp(c->cards[i].uuid, uuid))
            return c->cards[i].memory_percent ? (total / MIB) * (uint64_t)c->cards[i].memory_percent / 100 * MIB
                                              : c->cards[i].memory_bytes;
    return 0;
}
