/* layout.c -- memory layout: one arena, an offset for every buffer
 *
 * Uses (through internal.h): base.c. */
#include "internal.h"

/* ---------------------------------------------------------------------------
 * Memory layout: one arena, an offset for every buffer
 *
 * Buffers are recorded at a plan's birth with exact lifetimes (inclusive
 * step ranges: a buffer counts in the step that frees it, as in the
 * contract), so placing them is an offline problem (dynamic storage
 * allocation): give each an aligned offset so that buffers alive in the
 * same step never share a byte, in the least arena. The plan's aligned
 * peak, the most aligned bytes alive in one step, is a lower bound on any
 * layout, and the placer works towards it:
 * 1. an in-place chain (takes_over) is one block, its first buffer over the
 *    chain's lifetime; sizes round up to the alignment and count in units
 *    of it; zero-byte buffers sit at offset 0;
 * 2. the skyline (below): O(n log^2 n), at the bound on 63 % of the bundled
 *    graphs' plans (every algorithm, 90..20 % and the smallest budgets);
 * 3. where it misses: first fit in creation order (a dynamic allocator's
 *    layout: DTR plans on it, so for DTR plans it fits the budget), the
 *    library's first greedy in three orders (up to RKM__LAYOUT_GREEDY_ITEMS
 *    buffers), then a search over canonical placements (MiniMalloc:
 *    Moffitt, ASPLOS 2024) for a layout at the bound, then bisection
 *    between the bound and the best found. First fit has
 *    RKM__LAYOUT_FIRSTFIT_WORK units of work, the last two share
 *    RKM__LAYOUT_WORK (a unit: one buffer or section visited), so the
 *    layout is the same on every machine. All together, on 349 plans:
 *    89.1 % at the bound, the geometric mean of arena / bound 1.0015
 *    (bench_layout; 10x the work moves a few plans, at 10x the time).
 * ------------------------------------------------------------------------- */

/* A placement problem, in units of the alignment. Items are the buffers to
 * place; their lifetimes are section ranges [s0, s1) of a time axis
 * compressed to where lifetimes start and end. */
typedef struct rkm__lay {
    rkm_context *ctx;
    int32_t n, nsec;
    int32_t *s0, *s1;   /* [n] */
    int64_t *life;      /* [n] steps alive: the skyline's first tie-break */
    uint64_t *w;        /* [n] size in units */
    int32_t *rank[3];   /* [n] ranks in three preorders (MiniMalloc's: by lifetime, area
                           and section load in turn; see rkm__lay_ranks) */
    uint64_t *off;      /* [n] offsets being built (units) */
    uint64_t *best;     /* [n] the best layout found */
    uint64_t height;    /* its height (units); UINT64_MAX before the first */
    uint64_t bound;     /* the most units alive in one section: no layout is lower */
    uint64_t work;      /* units of work left to the search */
} rkm__lay;

/* ---- Skyline: the lowest stretch first, O(n log^2 n) ----
 * The skyline is the top of the placed items over the sections, kept as
 * maximal runs of one height ("segments"). Take the lowest segment (the
 * leftmost of equals); of the unplaced items whose sections lie inside it,
 * put the first in the preorder (rank[0]) on it; if none lies inside, the
 * segment can hold nothing more: raise it to its lower neighbour (the space
 * under it is lost) and merge. This is the bottom-left rule of strip
 * packing, and it places like the canonical order of the search below; on
 * the bundled graphs' plans it is as good as placing the item that can sit
 * lowest of all, which costs O(n^2) on long plans. The query "first rank
 * inside [a, b)" is a merge-sort tree over the items' first sections: per
 * level, each node's items sorted by their end, with a min-tree of ranks
 * over every level's array. */

/* A heap entry: a key (an offset, a height), then a rank, then an item. */
typedef struct rkm__hent {
    uint64_t key;
    int32_t pre, item;
} rkm__hent;

static int rkm__hent_less(const rkm__hent *a, const rkm__hent *b)
{
    if (a->key != b->key) return a->key < b->key;
    return a->pre != b->pre ? a->pre < b->pre : a->item < b->item;
}

static int rkm__hent_cmp(const void *x, const void *y)
{
    const rkm__hent *a = x, *b = y;
    return rkm__hent_less(a, b) ? -1 : rkm__hent_less(b, a);
}

