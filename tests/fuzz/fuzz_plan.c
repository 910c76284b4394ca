/* fuzz_plan: the .rkp reader with the simulator, the layout and the
 * executor, against a fixed graph: tests/graphs/gpt2-tiny.rkg with every op
 * that can be declared in place declared so, and a copy link (read once;
 * plans without `inplace` or copy steps mean on it what they mean on the
 * file's graph).
 * A plan is refused with a message or handed out valid; a valid one lays
 * out without overlap, holds its peak, runs, and writes back to text that
 * reads to the same steps, laid out as it was. */
#include "fuzz.h"

static rkm_context *ctx;
static rkm_graph *graph;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!graph) {
        ctx = fuzz_ctx();
        rkm_graph *g = test_load_inplace_graph(ctx, "gpt2-tiny");
        rkm_copy_desc link = {1e12, 5e11, 1e-7};
        FUZZ_CHECK(g && rkm_graph_with_copy(g, &link, &graph) == RKM_OK);
        rkm_graph_destroy(g);
    }
    rkm_plan *p = NULL, *q = NULL;
    rkm_sim_result res;
    rkm_result r = rkm_plan_read_string(graph, (const char *)data, size, "fuzz.rkp", &res, &p);
    FUZZ_CHECK((r == RKM_OK) == (p != NULL));
    if (r == RKM_ERROR_PLAN) FUZZ_CHECK(!res.valid && res.rule != RKM_RULE_NONE);
    if (p) {
        FUZZ_CHECK(res.valid);
        fuzz_check_plan(p);
        sbuf a = {0};
        FUZZ_CHECK(rkm_plan_write(p, sbuf_write, &a) == RKM_OK);
        FUZZ_CHECK(rkm_plan_read_string(graph, a.data, a.len, "again.rkp", NULL, &q) == RKM_OK);
        FUZZ_CHECK(rkm_plan_num_steps(q) == rkm_plan_num_steps(p));
        FUZZ_CHECK(memcmp(rkm_plan_steps(p), rkm_plan_steps(q), rkm_plan_num_steps(p) * sizeof(rkm_step)) == 0);
        rkm_plan_stats ps, qs;
        FUZZ_CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK && rkm_plan_stats_get(q, &qs) == RKM_OK);
        FUZZ_CHECK(qs.alignment == ps.alignment && qs.arena_bytes == ps.arena_bytes);
        free(a.data);
    }
    rkm_plan_destroy(q);
    rkm_plan_destroy(p);
    return 0;
}
