// A pthread lock benchmark for the lock-storm corpus (tests/src/corpus.rs): threads take one
// lock of a chosen kind around a critical section of busy work, then work outside it. What
// runs is glibc's own locking; this program only chooses the lock, the threads and the work.
//
//   lockbench --lock mutex|adaptive|rwlock|shared|pool [--threads N] [--procs P] [--seconds S]
//             [--cs ITER] [--out ITER] [--uncontended] [--sleep-in-cs US]
//             [--sleep-out US]
//
// --lock mutex      a default pthread mutex
//        adaptive   a PTHREAD_MUTEX_ADAPTIVE_NP mutex (spins a while before it sleeps)
//        rwlock     a pthread rwlock, every thread taking it as a writer
//        shared     a PTHREAD_PROCESS_SHARED mutex in MAP_SHARED memory, taken by the threads
//                   of --procs forked processes
//        pool       no lock around the work: a pool of --threads workers waiting for work on a
//                   condition variable, fed by one producer thread (an event loop, as libuv's
//                   pool is fed) that spends --out iterations making each task and posts it
//                   under the queue's mutex, signalling an idle worker; a worker takes a task
//                   under the mutex and runs it (--cs iterations) outside. At most 2 tasks per
//                   worker wait in the queue (the producer then waits for room, woken by the
//                   workers that take). An operation is a task done.
// --threads N       threads (per process in shared mode), default 32
// --procs P         processes, each running --threads threads (shared mode only), default 1
// --seconds S       how long to run, default 10
// --cs ITER         xorshift iterations inside the critical section, default 50
// --out ITER        xorshift iterations between acquisitions, default 50
// --uncontended     the counterfactual: each thread takes a lock of its own, of the same kind,
//                   around the same work; nothing else changes
// --sleep-in-cs US  the holder sleeps US microseconds inside each critical section (a holder
//                   off the CPU while it holds the lock: tests/tests/callsites.rs)
// --sleep-out US    each thread sleeps US microseconds after it lets the lock go (so that a
//                   woken waiter, not the releaser, takes it next, and no thread competes
//                   with the holder for a CPU)
//
// Prints {"ops":N,"seconds":S} every second while it runs (operations so far, seconds since
// the start) and once more when it stops, at --seconds or on SIGTERM/SIGINT: N is summed over
// every thread of every process (each thread counts in the shared mapping).

#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum kind { MUTEX, ADAPTIVE, RWLOCK, SHARED, POOL };

// A lock and the data it guards, alone on its cache lines.
struct slot {
    union {
        pthread_mutex_t mutex;
        pthread_rwlock_t rwlock;
    } lock;
    uint64_t data;
} __attribute__((aligned(128)));

// One thread's operations so far, written only by that thread.
struct counter {
    _Atomic uint64_t ops;
} __attribute__((aligned(128)));

// What the threads of every process share: the header, then a slot and a counter per thread
// (one MAP_SHARED mapping, so forked children use the same locks and counters).
struct shared {
    _Atomic int stop;
    enum kind kind;
    int threads, cs, out, uncontended, sleep_us, sleep_out_us;
    struct slot *slots;
    struct counter *counters;
};