static void rkm__heap_push(rkm__hent *h, int32_t *n, rkm__hent e)
{
    int32_t i = (*n)++;
    while (i > 0 && rkm__hent_less(&e, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static rkm__hent rkm__heap_pop(rkm__hent *h, int32_t *n)
{
    rkm__hent top = h[0], e = h[--*n];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && rkm__hent_less(&h[c + 1], &h[c])) c++;
        if (!rkm__hent_less(&h[c], &e)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = e;
    return top;
}

/* The unplaced items, by first section: level l's array holds every item,
 * grouped by node (first section >> l), each group sorted by end. */
typedef struct rkm__cands {
    int32_t n, levels, leaves, n2; /* leaves >= nsec, n2 >= n: powers of two */
    int32_t *end, *at, *pos;       /* [levels * n]: end and item per position, position per item */
    int32_t *first;                /* [levels * (leaves + 1)]: each node's first position */
    int32_t *mint;                 /* [levels * 2 * n2]: min-tree of ranks; INT32_MAX: placed */
    int32_t *by_rank;              /* [n] the item of each rank */
} rkm__cands;

static void rkm__cands_free(rkm_context *ctx, rkm__cands *c)
{
    size_t lv = (size_t)c->levels, n = (size_t)c->n + 1;
    rkm__free(ctx, c->end, lv * n * sizeof *c->end);
    rkm__free(ctx, c->at, lv * n * sizeof *c->at);
    rkm__free(ctx, c->pos, lv * n * sizeof *c->pos);
    rkm__free(ctx, c->first, lv * ((size_t)c->leaves + 1) * sizeof *c->first);
    rkm__free(ctx, c->mint, lv * 2 * (size_t)c->n2 * sizeof *c->mint);
    rkm__free(ctx, c->by_rank, n * sizeof *c->by_rank);
}

/* order: the items sorted by end (then rank). 0 on NOMEM. */
static int rkm__cands_init(const rkm__lay *L, rkm__cands *c, const int32_t *order)
{
    memset(c, 0, sizeof *c);
    c->n = L->n;
    c->leaves = c->n2 = 1;
    while (c->leaves < L->nsec) c->leaves *= 2;
    while (c->n2 < L->n) c->n2 *= 2;
    for (int32_t x = c->leaves; x; x >>= 1) c->levels++;
    size_t lv = (size_t)c->levels, n = (size_t)L->n + 1;
    c->end = rkm__alloc(L->ctx, lv * n * sizeof *c->end);
    c->at = rkm__alloc(L->ctx, lv * n * sizeof *c->at);
    c->pos = rkm__alloc(L->ctx, lv * n * sizeof *c->pos);
    c->first = rkm__alloc(L->ctx, lv * ((size_t)c->leaves + 1) * sizeof *c->first);
    c->mint = rkm__alloc(L->ctx, lv * 2 * (size_t)c->n2 * sizeof *c->mint);
    c->by_rank = rkm__alloc(L->ctx, n * sizeof *c->by_rank);
    if (!c->end || !c->at || !c->pos || !c->first || !c->mint || !c->by_rank) return 0;
    for (int32_t i = 0; i < L->n; i++) c->by_rank[L->rank[0][i]] = i;
    for (int32_t l = 0; l < c->levels; l++) { /* counting sort by node; the order by end stays */
        int32_t *first = c->first + (size_t)l * ((size_t)c->leaves + 1), *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
        int32_t nodes = c->leaves >> l;
        memset(first, 0, ((size_t)nodes + 1) * sizeof *first);
        for (int32_t i = 0; i < L->n; i++) first[(L->s0[i] >> l) + 1]++;
        for (int32_t j = 0; j < nodes; j++) first[j + 1] += first[j];
        int32_t *fill = c->pos + (size_t)l * n; /* the next free position per node, borrowed */
        for (int32_t j = 0; j < nodes; j++) fill[j] = first[j];
        for (int32_t k = 0; k < L->n; k++) c->at[(size_t)l * n + (size_t)fill[L->s0[order[k]] >> l]++] = order[k];
        for (int32_t k = 0; k < L->n; k++) {
            int32_t i = c->at[(size_t)l * n + (size_t)k];
            c->pos[(size_t)l * n + (size_t)i] = k;
            c->end[(size_t)l * n + (size_t)k] = L->s1[i];
            mint[c->n2 + k] = L->rank[0][i];
        }
        for (int32_t k = L->n; k < c->n2; k++) mint[c->n2 + k] = INT32_MAX;
        for (int32_t k = c->n2 - 1; k > 0; k--) mint[k] = mint[2 * k] < mint[2 * k + 1] ? mint[2 * k] : mint[2 * k + 1];
    }
    return 1;
}

static void rkm__cands_remove(rkm__cands *c, int32_t item)
{
    for (int32_t l = 0; l < c->levels; l++) {
        int32_t *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
        int32_t k = c->n2 + c->pos[(size_t)l * ((size_t)c->n + 1) + (size_t)item];
        for (mint[k] = INT32_MAX; k > 1; k /= 2) mint[k / 2] = mint[k] < mint[k ^ 1] ? mint[k] : mint[k ^ 1];
    }
}

/* The first rank among level l's positions [x, y). */
static int32_t rkm__cands_min(const rkm__cands *c, int32_t l, int32_t x, int32_t y)
{
    const int32_t *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
    int32_t m = INT32_MAX;
    for (x += c->n2, y += c->n2; x < y; x /= 2, y /= 2) {
        if (x & 1) m = mint[x] < m ? mint[x] : m, x++;
        if (y & 1) y--, m = mint[y] < m ? mint[y] : m;
    }
    return m;
}

/* The unplaced item of first rank inside sections [a, b), or -1. */
static int32_t rkm__cands_inside(const rkm__cands *c, int32_t a, int32_t b)
{
    int32_t best = INT32_MAX;
    size_t n = (size_t)c->n + 1;
    for (int32_t l = 0, x = a, y = b; x < y; l++, x /= 2, y /= 2) {
        int32_t node[2] = {-1, -1};
        if (x & 1) node[0] = x++;
        if (y & 1) node[1] = --y;
        for (int q = 0; q < 2; q++) {
            if (node[q] < 0) continue;
            const int32_t *first = c->first + (size_t)l * ((size_t)c->leaves + 1), *end = c->end + (size_t)l * n;
            int32_t lo = first[node[q]], hi = first[node[q] + 1];
            while (lo < hi) { /* the first position whose item ends after b */
                int32_t m = lo + (hi - lo) / 2;
                if (end[m] <= b) lo = m + 1;
                else hi = m;
            }
            int32_t r = rkm__cands_min(c, l, first[node[q]], lo);
            if (r < best) best = r;
        }
    }
    return best == INT32_MAX ? -1 : c->by_rank[best];
}

/* The skyline's segments, by first section: end, height, previous. */
typedef struct rkm__skyline {
    int32_t *end, *prev;
    uint64_t *h;
    uint8_t *alive;
    rkm__hent *heap; /* (height, start): the lowest first, lazily */
    int32_t nh;
} rkm__skyline;

static void rkm__sky_push(rkm__skyline *k, int32_t s) { rkm__heap_push(k->heap, &k->nh, (rkm__hent){k->h[s], s, k->end[s]}); }

/* Merge segment s with the next one (same height). */
static void rkm__sky_merge(rkm__skyline *k, int32_t s, int32_t nsec)
{
    int32_t t = k->end[s];
    k->end[s] = k->end[t];
    k->alive[t] = 0;
    if (k->end[s] < nsec) k->prev[k->end[s]] = s;
}

/* A new segment [a, b) at height h, merged with equal neighbours; pushed. */
static void rkm__sky_set(rkm__skyline *k, int32_t a, int32_t b, uint64_t h, int32_t before, int32_t nsec)
{
    k->end[a] = b, k->h[a] = h, k->alive[a] = 1, k->prev[a] = before;
    if (b < nsec) k->prev[b] = a;
    if (b < nsec && k->h[b] == h) rkm__sky_merge(k, a, nsec);
    if (before >= 0 && k->h[before] == h) {
        rkm__sky_merge(k, before, nsec);
        a = before;
    }
    rkm__sky_push(k, a);
}

/* The skyline layout into L->off; its height, or UINT64_MAX when memory ran out. */
static uint64_t rkm__lay_skyline(rkm__lay *L)
{
    rkm_context *ctx = L->ctx;
    size_t n = (size_t)L->n + 1, ns = (size_t)L->nsec + 1, nh = 5 * n + 8; /* pushes: 3 a placement, 1 a raise */
    rkm__cands c = {0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
    rkm__skyline k = {NULL, NULL, NULL, NULL, NULL, 0};
    rkm__hent *ord = rkm__alloc(ctx, n * sizeof *ord);
    int32_t *order = rkm__alloc(ctx, n * sizeof *order);
    k.end = rkm__alloc(ctx, ns * sizeof *k.end), k.prev = rkm__alloc(ctx, ns * sizeof *k.prev);
    k.h = rkm__alloc(ctx, ns * sizeof *k.h), k.alive = rkm__alloc(ctx, ns), k.heap = rkm__alloc(ctx, nh * sizeof *k.heap);
    int ok = ord && order && k.end && k.prev && k.h && k.alive && k.heap;
    if (ok) { /* the items by end, then rank */
        for (int32_t i = 0; i < L->n; i++) ord[i] = (rkm__hent){(uint64_t)L->s1[i], L->rank[0][i], i};
        qsort(ord, (size_t)L->n, sizeof *ord, rkm__hent_cmp);
        for (int32_t i = 0; i < L->n; i++) order[i] = ord[i].item;
    }
    ok = ok && rkm__cands_init(L, &c, order);
    uint64_t height = UINT64_MAX;
    if (ok) {
        height = 0;
        memset(k.alive, 0, ns);
        k.h[L->nsec] = UINT64_MAX; /* a sentinel: never merged into */
        rkm__sky_set(&k, 0, L->nsec, 0, -1, L->nsec);
        for (int32_t left = L->n; left > 0;) {
            rkm__hent e = rkm__heap_pop(k.heap, &k.nh);
            int32_t a = e.pre, b = e.item;
            if (!k.alive[a] || k.end[a] != b || k.h[a] != e.key) continue; /* stale */
            int32_t i = rkm__cands_inside(&c, a, b), before = k.prev[a];
            if (i < 0) { /* nothing fits: up to the lower neighbour */
                uint64_t hl = before >= 0 ? k.h[before] : UINT64_MAX, hr = b < L->nsec ? k.h[b] : UINT64_MAX;
                k.alive[a] = 0;
                rkm__sky_set(&k, a, b, hl < hr ? hl : hr, before, L->nsec);
                continue;
            }
            uint64_t top = e.key + L->w[i];
            L->off[i] = e.key;
            if (top > height) height = top;
            rkm__cands_remove(&c, i);
            left--;
            k.alive[a] = 0;
            if (L->s0[i] > a) { /* what is left of the segment, on either side */
                k.end[a] = L->s0[i], k.alive[a] = 1;
                rkm__sky_push(&k, a);
                before = a;
            }
            if (L->s1[i] < b) {
                k.end[L->s1[i]] = b, k.h[L->s1[i]] = e.key, k.alive[L->s1[i]] = 1, k.prev[L->s1[i]] = L->s0[i];
                if (b < L->nsec) k.prev[b] = L->s1[i];
                rkm__sky_push(&k, L->s1[i]);
            }
            rkm__sky_set(&k, L->s0[i], L->s1[i], top, before, L->nsec);
        }
    }
    rkm__cands_free(ctx, &c);
    rkm__free(ctx, ord, n * sizeof *ord);
    rkm__free(ctx, order, n * sizeof *order);
    rkm__free(ctx, k.end, ns * sizeof *k.end);
    rkm__free(ctx, k.prev, ns * sizeof *k.prev);
    rkm__free(ctx, k.h, ns * sizeof *k.h);
    rkm__free(ctx, k.alive, ns);
    rkm__free(ctx, k.heap, nh * sizeof *k.heap);
    return height;
}

/* Keep L->off as the best layout if it is lower than the best so far. */
static void rkm__lay_keep(rkm__lay *L, uint64_t height)
{
    if (height >= L->height) return;
    L->height = height;
    memcpy(L->best, L->off, (size_t)L->n * sizeof *L->best);
}

/* ---- First fit in creation order: what a dynamic allocator does ----
 * Each item, in the order the plan creates them, at the lowest offset free
 * of the items still alive when it is made. DTR plans on exactly this
 * allocator (dtr.c), so for them this layout fits the budget; on
 * others it is one more candidate. O(n x live), while work lasts. */
static uint64_t rkm__lay_firstfit(rkm__lay *L, int32_t *live)
{
    uint64_t height = 0;
    int32_t n_live = 0;
    for (int32_t i = 0; i < L->n; i++) {
        if (L->work < (uint64_t)n_live + 1) return UINT64_MAX;
        L->work -= (uint64_t)n_live + 1;
        int32_t m = 0, at = -1;
        uint64_t lo = 0;
        for (int32_t k = 0; k < n_live; k++) { /* drop the dead; find the first gap that holds i */
            int32_t j = live[k];
            if (L->s1[j] <= L->s0[i]) continue;
            if (at < 0 && L->off[j] - lo >= L->w[i]) at = m;
            if (at < 0) lo = L->off[j] + L->w[j];
            live[m++] = j;
        }
        n_live = m;
        if (at < 0) at = n_live;
        memmove(live + at + 1, live + at, (size_t)(n_live - at) * sizeof *live);
        live[at] = i;
        n_live++;
        L->off[i] = lo;
        if (lo + L->w[i] > height) height = lo + L->w[i];
    }
    return height;
}

/* ---- Greedy: one order, each item at the lowest offset free of the placed
 * items alive with it (the library's first placer, kept as a candidate:
 * on some plans it is the best of all). The placed items are kept sorted
 * by offset, so each placement is one scan: O(n^2), while work lasts. ---- */

/* The greedy layout in order ord (n items) into L->off; its height, or
 * UINT64_MAX when work ran out. placed: scratch for n items. */
static uint64_t rkm__lay_greedy(rkm__lay *L, const int32_t *ord, int32_t *placed)
{
    uint64_t height = 0;
    for (int32_t k = 0; k < L->n; k++) {
        int32_t i = ord[k], at = k;
        if (L->work < (uint64_t)k + 1) return UINT64_MAX;
        L->work -= (uint64_t)k + 1;
        uint64_t lo = 0;
        for (int32_t q = 0; q < k; q++) { /* offset order: the first gap that holds i */
            int32_t j = placed[q];
            if (!(L->s0[i] < L->s1[j] && L->s0[j] < L->s1[i])) continue;
            if (L->off[j] >= lo + L->w[i]) {
                at = q;
                break;
            }
            if (L->off[j] + L->w[j] > lo) lo = L->off[j] + L->w[j];
        }
        L->off[i] = lo;
        while (at > 0 && L->off[placed[at - 1]] > lo) at--; /* keep the list sorted by offset */
        while (at < k && L->off[placed[at]] <= lo) at++;
        memmove(placed + at + 1, placed + at, (size_t)(k - at) * sizeof *placed);
        placed[at] = i;
        if (lo + L->w[i] > height) height = lo + L->w[i];
    }
    return height;
}

/* ---- Search: canonical placements (MiniMalloc), depth first ----
 * Some layout of height C, if one exists, places its items one by one so
 * that each sits at the lowest offset the items before it leave free (its
 * "lowest offset": the highest top of an earlier item alive with it), in an
 * order where offsets never fall and items at the same offset come in rank
 * order. The search tries those orders, pruned by:
 * - dominance: an item placed at or above where another could sit whole
 *   leaves a gap that a canonical order never does;
 * - the sections: a section's unplaced units, stacked from the lowest
 *   offset any of them can have, must fit under C;
 * - decomposition: once no unplaced item spans a section boundary, the two
 *   sides are independent problems, each solved once;
 * - an item that touches no unplaced item: if the rest fails with it there,
 *   it fails with any other first.
 * Iterative (an explicit stack of frames), so that no C stack grows with
 * the problem; every change is logged and undone on backtracking. */

enum { RKM__UNDO_MO, RKM__UNDO_FLOOR, RKM__UNDO_TOTAL, RKM__UNDO_CUTS, RKM__UNDO_PLACED };

typedef struct rkm__lay_frame {
    int32_t *part;       /* the partition's items (placed ones included), a range of d->all */
    int32_t np, lo, hi;  /* their count, the sections [lo, hi) */
    uint64_t lastoff;    /* canonical order: nothing lower than this, */
    int32_t lastpre;     /* nor at it with a rank before this */
    uint64_t minh;       /* the lowest top any unplaced item can have (dominance) */
    uint64_t ckey;       /* the last candidate tried: the next is the first */
    int32_t cpre;        /* after it in (offset, rank) order */
    int32_t cur, hat;    /* the candidate placed now (-1: none); it touched no unplaced item */
    size_t undo;         /* undo log length before cur */
    size_t mark;         /* scratch length on entry */
    int32_t subs, nsub, sub; /* decomposition: nsub parts at scratch offset subs (lo, hi, first, count), the one running */
    size_t subs_end;     /* scratch length after the parts' lists */
} rkm__lay_frame;

typedef struct rkm__dfs {
    rkm__lay *L;
    const int32_t *pre;  /* [n] the preorder's ranks */
    uint64_t cap;        /* the height sought */
    uint64_t *mo;        /* [n] lowest offset of each unplaced item */
    uint8_t *placed;     /* [n] */
    uint64_t *floor, *total; /* [nsec] top of the placed items; units unplaced */
    int32_t *cuts;       /* [nsec] unplaced items spanning sections s and s + 1 */
    uint64_t *minmo;     /* [nsec] lowest offset of the unplaced items in it (per node) */
    int32_t *next;       /* [nsec + 1] union-find "next unpainted section" */
    rkm__hent *order;    /* [n] a node's unplaced items, sorted */
    int32_t *all;        /* [n] every item, reordered by the splits */
    int32_t *tmp, *tmpkey; /* [n] the splits' counting sort */
    int32_t *scratch;    /* candidate and part lists, a stack */
    size_t ns, scap;
    int32_t *uidx;       /* the undo log: kind << 29 | index, and the old value */
    uint64_t *uold;
    size_t nu, ucap;
    uint64_t nodes;      /* frames entered that the round robin still allows */
    rkm__lay_frame *fr;  /* frames */
    int32_t nf, fcap;
} rkm__dfs;

#define RKM__DFS_FAIL 0
#define RKM__DFS_FOUND 1
#define RKM__DFS_ABORT 2  /* out of work */
#define RKM__DFS_NOMEM 3

static int rkm__dfs_spend(rkm__dfs *d, uint64_t units)
{
    if (d->L->work < units) {
        d->L->work = 0;
        return 0;
    }
    d->L->work -= units;
    return 1;
}

static int rkm__dfs_log(rkm__dfs *d, int kind, int32_t index, uint64_t old)
{
    if (d->nu == d->ucap) {
        size_t c1 = d->ucap, c2 = d->ucap;
        if (!rkm__reserve(d->L->ctx, (void **)&d->uidx, &c1, d->nu + 1, sizeof *d->uidx) ||
            !rkm__reserve(d->L->ctx, (void **)&d->uold, &c2, d->nu + 1, sizeof *d->uold))
            return 0;
        d->ucap = c1 < c2 ? c1 : c2;
    }
    d->uidx[d->nu] = (int32_t)((uint32_t)kind << 29 | (uint32_t)index);
    d->uold[d->nu++] = old;
    return 1;
}

static void rkm__dfs_undo(rkm__dfs *d, size_t mark)
{
    while (d->nu > mark) {
        d->nu--;
        uint32_t x = (uint32_t)d->uidx[d->nu];
        int32_t i = (int32_t)(x & 0x1fffffffu);
        uint64_t v = d->uold[d->nu];
        switch (x >> 29) {
        case RKM__UNDO_MO: d->mo[i] = v; break;
        case RKM__UNDO_FLOOR: d->floor[i] = v; break;
        case RKM__UNDO_TOTAL: d->total[i] = v; break;
        case RKM__UNDO_CUTS: d->cuts[i] = (int32_t)v; break;
        default: d->placed[i] = 0; break;
        }
    }
}

/* n int32s on the scratch stack; -1 when it is full (the search gives up). */
static int32_t rkm__dfs_take(rkm__dfs *d, size_t n)
{
    if (d->scap - d->ns < n) return -1;
    size_t at = d->ns;
    d->ns += n;
    return (int32_t)at;
}

static int rkm__sec_overlap(const rkm__lay *L, int32_t a, int32_t b)
{
    return L->s0[a] < L->s1[b] && L->s0[b] < L->s1[a];
}

/* Union-find over sections: the first unpainted one from s. */
static int32_t rkm__dfs_find(int32_t *next, int32_t s)
{
    int32_t r = s;
    while (next[r] != r) r = next[r];
    while (next[s] != r) {
        int32_t t = next[s];
        next[s] = r;
        s = t;
    }
    return r;
}

/* A frame's entry: its unplaced items, the sections' check. Returns FOUND
 * when nothing is left to place, FAIL when the sections cannot fit under
 * cap, ABORT; else -1, the frame ready for its first candidate. */
static int rkm__dfs_enter(rkm__dfs *d, rkm__lay_frame *f)
{
    const rkm__lay *L = d->L;
    int32_t m = 0;
    uint64_t minh = UINT64_MAX;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t i = f->part[k];
        if (d->placed[i]) continue;
        d->order[m++] = (rkm__hent){d->mo[i], d->pre[i], i};
        if (d->mo[i] + L->w[i] < minh) minh = d->mo[i] + L->w[i];
    }
    if (!m) return RKM__DFS_FOUND;
    uint64_t lg = 1;
    while ((1u << lg) < (uint32_t)m && lg < 31) lg++;
    if (!rkm__dfs_spend(d, (uint64_t)f->np + (uint64_t)m * lg + 2 * (uint64_t)(f->hi - f->lo))) return RKM__DFS_ABORT;
    qsort(d->order, (size_t)m, sizeof *d->order, rkm__hent_cmp);
    /* Each section's floor: no unplaced item in it sits below the lowest
     * offset among them (painted lowest first), nor below lastoff. */
    for (int32_t s = f->lo; s <= f->hi; s++) d->next[s] = s;
    for (int32_t k = 0; k < m; k++) {
        int32_t i = d->order[k].item, end = L->s1[i] < f->hi ? L->s1[i] : f->hi;
        for (int32_t s = rkm__dfs_find(d->next, L->s0[i] > f->lo ? L->s0[i] : f->lo); s < end; s = rkm__dfs_find(d->next, s)) {
            d->minmo[s] = d->order[k].key;
            d->next[s] = s + 1;
        }
    }
    for (int32_t s = f->lo; s < f->hi; s++) {
        if (!d->total[s]) continue;
        uint64_t fl = d->floor[s] > f->lastoff ? d->floor[s] : f->lastoff;
        if (d->minmo[s] > fl) fl = d->minmo[s];
        if (fl + d->total[s] > d->cap) return RKM__DFS_FAIL;
    }
    f->minh = minh;
    f->ckey = f->lastoff;
    f->cpre = f->lastpre;
    return -1;
}

/* Place candidate i of frame f at its lowest offset, logging every change.
 * Returns 0, or NOMEM / ABORT. Sets f->hat and counts new zero cuts into
 * *zeros (their boundaries s, meaning between s and s + 1, at scratch *zat). */
static int rkm__dfs_place(rkm__dfs *d, rkm__lay_frame *f, int32_t i, int32_t *zat, int32_t *zeros)
{
    rkm__lay *L = d->L;
    uint64_t top = d->mo[i] + L->w[i];
    int32_t span = L->s1[i] - L->s0[i];
    if (!rkm__dfs_spend(d, (uint64_t)f->np + 3 * (uint64_t)span)) return RKM__DFS_ABORT;
    f->undo = d->nu;
    if (!rkm__dfs_log(d, RKM__UNDO_PLACED, i, 0)) return RKM__DFS_NOMEM;
    d->placed[i] = 1;
    L->off[i] = d->mo[i];
    f->hat = 1;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t j = f->part[k];
        if (d->placed[j] || !rkm__sec_overlap(L, i, j)) continue;
        f->hat = 0;
        if (d->mo[j] >= top) continue;
        if (!rkm__dfs_log(d, RKM__UNDO_MO, j, d->mo[j])) return RKM__DFS_NOMEM;
        d->mo[j] = top;
    }
    for (int32_t s = L->s0[i]; s < L->s1[i]; s++) {
        if (!rkm__dfs_log(d, RKM__UNDO_FLOOR, s, d->floor[s]) || !rkm__dfs_log(d, RKM__UNDO_TOTAL, s, d->total[s]))
            return RKM__DFS_NOMEM;
        d->floor[s] = top;
        d->total[s] -= L->w[i];
    }
    *zat = (int32_t)d->ns;
    *zeros = 0;
    for (int32_t s = L->s0[i]; s + 1 < L->s1[i]; s++) {
        if (!rkm__dfs_log(d, RKM__UNDO_CUTS, s, (uint64_t)d->cuts[s])) return RKM__DFS_NOMEM;
        if (--d->cuts[s] == 0 && s >= f->lo && s + 1 < f->hi) {
            if (rkm__dfs_take(d, 1) < 0) return RKM__DFS_ABORT;
            d->scratch[*zat + (*zeros)++] = s;
        }
    }
    return 0;
}

/* Split f's unplaced items at the zero cuts at scratch zat (ascending
 * boundaries: a cut at s lies between sections s and s + 1): f's list is
 * reordered in place (a stable counting sort: placed items first, then
 * each part's), and each part with items is recorded on the scratch as
 * (lo, hi, first, count), first indexing d->all. */
static int rkm__dfs_split(rkm__dfs *d, rkm__lay_frame *f, int32_t zat, int32_t zeros)
{
    const rkm__lay *L = d->L;
    int32_t subs = rkm__dfs_take(d, 4 * ((size_t)zeros + 1));
    if (subs < 0) return RKM__DFS_ABORT;
    if (!rkm__dfs_spend(d, 3 * (uint64_t)f->np + (uint64_t)zeros)) return RKM__DFS_ABORT;
    int32_t *count = d->next; /* free outside a frame's entry; zeros + 2 <= nsec + 1 */
    memset(count, 0, ((size_t)zeros + 2) * sizeof *count);
    for (int32_t k = 0; k < f->np; k++) {
        int32_t j = f->part[k], key = 0;
        if (!d->placed[j]) { /* 1 + the cuts at or before its first section */
            int32_t a = 0, b = zeros;
            while (a < b) {
                int32_t m = a + (b - a) / 2;
                if (d->scratch[zat + m] < L->s0[j]) a = m + 1;
                else b = m;
            }
            key = 1 + a;
        }
        d->tmpkey[k] = key;
        count[key]++;
    }
    for (int32_t z = 0, at = 0; z <= zeros + 1; z++) {
        int32_t c = count[z];
        count[z] = at;
        at += c;
    }
    for (int32_t k = 0; k < f->np; k++) d->tmp[count[d->tmpkey[k]]++] = f->part[k];
    memcpy(f->part, d->tmp, (size_t)f->np * sizeof *f->part);
    /* count[0] now ends the placed items, count[z + 1] part z */
    int32_t nsub = 0, lo = f->lo, first = count[0];
    for (int32_t z = 0; z <= zeros; z++) {
        int32_t hi = z < zeros ? d->scratch[zat + z] + 1 : f->hi, end = count[z + 1];
        if (end > first) {
            int32_t *p = &d->scratch[subs + 4 * nsub++];
            p[0] = lo, p[1] = hi, p[2] = (int32_t)(f->part - d->all) + first, p[3] = end - first;
        }
        first = end;
        lo = hi;
    }
    f->subs = subs;
    f->nsub = nsub;
    f->sub = 0;
    f->subs_end = d->ns;
    return 0;
}

static void rkm__dfs_push(rkm__dfs *d, int32_t *part, int32_t np, int32_t lo, int32_t hi, uint64_t lastoff,
                          int32_t lastpre)
{
    rkm__lay_frame *f = &d->fr[d->nf++];
    *f = (rkm__lay_frame){.part = part, .np = np, .lo = lo, .hi = hi, .lastoff = lastoff, .lastpre = lastpre, .cur = -1,
                          .mark = d->ns};
}

/* Push the frame of f's next part; 0 when none is left. */
static int rkm__dfs_next_part(rkm__dfs *d, rkm__lay_frame *f)
{
    if (f->sub >= f->nsub) return 0;
    const int32_t *p = &d->scratch[f->subs + 4 * f->sub++];
    rkm__dfs_push(d, &d->all[p[2]], p[3], p[0], p[1], 0, -1);
    return 1;
}

/* f's next candidate: the unplaced item first in (lowest offset, rank)
 * order after the last one tried (or, first, after the item placed before
 * f: the canonical order), below every unplaced item's top (dominance) and
 * fitting under cap; -1 when none is left. Scanned, not kept, so that a
 * frame holds no list. */
static int32_t rkm__dfs_next_cand(rkm__dfs *d, rkm__lay_frame *f)
{
    const rkm__lay *L = d->L;
    int32_t best = -1;
    uint64_t bk = 0;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t i = f->part[k];
        uint64_t mo = d->mo[i];
        if (d->placed[i] || mo >= f->minh || mo + L->w[i] > d->cap) continue;
        if (mo < f->ckey || (mo == f->ckey && d->pre[i] <= f->cpre)) continue;
        if (best < 0 || mo < bk || (mo == bk && d->pre[i] < d->pre[best])) best = i, bk = mo;
    }
    return best;
}

/* Try f's next candidate: place it and push what follows it. Returns -1
 * when a frame was pushed, else FAIL (none left), ABORT or NOMEM. */
static int rkm__dfs_try(rkm__dfs *d, rkm__lay_frame *f)
{
    if (!rkm__dfs_spend(d, (uint64_t)f->np)) return RKM__DFS_ABORT;
    int32_t i = rkm__dfs_next_cand(d, f), zat, zeros;
    f->cur = i;
    if (i < 0) return RKM__DFS_FAIL;
    uint64_t at = d->mo[i];
    f->ckey = at;
    f->cpre = d->pre[i];
    size_t ns = d->ns;
    int r = rkm__dfs_place(d, f, i, &zat, &zeros);
    if (r) return r;
    if (zeros && (r = rkm__dfs_split(d, f, zat, zeros))) return r;
    if (zeros && rkm__dfs_next_part(d, f)) return -1;
    /* no cut, or no item left: go on in the same partition */
    d->ns = ns;
    f->nsub = 0;
    rkm__dfs_push(d, f->part, f->np, f->lo, f->hi, at, d->pre[i]);
    return -1;
}

/* Depth-first search for a layout of height cap over all items; the
 * partitions at the start are those between sections no item spans. */
static int rkm__dfs_run(rkm__dfs *d)
{
    const rkm__lay *L = d->L;
    rkm__dfs_push(d, d->all, L->n, 0, L->nsec, 0, -1);
    rkm__lay_frame *root = &d->fr[0];
    int32_t zat = (int32_t)d->ns, zeros = 0, r;
    for (int32_t s = 0; s + 1 < L->nsec; s++)
        if (!d->cuts[s]) {
            if (rkm__dfs_take(d, 1) < 0) return RKM__DFS_ABORT;
            d->scratch[zat + zeros++] = s;
        }
    if ((r = rkm__dfs_split(d, root, zat, zeros))) return r;
    root->cur = -2; /* the root only runs its parts */
    if (!rkm__dfs_next_part(d, root)) return RKM__DFS_FOUND;
    int res = -1;
    while (d->nf > 0) {
        rkm__lay_frame *f = &d->fr[d->nf - 1];
        if (res == RKM__DFS_FOUND) { /* a child solved its part */
            if (f->nsub) d->ns = f->subs_end;
            if (f->nsub && rkm__dfs_next_part(d, f)) {
                res = -1;
                continue;
            }
            d->nf--; /* f solved: its placements stay */
            continue;
        }
        if (res == RKM__DFS_FAIL) {
            if (f->cur == -2) break;
            rkm__dfs_undo(d, f->undo);
            d->ns = f->mark;
            f->nsub = 0;
            if (f->hat) { /* nothing else can do better */
                d->ns = f->mark;
                d->nf--;
                continue;
            }
        } else if (res < 0) { /* a new frame */
            if (!d->nodes--) return RKM__DFS_ABORT;
            int e = rkm__dfs_enter(d, f);
            if (e >= 0) {
                if (e == RKM__DFS_ABORT || e == RKM__DFS_NOMEM) return e;
                res = e;
                d->ns = f->mark;
                d->nf--;
                continue;
            }
        }
        res = rkm__dfs_try(d, f);
        if (res == RKM__DFS_ABORT || res == RKM__DFS_NOMEM) return res;
        if (res == RKM__DFS_FAIL) {
            d->ns = f->mark;
            d->nf--;
        }
    }
    return res == RKM__DFS_FAIL ? RKM__DFS_FAIL : RKM__DFS_FOUND;
}

/* The search's arrays, for L; 0 or NOMEM. */
static int rkm__dfs_init(rkm__dfs *d, rkm__lay *L)
{
    size_t n = (size_t)L->n + 1, ns = (size_t)L->nsec + 1;
    memset(d, 0, sizeof *d);
    d->L = L;
    d->scap = 16 * n + 4096;
    d->fcap = 2 * L->n + 4;
    d->mo = rkm__alloc(L->ctx, n * sizeof *d->mo);
    d->placed = rkm__alloc(L->ctx, n);
    d->order = rkm__alloc(L->ctx, n * sizeof *d->order);
    d->floor = rkm__alloc(L->ctx, ns * sizeof *d->floor);
    d->total = rkm__alloc(L->ctx, ns * sizeof *d->total);
    d->minmo = rkm__alloc(L->ctx, ns * sizeof *d->minmo);
    d->cuts = rkm__alloc(L->ctx, ns * sizeof *d->cuts);
    d->next = rkm__alloc(L->ctx, (ns + 1) * sizeof *d->next);
    d->scratch = rkm__alloc(L->ctx, d->scap * sizeof *d->scratch);
    d->fr = rkm__alloc(L->ctx, (size_t)d->fcap * sizeof *d->fr);
    d->all = rkm__alloc(L->ctx, n * sizeof *d->all);
    d->tmp = rkm__alloc(L->ctx, n * sizeof *d->tmp);
    d->tmpkey = rkm__alloc(L->ctx, n * sizeof *d->tmpkey);
    return d->mo && d->placed && d->order && d->floor && d->total && d->minmo && d->cuts && d->next && d->scratch &&
           d->fr && d->all && d->tmp && d->tmpkey;
}

static void rkm__dfs_free(rkm__dfs *d)
{
    if (!d->L) return;
    rkm_context *ctx = d->L->ctx;
    size_t n = (size_t)d->L->n + 1, ns = (size_t)d->L->nsec + 1;
    rkm__free(ctx, d->mo, n * sizeof *d->mo);
    rkm__free(ctx, d->placed, n);
    rkm__free(ctx, d->order, n * sizeof *d->order);
    rkm__free(ctx, d->floor, ns * sizeof *d->floor);
    rkm__free(ctx, d->total, ns * sizeof *d->total);
    rkm__free(ctx, d->minmo, ns * sizeof *d->minmo);
    rkm__free(ctx, d->cuts, ns * sizeof *d->cuts);
    rkm__free(ctx, d->next, (ns + 1) * sizeof *d->next);
    rkm__free(ctx, d->scratch, d->scap * sizeof *d->scratch);
    rkm__free(ctx, d->fr, (size_t)d->fcap * sizeof *d->fr);
    rkm__free(ctx, d->all, n * sizeof *d->all);
    rkm__free(ctx, d->tmp, n * sizeof *d->tmp);
    rkm__free(ctx, d->tmpkey, n * sizeof *d->tmpkey);
    rkm__free(ctx, d->uidx, d->ucap * sizeof *d->uidx);
    rkm__free(ctx, d->uold, d->ucap * sizeof *d->uold);
}

/* One probe: a layout of height cap or less? */
static int rkm__dfs_probe(rkm__dfs *d, uint64_t cap)
{
    const rkm__lay *L = d->L;
    for (int32_t i = 0; i < L->n; i++) d->all[i] = i;
    memset(d->mo, 0, (size_t)L->n * sizeof *d->mo);
    memset(d->placed, 0, (size_t)L->n);
    memset(d->floor, 0, (size_t)L->nsec * sizeof *d->floor);
    memset(d->total, 0, (size_t)L->nsec * sizeof *d->total);
    memset(d->cuts, 0, (size_t)L->nsec * sizeof *d->cuts);
    for (int32_t i = 0; i < L->n; i++) { /* difference arrays */
        d->total[L->s0[i]] += L->w[i];
        if (L->s1[i] < L->nsec) d->total[L->s1[i]] -= L->w[i];
        d->cuts[L->s0[i]]++;
        if (L->s1[i] - 1 < L->nsec) d->cuts[L->s1[i] - 1]--;
    }
    for (int32_t s = 1; s < L->nsec; s++) {
        d->total[s] += d->total[s - 1];
        d->cuts[s] += d->cuts[s - 1];
    }
    d->cap = cap;
    d->nu = d->ns = 0;
    d->nf = 0;
    if (!rkm__dfs_spend(d, (uint64_t)L->n + (uint64_t)L->nsec)) return RKM__DFS_ABORT;
    return rkm__dfs_run(d);
}

static uint64_t rkm__lay_top(const rkm__lay *L)
{
    uint64_t h = 0;
    for (int32_t i = 0; i < L->n; i++)
        if (L->off[i] + L->w[i] > h) h = L->off[i] + L->w[i];
    return h;
}

/* One capacity: the three preorders in turn, each with a work limit that
 * doubles every round (MiniMalloc's round robin: one order often finds at
 * once what another misses after long), until one finds a layout, one
 * proves there is none (a search that ends without running out), or the
 * work is spent. */
static int rkm__lay_probe(rkm__lay *L, rkm__dfs *d, uint64_t cap)
{
    for (uint64_t limit = 2 * (uint64_t)L->n;; limit *= 2)
        for (int h = 0; h < 3; h++) {
            d->pre = L->rank[h];
            d->nodes = limit;
            int r = rkm__dfs_probe(d, cap);
            if (r != RKM__DFS_ABORT || !L->work) return r;
        }
}

/* The search: a layout at the bound (with half the work), else bisection
 * between the bound and the best so far (a probe that runs out of its
 * share counts as failed). 0 or NOMEM. */
static int rkm__lay_search(rkm__lay *L)
{
    rkm__dfs d;
    if (!rkm__dfs_init(&d, L)) {
        rkm__dfs_free(&d);
        return 0;
    }
    uint64_t lo = L->bound, hi = L->height - 1;
    int r = RKM__DFS_FAIL;
    for (int first = 1; lo <= hi && L->work; first = 0) {
        uint64_t cap = first ? lo : lo + (hi - lo) / 2, share = first ? L->work / 2 : L->work / 3 + 1;
        uint64_t keep = L->work - share;
        L->work = share;
        r = rkm__lay_probe(L, &d, cap);
        L->work += keep;
        if (r == RKM__DFS_NOMEM) break;
        if (r == RKM__DFS_FOUND) {
            uint64_t h = rkm__lay_top(L);
            rkm__lay_keep(L, h);
            hi = h - 1;
        } else
            lo = cap + 1;
    }
    rkm__dfs_free(&d);
    return r != RKM__DFS_NOMEM;
}

/* ---- The problem from a plan's buffers ---- */

static int rkm__i64_cmp(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The section of time t: the index of t among the sorted times. */
static int32_t rkm__lay_section(const int64_t *t, int32_t n, int64_t v)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t m = lo + (hi - lo) / 2;
        if (t[m] < v) lo = m + 1;
        else hi = m;
    }
    return lo;
}

