/* copy_graph.h -- docs/formats.md's worked example with a copy link and
 * plans of it, for the tests by hand (test_offload) and the out-of-memory
 * loop (test_oom). */
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

#endif