// The pool's queue (--lock pool): tasks waiting, idle workers, and the producer's wait for room.
static struct {
    pthread_mutex_t mutex;
    pthread_cond_t work, room;
    int queued, idle, capacity;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
// Where the pool's threads leave their results, so that the work is not optimized away.
static volatile uint64_t pool_sink;

static struct shared *sh;

static _Noreturn void die(const char *what, int err) {
    fprintf(stderr, "lockbench: %s: %s\n", what, strerror(err));
    exit(2);
}

static uint64_t burn(int iterations, uint64_t x) {
    x |= 1;
    for (int i = 0; i < iterations; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    return x;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void init_slot(struct slot *s, enum kind kind) {
    int err;
    if (kind == RWLOCK) {
        if ((err = pthread_rwlock_init(&s->lock.rwlock, NULL)))
            die("pthread_rwlock_init", err);
        return;
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    if (kind == ADAPTIVE && (err = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP)))
        die("PTHREAD_MUTEX_ADAPTIVE_NP", err);
    if (kind == SHARED && (err = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)))
        die("PTHREAD_PROCESS_SHARED", err);
    if ((err = pthread_mutex_init(&s->lock.mutex, &attr)))
        die("pthread_mutex_init", err);
    pthread_mutexattr_destroy(&attr);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    struct slot *s = &sh->slots[sh->uncontended ? id : 0];
    uint64_t x = (uint64_t)id + 1, ops = 0;
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        if (sh->kind == RWLOCK)
            pthread_rwlock_wrlock(&s->lock.rwlock);
        else
            pthread_mutex_lock(&s->lock.mutex);
        x = burn(sh->cs, x ^ s->data);
        if (sh->sleep_us)
            usleep(sh->sleep_us);
        s->data = x;
        if (sh->kind == RWLOCK)
            pthread_rwlock_unlock(&s->lock.rwlock);
        else
            pthread_mutex_unlock(&s->lock.mutex);
        x = burn(sh->out, x);
        if (sh->sleep_out_us)
            usleep(sh->sleep_out_us);
        atomic_store_explicit(&sh->counters[id].ops, ++ops, memory_order_relaxed);
    }
    return NULL;
}

// A worker of the pool: waits for a task, takes it, runs it.
static void *pool_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t x = (uint64_t)id + 1, ops = 0;
    for (;;) {
        pthread_mutex_lock(&pool.mutex);
        while (!pool.queued && !atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
            pool.idle++;
            pthread_cond_wait(&pool.work, &pool.mutex);
            pool.idle--;
        }
        if (!pool.queued) {
            pthread_mutex_unlock(&pool.mutex);
            pool_sink = x;
            return NULL;
        }
        if (pool.queued-- == pool.capacity)
            pthread_cond_signal(&pool.room);
        pthread_mutex_unlock(&pool.mutex);
        x = burn(sh->cs, x);
        atomic_store_explicit(&sh->counters[id].ops, ++ops, memory_order_relaxed);
    }
}

// The pool's producer: makes each task (--out iterations) and posts it.
static void *pool_producer(void *arg) {
    (void)arg;
    uint64_t x = 7;
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        x = burn(sh->out, x);
        pthread_mutex_lock(&pool.mutex);
        while (pool.queued == pool.capacity && !atomic_load_explicit(&sh->stop, memory_order_relaxed))
            pthread_cond_wait(&pool.room, &pool.mutex);
        pool.queued++;
        if (pool.idle)
            pthread_cond_signal(&pool.work);
        pthread_mutex_unlock(&pool.mutex);
    }
    // Wake every worker to see the stop flag (and the producer's last tasks run first).
    pthread_mutex_lock(&pool.mutex);
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mutex);
    pool_sink = x;
    return NULL;
}

// Starts the threads of process number `proc`.
static pthread_t *start_threads(int proc) {
    // The pool's producer is one thread more, last.
    int extra = sh->kind == POOL;
    pthread_t *tids = calloc(sh->threads + extra, sizeof *tids);
    if (!tids)
        die("calloc", ENOMEM);
    for (int t = 0; t < sh->threads; t++) {
        int err = pthread_create(&tids[t], NULL, sh->kind == POOL ? pool_worker : worker,
                                 (void *)(intptr_t)(proc * sh->threads + t));
        if (err)
            die("pthread_create", err);
    }
    if (extra) {
        int err = pthread_create(&tids[sh->threads], NULL, pool_producer, NULL);
        if (err)
            die("pthread_create", err);
    }
    return tids;
}

static void join_threads(pthread_t *tids) {
    for (int t = 0; t < sh->threads + (sh->kind == POOL); t++)
        pthread_join(tids[t], NULL);
    free(tids);
}

static uint64_t total_ops(int n) {
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += atomic_load_explicit(&sh->counters[i].ops, memory_order_relaxed);
    return sum;
}

static void report(uint64_t ops, double seconds) {
    printf("{\"ops\":%llu,\"seconds\":%.3f}\n", (unsigned long long)ops, seconds);
    fflush(stdout);
}

static _Noreturn void usage(void) {
    fprintf(stderr, "usage: lockbench --lock mutex|adaptive|rwlock|shared|pool [--threads N] "
                    "[--procs P] [--seconds S] [--cs ITER] [--out ITER] [--uncontended] "
                    "[--sleep-in-cs US] [--sleep-out US]\n");
    exit(2);
}