/* A preorder's keys: three of lifetime (W), area (A) and the most units
 * alive in the item's sections (T), in the order of the preorder's name. */
typedef struct rkm__pkey {
    uint64_t k[3];
    int32_t item;
} rkm__pkey;

static int rkm__pkey_cmp(const void *x, const void *y)
{
    const rkm__pkey *a = x, *b = y;
    for (int q = 0; q < 3; q++)
        if (a->k[q] != b->k[q]) return a->k[q] > b->k[q] ? -1 : 1;
    return (a->item > b->item) - (a->item < b->item);
}

/* The three preorders' ranks and the bound. load: scratch, nsec + 1. */
static int rkm__lay_ranks(rkm__lay *L, uint64_t *load)
{
    static const char order[3][4] = {"WAT", "TAW", "TWA"};
    int32_t size = 1;
    while (size < L->nsec) size *= 2;
    size_t tb = 2 * (size_t)size * sizeof(uint64_t);
    rkm__pkey *pk = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *pk);
    uint64_t *mx = rkm__calloc(L->ctx, 2 * (size_t)size, sizeof *mx); /* a max-tree of the loads */
    int ok = pk && mx;
    if (ok) {
        memset(load, 0, ((size_t)L->nsec + 1) * sizeof *load);
        for (int32_t i = 0; i < L->n; i++) load[L->s0[i]] += L->w[i], load[L->s1[i]] -= L->w[i];
        L->bound = 0;
        for (int32_t s = 0; s < L->nsec; s++) {
            if (s) load[s] += load[s - 1];
            if (load[s] > L->bound) L->bound = load[s];
            mx[size + s] = load[s];
        }
        for (int32_t k = size - 1; k > 0; k--) mx[k] = mx[2 * k] > mx[2 * k + 1] ? mx[2 * k] : mx[2 * k + 1];
        for (int h = 0; h < 3; h++) {
            for (int32_t i = 0; i < L->n; i++) {
                uint64_t W = (uint64_t)L->life[i], A = L->w[i] > UINT64_MAX / W ? UINT64_MAX : L->w[i] * W, T = 0;
                for (int32_t x = L->s0[i] + size, y = L->s1[i] + size; x < y; x /= 2, y /= 2) {
                    if (x & 1) T = mx[x] > T ? mx[x] : T, x++;
                    if (y & 1) y--, T = mx[y] > T ? mx[y] : T;
                }
                for (int q = 0; q < 3; q++) pk[i].k[q] = order[h][q] == 'W' ? W : order[h][q] == 'A' ? A : T;
                pk[i].item = i;
            }
            qsort(pk, (size_t)L->n, sizeof *pk, rkm__pkey_cmp);
            for (int32_t i = 0; i < L->n; i++) L->rank[h][pk[i].item] = i;
        }
    }
    rkm__free(L->ctx, pk, ((size_t)L->n + 1) * sizeof *pk);
    rkm__free(L->ctx, mx, tb);
    return ok;
}

