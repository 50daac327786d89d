// JVM workloads of the lock-storm corpus (tests/tests/corpus.rs). What runs is the JVM's own
// locking: `synchronized` monitors, java.util.concurrent's fair ReentrantLock, LockSupport,
// ThreadPoolExecutor and SynchronousQueue; this file only decides how many threads use them.
//
//   java Corpus <mode> <threads> <seconds> [rate]   (for convoy, convoyfree: the section's
//                                                    length instead of a rate)
//
// storm    threads contend on one `synchronized` monitor (short critical section, short work
//          outside): a JVM mutex storm.
// stormfree  the same work, each thread taking a monitor of its own: the storm's
//          counterfactual, the lock made uncontended.
// fair     threads take turns on one fair ReentrantLock: every release parks the releaser and
//          unparks the longest waiter, a convoy that leaves the CPUs idle.
// timers   an idle pool: each thread parks for 2 ms at a time (LockSupport.parkNanos), every
//          park ends in its timeout.
// queue    a ThreadPoolExecutor of `threads` workers fed `rate` tasks per second by one
//          producer: a producer/consumer queue at a modest rate.
// handoff  two threads hand an object back and forth through a SynchronousQueue.
// convoy   threads take one non-fair ReentrantLock around a long critical section (`rate`
//          iterations inside, default 20000, a tenth of that outside): the lock is held nearly
//          all the time, its waiters park, and each release unparks one of them.
// convoyfree  the same work, each thread taking a ReentrantLock of its own: the convoy's
//          counterfactual, the lock made uncontended.
// smallpool  a ThreadPoolExecutor of `threads` workers fed small tasks by one producer as fast
//          as its bounded queue (1024) takes them: when it is full the producer blocks in
//          put(). A small pool inside a large runtime: the JVM's own threads are many, the
//          ones that hand work to one another few. `rate` is the task's iterations here
//          (default 200): with many workers and long tasks, a busy pool of CPU-bound workers.
// ownpool  smallpool's work and workers, each worker with a queue of its own (a one-thread
//          executor; the producer deals the tasks round-robin): the shared queue's lock made
//          uncontended, each worker still woken for the tasks it waits for. smallpool's
//          counterfactual for "does the queue's lock limit it".
//
// Prints one JSON line at the end: {"mode":…,"threads":…,"ops":…,"cpu_seconds":…}; smallpool,
// storm, stormfree, convoy and convoyfree also print {"ops":…,"seconds":…} every second while
// they run (operations done so far, seconds since the start).

import java.lang.management.ManagementFactory;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

public class Corpus {
    static final AtomicLong OPS = new AtomicLong();
    static volatile boolean running = true;
    static long sink;

    // The storms' workers are named methods, not lambdas, so that the call sites stormwatch
    // names (tests/tests/callsites.rs) are the names in this file.

    /// storm, stormfree: takes the monitor, works inside it, works outside it, counts the
    /// operation.
    static void monitorWorker(Object monitor, long id, LongAdder done) {
        long x = id;
        while (running) {
            synchronized (monitor) {
                x = burn(200, x);
                sink += x;
            }
            x = burn(200, x);
            done.increment();
        }
    }

    /// fair: the same around a fair ReentrantLock.
    static long fairLockWorker(ReentrantLock lock, long id) {
        long local = 0, x = id;
        while (running) {
            lock.lock();
            try {
                x = burn(200, x);
                sink += x;
            } finally {
                lock.unlock();
            }
            x = burn(200, x);
            local++;
        }
        return local;
    }

    /// convoy, convoyfree: the same around a non-fair ReentrantLock, a long section inside,
    /// counting each operation as it completes (for the progress lines).
    static void convoyWorker(ReentrantLock lock, int inside, long id, LongAdder done) {
        long x = id;
        while (running) {
            lock.lock();
            try {
                x = burn(inside, x);
                sink += x;
            } finally {
                lock.unlock();
            }
            x = burn(inside / 10, x);
            done.increment();
        }
    }

