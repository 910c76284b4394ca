/* copier.h -- the CPU examples' copy streams for offloading: two threads,
 * device to host and host to device, each moving the bytes it is given in
 * the order they came, at a set bandwidth, while the caller computes on.
 *
 * This is what a GPU host does with cudaMemcpyAsync on two copy streams,
 * played on the CPU: copier_start issues a copy and returns its ticket at
 * once (the stream is in it); copier_wait blocks until that copy is done
 * (the plan's `wait` step). A copy of B bytes takes latency + B / bandwidth
 * seconds of wall time (the memcpy, then a sleep to the end of that span),
 * and starts when its stream is free: the simulator's model of
 * docs/formats.md, "Offloading", made real, so overlap with compute is
 * measurable.
 * Bandwidth 0 copies as fast as memcpy goes.
 *
 *   copier cp;
 *   if (copier_open(&cp, 1e9, 0.0)) ...;          // 1 GB/s each way
 *   uint64_t t = copier_start(&cp, COPIER_D2H, host, dev, bytes);
 *   ... compute ...
 *   copier_wait(&cp, t);                          // dev may now be freed
 *   copier_close(&cp);
 *
 * The caller keeps to the contract's rules (no write to a buffer while it
 * is copied, no read of a prefetched one before its wait); the mutex gives
 * the caller's thread everything the copy wrote once copier_wait returns. */
#ifndef COPIER_H
#define COPIER_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { COPIER_D2H = 0, COPIER_H2D = 1, COPIER_QUEUE = 256 /* copies issued, not done, per stream at most */ };

typedef struct copier_job {
    void *dst;
    const void *src;
    size_t bytes;
} copier_job;

typedef struct copier copier;
typedef struct copier_arg {
    copier *cp;
    int stream;
} copier_arg;

/* Opened in place: it must not move until closed (its threads point at it). */
struct copier {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast when a copy is issued or done, and at close */
    pthread_t thread[2];
    copier_arg arg[2];
    copier_job queue[2][COPIER_QUEUE];
    uint64_t issued[2], done[2]; /* per stream: tickets below done[s] are complete */
    double bandwidth, latency;   /* bytes a second (0: memcpy speed), seconds a copy */
    double busy[2];              /* seconds each stream spent copying */
    int closing;
};

static inline double copier__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps until `until` (copier__now's clock). */
static inline void copier__sleep_until(double until)
{
    struct timespec ts;
    ts.tv_sec = (time_t)until;
    ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

/* One copy, paced: it ends latency + bytes / bandwidth after it began. */
static inline double copier__copy(const copier *cp, const copier_job *j)
{
    double t0 = copier__now();
    memcpy(j->dst, j->src, j->bytes);
    if (cp->bandwidth > 0) copier__sleep_until(t0 + cp->latency + (double)j->bytes / cp->bandwidth);
    return copier__now() - t0;
}

/* A stream's thread: its copies in order until closed and drained. */
static inline void *copier__thread(void *arg)
{
    copier *cp = ((copier_arg *)arg)->cp;
    int s = ((copier_arg *)arg)->stream;
    pthread_mutex_lock(&cp->mu);
    for (;;) {
        copier_job j;
        double took;
        while (!cp->closing && cp->done[s] == cp->issued[s]) pthread_cond_wait(&cp->cv, &cp->mu);
        if (cp->done[s] == cp->issued[s]) break; /* closing, nothing left */
        j = cp->queue[s][cp->done[s] % COPIER_QUEUE];
        pthread_mutex_unlock(&cp->mu);
        took = copier__copy(cp, &j);
        pthread_mutex_lock(&cp->mu);
        cp->busy[s] += took;
        cp->done[s]++;
        pthread_cond_broadcast(&cp->cv);
    }
    pthread_mutex_unlock(&cp->mu);
    return NULL;
}

/* Stops the first n threads (after their copies) and releases the rest. */
static inline void copier__shut(copier *cp, int n)
{
    pthread_mutex_lock(&cp->mu);
    cp->closing = 1;
    pthread_cond_broadcast(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
    for (int s = 0; s < n; s++) pthread_join(cp->thread[s], NULL);
    pthread_cond_destroy(&cp->cv);
    pthread_mutex_destroy(&cp->mu);
}

/* Both streams' threads. 0 on success; -1 when they cannot be made, with
 * nothing left to close. */
static inline int copier_open(copier *cp, double bandwidth, double latency)
{
    memset(cp, 0, sizeof *cp);
    cp->bandwidth = bandwidth;
    cp->latency = latency;
    if (pthread_mutex_init(&cp->mu, NULL)) return -1;
    if (pthread_cond_init(&cp->cv, NULL)) {
        pthread_mutex_destroy(&cp->mu);
        return -1;
    }
    for (int s = 0; s < 2; s++) {
        cp->arg[s].cp = cp, cp->arg[s].stream = s;
        if (pthread_create(&cp->thread[s], NULL, copier__thread, &cp->arg[s])) {
            copier__shut(cp, s);
            return -1;
        }
    }
    return 0;
}

/* Issues a copy of `bytes` from src to dst on `stream` and returns its
 * ticket for copier_wait (its number on the stream, then the stream in the
 * low bit). Blocks only while COPIER_QUEUE copies of that stream are still
 * to do. */
static inline uint64_t copier_start(copier *cp, int stream, void *dst, const void *src, size_t bytes)
{
    uint64_t t;
    pthread_mutex_lock(&cp->mu);
    while (cp->issued[stream] - cp->done[stream] >= COPIER_QUEUE) pthread_cond_wait(&cp->cv, &cp->mu);
    t = cp->issued[stream]++;
    cp->queue[stream][t % COPIER_QUEUE].dst = dst;
    cp->queue[stream][t % COPIER_QUEUE].src = src;
    cp->queue[stream][t % COPIER_QUEUE].bytes = bytes;
    pthread_cond_broadcast(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
    return t << 1 | (uint64_t)stream;
}

/* Blocks until the copy with `ticket` (copier_start's) is done. */
static inline void copier_wait(copier *cp, uint64_t ticket)
{
    int stream = (int)(ticket & 1);
    pthread_mutex_lock(&cp->mu);
    while (cp->done[stream] <= ticket >> 1) pthread_cond_wait(&cp->cv, &cp->mu);
    pthread_mutex_unlock(&cp->mu);
}

/* Blocks until every copy issued so far is done (before freeing buffers a
 * failed step left with copies on them). */
static inline void copier_drain(copier *cp)
{
    pthread_mutex_lock(&cp->mu);
    while (cp->done[0] < cp->issued[0] || cp->done[1] < cp->issued[1]) pthread_cond_wait(&cp->cv, &cp->mu);
    pthread_mutex_unlock(&cp->mu);
}

/* Finishes the copies issued, stops the threads. */
static inline void copier_close(copier *cp) { copier__shut(cp, 2); }

#endif /* COPIER_H */