/* The greedy in its three orders (largest first, largest size x lifetime
 * first, created first), each kept if lower. 0 on NOMEM. */
static int rkm__lay_greedies(rkm__lay *L)
{
    int32_t *placed = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *placed);
    int32_t *ord = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *ord);
    rkm__pkey *pk = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *pk);
    int ok = placed && ord && pk;
    for (int pass = 0; ok && pass < 3 && L->height > L->bound; pass++) {
        for (int32_t i = 0; i < L->n; i++) {
            uint64_t late = UINT64_MAX - (uint64_t)L->s0[i], W = (uint64_t)L->life[i];
            uint64_t A = L->w[i] > UINT64_MAX / W ? UINT64_MAX : L->w[i] * W;
            pk[i] = (rkm__pkey){{pass == 0 ? L->w[i] : pass == 1 ? A : late, late, 0}, i};
        }
        qsort(pk, (size_t)L->n, sizeof *pk, rkm__pkey_cmp);
        for (int32_t i = 0; i < L->n; i++) ord[i] = pk[i].item;
        uint64_t h = rkm__lay_greedy(L, ord, placed);
        if (h != UINT64_MAX) rkm__lay_keep(L, h);
    }
    rkm__free(L->ctx, placed, ((size_t)L->n + 1) * sizeof *placed);
    rkm__free(L->ctx, ord, ((size_t)L->n + 1) * sizeof *ord);
    rkm__free(L->ctx, pk, ((size_t)L->n + 1) * sizeof *pk);
    return ok;
}