int main(int argc, char **argv) {
    static const struct option options[] = {
        {"lock", required_argument, NULL, 'l'},  {"threads", required_argument, NULL, 't'},
        {"procs", required_argument, NULL, 'p'}, {"seconds", required_argument, NULL, 's'},
        {"cs", required_argument, NULL, 'c'},    {"out", required_argument, NULL, 'o'},
        {"uncontended", no_argument, NULL, 'u'}, {"sleep-in-cs", required_argument, NULL, 'z'},
        {"sleep-out", required_argument, NULL, 'y'},     {NULL, 0, NULL, 0},
    };
    const char *lock = NULL;
    int threads = 32, procs = 1, cs = 50, out = 50, uncontended = 0, sleep_us = 0, sleep_out_us = 0;
    double seconds = 10;
    for (int c; (c = getopt_long(argc, argv, "", options, NULL)) != -1;) {
        switch (c) {
        case 'l': lock = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'p': procs = atoi(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'c': cs = atoi(optarg); break;
        case 'o': out = atoi(optarg); break;
        case 'u': uncontended = 1; break;
        case 'z': sleep_us = atoi(optarg); break;
        case 'y': sleep_out_us = atoi(optarg); break;
        default: usage();
        }
    }
    if (!lock || optind != argc || threads < 1 || procs < 1 || cs < 0 || out < 0 || !(seconds > 0))
        usage();
    enum kind kind;
    if (!strcmp(lock, "mutex"))
        kind = MUTEX;
    else if (!strcmp(lock, "adaptive"))
        kind = ADAPTIVE;
    else if (!strcmp(lock, "rwlock"))
        kind = RWLOCK;
    else if (!strcmp(lock, "shared"))
        kind = SHARED;
    else if (!strcmp(lock, "pool"))
        kind = POOL;
    else
        usage();
    if (kind == POOL && uncontended) {
        fprintf(stderr, "lockbench: --uncontended has no meaning for a pool (it takes no lock "
                        "around its work): its counterfactual is fewer --threads\n");
        exit(2);
    }
    pool.capacity = 2 * threads;
    if (procs > 1 && kind != SHARED) {
        fprintf(stderr, "lockbench: --procs needs --lock shared (a private lock is per process)\n");
        exit(2);
    }

    int n = threads * procs;
    size_t size = sizeof(struct shared) + 128 + (size_t)n * (sizeof(struct slot) + sizeof(struct counter));
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        die("mmap", errno);
    sh = mem;
    sh->kind = kind;
    sh->threads = threads;
    sh->cs = cs;
    sh->out = out;
    sh->uncontended = uncontended;
    sh->sleep_us = sleep_us;
    sh->sleep_out_us = sleep_out_us;
    sh->slots = (struct slot *)(((uintptr_t)(sh + 1) + 127) & ~(uintptr_t)127);
    sh->counters = (struct counter *)(sh->slots + n);
    for (int i = 0; i < (uncontended ? n : 1); i++)
        init_slot(&sh->slots[i], kind);

    // SIGTERM and SIGINT stay blocked everywhere: the main thread takes them with
    // sigtimedwait while it reports, children (which inherit the mask) never see them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    double start = now();
    pid_t parent = getpid();
    pid_t *children = NULL;
    pthread_t *tids = NULL;
    if (kind == SHARED) {
        children = calloc(procs, sizeof *children);
        if (!children)
            die("calloc", ENOMEM);
        for (int p = 0; p < procs; p++) {
            pid_t pid = fork();
            if (pid < 0)
                die("fork", errno);
            if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                    _exit(1);
                join_threads(start_threads(p));
                _exit(0);
            }
            children[p] = pid;
        }
    } else {
        tids = start_threads(0);
    }

    // Report every second until --seconds or a stop signal.
    double deadline = start + seconds, next = start + 1;
    for (;;) {
        double t = now();
        if (t >= deadline)
            break;
        if (t >= next) {
            report(total_ops(n), t - start);
            next += 1;
            continue;
        }
        double wait = (next < deadline ? next : deadline) - t;
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        if (sigtimedwait(&stop_signals, NULL, &ts) > 0)
            break;
    }
    uint64_t ops = total_ops(n);
    double elapsed = now() - start;
    atomic_store(&sh->stop, 1);
    if (kind == SHARED) {
        for (int p = 0; p < procs; p++) {
            int status;
            if (waitpid(children[p], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
                fprintf(stderr, "lockbench: process %d did not finish cleanly\n", p);
        }
        free(children);
    } else {
        join_threads(tids);
    }
    report(ops, elapsed);
    return 0;
}
