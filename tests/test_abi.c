/* test_abi: the binary layout of every public struct in rockmate.h, pinned.
 *
 * IF THIS FAILS, YOU CHANGED THE ABI: a public struct's size or layout moved
 * (a field added, removed, reordered or retyped). That is allowed, but it
 * breaks programs built against the old header, so bump RKM_VERSION_MINOR in
 * rockmate.h (the policy is written there, by the version macros) and then
 * update these figures to the new ones. Adding a field at the end of a desc
 * keeps source compatibility (a zeroed desc still means the defaults), never
 * binary compatibility.
 *
 * The figures are those of version 0.7.0 (0.5.0 changed a function's
 * signature, rkm_parse_budget; 0.6.0 added rkm_planner_stats' work and
 * work_limit at its end; 0.7.0 added the pipeline replay's rkm_pipe_stage
 * and rkm_pipe_phase, which hosts read in arrays), on LP64 (x86-64;
 * aarch64 and the other LP64 ABIs lay these structs out the same). Elsewhere (32-bit, LLP64
 * Windows) they differ, and the test says SKIP. Sizes pin every struct; the
 * offsets pin the last field of each (a field inserted or moved before it
 * moves it) and every field of rkm_step and rkm_buffer, which hosts read in
 * arrays. */
#include "test.h"

#include <limits.h>
#include <stddef.h>

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu && ULONG_MAX == 0xFFFFFFFFFFFFFFFFu && UINT_MAX == 0xFFFFFFFFu
#define TEST_LP64 1
#else
#define TEST_LP64 0
#endif

#define CHECK_SIZE(type, size)                                                                    \
    do {                                                                                          \
        if (sizeof(type) != (size))                                                               \
            fprintf(stderr, "sizeof(%s) is %zu, pinned %zu: the ABI changed\n", #type, sizeof(type), \
                    (size_t)(size));                                                              \
        CHECK(sizeof(type) == (size));                                                            \
    } while (0)

#define CHECK_OFFSET(type, member, off)                                                               \
    do {                                                                                              \
        if (offsetof(type, member) != (off))                                                          \
            fprintf(stderr, "offsetof(%s, %s) is %zu, pinned %zu: the ABI changed\n", #type, #member, \
                    offsetof(type, member), (size_t)(off));                                           \
        CHECK(offsetof(type, member) == (off));                                                       \
    } while (0)