/* The items of buffers b[0..n): in-place chains merged into their first
 * buffer (head[i]: the chain's first), zero-byte buffers left out; their
 * sections, units and preorders. item[k]: the buffer of item k. 0 on NOMEM. */
static int rkm__lay_build(rkm__lay *L, const rkm_buffer *b, size_t n, uint64_t align, const int64_t *head,
                          const int64_t *last, int32_t *item)
{
    size_t ni = (size_t)L->n + 1, nt = 2 * ni;
    int64_t *t = rkm__alloc(L->ctx, nt * sizeof *t);
    uint64_t *load = NULL;
    int ok = t != NULL;
    int32_t u = 0;
    if (ok) {
        for (size_t i = 0, k = 0; i < n; i++)
            if (head[i] == (int64_t)i && b[i].bytes) {
                item[k] = (int32_t)i;
                t[2 * k] = b[i].first_step, t[2 * k + 1] = last[i] + 1;
                L->w[k] = rkm__round_up(b[i].bytes, align) / align;
                L->life[k] = last[i] - b[i].first_step + 1;
                k++;
            }
        qsort(t, 2 * (size_t)L->n, sizeof *t, rkm__i64_cmp);
        for (int32_t i = 0; i < 2 * L->n; i++)
            if (!u || t[i] != t[u - 1]) t[u++] = t[i];
        L->nsec = u ? u - 1 : 0;
        for (int32_t k = 0; k < L->n; k++) {
            L->s0[k] = rkm__lay_section(t, u, b[item[k]].first_step);
            L->s1[k] = rkm__lay_section(t, u, last[item[k]] + 1);
        }
        load = rkm__alloc(L->ctx, ((size_t)L->nsec + 1) * sizeof *load);
        ok = load && rkm__lay_ranks(L, load);
    }
    rkm__free(L->ctx, t, nt * sizeof *t);
    rkm__free(L->ctx, load, ((size_t)L->nsec + 1) * sizeof *load);
    return ok;
}

