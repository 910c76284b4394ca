/* base.c -- context, allocator, errors, small containers
 *
 * Uses (through internal.h): nothing else. */
#include "internal.h"

static void *rkm__default_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

RKM__PRIVATE void *rkm__alloc(rkm_context *ctx, size_t size)
{
    if (size == 0) size = 1;
    return ctx->alloc(ctx->alloc_user, NULL, 0, size);
}

RKM__PRIVATE void *rkm__calloc(rkm_context *ctx, size_t n, size_t elem)
{
    if (elem && n > SIZE_MAX / elem) return NULL;
    void *p = rkm__alloc(ctx, n * elem);
    if (p) memset(p, 0, n * elem > 0 ? n * elem : 1);
    return p;
}

RKM__PRIVATE void *rkm__realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size)
{
    if (new_size == 0) new_size = 1;
    if (!ptr) old_size = 0;
    return ctx->alloc(ctx->alloc_user, ptr, old_size, new_size);
}

RKM__PRIVATE void rkm__free(rkm_context *ctx, void *ptr, size_t size)
{
    if (ptr) ctx->alloc(ctx->alloc_user, ptr, size ? size : 1, 0);
}

/* rkm__reserve's growth: *p (an array of `elem`-byte items with capacity
 * *cap) to hold `need`, more than it does. */
RKM__PRIVATE int rkm__reserve_grow(rkm_context *ctx, void **p, size_t *cap, size_t need, size_t elem)
{
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) ncap *= 2;
    if (ncap > SIZE_MAX / elem) return 0;
    void *np = rkm__realloc(ctx, *p, *cap * elem, ncap * elem);
    if (!np) return 0;
    *p = np;
    *cap = ncap;
    return 1;
}

RKM__PRIVATE char *rkm__strdup(rkm_context *ctx, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = rkm__alloc(ctx, n);
    if (d) memcpy(d, s, n);
    return d;
}

RKM__PRIVATE void rkm__strfree(rkm_context *ctx, char *s)
{
    if (s) rkm__free(ctx, s, strlen(s) + 1);
}

static void rkm__logv(rkm_context *ctx, rkm_log_level level, const char *fmt, va_list ap)
{
    if (!ctx->log || (int)level > ctx->log_level) return;
    char buf[RKM__ERRMSG_SIZE];
    vsnprintf(buf, sizeof buf, fmt, ap);
    ctx->log(ctx->log_user, level, buf);
}

RKM__PRIVATE void rkm__log(rkm_context *ctx, rkm_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rkm__logv(ctx, level, fmt, ap);
    va_end(ap);
}

/* Record the message of a failed call and return its code. */
RKM__PRIVATE rkm_result rkm__err(rkm_context *ctx, rkm_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    va_end(ap);
    if (ctx->log && ctx->log_level >= RKM_LOG_ERROR) ctx->log(ctx->log_user, RKM_LOG_ERROR, ctx->errmsg);
    return code;
}

RKM__PRIVATE rkm_result rkm__nomem(rkm_context *ctx, const char *where)
{
    return rkm__err(ctx, RKM_ERROR_NOMEM, "%s: out of memory", where);
}

RKM__PRIVATE double rkm__now(void)
{
    struct timespec ts;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Checked 64-bit add: returns 0 on overflow. */
RKM__PRIVATE int rkm__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b) return 0;
    *out = a + b;
    return 1;
}

/* v rounded up to a multiple of a power of two a (v + a - 1 must fit). */
RKM__PRIVATE uint64_t rkm__round_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

const char *rkm_version(void) { return RKM_VERSION_STRING; }
int rkm_version_number(void) { return RKM_VERSION_NUMBER; }

const char *rkm_result_string(rkm_result r)
{
    static const char *const names[RKM_RESULT_COUNT] = {
        "ok",
        "out of memory",
        "invalid argument",
        "call not allowed in this state",
        "input/output error",
        "syntax error",
        "graph breaks a rule of the contract",
        "plan breaks a rule of the contract",
        "no plan fits the budget",
        "a host callback failed",
        "the ILP solver failed",
        "planning time ran out",
        "feature compiled out",
        "internal error (a bug in rockmate)",
        "cancelled by the progress callback",
    };
    if ((int)r < 0 || r >= RKM_RESULT_COUNT) return "unknown result";
    return names[r];
}