TEST(struct_layouts)
{
    /* Enums as fields (rkm_algo, rkm_rule) are int-sized on every LP64 ABI
     * the figures were made for; a compiler that packs enums is not one. */
    if (!TEST_LP64 || sizeof(rkm_algo) != sizeof(int) || sizeof(rkm_rule) != sizeof(int))
        TEST_SKIP("the pinned figures are for LP64 with int-sized enums");
    CHECK_SIZE(rkm_context_desc, 40);
    CHECK_OFFSET(rkm_context_desc, log_level, 32);
    CHECK_SIZE(rkm_op_desc, 112);
    CHECK_OFFSET(rkm_op_desc, phantom, 72);
    CHECK_OFFSET(rkm_op_desc, scratch, 96);
    CHECK_OFFSET(rkm_op_desc, flags, 104);
    CHECK_SIZE(rkm_op_costs, 32);
    CHECK_OFFSET(rkm_op_costs, bwd_ws, 24);
    CHECK_SIZE(rkm_tensor_info, 32);
    CHECK_OFFSET(rkm_tensor_info, n_contributors, 28);
    CHECK_SIZE(rkm_graph_stats, 40);
    CHECK_OFFSET(rkm_graph_stats, block_classes, 36);
    CHECK_SIZE(rkm_block_info, 24);
    CHECK_OFFSET(rkm_block_info, class_id, 20);
    CHECK_SIZE(rkm_step, 16);
    CHECK_OFFSET(rkm_step, kind, 0);
    CHECK_OFFSET(rkm_step, index, 4);
    CHECK_OFFSET(rkm_step, save, 8);
    CHECK_OFFSET(rkm_step, inplace, 12);
    CHECK_SIZE(rkm_sim_result, 96);
    CHECK_OFFSET(rkm_sim_result, failed, 20);
    CHECK_OFFSET(rkm_sim_result, recomputes, 72);
    CHECK_OFFSET(rkm_sim_result, wait_seconds, 88);
    CHECK_SIZE(rkm_buffer, 48);
    CHECK_OFFSET(rkm_buffer, first_step, 8);
    CHECK_OFFSET(rkm_buffer, bytes, 24);
    CHECK_OFFSET(rkm_buffer, offset, 32);
    CHECK_OFFSET(rkm_buffer, takes_over, 40);
    CHECK_SIZE(rkm_solve_desc, 80);
    CHECK_OFFSET(rkm_solve_desc, in_flight, 72);
    CHECK_OFFSET(rkm_solve_desc, ilp_budget, 40);
    CHECK_OFFSET(rkm_solve_desc, alignment, 48);
    CHECK_OFFSET(rkm_solve_desc, progress, 56);
    CHECK_OFFSET(rkm_solve_desc, progress_user, 64);
    CHECK_SIZE(rkm_progress, 56);
    CHECK_OFFSET(rkm_progress, algo, 4);
    CHECK_OFFSET(rkm_progress, stage_name, 8);
    CHECK_OFFSET(rkm_progress, fraction, 16);
    CHECK_OFFSET(rkm_progress, seconds, 48);
    CHECK_SIZE(rkm_plan_stats, 184);
    CHECK_OFFSET(rkm_plan_stats, in_flight, 160);
    CHECK_OFFSET(rkm_plan_stats, stage_peak, 168);
    CHECK_OFFSET(rkm_plan_stats, stage_arena_bytes, 176);
    CHECK_OFFSET(rkm_plan_stats, alignment, 88);
    CHECK_OFFSET(rkm_plan_stats, cut, 112);
    CHECK_OFFSET(rkm_plan_stats, offloads, 152);
    CHECK_SIZE(rkm_planner_stats, 88);
    CHECK_OFFSET(rkm_planner_stats, nested_classes, 64);
    CHECK_OFFSET(rkm_planner_stats, cut, 68);
    CHECK_OFFSET(rkm_planner_stats, work, 72);
    CHECK_OFFSET(rkm_planner_stats, work_limit, 80);
    CHECK_SIZE(rkm_fwd_call, 88);
    CHECK_OFFSET(rkm_fwd_call, micro, 80);
    CHECK_OFFSET(rkm_fwd_call, out_new, 56);
    CHECK_OFFSET(rkm_fwd_call, ws_bytes, 72);
    CHECK_SIZE(rkm_bwd_call, 104);
    CHECK_OFFSET(rkm_bwd_call, micro, 96);
    CHECK_OFFSET(rkm_bwd_call, saved, 64);
    CHECK_OFFSET(rkm_bwd_call, ws_bytes, 88);
    CHECK_SIZE(rkm_buffer_call, 32);
    CHECK_OFFSET(rkm_buffer_call, micro, 24);
    CHECK_OFFSET(rkm_buffer_call, bytes, 16);
    CHECK_SIZE(rkm_callbacks, 88);
    CHECK_OFFSET(rkm_callbacks, forward, 8);
    CHECK_OFFSET(rkm_callbacks, free_grad, 48);
    CHECK_OFFSET(rkm_callbacks, free_host, 80);
    CHECK_SIZE(rkm_copy_desc, 24);
    CHECK_OFFSET(rkm_copy_desc, latency_seconds, 16);
    CHECK_SIZE(rkm_copy_call, 40);
    CHECK_OFFSET(rkm_copy_call, micro, 32);
    CHECK_OFFSET(rkm_copy_call, wait_step, 24);
    CHECK_SIZE(rkm_arena_stats, 40);
    CHECK_OFFSET(rkm_arena_stats, blocks, 32);
    CHECK_SIZE(rkm_arena_exec_desc, 48);
    CHECK_OFFSET(rkm_arena_exec_desc, plan, 16);
    CHECK_OFFSET(rkm_arena_exec_desc, host, 32);
    CHECK_OFFSET(rkm_arena_exec_desc, allocate, 40);
    CHECK_SIZE(rkm_arena_capacity_info, 24);
    CHECK_OFFSET(rkm_arena_capacity_info, slack, 16);
    CHECK_SIZE(rkm_profile_desc, 40);
    CHECK_OFFSET(rkm_profile_desc, user, 32);
    CHECK_SIZE(rkm_pipe_stage, 32);
    CHECK_OFFSET(rkm_pipe_stage, send_bwd, 24);
    CHECK_SIZE(rkm_stage_memory, 72);
    CHECK_OFFSET(rkm_stage_memory, kept_bytes, 8);
    CHECK_OFFSET(rkm_stage_memory, alignment, 64);
    CHECK_SIZE(rkm_pipe_phase, 40);
    CHECK_OFFSET(rkm_pipe_phase, bwd, 8);
    CHECK_OFFSET(rkm_pipe_phase, start, 16);
    CHECK_OFFSET(rkm_pipe_phase, arrive, 32);
}

/* The header and the compiled library agree on the version (a program built
 * against one header and linked with another library would not). */
TEST(header_matches_library)
{
    CHECK(strcmp(rkm_version(), RKM_VERSION_STRING) == 0);
    CHECK(rkm_version_number() == RKM_VERSION_NUMBER);
    CHECK(RKM_VERSION_NUMBER == RKM_VERSION_MAJOR * 10000 + RKM_VERSION_MINOR * 100 + RKM_VERSION_PATCH);
}

int main(void)
{
    RUN(struct_layouts);
    RUN(header_matches_library);
    TEST_END();
}