/* Lay out b[0..n) (lifetimes and takes_over as recorded) at alignment
 * `align` with the given stages: offsets into b, the arena and the aligned
 * peak. RKM_OK or RKM_ERROR_NOMEM (message left to the caller). */
RKM__PRIVATE rkm_result rkm__layout(rkm_context *ctx, rkm_buffer *b, size_t n, uint64_t align, unsigned stages,
                              uint64_t *work, uint64_t *arena, uint64_t *peak)
{
    /* the work first fit and the later stages may do, and what they did */
    uint64_t cap = work ? *work : UINT64_MAX, spent = 0, give;
    rkm__lay L;
    memset(&L, 0, sizeof L);
    L.ctx = ctx;
    size_t nb = n + 1;
    int64_t *head = rkm__alloc(ctx, nb * sizeof *head), *last = rkm__alloc(ctx, nb * sizeof *last);
    int32_t *item = rkm__alloc(ctx, nb * sizeof *item);
    int ok = head && last && item;
    for (size_t i = 0; ok && i < n; i++) {
        head[i] = b[i].takes_over >= 0 ? head[b[i].takes_over] : (int64_t)i;
        last[i] = b[i].last_step;
        if (last[i] > last[head[i]]) last[head[i]] = last[i];
        if (head[i] == (int64_t)i && b[i].bytes) L.n++;
    }
    size_t ni = (size_t)L.n + 1;
    if (ok) {
        L.s0 = rkm__alloc(ctx, ni * sizeof *L.s0), L.s1 = rkm__alloc(ctx, ni * sizeof *L.s1);
        L.life = rkm__alloc(ctx, ni * sizeof *L.life), L.w = rkm__alloc(ctx, ni * sizeof *L.w);
        L.off = rkm__alloc(ctx, ni * sizeof *L.off), L.best = rkm__alloc(ctx, ni * sizeof *L.best);
        for (int h = 0; h < 3; h++) L.rank[h] = rkm__alloc(ctx, ni * sizeof *L.rank[h]);
        ok = L.s0 && L.s1 && L.life && L.w && L.off && L.best && L.rank[0] && L.rank[1] && L.rank[2] &&
             rkm__lay_build(&L, b, n, align, head, last, item);
    }
    L.height = L.n ? UINT64_MAX : 0;
    if (ok && L.n && (stages & RKM__LAY_SKYLINE)) {
        uint64_t h = rkm__lay_skyline(&L);
        ok = h != UINT64_MAX;
        if (ok) rkm__lay_keep(&L, h);
    }
    if (ok && L.height > L.bound && (stages & RKM__LAY_SKYLINE)) {
        int32_t *live = rkm__alloc(ctx, ni * sizeof *live);
        L.work = give = RKM__LAYOUT_FIRSTFIT_WORK < cap ? RKM__LAYOUT_FIRSTFIT_WORK : cap;
        uint64_t h = live ? rkm__lay_firstfit(&L, live) : UINT64_MAX;
        spent += give - L.work;
        cap -= give - L.work;
        ok = live != NULL;
        if (h != UINT64_MAX) rkm__lay_keep(&L, h);
        rkm__free(ctx, live, ni * sizeof *live);
    }
    L.work = give = stages & RKM__LAY_SKYLINE ? (RKM__LAYOUT_WORK < cap ? RKM__LAYOUT_WORK : cap)
                                              : UINT64_MAX; /* the greedy alone: all it takes */
    if (ok && L.height > L.bound && (stages & RKM__LAY_GREEDY) && (L.n <= RKM__LAYOUT_GREEDY_ITEMS || stages == RKM__LAY_GREEDY))
        ok = rkm__lay_greedies(&L);
    /* the search improves on a layout; its undo log packs an index in 29 bits */
    if (ok && L.height > L.bound && L.height != UINT64_MAX && (stages & RKM__LAY_SEARCH) && L.n < (1 << 28) &&
        L.nsec < (1 << 28))
        ok = rkm__lay_search(&L);
    spent += give - L.work;
    if (work) *work = spent;
    if (ok) {
        for (size_t i = 0; i < n; i++) b[i].offset = 0;
        for (int32_t k = 0; k < L.n; k++) b[item[k]].offset = L.best[k] * align;
        for (size_t i = 0; i < n; i++) b[i].offset = b[head[i]].offset;
        *arena = L.height * align;
        *peak = L.bound * align;
    }
    rkm__free(ctx, head, nb * sizeof *head);
    rkm__free(ctx, last, nb * sizeof *last);
    rkm__free(ctx, item, nb * sizeof *item);
    rkm__free(ctx, L.s0, ni * sizeof *L.s0);
    rkm__free(ctx, L.s1, ni * sizeof *L.s1);
    rkm__free(ctx, L.life, ni * sizeof *L.life);
    rkm__free(ctx, L.w, ni * sizeof *L.w);
    rkm__free(ctx, L.off, ni * sizeof *L.off);
    rkm__free(ctx, L.best, ni * sizeof *L.best);
    for (int h = 0; h < 3; h++) rkm__free(ctx, L.rank[h], ni * sizeof *L.rank[h]);
    return ok ? RKM_OK : RKM_ERROR_NOMEM;
}