rkm_result rkm_context_create(const rkm_context_desc *desc, rkm_context **out)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.alloc) d.alloc = rkm__default_alloc;
    if (d.log_level < 0 || d.log_level > RKM_LOG_DEBUG) return RKM_ERROR_ARGUMENT;
    if (d.log_level == 0) d.log_level = RKM_LOG_WARN;
    rkm_context *ctx = d.alloc(d.alloc_user, NULL, 0, sizeof *ctx);
    if (!ctx) return RKM_ERROR_NOMEM;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = d.alloc;
    ctx->alloc_user = d.alloc_user;
    ctx->log = d.log;
    ctx->log_user = d.log_user;
    ctx->log_level = d.log_level;
    *out = ctx;
    return RKM_OK;
}

static void rkm__ctx_free(rkm_context *ctx) { ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0); }

RKM__PRIVATE void rkm__ctx_hold(rkm_context *ctx) { ctx->live++; }

RKM__PRIVATE void rkm__ctx_release(rkm_context *ctx)
{
    if (--ctx->live == 0 && ctx->destroyed) rkm__ctx_free(ctx);
}

RKM__PRIVATE void rkm__ctx_free_holder(rkm_context *ctx, void *holder, size_t size)
{
    rkm__free(ctx, holder, size);
    rkm__ctx_release(ctx); /* last: it may free ctx */
}

/* Deferred while graphs or arenas made with it live (as sqlite3_close_v2):
 * they keep working, messages and logger included, and the last one's
 * destroy frees the context. */
void rkm_context_destroy(rkm_context *ctx)
{
    if (!ctx) return;
    if (ctx->live) ctx->destroyed = 1;
    else rkm__ctx_free(ctx);
}

const char *rkm_context_errmsg(const rkm_context *ctx) { return ctx ? ctx->errmsg : ""; }

void *rkm_context_realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size)
{
    if (!ctx) return NULL;
    if (new_size == 0) {
        rkm__free(ctx, ptr, old_size);
        return NULL;
    }
    return rkm__realloc(ctx, ptr, old_size, new_size);
}

rkm_result rkm_context_fail(rkm_context *ctx, rkm_result code, const char *fmt, ...)
{
    if (!ctx || !fmt) return code;
    char msg[RKM__ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rkm__err(ctx, code, "%s", msg);
}

static uint64_t rkm__hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

RKM__PRIVATE int32_t rkm__map_find(const rkm__map *m, const char *name, rkm__name_of name_of, const void *owner)
{
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)rkm__hash(name) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (strcmp(name_of(owner, id), name) == 0) return id;
    }
}

/* Insert id (whose name is not yet in the map); 0 on allocation failure. */
RKM__PRIVATE int rkm__map_insert(rkm_context *ctx, rkm__map *m, int32_t id, rkm__name_of name_of, const void *owner)
{
    if ((m->count + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        int32_t *ns = rkm__alloc(ctx, ncap * sizeof *ns);
        if (!ns) return 0;
        for (size_t i = 0; i < ncap; i++) ns[i] = -1;
        for (size_t i = 0; i < m->cap; i++) {
            int32_t e = m->slots[i];
            if (e < 0) continue;
            size_t j = (size_t)rkm__hash(name_of(owner, e)) & (ncap - 1);
            while (ns[j] >= 0) j = (j + 1) & (ncap - 1);
            ns[j] = e;
        }
        rkm__free(ctx, m->slots, m->cap * sizeof *m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    size_t j = (size_t)rkm__hash(name_of(owner, id)) & (m->cap - 1);
    while (m->slots[j] >= 0) j = (j + 1) & (m->cap - 1);
    m->slots[j] = id;
    m->count++;
    return 1;
}

RKM__PRIVATE void rkm__map_free(rkm_context *ctx, rkm__map *m)
{
    rkm__free(ctx, m->slots, m->cap * sizeof *m->slots);
    memset(m, 0, sizeof *m);
}