    /// Prints {"ops":…,"seconds":…} now (from the calling thread, before the workers start) and
    /// every second until the deadline: the work done so far.
    ///
    /// The line is built by concatenation, not `printf`: a first `Formatter` call initializes
    /// the JDK's Unicode tables (`CharacterData00.<clinit>`, interpreted), and a reporter doing
    /// that with its fair share of a 0.5-CPU quota beside 32 busy workers (~1% of a CPU)
    /// printed nothing for 11 s. Printing the first line before the workers start runs the
    /// printing path once while the JVM has its CPUs to itself.
    static void printProgress(LongAdder done, long start, long deadline) {
        printOps(done.sum(), System.nanoTime() - start);
        Thread progress = new Thread(() -> {
            for (long next = start + 1_000_000_000L; next < deadline; next += 1_000_000_000L) {
                LockSupport.parkNanos(next - System.nanoTime());
                printOps(done.sum(), System.nanoTime() - start);
            }
        });
        progress.setDaemon(true);
        progress.start();
    }

    /// {"ops":<ops>,"seconds":<seconds, to the millisecond>}
    static void printOps(long ops, long nanos) {
        long ms = nanos / 1_000_000L;
        String frac = Long.toString(1000 + ms % 1000).substring(1);
        System.out.println("{\"ops\":" + ops + ",\"seconds\":" + ms / 1000 + "." + frac + "}");
    }