/* Whether the plan's buffers, rounded up to align, add up within 64 bits
 * (then every offset + size does too). */
RKM__PRIVATE int rkm__layout_fits(const rkm_plan *p, uint64_t align)
{
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_buffers; i++)
        if (p->buffers[i].bytes > UINT64_MAX - (align - 1) ||
            !rkm__add_u64(total, rkm__round_up(p->buffers[i].bytes, align), &total))
            return 0;
    return 1;
}

static rkm_result rkm__layout_too_big(const rkm_plan *p, uint64_t align, const char *fn)
{
    return rkm__err(p->ctx, RKM_ERROR_ARGUMENT,
                    "%s: the buffers rounded up to %llu bytes add up to more than 64 bits: no arena offsets can hold "
                    "them", fn, (unsigned long long)align);
}

/* The plan's own layout, at `alignment`, kept with it: offsets in
 * p->buffers, the figures in p->stats. Done once, before a plan is handed
 * out (the planner's candidates are never laid out). */
RKM__PRIVATE rkm_result rkm__plan_seal(rkm_plan *p, uint64_t alignment, uint64_t *work)
{
    if (!rkm__layout_fits(p, alignment)) return rkm__layout_too_big(p, alignment, "plan layout");
    rkm_result r;
    uint64_t arena, peak;
    if ((r = rkm__layout(p->ctx, p->buffers, p->n_buffers, alignment, RKM__LAY_ALL, work, &arena, &peak)))
        return rkm__nomem(p->ctx, "the plan's memory layout");
    p->stats.alignment = alignment;
    p->stats.aligned_peak = peak;
    p->stats.arena_bytes = arena;
    p->stats.in_flight = 1; /* a stage of more is the planner's to say (rkm__handout_seal) */
    p->stats.stage_peak = p->stats.peak;
    p->stats.stage_arena_bytes = arena;
    return RKM_OK;
}

rkm_result rkm_plan_layout(const rkm_plan *p, uint64_t alignment, rkm_buffer *buffers, uint64_t *arena_bytes)
{
    if (!p || !buffers || !arena_bytes)
        return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_layout: an output pointer is NULL") : RKM_ERROR_ARGUMENT;
    if (alignment & (alignment - 1))
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_layout: alignment %llu is not a power of two",
                        (unsigned long long)alignment);
    size_t n = p->n_buffers;
    if (n) memcpy(buffers, p->buffers, n * sizeof *buffers);
    if (p->stats.alignment && (!alignment || alignment == p->stats.alignment)) { /* the plan's own */
        *arena_bytes = p->stats.arena_bytes;
        return RKM_OK;
    }
    if (!alignment) alignment = RKM_ARENA_ALIGN; /* a plan born without a layout */
    if (!rkm__layout_fits(p, alignment)) return rkm__layout_too_big(p, alignment, "rkm_plan_layout");
    uint64_t peak;
    if (rkm__layout(p->ctx, buffers, n, alignment, RKM__LAY_ALL, NULL, arena_bytes, &peak))
        return rkm__nomem(p->ctx, "rkm_plan_layout");
    return RKM_OK;
}

