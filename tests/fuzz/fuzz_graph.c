/* fuzz_graph: the .rkg reader and writer. Any input is read or refused
 * with a message; what is read writes out, reads back, and writes out again
 * to the same text (the round trip is the identity). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rkm_context *ctx = fuzz_ctx();
    rkm_graph *g = NULL, *h = NULL;
    rkm_result r = rkm_graph_read_string(ctx, (const char *)data, size, "fuzz.rkg", &g);
    FUZZ_CHECK((r == RKM_OK) == (g != NULL));
    if (r) FUZZ_CHECK(rkm_context_errmsg(ctx)[0] != '\0');
    if (g) {
        sbuf a = {0}, b = {0};
        FUZZ_CHECK(rkm_graph_write(g, sbuf_write, &a) == RKM_OK);
        FUZZ_CHECK(rkm_graph_read_string(ctx, a.data, a.len, "again.rkg", &h) == RKM_OK);
        FUZZ_CHECK(rkm_graph_write(h, sbuf_write, &b) == RKM_OK);
        FUZZ_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
        rkm_graph_stats s1, s2;
        FUZZ_CHECK(rkm_graph_stats_get(g, &s1) == RKM_OK && rkm_graph_stats_get(h, &s2) == RKM_OK);
        FUZZ_CHECK(s1.baseline_peak == s2.baseline_peak && s1.block_classes == s2.block_classes);
        FUZZ_CHECK(s1.lower_bound <= s1.baseline_peak);
        free(a.data);
        free(b.data);
    }
    rkm_graph_destroy(h);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    return 0;
}