    /**
     * A ThreadPoolExecutor of `workers` workers, all started, on a bounded queue of `capacity`
     * into which a full queue's submitter blocks (put) instead of being refused.
     */
    static ThreadPoolExecutor blockingPool(int workers, int capacity) {
        ThreadPoolExecutor pool = new ThreadPoolExecutor(workers, workers, 60, TimeUnit.SECONDS,
                new ArrayBlockingQueue<>(capacity), (task, executor) -> {
                    try {
                        executor.getQueue().put(task);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                });
        pool.prestartAllCoreThreads();
        return pool;
    }

    static long burn(int iterations, long seed) {
        long x = seed | 1;
        for (int i = 0; i < iterations; i++) {
            x ^= x << 13;
            x ^= x >>> 7;
            x ^= x << 17;
        }
        return x;
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        int threads = Integer.parseInt(args[1]);
        double seconds = Double.parseDouble(args[2]);
        int rate = args.length > 3 ? Integer.parseInt(args[3]) : 0;
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        Thread[] workers;
        switch (mode) {
            case "storm":
            case "stormfree": {
                LongAdder done = new LongAdder();
                printProgress(done, System.nanoTime(), deadline);
                Object shared = new Object();
                boolean own = mode.equals("stormfree");
                workers = counted(start(threads,
                        id -> monitorWorker(own ? new Object() : shared, id, done)), done);
                break;
            }
            case "convoy":
            case "convoyfree": {
                LongAdder done = new LongAdder();
                printProgress(done, System.nanoTime(), deadline);
                ReentrantLock shared = new ReentrantLock();
                boolean own = mode.equals("convoyfree");
                int inside = rate > 0 ? rate : 20_000;
                workers = counted(start(threads, id -> convoyWorker(
                        own ? new ReentrantLock() : shared, inside, id, done)), done);
                break;
            }
            case "fair": {
                ReentrantLock lock = new ReentrantLock(true);
                workers = start(threads, id -> OPS.addAndGet(fairLockWorker(lock, id)));
                break;
            }
            case "timers": {
                workers = start(threads, id -> {
                    long local = 0;
                    while (running) {
                        LockSupport.parkNanos(2_000_000L);
                        local++;
                    }
                    OPS.addAndGet(local);
                });
                break;
            }
            case "queue": {
                ThreadPoolExecutor pool = new ThreadPoolExecutor(threads, threads, 60,
                        TimeUnit.SECONDS, new LinkedBlockingQueue<>());
                pool.prestartAllCoreThreads();
                long period = 1_000_000_000L / Math.max(rate, 1);
                long next = System.nanoTime();
                while (System.nanoTime() < deadline) {
                    pool.execute(() -> {
                        sink += burn(2000, OPS.incrementAndGet());
                    });
                    next += period;
                    long wait = next - System.nanoTime();
                    if (wait > 0) LockSupport.parkNanos(wait);
                }
                pool.shutdown();
                pool.awaitTermination(10, TimeUnit.SECONDS);
                report(mode, threads, seconds);
                return;
            }
            case "smallpool":
            case "ownpool": {
                // smallpool: one executor of `threads` workers on one queue; ownpool: `threads`
                // executors of one worker, each on a queue of its own, dealt tasks round-robin.
                ThreadPoolExecutor[] pools = mode.equals("smallpool")
                        ? new ThreadPoolExecutor[] {blockingPool(threads, 1024)}
                        : new ThreadPoolExecutor[threads];
                for (int i = 0; i < pools.length; i++) {
                    if (pools[i] == null) pools[i] = blockingPool(1, Math.max(1024 / threads, 8));
                }
                // The task's iterations: 200 unless given (where `rate` is for other modes).
                final int task = rate > 0 ? rate : 200;
                LongAdder done = new LongAdder();
                printProgress(done, System.nanoTime(), deadline);
                long x = 1;
                while (System.nanoTime() < deadline) {
                    final long seed = x++;
                    pools[(int) (seed % pools.length)].execute(() -> {
                        sink += burn(task, seed);
                        done.increment();
                    });
                }
                for (ThreadPoolExecutor pool : pools) pool.shutdown();
                for (ThreadPoolExecutor pool : pools) pool.awaitTermination(10, TimeUnit.SECONDS);
                OPS.set(done.sum());
                report(mode, threads, seconds);
                return;
            }
            case "handoff": {
                SynchronousQueue<Long> ping = new SynchronousQueue<>(), pong = new SynchronousQueue<>();
                Thread a = new Thread(() -> {
                    try {
                        long v = 0;
                        while (running) {
                            ping.put(v);
                            v = pong.take() + 1;
                            OPS.incrementAndGet();
                        }
                        ping.put(-1L);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                });
                Thread b = new Thread(() -> {
                    try {
                        while (true) {
                            long v = ping.take();
                            if (v < 0) break;
                            pong.put(v);
                        }
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                });
                a.start();
                b.start();
                workers = new Thread[] {a, b};
                break;
            }
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        long left;
        while ((left = deadline - System.nanoTime()) > 0) {
            Thread.sleep(Math.max(1, Math.min(100, left / 1_000_000)));
        }
        running = false;
        for (Thread t : workers) t.join();
        report(mode, threads, seconds);
    }

    interface Body {
        void run(int id) throws Exception;
    }

    /// A thread that waits for `workers` and then sets the final count from `done`: what main
    /// joins after the deadline, in their stead.
    static Thread[] counted(Thread[] workers, LongAdder done) {
        Thread counter = new Thread(() -> {
            for (Thread t : workers) {
                try {
                    t.join();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            OPS.set(done.sum());
        });
        counter.start();
        return new Thread[] {counter};
    }

    static Thread[] start(int n, Body body) {
        Thread[] ts = new Thread[n];
        for (int i = 0; i < n; i++) {
            final int id = i + 1;
            ts[i] = new Thread(() -> {
                try {
                    body.run(id);
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            ts[i].start();
        }
        return ts;
    }

    static void report(String mode, int threads, double seconds) {
        double cpu = ((com.sun.management.OperatingSystemMXBean)
                ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime() / 1e9;
        System.out.printf("{\"mode\":\"%s\",\"threads\":%d,\"seconds\":%s,\"ops\":%d,"
                + "\"cpu_seconds\":%.3f}%n", mode, threads, seconds, OPS.get(), cpu);
    }
}
