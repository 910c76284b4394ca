/* copy_graph.h -- docs/formats.md's worked example with a copy link and
 * plans of it, and a random tiny graph with a link, for the tests by hand
 * (test_offload) and the out-of-memory loop (test_oom). */
#ifndef COPY_GRAPH_H
#define COPY_GRAPH_H

/* docs/formats.md's worked example with a copy, in whole seconds. */
#define G_COPY                                                              \
    "rockmate-graph 1\n"                                                    \
    "copy d2h=1000 h2d=1000\n"                                              \
    "tensor x 400 input\n"                                                  \
    "tensor h 1000\n"                                                       \
    "tensor a 1000\n"                                                       \
    "tensor s 1000\n"                                                       \
    "tensor loss 4\n"                                                       \
    "op fc   fwd=2 bwd=4 in=x out=h saved=x\n"                              \
    "op gelu fwd=1 bwd=1 in=h out=a saved=h\n"                              \
    "op add  fwd=0.5 bwd=0.5 in=h,a out=s\n"                                \
    "op ce   fwd=1 bwd=1 in=s out=loss saved=s phantom=200 fwd_ws=100\n"    \
    "loss loss\n"

#define P_COPY                                                                                   \
    "rockmate-plan 1\n"                                                                          \
    "fwd fc\nfwd gelu\noffload h\nfwd add\nfree a\nfwd ce save\nwait h\nfree h\nloss\nfree loss\n" \
    "bwd ce\nfree_saved ce\nfree_grad loss\nfree s\nbwd add\nfree_grad s\nprefetch h\nwait h\n"  \
    "bwd gelu\nfree_grad a\nfree h\nfree_host h\nbwd fc\nfree_grad h\n"

/* G_COPY's plan that rebuilds h for gelu's backward instead of offloading
 * it: 13 s (11 s of compute and fc's 2 s again), peak 3400 (add's forward;
 * add's backward with both gradients). */
#define P_RECOMPUTE                                                                              \
    "rockmate-plan 1\n"                                                                          \
    "fwd fc\nfwd gelu\nfwd add\nfree a\nfree h\nfwd ce save\nloss\nfree loss\n"                     \
    "bwd ce\nfree_saved ce\nfree_grad loss\nfree s\nbwd add\nfree_grad s\nfwd fc\n"                 \
    "bwd gelu\nfree_grad a\nfree h\nbwd fc\nfree_grad h\n"

/* A random tiny graph (test_offload's planner_against_brute_force, seed
 * 25): its lower bound is 224 bytes, rockmate's and checkmate's
 * recompute-only floors 240 bytes (alignment 1); with the link both plan
 * at 224. */
#define G_TINY_COPY                                                                                              \
    "rockmate-graph 1\ncopy d2h=31000000 h2d=30000000 latency=5e-07\ntensor x 64 input\ntensor t0_0 48\n"       \
    "tensor t0_1 32\ntensor t1_0 48\ntensor t1_1 32 nograd\ntensor t2_0 64\n"                                    \
    "op op0 fwd=2.043e-06 bwd=1e-05 in=x out=t0_0,t0_1\nop op1 fwd=4.024e-06 bwd=1e-05 in=t0_0 out=t1_0,t1_1 "  \
    "saved=t0_0\nop op2 fwd=5.051e-06 bwd=1.6e-05 in=t1_0 out=t2_0 saved=t1_0 fwd_ws=16\nloss t2_0\n"

#endif
