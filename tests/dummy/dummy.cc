/* dummy.cc -- the dummy device: the CUDA runtime and cuBLAS calls of
 * cuda_runtime.h and cublas_v2.h on the CPU. See README.md beside it.
 *
 * Parts: device and pinned memory (poisoned when allocated: NaN bytes, as
 * uninitialised as a GPU's), streams whose operations queue and run when
 * something waits for them, events, kernels (blocks one at a time, each
 * thread on a stack of its own for barriers and shuffles), cuBLAS's GEMMs,
 * injected failures, and a summary line on stderr at exit. */
#include "cuda_runtime.h"
#include "cublas_v2.h"
#include "dummy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define RKM_DUMMY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RKM_DUMMY_ASAN 1
#endif
#endif
#ifdef RKM_DUMMY_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__) && !defined(RKM_DUMMY_UCONTEXT)
#define RKM_DUMMY_UCONTEXT 1
#endif
#ifdef RKM_DUMMY_UCONTEXT
#include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

/* ---------------------------------------------------------------------------
 * The device's limits (an H200's) and the state of the dummy
 * ------------------------------------------------------------------------- */

const unsigned MAX_THREADS = 1024, MAX_BLOCK_X = 1024, MAX_BLOCK_Y = 1024, MAX_BLOCK_Z = 64;
const unsigned long long MAX_GRID_X = 2147483647ull, MAX_GRID_YZ = 65535ull;
const size_t MAX_DYN_SHARED = 48u << 10; /* without cudaFuncSetAttribute */
const unsigned char POISON = 0xff;       /* 0xffffffff is a NaN */

enum mem_kind { MEM_DEVICE, MEM_PINNED };

struct region {
    size_t bytes;
    mem_kind kind;
};

/* A GEMM's arguments, alpha and beta read at the call (host pointer mode). */
struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    float alpha, beta;
    const float *A, *B;
    float *C;
    long long sa, sb, sc;
};

struct op {
    uint64_t seq;
    enum { KERNEL, CALL, RECORD, WAIT } kind;
    rkm_dummy::job *kernel; /* KERNEL */
    const char *name;
    dim3 grid, block;
    int bad_arg; /* KERNEL: the first pointer argument outside device memory, -1 if none */
    std::vector<unsigned char> data; /* CALL: a pageable source, copied at the call */
    void (*call)(op &);              /* CALL */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    CUevent_st *event;      /* RECORD */
    CUstream_st *wait_on;   /* WAIT: the stream of the record waited for */
    uint64_t wait_seq;      /* ... and its sequence number */
    gemm_args gemm;         /* CALL of a GEMM */
};

} /* namespace */

struct CUstream_st {
    std::deque<op> q;
    bool legacy;
    bool nonblocking; /* cudaStreamNonBlocking: no implicit order with the legacy stream */
};

struct CUevent_st {
    CUstream_st *stream = nullptr; /* of the latest record */
    uint64_t recorded = 0;         /* sequence number of the latest record queued, 0: never */
    uint64_t completed = 0;        /* ... of the latest record run */
    double ms = 0.0;               /* when it ran */
};

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace {

struct fiber {
    void *sp = nullptr;
    char *stack = nullptr; /* usable part, above a guard page */
    size_t stack_bytes = 0;
#ifdef RKM_DUMMY_UCONTEXT
    ucontext_t uc;
#endif
};

enum { T_RUN, T_WARP, T_BLOCK, T_DONE };

struct counter {
    const char *name;
    long calls, fail_at;
};

struct state {
    std::map<uintptr_t, region> mem;
    size_t device_bytes = 0, device_peak = 0, device_limit = 0;
    std::set<CUstream_st *> streams;
    std::set<CUevent_st *> events;
    std::set<cublasContext *> handles;
    CUstream_st legacy;
    uint64_t seq = 0;
    cudaError_t last = cudaSuccess, sticky = cudaSuccess;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    bool eager = false; /* rkm_dummy::eager_nonblocking */
    long launches = 0, cooperative = 0, gemms = 0, pageable_async = 0, faults = 0;
    counter counters[12] = {{"cudaMalloc", 0, 0},      {"cudaMallocHost", 0, 0},  {"cudaEventCreate", 0, 0},
                            {"cudaEventRecord", 0, 0}, {"cudaMemcpy", 0, 0},      {"cudaMemcpyAsync", 0, 0},
                            {"cudaMemsetAsync", 0, 0}, {"cudaStreamCreate", 0, 0}, {"launch", 0, 0},
                            {"cublasCreate", 0, 0},    {"gemm", 0, 0},            {nullptr, 0, 0}};
    /* The kernel being run. */
    rkm_dummy::job *job = nullptr;
    const char *kname = nullptr;
    std::vector<fiber> fibers;
    std::vector<unsigned char> tstate;
    std::vector<unsigned char> parity;  /* per warp: the slot of its next shuffle */
    std::vector<uint64_t> slots;        /* per warp, 2 x 32 lanes */
    unsigned cur = 0, nthreads = 0;
    bool fiber_mode = false, barrier_hit = false;
    void *sched_sp = nullptr;
#ifdef RKM_DUMMY_UCONTEXT
    ucontext_t sched_uc;
#endif
    const void *main_bottom = nullptr;
    size_t main_size = 0;
};

void summary(void);

state *g_state;

state &init(void)
{
    state *s = g_state = new state;
    s->legacy.legacy = true;
    s->legacy.nonblocking = false;
    const char *lim = getenv("RKM_DUMMY_MEMORY");
    s->device_limit = lim ? (size_t)strtoull(lim, nullptr, 10) : (size_t)8 << 30;
    const char *f = getenv("RKM_DUMMY_FAIL");
    while (f && *f) { /* name:n[,name:n...] */
        const char *colon = strchr(f, ':'), *comma = strchr(f, ',');
        if (!colon) break;
        std::string name(f, (size_t)(colon - f));
        rkm_dummy::fail_nth(name.c_str(), strtol(colon + 1, nullptr, 10));
        f = comma ? comma + 1 : nullptr;
    }
#ifdef RKM_DUMMY_ASAN
    pthread_attr_t at; /* the scheduler's stack, for the sanitizer's fiber switches */
    void *addr = nullptr;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstack(&at, &addr, &s->main_size);
        pthread_attr_destroy(&at);
    }
    s->main_bottom = addr;
#endif
    atexit(summary);
    return *s;
}

