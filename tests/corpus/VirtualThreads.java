import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Virtual-thread workloads for the corpus (JDK 21 and later; tests/src/corpus.rs runs them
 * with the first JDK of 21 or later it finds).
 *
 * <pre>java VirtualThreads &lt;mode&gt; &lt;threads&gt; &lt;seconds&gt; &lt;inside&gt; &lt;outside&gt;</pre>
 *
 * <ul>
 *   <li>{@code lock}: {@code threads} virtual threads take one non-fair {@code ReentrantLock}
 *       around {@code inside} iterations of work and do {@code outside} outside it;
 *   <li>{@code ownlock}: the same, each with a lock of its own (the lock made uncontended);
 *   <li>{@code monitor}: the same as {@code lock} on one object's monitor ({@code synchronized},
 *       which unmounts a virtual thread that blocks from JDK 24 on);
 *   <li>{@code queue}: {@code threads} virtual threads take tasks of {@code inside} iterations
 *       from one {@code LinkedBlockingQueue} that a platform thread fills, spending
 *       {@code outside} iterations on each task it queues: a pool waiting for work.
 * </ul>
 *
 * Prints {"ops":N,"seconds":S} every second: the work done so far (operations, or tasks).
 * The work and the lines are Corpus.java's ({@code Corpus.burn}, {@code Corpus.printOps}):
 * compile it with {@code -sourcepath tests/corpus}.
 */
public class VirtualThreads {
    static final ReentrantLock LOCK = new ReentrantLock();
    static final Object MONITOR = new Object();
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        int threads = Integer.parseInt(args[1]);
        long seconds = Long.parseLong(args[2]);
        int inside = Integer.parseInt(args[3]);
        int outside = Integer.parseInt(args[4]);
        LongAdder done = new LongAdder();
        long start = System.nanoTime();
        long deadline = start + seconds * 1_000_000_000L;
        Corpus.printOps(0, 0);
        LinkedBlockingQueue<Integer> queue = new LinkedBlockingQueue<>(4 * threads);
        for (int t = 0; t < threads; t++) {
            ReentrantLock own = new ReentrantLock();
            Runnable body = switch (mode) {
                case "lock" -> () -> locked(LOCK, inside, outside, done);
                case "ownlock" -> () -> locked(own, inside, outside, done);
                case "monitor" -> () -> monitor(inside, outside, done);
                case "queue" -> () -> consume(queue, done);
                default -> throw new IllegalArgumentException("mode " + mode);
            };
            Thread.ofVirtual().name("vt-" + t).start(body);
        }
        if (mode.equals("queue")) {
            Thread producer = Thread.ofPlatform().name("producer").daemon().start(() -> {
                long x = 1;
                try {
                    while (true) {
                        x = Corpus.burn(outside, x);
                        queue.put(inside);
                    }
                } catch (InterruptedException e) {
                    sink = x;
                }
            });
        }
        for (long next = start + 1_000_000_000L; next <= deadline; next += 1_000_000_000L) {
            LockSupport.parkNanos(next - System.nanoTime());
            Corpus.printOps(done.sum(), System.nanoTime() - start);
        }
        System.exit(0);
    }

    static void locked(ReentrantLock lock, int inside, int outside, LongAdder done) {
        long x = 1;
        while (true) {
            lock.lock();
            try {
                x = Corpus.burn(inside, x);
            } finally {
                lock.unlock();
            }
            x = Corpus.burn(outside, x);
            sink = x;
            done.increment();
        }
    }

    static void monitor(int inside, int outside, LongAdder done) {
        long x = 1;
        while (true) {
            synchronized (MONITOR) {
                x = Corpus.burn(inside, x);
            }
            x = Corpus.burn(outside, x);
            sink = x;
            done.increment();
        }
    }

    static void consume(LinkedBlockingQueue<Integer> queue, LongAdder done) {
        long x = 1;
        try {
            while (true) {
                x = Corpus.burn(queue.take(), x);
                sink = x;
                done.increment();
            }
        } catch (InterruptedException e) {
            sink = x;
        }
    }
}
