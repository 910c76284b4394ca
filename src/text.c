/* text.c -- text in and out: statements, numbers, buffered output, files
 *
 * What the graph (.rkg) and plan (.rkp) readers and writers share, and the
 * budget parser's numbers.
 *
 * Uses (through internal.h): base.c. */
#include "internal.h"

RKM__PRIVATE rkm_result rkm__rerr(rkm__reader *r, rkm_result code, const char *fmt, ...)
{
    char msg[RKM__ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rkm__err(r->ctx, code, "%s:%d: %s", r->src, (int)r->line, msg);
}

/* Next non-empty statement into r->tok. RKM_OK with ntok > 0, or ntok == 0
 * at the end of the text. */
RKM__PRIVATE rkm_result rkm__next_stmt(rkm__reader *r)
{
    r->ntok = 0;
    while (r->p < r->end) {
        const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
        const char *le = nl ? nl : r->end;
        size_t n = (size_t)(le - r->p);
        r->line++;
        if (!rkm__reserve(r->ctx, (void **)&r->buf, &r->cap, n + 1, 1)) return rkm__nomem(r->ctx, r->src);
        if (memchr(r->p, 0, n)) return rkm__rerr(r, RKM_ERROR_PARSE, "a NUL byte is not allowed in the text");
        memcpy(r->buf, r->p, n);
        r->buf[n] = 0;
        r->p = nl ? nl + 1 : r->end;
        char *hash = strchr(r->buf, '#');
        if (hash) *hash = 0;
        for (char *s = r->buf;;) {
            while (*s == ' ' || *s == '\t' || *s == '\r') s++;
            if (!*s) break;
            if (r->ntok == RKM__MAX_TOKENS) return rkm__rerr(r, RKM_ERROR_PARSE, "too many fields on one line");
            r->tok[r->ntok++] = s;
            while (*s && *s != ' ' && *s != '\t' && *s != '\r') s++;
            if (*s) *s++ = 0;
        }
        if (r->ntok) return RKM_OK;
    }
    return RKM_OK;
}

RKM__PRIVATE void rkm__reader_free(rkm__reader *r) { rkm__free(r->ctx, r->buf, r->cap); }

/* Unsigned 64-bit decimal: digits only, no overflow. */
RKM__PRIVATE int rkm__parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* The length of the decimal number s starts with,
 * [0-9]*[.[0-9]*][(e|E)[+-][0-9]+] with a digit somewhere; 0 if none. No
 * hex, no inf or nan: what strtod also takes is not the documented syntax. */
RKM__PRIVATE size_t rkm__decimal_len(const char *s)
{
    const char *p = s;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') p++, digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        if (*e == '+' || *e == '-') e++;
        if (*e >= '0' && *e <= '9') {
            while (*e >= '0' && *e <= '9') e++;
            p = e;
        }
    }
    return (size_t)(p - s);
}

/* The value of the decimal number s[0..n), finite and non-negative; 0 if not. */
RKM__PRIVATE int rkm__decimal_value(const char *s, size_t n, double *out)
{
    char buf[64];
    if (!n || n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    double v = strtod(buf, NULL);
    if (!isfinite(v) || v < 0) return 0;
    *out = v;
    return 1;
}

/* Read a whole file through the context allocator. */
RKM__PRIVATE rkm_result rkm__slurp(rkm_context *ctx, const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return rkm__err(ctx, RKM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, n = 0;
    char *buf = NULL;
    rkm_result res = RKM_OK;
    for (;;) {
        if (!rkm__reserve(ctx, (void **)&buf, &cap, n + 65536, 1)) {
            res = rkm__nomem(ctx, path);
            break;
        }
        errno = 0;
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            /* errno names the cause (EISDIR: a folder given as a file) */
            if (ferror(f))
                res = rkm__err(ctx, RKM_ERROR_IO, "%s: cannot read: %s", path, errno ? strerror(errno) : "read error");
            break;
        }
    }
    fclose(f);
    if (res) {
        rkm__free(ctx, buf, cap);
        return res;
    }
    /* Shrink to n + 1 bytes: callers free with *len + 1. */
    char *fit = rkm__realloc(ctx, buf, cap, n + 1);
    if (!fit) {
        rkm__free(ctx, buf, cap);
        return rkm__nomem(ctx, path);
    }
    *data = fit;
    *len = n;
    return RKM_OK;
}

RKM__PRIVATE void rkm__out_flush(rkm__out *o)
{
    if (o->n && !o->failed && o->fn(o->user, o->buf, o->n) != 0) o->failed = 1;
    o->n = 0;
}

RKM__PRIVATE void rkm__outf(rkm__out *o, const char *fmt, ...)
{
    char tmp[RKM__NAME_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1;
    if (o->n + (size_t)n > sizeof o->buf) rkm__out_flush(o);
    memcpy(o->buf + o->n, tmp, (size_t)n);
    o->n += (size_t)n;
}

static int rkm__file_write(void *user, const char *data, size_t len)
{
    return fwrite(data, 1, len, (FILE *)user) == len ? 0 : 1;
}

/* Open path, run writer(obj) into it, close; errors name the path. */
RKM__PRIVATE rkm_result rkm__write_file(rkm_context *ctx, const char *path, rkm_result (*writer)(const void *, rkm_write_fn, void *),
                                  const void *obj)
{
    if (!path) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "write: path is NULL");
    FILE *f = fopen(path, "wb");
    if (!f) return rkm__err(ctx, RKM_ERROR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    rkm_result res = writer(obj, rkm__file_write, f);
    if (fclose(f) != 0 && res == RKM_OK) res = rkm__err(ctx, RKM_ERROR_IO, "%s: write error", path);
    if (res == RKM_ERROR_IO) rkm__err(ctx, RKM_ERROR_IO, "%s: write error", path);
    return res;
}