/* The dummy's state, made at the first call. */
inline state &S(void) { return g_state ? *g_state : init(); }

/* A message from the dummy itself (what a GPU would show as a fault). */
void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda dummy: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

[[noreturn]] void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda dummy: fatal: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

double now_ms(void)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - S().t0).count();
}

counter *find_counter(const char *what)
{
    for (counter *c = S().counters; c->name; c++)
        if (!strcmp(c->name, what)) return c;
    fatal("no call named '%s' counts (see dummy.h)", what);
}

/* Counts a call of `what`; true when it is the one to fail. */
bool fails(const char *what)
{
    counter *c = find_counter(what);
    return ++c->calls == c->fail_at;
}

/* A failed call is the last error, as the runtime keeps it (but "not
 * ready", which is no error). */
cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess && e != cudaErrorNotReady) S().last = e;
    return e;
}

/* A kernel or a copy faulted: sticky, as a GPU's context is lost. */
void fault(cudaError_t e)
{
    S().faults++;
    if (S().sticky == cudaSuccess) S().sticky = e;
    S().last = S().sticky;
}

/* The region holding [p, p + bytes) (bytes 0: p may be its end), or null. */
const region *find_region(const void *p, size_t bytes, uintptr_t *start = nullptr)
{
    state &s = S();
    uintptr_t a = (uintptr_t)p;
    auto it = s.mem.upper_bound(a);
    if (it == s.mem.begin()) return nullptr;
    --it;
    if (a < it->first || a - it->first > it->second.bytes || bytes > it->second.bytes - (a - it->first))
        return nullptr;
    if (start) *start = it->first;
    return &it->second;
}

bool is_device(const void *p, size_t bytes)
{
    const region *r = find_region(p, bytes);
    return r && r->kind == MEM_DEVICE;
}

bool is_pinned(const void *p, size_t bytes)
{
    const region *r = find_region(p, bytes);
    return r && r->kind == MEM_PINNED;
}

/* ---------------------------------------------------------------------------
 * Streams: operations queue and run in order when waited for
 * ------------------------------------------------------------------------- */

void run_op(op &o);

CUstream_st *stream_of(cudaStream_t s) { return s ? s : &S().legacy; }

bool valid_stream(cudaStream_t s) { return !s || S().streams.count(s); }

/* Run stream s's operations up to sequence number `upto`. The legacy
 * default stream (0) and the blocking streams wait for each other: an
 * operation runs after every earlier one of the other side. A non-blocking
 * stream waits only for the events it is told to. */
void drain(CUstream_st *s, uint64_t upto)
{
    state &st = S();
    while (!s->q.empty() && s->q.front().seq <= upto) {
        op o = std::move(s->q.front());
        s->q.pop_front();
        if (s->legacy) {
            for (CUstream_st *t : st.streams)
                if (!t->nonblocking) drain(t, o.seq - 1);
        } else if (!s->nonblocking) {
            drain(&st.legacy, o.seq - 1);
        }
        run_op(o);
    }
}

void drain_all(void)
{
    state &st = S();
    drain(&st.legacy, UINT64_MAX);
    for (CUstream_st *t : st.streams) drain(t, UINT64_MAX);
}

uint64_t enqueue(cudaStream_t s, op &&o)
{
    o.seq = ++S().seq;
    uint64_t seq = o.seq;
    stream_of(s)->q.push_back(std::move(o));
    if (s && s->nonblocking && S().eager) drain(s, seq);
    return seq;
}

op make_op(int kind)
{
    op o;
    o.seq = 0;
    o.kind = (decltype(o.kind))kind;
    o.kernel = nullptr;
    o.name = nullptr;
    o.bad_arg = -1;
    o.call = nullptr;
    o.dst = nullptr;
    o.src = nullptr;
    o.bytes = 0;
    o.value = 0;
    o.event = nullptr;
    o.wait_on = nullptr;
    o.wait_seq = 0;
    memset(&o.gemm, 0, sizeof o.gemm);
    return o;
}

/* ---------------------------------------------------------------------------
 * Kernels: threads on stacks of their own
 * ------------------------------------------------------------------------- */

void fiber_main(void);

#ifndef RKM_DUMMY_UCONTEXT
/* Saves the callee-saved registers on the current stack and its pointer
 * in *save, then takes those of the stack `to` (System V x86-64). */
extern "C" void rkm_dummy_switch(void **save, void *to);
__asm__(".text\n"
        ".globl rkm_dummy_switch\n"
        ".type rkm_dummy_switch, @function\n"
        "rkm_dummy_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size rkm_dummy_switch, .-rkm_dummy_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

const size_t FIBER_STACK = 256u << 10;

/* A stack's first switch starts fiber_main. */
void fiber_start(fiber &f)
{
#ifdef RKM_DUMMY_UCONTEXT
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = f.stack_bytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main, 0);
#else
    uintptr_t *sp = (uintptr_t *)((uintptr_t)(f.stack + f.stack_bytes) & ~(uintptr_t)15);
    *--sp = 0;                         /* fiber_main's return address: it never returns */
    *--sp = (uintptr_t)&fiber_main;    /* where the first switch returns to */
    for (int i = 0; i < 6; i++) *--sp = 0; /* rbp (0 ends backtraces), rbx, r12-r15 */
    f.sp = sp;
#endif
}

void fiber_init(fiber &f)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m = (char *)mmap(nullptr, FIBER_STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fatal("no memory for a thread's stack");
    mprotect(m, page, PROT_NONE); /* a guard page below */
    f.stack = m + page;
    f.stack_bytes = FIBER_STACK;
    fiber_start(f);
}

/* A thread abandoned in the middle of a kernel (its block faulted): its
 * stack starts afresh, without the sanitizer's marks of its frames. */
void fiber_abandon(fiber &f)
{
#ifdef RKM_DUMMY_ASAN
    __asan_unpoison_memory_region(f.stack, f.stack_bytes);
#endif
    fiber_start(f);
}

void set_builtins(unsigned t)
{
    threadIdx.x = t % blockDim.x;
    threadIdx.y = t / blockDim.x % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

/* Switches from the stack whose pointer goes to *save (and context to
 * *save_uc) to thread t's stack, or to the scheduler's (t == nthreads). */
void jump(void **save, void *save_uc, unsigned t)
{
    state &s = S();
    bool sched = t == s.nthreads;
    fiber *to = sched ? nullptr : &s.fibers[t];
    if (!sched) {
        s.cur = t;
        set_builtins(t);
    }
#ifdef RKM_DUMMY_ASAN
    __sanitizer_start_switch_fiber(nullptr, sched ? s.main_bottom : to->stack, sched ? s.main_size : to->stack_bytes);
#endif
#ifdef RKM_DUMMY_UCONTEXT
    (void)save;
    swapcontext((ucontext_t *)save_uc, sched ? &s.sched_uc : &to->uc);
#else
    (void)save_uc;
    rkm_dummy_switch(save, sched ? s.sched_sp : to->sp);
#endif
#ifdef RKM_DUMMY_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

/* Scheduler -> thread t; the threads of the sweep then pass the CPU on
 * from one to the next (yield), and the last gives it back. */
void resume(unsigned t)
{
    state &s = S();
#ifdef RKM_DUMMY_UCONTEXT
    jump(nullptr, &s.sched_uc, t);
#else
    jump(&s.sched_sp, nullptr, t);
#endif
}

/* The running thread waits at a barrier or is done: on to the next
 * runnable thread of this sweep, or back to the scheduler. */
void yield(void)
{
    state &s = S();
    fiber &f = s.fibers[s.cur];
    unsigned t = s.cur + 1;
    while (t < s.nthreads && s.tstate[t] != T_RUN) t++;
#ifdef RKM_DUMMY_UCONTEXT
    jump(nullptr, &f.uc, t);
#else
    jump(&f.sp, nullptr, t);
#endif
}

/* Each stack runs one thread after another: the thread it was resumed
 * for. */
void fiber_main(void)
{
    state &s = S();
#ifdef RKM_DUMMY_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    for (;;) {
        s.job->call(s.job);
        s.tstate[s.cur] = T_DONE;
        yield();
    }
}

/* A barrier or a shuffle in a block that runs without stacks of its own:
 * the first block the kernel ran used none. */
void need_fibers(const char *what)
{
    state &s = S();
    if (s.fiber_mode) return;
    fatal("kernel %s: thread (%u,%u,%u) of block (%u,%u,%u) reached %s, but its block (0,0,0) ran without "
          "one; the dummy runs a kernel's threads on stacks of their own only when its first block needs them",
          s.kname, threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
}

/* A kernel's fault: the message, and the rest of the block abandoned. */
struct kernel_fault {
    cudaError_t e;
};

void block_fault(const char *fmt, ...)
{
    state &s = S();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda dummy: kernel %s, block (%u,%u,%u): ", s.kname, blockIdx.x, blockIdx.y, blockIdx.z);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* One block, every thread on its own stack. Returns false after a fault
 * (threads that wait at barriers nobody else reaches: a GPU hangs or
 * faults there). */
bool run_block_fibers(void)
{
    state &s = S();
    unsigned n = s.nthreads, warps = (n + 31) / 32;
    while (s.fibers.size() < n) {
        s.fibers.emplace_back();
        fiber_init(s.fibers.back());
    }
    s.tstate.assign(n, T_RUN);
    s.parity.assign(warps, 0);
    s.slots.assign((size_t)warps * 64, 0);
    for (;;) {
        unsigned first = 0;
        while (first < n && s.tstate[first] != T_RUN) first++;
        if (first < n) resume(first);
        bool released = false;
        for (unsigned w = 0; w < warps; w++) {
            unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, at_warp = 0, done = 0;
            for (unsigned t = lo; t < hi; t++) {
                at_warp += s.tstate[t] == T_WARP;
                done += s.tstate[t] == T_DONE;
            }
            if (!at_warp) continue;
            if (hi - lo < 32) {
                block_fault("a shuffle over all 32 lanes in a warp of %u threads", hi - lo);
                return false;
            }
            if (done) {
                block_fault("lanes of warp %u wait at a shuffle that %u lanes of it exited before", w, done);
                return false;
            }
            if (at_warp == 32) {
                for (unsigned t = lo; t < hi; t++) s.tstate[t] = T_RUN;
                s.parity[w] ^= 1;
                released = true;
            }
        }
        if (released) continue;
        unsigned at_block = 0, done = 0;
        for (unsigned t = 0; t < n; t++) {
            at_block += s.tstate[t] == T_BLOCK;
            done += s.tstate[t] == T_DONE;
        }
        if (done == n) return true;
        if (at_block + done == n) {
            if (done) {
                block_fault("%u threads wait at __syncthreads that %u threads of the block exited before", at_block,
                            done);
                return false;
            }
            for (unsigned t = 0; t < n; t++) s.tstate[t] = T_RUN;
            continue;
        }
        block_fault("threads wait at different barriers (a shuffle in one, __syncthreads in another): a deadlock");
        return false;
    }
}

void run_kernel(op &o)
{
    state &s = S();
    s.job = o.kernel;
    s.kname = o.name;
    gridDim = o.grid;
    blockDim = o.block;
    s.nthreads = o.block.x * o.block.y * o.block.z;
    unsigned long long nb = (unsigned long long)o.grid.x * o.grid.y * o.grid.z;
    /* Block 0 first, on stacks of their own (it tells whether the kernel
     * uses barriers); then the others from the last, as a GPU may run
     * them in any order. */
    s.barrier_hit = false;
    for (unsigned long long i = 0; i < nb; i++) {
        unsigned long long b = i == 0 ? 0 : nb - i;
        blockIdx.x = (unsigned)(b % o.grid.x);
        blockIdx.y = (unsigned)(b / o.grid.x % o.grid.y);
        blockIdx.z = (unsigned)(b / ((unsigned long long)o.grid.x * o.grid.y));
        if (i == 0 || s.barrier_hit) {
            s.fiber_mode = true;
            if (!run_block_fibers()) {
                for (unsigned t = 0; t < s.nthreads; t++)
                    if (s.tstate[t] != T_DONE) fiber_abandon(s.fibers[t]);
                fault(cudaErrorLaunchFailure);
                break;
            }
        } else {
            s.fiber_mode = false;
            for (unsigned t = 0; t < s.nthreads; t++) {
                s.cur = t;
                set_builtins(t);
                s.job->call(s.job);
            }
        }
    }
    if (s.barrier_hit) s.cooperative++;
    s.fiber_mode = false;
    s.job = nullptr;
}

/* ---------------------------------------------------------------------------
 * Running queued operations
 * ------------------------------------------------------------------------- */

void run_op(op &o)
{
    state &s = S();
    bool ok = s.sticky == cudaSuccess;
    switch (o.kind) {
    case op::KERNEL:
        if (ok && o.bad_arg >= 0) {
            say("kernel %s: pointer argument %d is not in device memory: an illegal address", o.name, o.bad_arg);
            fault(cudaErrorIllegalAddress);
        } else if (ok) {
            run_kernel(o);
        }
        o.kernel->destroy(o.kernel);
        break;
    case op::CALL:
        if (ok) o.call(o);
        break;
    case op::RECORD:
        if (o.seq >= o.event->completed) {
            o.event->completed = o.seq;
            o.event->ms = now_ms();
        }
        break;
    case op::WAIT:
        if (o.wait_on) drain(o.wait_on, o.wait_seq); /* NULL: its stream is gone, its work done */
        break;
    }
}

/* At exit: what ran, and what a GPU would have left behind. */
void summary(void)
{
    state &s = S();
    fflush(stdout);
    long left = 0, pinned = 0;
    size_t pending = s.legacy.q.size();
    for (CUstream_st *t : s.streams) pending += t->q.size();
    for (auto &m : s.mem) (m.second.kind == MEM_DEVICE ? left : pinned)++;
    fprintf(stderr,
            "cuda dummy: %ld launches (%ld with barriers), %ld GEMMs, %ld pageable async copies, %ld faults, "
            "device peak %zu bytes; left at exit: %ld device and %ld pinned allocations, %zu streams, %zu events, "
            "%zu handles, %zu operations never run\n",
            s.launches, s.cooperative, s.gemms, s.pageable_async, s.faults, s.device_peak, left, pinned,
            s.streams.size(), s.events.size(), s.handles.size(), pending);
    fputs("cuda dummy: calls:", stderr); /* what RKM_DUMMY_FAIL counts */
    for (counter *c = s.counters; c->name; c++) fprintf(stderr, " %s=%ld", c->name, c->calls);
    fputc('\n', stderr);
}

void copy_call(op &o) { memcpy(o.dst, o.data.empty() ? o.src : o.data.data(), o.bytes); }
void set_call(op &o) { memset(o.dst, o.value, o.bytes); }

/* Checks a copy's pointers against its kind; the kinds of both sides. */
cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, bool *dst_dev, bool *src_dev)
{
    *dst_dev = is_device(dst, 0);
    *src_dev = is_device(src, 0);
    if (kind == cudaMemcpyDefault) kind = *dst_dev ? (*src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                                   : (*src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src || want_dst != *dst_dev || want_src != *src_dev) return cudaErrorInvalidValue;
    if ((*dst_dev && !is_device(dst, bytes)) || (*src_dev && !is_device(src, bytes))) return cudaErrorInvalidValue;
    return cudaSuccess;
}

} /* namespace */

/* ---------------------------------------------------------------------------
 * The runtime API
 * ------------------------------------------------------------------------- */

#define STICKY()                                          \
    do {                                                  \
        if (S().sticky != cudaSuccess) return S().sticky; \
    } while (0)

/* cudaMalloc promises 256-byte alignment and no more: each block starts
 * 256 bytes past a 4096-byte boundary, so that code counting on more fails
 * here too (those 256 bytes poisoned for AddressSanitizer). */
#define RKM_DUMMY_SKEW 256

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    state &s = S();
    STICKY();
    if (!ptr) return set_error(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (fails("cudaMalloc") || bytes > s.device_limit - s.device_bytes) return set_error(cudaErrorMemoryAllocation);
    if (bytes == 0) return cudaSuccess;
    void *raw = nullptr;
    if (bytes > SIZE_MAX - RKM_DUMMY_SKEW || posix_memalign(&raw, 4096, bytes + RKM_DUMMY_SKEW) != 0)
        return set_error(cudaErrorMemoryAllocation);
#ifdef RKM_DUMMY_ASAN
    __asan_poison_memory_region(raw, RKM_DUMMY_SKEW);
#endif
    void *p = (char *)raw + RKM_DUMMY_SKEW;
    memset(p, POISON, bytes);
    s.mem[(uintptr_t)p] = region{bytes, MEM_DEVICE};
    s.device_bytes += bytes;
    if (s.device_bytes > s.device_peak) s.device_peak = s.device_bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    state &s = S();
    STICKY();
    if (!ptr) return cudaSuccess;
    auto it = s.mem.find((uintptr_t)ptr);
    if (it == s.mem.end() || it->second.kind != MEM_DEVICE) return set_error(cudaErrorInvalidValue);
    drain_all(); /* cudaFree waits for the device */
    s.device_bytes -= it->second.bytes;
    s.mem.erase(it);
    char *raw = (char *)ptr - RKM_DUMMY_SKEW;
#ifdef RKM_DUMMY_ASAN
    __asan_unpoison_memory_region(raw, RKM_DUMMY_SKEW);
#endif
    free(raw);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes)
{
    state &s = S();
    STICKY();
    if (!ptr) return set_error(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (fails("cudaMallocHost")) return set_error(cudaErrorMemoryAllocation);
    void *p = nullptr;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    memset(p, POISON, bytes);
    s.mem[(uintptr_t)p] = region{bytes, MEM_PINNED};
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    state &s = S();
    STICKY();
    if (!ptr) return cudaSuccess;
    auto it = s.mem.find((uintptr_t)ptr);
    if (it == s.mem.end() || it->second.kind != MEM_PINNED) return set_error(cudaErrorInvalidValue);
    drain_all(); /* copies from or to it may be queued */
    s.mem.erase(it);
    free(ptr);
    return cudaSuccess;
}

/* Synchronous: after every earlier operation of the blocking streams (the
 * legacy default stream's rule), and done when it returns. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    STICKY();
    bool dd, sd;
    if (fails("cudaMemcpy")) return set_error(cudaErrorLaunchFailure);
    cudaError_t e = check_copy(dst, src, bytes, kind, &dd, &sd);
    if (e != cudaSuccess) return set_error(e);
    op o = make_op(op::CALL);
    o.call = copy_call;
    o.dst = dst;
    o.src = src;
    o.bytes = bytes;
    drain(&S().legacy, enqueue(nullptr, std::move(o)));
    return S().sticky;
}

/* Pinned host memory is copied when the copy runs; pageable memory as a
 * GPU does it: a source is staged at the call, a destination is written
 * before the call returns (both counted: a pageable async copy is no
 * overlap and a hidden synchronisation). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream)
{
    state &s = S();
    STICKY();
    bool dd, sd;
    if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    if (fails("cudaMemcpyAsync")) return set_error(cudaErrorLaunchFailure);
    cudaError_t e = check_copy(dst, src, bytes, kind, &dd, &sd);
    if (e != cudaSuccess) return set_error(e);
    op o = make_op(op::CALL);
    o.call = copy_call;
    o.dst = dst;
    o.src = src;
    o.bytes = bytes;
    bool src_pageable = !sd && !is_pinned(src, bytes), dst_pageable = !dd && !is_pinned(dst, bytes);
    if (bytes && (src_pageable || dst_pageable)) s.pageable_async++;
    if (bytes && src_pageable) o.data.assign((const unsigned char *)src, (const unsigned char *)src + bytes);
    uint64_t seq = enqueue(stream, std::move(o));
    if (bytes && dst_pageable) drain(stream_of(stream), seq);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    STICKY();
    if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    if (fails("cudaMemsetAsync")) return set_error(cudaErrorLaunchFailure);
    if (bytes && !is_device(ptr, bytes)) return set_error(cudaErrorInvalidValue);
    op o = make_op(op::CALL);
    o.call = set_call;
    o.dst = ptr;
    o.value = value;
    o.bytes = bytes;
    enqueue(stream, std::move(o));
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    STICKY();
    if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking)) return set_error(cudaErrorInvalidValue);
    if (fails("cudaStreamCreate")) return set_error(cudaErrorLaunchFailure);
    *stream = new CUstream_st;
    (*stream)->legacy = false;
    (*stream)->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    S().streams.insert(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    STICKY();
    if (!stream || !S().streams.count(stream)) return set_error(cudaErrorInvalidResourceHandle);
    drain(stream, UINT64_MAX); /* its work completes */
    for (CUevent_st *e : S().events) /* its records have run */
        if (e->stream == stream) e->stream = nullptr;
    for (CUstream_st *t : S().streams) /* so have the operations others wait for */
        for (op &o : t->q)
            if (o.kind == op::WAIT && o.wait_on == stream) o.wait_on = nullptr;
    for (op &o : S().legacy.q)
        if (o.kind == op::WAIT && o.wait_on == stream) o.wait_on = nullptr;
    S().streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    STICKY();
    if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    drain(stream_of(stream), UINT64_MAX);
    return S().sticky;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    STICKY();
    if (!valid_stream(stream) || !S().events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
    if (flags) return set_error(cudaErrorInvalidValue);
    if (!event->recorded) return cudaSuccess; /* nothing to wait for */
    op o = make_op(op::WAIT);
    o.wait_on = event->stream;
    o.wait_seq = event->recorded;
    enqueue(stream, std::move(o));
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    STICKY();
    drain_all();
    return S().sticky;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    STICKY();
    if (!event) return set_error(cudaErrorInvalidValue);
    if (fails("cudaEventCreate")) return set_error(cudaErrorMemoryAllocation);
    *event = new CUevent_st;
    S().events.insert(*event);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    STICKY();
    if (!S().events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
    /* Its records may still be queued, on any stream it was recorded on: a
     * GPU completes them after the destroy; here they run first. */
    state &st = S();
    for (CUstream_st *t : st.streams)
        for (size_t i = t->q.size(); i-- > 0;)
            if (t->q[i].kind == op::RECORD && t->q[i].event == event) {
                drain(t, t->q[i].seq);
                break;
            }
    if (event->stream) drain(event->stream, event->recorded);
    S().events.erase(event);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    STICKY();
    if (!S().events.count(event) || !valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    if (fails("cudaEventRecord")) return set_error(cudaErrorLaunchFailure);
    op o = make_op(op::RECORD);
    o.event = event;
    event->stream = stream_of(stream);
    event->recorded = enqueue(stream, std::move(o));
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    STICKY();
    if (!S().events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
    if (event->stream) drain(event->stream, event->recorded);
    return S().sticky;
}

/* Both events must have run: a time asked for before the events it needs
 * is cudaErrorNotReady, as on a GPU. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    STICKY();
    if (!ms) return set_error(cudaErrorInvalidValue);
    if (!S().events.count(start) || !S().events.count(end) || !start->recorded || !end->recorded)
        return set_error(cudaErrorInvalidResourceHandle);
    if (start->completed < start->recorded || end->completed < end->recorded) return set_error(cudaErrorNotReady);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    state &s = S();
    cudaError_t e = s.sticky != cudaSuccess ? s.sticky : s.last;
    s.last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return S().sticky != cudaSuccess ? S().sticky : S().last; }

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

/* ---------------------------------------------------------------------------
 * Device code
 * ------------------------------------------------------------------------- */

void __syncthreads(void)
{
    state &s = S();
    need_fibers("__syncthreads");
    s.barrier_hit = true;
    s.tstate[s.cur] = T_BLOCK;
    yield();
}

namespace rkm_dummy {

uint64_t shfl_xor(unsigned mask, uint64_t v, int lane_mask, int width)
{
    state &s = S();
    need_fibers("a shuffle");
    if (mask != 0xffffffffu || width != 32 || lane_mask < 0 || lane_mask > 31)
        fatal("kernel %s: only full-warp shuffles (mask 0xffffffff, width 32) are emulated", s.kname);
    s.barrier_hit = true;
    unsigned t = s.cur, w = t / 32, lane = t % 32, p = s.parity[w];
    s.slots[(size_t)w * 64 + p * 32 + lane] = v;
    s.tstate[t] = T_WARP;
    yield();
    return s.slots[(size_t)w * 64 + p * 32 + (lane ^ (unsigned)lane_mask)];
}

void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, job *j, const void *const *ptrs,
            int n_ptrs)
{
    state &s = S();
    cudaError_t e = cudaSuccess;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (s.sticky != cudaSuccess) e = s.sticky;
    else if (!valid_stream(stream)) e = cudaErrorInvalidResourceHandle;
    else if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || threads > MAX_THREADS ||
             block.x > MAX_BLOCK_X || block.y > MAX_BLOCK_Y || block.z > MAX_BLOCK_Z || grid.x > MAX_GRID_X ||
             grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ || shmem > MAX_DYN_SHARED)
        e = cudaErrorInvalidConfiguration;
    else if (fails("launch"))
        e = cudaErrorLaunchOutOfResources;
    if (e != cudaSuccess) {
        if (e == cudaErrorInvalidConfiguration)
            say("kernel %s: launch <<<(%u,%u,%u), (%u,%u,%u), %zu>>> is over the device's limits", name, grid.x,
                grid.y, grid.z, block.x, block.y, block.z, shmem);
        set_error(e);
        j->destroy(j);
        return;
    }
    s.launches++;
    op o = make_op(op::KERNEL);
    o.kernel = j;
    o.name = name;
    o.grid = grid;
    o.block = block;
    for (int i = 0; i < n_ptrs && o.bad_arg < 0; i++)
        if (ptrs[i] && !find_region(ptrs[i], 0)) o.bad_arg = i;
    enqueue(stream, std::move(o));
}

void fail_nth(const char *what, long nth) { find_counter(what)->fail_at = nth; }

long calls(const char *what) { return find_counter(what)->calls; }

void eager_nonblocking(bool on) { S().eager = on; }

long live(const char *what)
{
    state &s = S();
    long n = 0;
    if (!strcmp(what, "device") || !strcmp(what, "pinned"))
        for (auto &m : s.mem) n += m.second.kind == (!strcmp(what, "device") ? MEM_DEVICE : MEM_PINNED);
    else if (!strcmp(what, "streams")) n = (long)s.streams.size();
    else if (!strcmp(what, "events")) n = (long)s.events.size();
    else if (!strcmp(what, "handles")) n = (long)s.handles.size();
    else fatal("live: no objects named '%s'", what);
    return n;
}

void reset_errors(void)
{
    state &s = S();
    for (counter *c = s.counters; c->name; c++) c->fail_at = 0;
    s.last = s.sticky = cudaSuccess;
}

} /* namespace rkm_dummy */

/* ---------------------------------------------------------------------------
 * cuBLAS
 * ------------------------------------------------------------------------- */

namespace {

/* The GEMM's loops are not instrumented by the sanitizers (whose checks
 * keep them from vectorising): gemm() has checked every matrix against
 * device memory before queueing it, and the indices are ints by cuBLAS's
 * own types. */
#if defined(__GNUC__) || defined(__clang__)
#define RKM_DUMMY_UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#else
#define RKM_DUMMY_UNCHECKED
#endif

/* acc[i] += a[i] * b for i < m: independent lanes, so the compiler
 * vectorises it without reordering any sum. */
RKM_DUMMY_UNCHECKED void axpy(float *__restrict__ acc, const float *__restrict__ a, float b, int m)
{
    int i = 0;
    for (; i + 8 <= m; i += 8) /* a fixed-length body, vectorised at -O2 */
        for (int l = 0; l < 8; l++) acc[i + l] += a[i + l] * b;
    for (; i < m; i++) acc[i] += a[i] * b;
}

/* C = alpha op(A) op(B) + beta C, column-major; each output one sum over
 * k in order (beta 0: C is not read, as cuBLAS's). */
RKM_DUMMY_UNCHECKED void gemm_one(const gemm_args &g, const float *A, const float *B, float *C)
{
    std::vector<float> av((size_t)g.m * (size_t)g.k), accv((size_t)g.m);
    float *a = av.data(), *acc = accv.data();
    for (int p = 0; p < g.k; p++) /* op(A) as m x k, column-major */
        for (int i = 0; i < g.m; i++)
            a[(size_t)p * g.m + i] = g.ta == CUBLAS_OP_N ? A[(size_t)p * g.lda + i] : A[(size_t)i * g.lda + p];
    for (int j = 0; j < g.n; j++) {
        memset(acc, 0, (size_t)g.m * sizeof *acc);
        for (int p = 0; p < g.k; p++)
            axpy(acc, a + (size_t)p * g.m, g.tb == CUBLAS_OP_N ? B[(size_t)j * g.ldb + p] : B[(size_t)p * g.ldb + j],
                 g.m);
        float *c = C + (size_t)j * g.ldc;
        for (int i = 0; i < g.m; i++) c[i] = g.beta == 0.0f ? g.alpha * acc[i] : g.alpha * acc[i] + g.beta * c[i];
    }
}

void gemm_call(op &o)
{
    const gemm_args &g = o.gemm;
    for (int b = 0; b < g.batch; b++) gemm_one(g, g.A + b * g.sa, g.B + b * g.sb, g.C + b * g.sc);
}

/* The bytes a stored rows x cols matrix (leading dimension ld) spans. */
size_t span(int rows, int cols, int ld) { return rows && cols ? ((size_t)(cols - 1) * ld + rows) * sizeof(float) : 0; }

bool in_device(const float *p, size_t one, long long stride, int batch)
{
    if (!one || !batch) return true;
    if (stride < 0) return false;
    return is_device(p, one + (size_t)stride * (size_t)(batch - 1) * sizeof(float));
}

cublasStatus_t gemm(cublasHandle_t h, const gemm_args &g)
{
    state &s = S();
    if (!s.handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
    int ar = an ? g.m : g.k, ac = an ? g.k : g.m, br = bn ? g.k : g.n, bc = bn ? g.n : g.k;
    if ((g.ta != CUBLAS_OP_N && g.ta != CUBLAS_OP_T) || (g.tb != CUBLAS_OP_N && g.tb != CUBLAS_OP_T) || g.m < 0 ||
        g.n < 0 || g.k < 0 || g.batch < 0 || g.lda < (ar > 1 ? ar : 1) || g.ldb < (br > 1 ? br : 1) ||
        g.ldc < (g.m > 1 ? g.m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (fails("gemm")) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (s.sticky != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!g.m || !g.n || !g.batch) return CUBLAS_STATUS_SUCCESS;
    s.gemms++;
    if (!in_device(g.A, g.k ? span(ar, ac, g.lda) : 0, g.sa, g.batch) ||
        !in_device(g.B, g.k ? span(br, bc, g.ldb) : 0, g.sb, g.batch) ||
        !in_device(g.C, span(g.m, g.n, g.ldc), g.sc, g.batch)) {
        /* a GPU faults when it runs; the dummy says so now */
        say("cuBLAS GEMM (m %d, n %d, k %d, batch %d): a matrix reaches outside device memory: an illegal address",
            g.m, g.n, g.k, g.batch);
        fault(cudaErrorIllegalAddress);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    op o = make_op(op::CALL);
    o.call = gemm_call;
    o.gemm = g;
    enqueue(h->stream, std::move(o));
    return CUBLAS_STATUS_SUCCESS;
}

} /* namespace */

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (fails("cublasCreate")) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new cublasContext;
    S().handles.insert(*handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!S().handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    drain_all(); /* cublasDestroy synchronises the device */
    S().handles.erase(handle);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!S().handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!S().handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
    handle->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* The dummy's GEMMs need none; it must be device memory, 256-aligned. */
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!S().handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && (!is_device(workspace, bytes) || (uintptr_t)workspace % 256)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc)
{
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    gemm_args g = {ta, tb, m, n, k, lda, ldb, ldc, 1, *alpha, *beta, A, B, C, 0, 0, 0};
    return gemm(handle, g);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                                         int n, int k, const float *alpha, const float *A, int lda,
                                         long long stride_a, const float *B, int ldb, long long stride_b,
                                         const float *beta, float *C, int ldc, long long stride_c, int batch)
{
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    gemm_args g = {ta, tb, m, n, k, lda, ldb, ldc, batch, *alpha, *beta, A, B, C, stride_a, stride_b, stride_c};
    return gemm(handle, g);
}
