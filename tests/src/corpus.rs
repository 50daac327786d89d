//! The lock-storm corpus: real workloads — packaged stressors and benchmarks, the JVM's and Go's
//! own locking — each with the verdict it must get from `stormwatch diagnose`, and what the
//! kernel says its threads do while it is judged.
//!
//! A case runs in a fresh cgroup (and a CFS quota where it says so), is left to settle, and is
//! then judged by a 10 s `diagnose --json`. Meanwhile a sampler reads, every 50 ms, each of the
//! cgroup's threads' state and the system call it is blocked in (`/proc/<tid>/stat`,
//! `/proc/<tid>/syscall`):
//! how many threads the kernel has asleep in a futex wait, how many running or runnable; and
//! the cgroup's own CPU time (`cpu.stat`) and, under a quota, its throttled time. Those are the
//! ground truth each case's premise is checked against, never the agent's figures.
//!
//! Some cases also measure whether they are lock-bound at all, the definition the rule is
//! judged by: the same program does clearly more work per second with the lock made
//! uncontended, or the threads cut to the allowed CPUs. Such a case names that variant of its
//! program (its `counterfactual`). Its program is measured once settled, before the agent
//! attaches (the agent's own cost stays out of the comparison); after the judged run the
//! counterfactual runs alone, in a fresh cgroup with the same quota, and is measured over the
//! same span of its life. Both read the work done from the progress lines the programs (or
//! their load generators) print.
//!
//! Cases are split: `Tuning` ones are those the rule's thresholds may be chosen on, `HeldOut`
//! ones are not looked at while choosing them, and say whether the rule carries over.
//!
//! Used by `tests/tests/corpus.rs` (each case once) and by the `corpus` binary (`cargo xtask
//! corpus`: each case N times, optionally beside a CPU hog, for verdict stability).

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    Agent, CpuStat, TestCgroup, cgroupfs, cpus,
    daemon::tool,
    join_before_exec, process_status,
    report::{Diagnosis, Finding, StormCheck},
    v2_root,
};

/// What a case must be found to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    LockStorm,
    NotLockStorm,
}

/// Which part of the corpus a case is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The rule's thresholds may be chosen on these.
    Tuning,
    /// Kept out of that choice: whether the rule carries over to shapes it was not fitted to.
    HeldOut,
}

/// The lock `lockbench` takes (`--lock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// A default pthread mutex.
    Mutex,
    /// `PTHREAD_MUTEX_ADAPTIVE_NP`: spins a while before it sleeps.
    Adaptive,
    /// A pthread rwlock, taken by every thread as a writer.
    RwLock,
    /// A `PTHREAD_PROCESS_SHARED` mutex in shared memory, taken by several processes.
    Shared,
    /// No lock around the work: a pool of workers waiting for work on a condition variable,
    /// fed by one producer thread (`cs`: a task's work, `out`: the producer's per task).
    Pool,
}

impl Lock {
    fn flag(self) -> &'static str {
        match self {
            Lock::Mutex => "mutex",
            Lock::Adaptive => "adaptive",
            Lock::RwLock => "rwlock",
            Lock::Shared => "shared",
            Lock::Pool => "pool",
        }
    }
}

/// The threads `VirtualHttpServer` answers its requests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpThreads {
    /// A virtual thread per request.
    Virtual,
    /// A fixed pool of this many platform threads (a counterfactual: the threads' kind and the
    /// JDK server's locks' sharing both change).
    Platform(u32),
    /// A virtual thread per request, at most this many in the handler at once (a counterfactual:
    /// the monitors under the handler are shared by at most that many; the threads' kind stays).
    VirtualAdmitted(u32),
}

/// How a case's program is started.
#[derive(Clone, Debug)]
pub enum Program {
    /// A packaged command (first word looked up on PATH).
    Cmd(&'static [&'static str]),
    /// `java Corpus <mode> <threads> <seconds> [rate]` (tests/corpus/Corpus.java; for the
    /// convoy modes `rate` is the critical section's length in iterations).
    Java {
        mode: &'static str,
        threads: u32,
        rate: Option<u32>,
    },
    /// `java VirtualThreads <mode> <threads> 60 <inside> <outside>` (tests/corpus/VirtualThreads.java,
    /// on the newest JDK of 21 or later under /usr/lib/jvm): `threads` virtual threads on one
    /// lock (`lock`), a lock each (`ownlock`), or a queue's consumers (`queue`).
    VirtualJava {
        mode: &'static str,
        threads: u32,
        inside: u32,
        outside: u32,
    },
    /// `java VirtualHttpServer <listen> <work> [platform:N | virtual:N]`
    /// (tests/corpus/VirtualHttpServer.java): the JDK's HTTP server on `threads`, `work`
    /// iterations a request, nothing shared in its own code; loaded by 64 keep-alive clients of
    /// httpload.
    VirtualHttp { work: u32, threads: HttpThreads },
    /// tests/corpus/gomutex with this GOMAXPROCS: `goroutines` take one sync.Mutex around
    /// `inside` iterations of work and do `outside` outside it; with `own`, each takes a mutex
    /// of its own (the storm's counterfactual); with `pool`, they are instead a pool waiting on
    /// a sync.Cond for tasks of `inside` iterations from a producer spending `outside` per
    /// task. Its work is its operations (tasks), from its progress lines.
    GoMutex {
        gomaxprocs: u32,
        goroutines: u32,
        inside: u32,
        outside: u32,
        own: bool,
        pool: bool,
    },
    /// `sysbench threads`: `threads` threads each taking one of `locks` pthread mutexes in
    /// turn and yielding while they hold it (one lock: a storm; a lock per thread: its
    /// counterfactual). Its work is its events, from the per-second reports.
    Sysbench { threads: u32, locks: u32 },
    /// `redis-server` in the cgroup, loaded by `redis-benchmark` from outside it.
    RedisUnderLoad,
    /// `lockbench` (tests/corpus/lockbench.c): `threads` threads in each of `procs` processes
    /// take one lock around `cs` iterations of busy work and do `out` outside it; with
    /// `uncontended`, each thread takes a lock of its own instead (its counterfactual).
    LockBench {
        lock: Lock,
        threads: u32,
        procs: u32,
        cs: u32,
        out: u32,
        uncontended: bool,
    },
    /// The plain Go net/http server (tests/corpus/httpserver, no lock in its handler) with this
    /// GOMAXPROCS, loaded from outside the cgroup by `clients` keep-alive clients of
    /// tests/corpus/httpload; its work is the requests answered.
    GoHttpUnderLoad { gomaxprocs: u32, clients: u32 },
    /// Node.js (tests/corpus/nodepool.js): a libuv pool of `threads` (`UV_THREADPOOL_SIZE`)
    /// fed pbkdf2 tasks of `iterations` rounds by the event loop; its work is the tasks done.
    NodePool { threads: u32, iterations: u32 },
    /// Debian's memcached with `threads` worker threads, loaded from outside the cgroup by 64
    /// keep-alive clients of tests/corpus/httpload (`-proto memcache`: a set, then a get, of
    /// each client's key); its work is the requests answered.
    Memcached { threads: u32 },
    /// Debian's nginx with `workers` worker processes answering every request from its
    /// configuration (`return 200`), loaded by 64 keep-alive clients of httpload.
    Nginx { workers: u32 },
    /// Debian's redis-server on loopback TCP with `io_threads` I/O threads (reads too), loaded
    /// by 64 keep-alive clients of httpload (`-proto redis`: SET, then GET).
    RedisIoThreads { io_threads: u32 },
    /// Debian's PostgreSQL (a fresh cluster, durability off: no fsync, asynchronous commits),
    /// loaded from outside the cgroup by `pgbench` with `clients` connections, each updating
    /// one row a transaction: one of `hot_rows` rows drawn at random (1: all the same row, a
    /// row lock every transaction waits for), or with `own_rows` a row of each client's own
    /// (the lock made uncontended). Its work is the transactions, from pgbench's per-second
    /// reports.
    Postgres {
        clients: u32,
        hot_rows: u32,
        own_rows: bool,
    },
    /// Apache Tomcat, embedded (tests/corpus/tomcat, its jars from Maven Central), whose
    /// connector's pool has `threads` workers and whose one servlet does a fixed piece of CPU
    /// work a request; loaded by 64 keep-alive clients of httpload.
    Tomcat { threads: u32 },
    /// The tokio service (tests/src/bin/tokio_http.rs): a multi-threaded runtime of `workers`
    /// workers answering each request after a fixed piece of CPU work on the worker; loaded
    /// by 64 keep-alive clients of httpload.
    Tokio { workers: u32 },
}

/// The Corpus.java modes that print progress lines (their work so far).
const JAVA_MODES_WITH_PROGRESS: [&str; 6] = [
    "smallpool",
    "ownpool",
    "storm",
    "stormfree",
    "convoy",
    "convoyfree",
];

impl Program {
    /// `lockbench` with one lock shared by `threads` threads of one process.
    fn lockbench(lock: Lock, threads: u32, cs: u32, out: u32) -> Self {
        Program::LockBench {
            lock,
            threads,
            procs: 1,
            cs,
            out,
            uncontended: false,
        }
    }

    /// The same `lockbench` with a lock per thread: the lock made uncontended.
    fn uncontended(&self) -> Self {
        let mut variant = self.clone();
        match &mut variant {
            Program::LockBench { uncontended, .. } => *uncontended = true,
            Program::GoMutex { own, pool, .. } if !*pool => *own = true,
            Program::Postgres { own_rows, .. } => *own_rows = true,
            Program::VirtualJava { mode, .. } if *mode == "lock" => *mode = "ownlock",
            other => {
                panic!(
                    "only lockbench, the Go storm, PostgreSQL and the virtual threads' lock have \
                     an uncontended variant, not {other:?}"
                )
            }
        }
        variant
    }

    /// Whether it runs JVM virtual threads (the agent reads them only when asked).
    pub fn runs_virtual_threads(&self) -> bool {
        matches!(
            self,
            Program::VirtualJava { .. }
                | Program::VirtualHttp {
                    threads: HttpThreads::Virtual | HttpThreads::VirtualAdmitted(_),
                    ..
                }
        )
    }

    /// Whether its load prepares the program's data before it reports (pgbench's tables).
    fn prepares_under_load(&self) -> bool {
        matches!(self, Program::Postgres { .. })
    }

    /// Whether the program itself prints progress lines (its load generator's are read
    /// otherwise).
    fn prints_progress(&self) -> bool {
        match self {
            Program::LockBench { .. }
            | Program::Sysbench { .. }
            | Program::NodePool { .. }
            | Program::GoMutex { .. }
            | Program::VirtualJava { .. } => true,
            Program::Java { mode, .. } => JAVA_MODES_WITH_PROGRESS.contains(mode),
            _ => false,
        }
    }
}

/// One workload of the corpus.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub what: &'static str,
    pub expect: Expect,
    pub program: Program,
    /// A CFS quota in CPUs (the v1 `cpu` controller on a hybrid host, `cpu.max` on pure v2).
    pub quota: Option<f64>,
    pub split: Split,
    /// The variant of `program` that says whether it is lock-bound (the lock made uncontended,
    /// or the threads cut to the allowed CPUs), run after the judged run with the same quota.
    /// Both programs report their work (see [`Outcome::work_per_second`]).
    pub counterfactual: Option<Program>,
    /// What its test asks besides the verdict, in order: the premise that makes `expect` the
    /// truth (from the kernel's account of its threads, or its counterfactual), then what the
    /// findings must say. The corpus test (tests/tests/corpus.rs) makes one test of each case
    /// from these.
    pub checks: &'static [Check],
    /// A named miss: why the verdict is not asked (the test is listed, ignored, with this
    /// reason). Its premise is still the row's, for `cargo +stable xtask corpus`.
    pub miss: Option<&'static str>,
}

/// One thing a case's test asks of its run (see [`Case::checks`]): a premise is asked before
/// the verdict, so that a case that was not what it claims fails as such and does not blame
/// the agent; a finding's wording after it.
#[derive(Clone, Copy, Debug)]
pub enum Check {
    /// Its counterfactual does ≥ [`LOCK_BOUND_GAIN`]× the work per second, or the program as
    /// observed is lock-bound (the agent's probes took its work: see the corpus test).
    LockBound,
    /// Its counterfactual does ≤ [`NO_CLEAR_GAIN`]× the work per second.
    NotLockBound,
    /// Not lock-bound, or the thread count costs and the agent names it:
    /// `thread_oversubscription`, or `runtime_sizing` (a runtime sized for more CPUs than the
    /// container may use).
    NotLockBoundOrOversubscribed,
    /// A storm by construction (the tuning storms): its counterfactual does more than
    /// [`NO_CLEAR_GAIN`]× the work per second.
    StormByConstruction,
    /// By the kernel's account, at least twice as many threads per allowed CPU asleep in futex
    /// waits as the CPUs could run.
    ThreadsQueueOnFutexes,
    /// Inside a quota: every thread sleeps at least once a second, two or more queue in futex
    /// waits at once.
    ThreadsTakeTurnsOnFutexes,
    /// Its quota ran out in at least a quarter of its periods (`cpu.stat`).
    Throttled,
    /// A convoy leaves the allowed CPUs partly idle: under 0.75 of them used.
    CpusPartlyIdle,
    /// A kernel figure of the cgroup at least this.
    AtLeast(Figure, Amount),
    /// A kernel figure of the cgroup below this.
    Below(Figure, Amount),
    /// The storm's summary says this.
    SummarySays(&'static str),
    /// A finding of one of these kinds about the cgroup.
    FindingOf(&'static [&'static str]),
    /// A storm inside a quota: `cpu_throttling` too, the storm's summary tied to the quota,
    /// its advice sizing the runtimes to the quota, no `thread_oversubscription`.
    QuotaStorm,
    /// A Go storm: told from the Go runtime's clock, the code that takes the mutex named.
    GoStorm,
    /// A storm of JVM virtual threads: told from the JVM's own figures, the lock and the code
    /// that takes it named.
    VirtualStorm,
    /// A `runtime_sizing` finding naming the runtime's `setting` and advising `advice`.
    SizingNamed {
        setting: &'static str,
        advice: &'static str,
    },
    /// A convoy the quota binds first: not lock-bound, and `cpu_throttling` names the convoy —
    /// unless the agent's probes made it lock-bound as observed, when `lock_storm` is the truth.
    QuotaBoundConvoy,
    /// Under emulation (the kernel matrix's guests) the verdict is the one the CPUs the
    /// container wanted give on the rule's line, the storm's or the quota-bound convoy's.
    VerdictByCpusWantedUnderEmulation,
    /// Its CPU time per unit of work at least this many times its counterfactual's.
    CpuPerWorkOverCounterfactual(f64),
    /// A server loaded from outside its cgroup: its CPU time per unit of work at most
    /// [`NO_CLEAR_GAIN`]× its counterfactual's (fewer threads), or the thread count costs and
    /// the agent names it, as [`Check::NotLockBoundOrOversubscribed`] asks of work per second,
    /// which the load generator's share of the CPUs sways here (nginx's 2 workers did
    /// 1.07–1.23× the requests per second of 64, memcached's 2 threads 0.99–1.25×). And the
    /// converse: a `runtime_sizing` finding only where the count costs more than
    /// [`NO_COST`]×.
    NoCostlierPerWorkOrOversubscribed,
}

/// A figure of [`KernelView`].
#[derive(Clone, Copy, Debug)]
pub enum Figure {
    Threads,
    FutexSleeping,
    OtherSleeping,
    Runnable,
    CpuCores,
}

/// An amount a [`Figure`] is held to.
#[derive(Clone, Copy, Debug)]
pub enum Amount {
    /// This many per CPU the case may use.
    PerAllowedCpu(f64),
    Absolute(f64),
}

impl Figure {
    pub fn of(self, k: &KernelView) -> f64 {
        match self {
            Figure::Threads => k.threads,
            Figure::FutexSleeping => k.futex_sleeping,
            Figure::OtherSleeping => k.other_sleeping,
            Figure::Runnable => k.runnable,
            Figure::CpuCores => k.cpu_cores,
        }
    }
}

impl Amount {
    pub fn given(self, allowed: f64) -> f64 {
        match self {
            Amount::PerAllowedCpu(n) => n * allowed,
            Amount::Absolute(n) => n,
        }
    }
}

/// The corpus case called `name`.
pub fn case(name: &str) -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no corpus case {name}"))
}

/// Every case: the first ones lock-bound first, then those grounded in a counterfactual.
pub fn cases() -> Vec<Case> {
    use Amount::*;
    use Check::*;
    use Expect::*;
    use Figure::*;
    use Program::*;
    use Split::*;
    let short_cs = Program::lockbench(Lock::Mutex, 32, 50, 50);
    let long_cs = Program::lockbench(Lock::Mutex, 32, 20_000, 2_000);
    let rwlock = Program::lockbench(Lock::RwLock, 32, 50, 50);
    let adaptive = Program::lockbench(Lock::Adaptive, 32, 50, 50);
    let go = |goroutines, inside, outside, pool| GoMutex {
        gomaxprocs: 16,
        goroutines,
        inside,
        outside,
        own: false,
        pool,
    };
    let go_storm = go(64, 200, 200, false);
    let go_tiny_cs = go(64, 1, 0, false);
    let go_long_outside = go(64, 100, 1000, false);
    let shared = LockBench {
        lock: Lock::Shared,
        threads: 8,
        procs: 4,
        cs: 50,
        out: 50,
        uncontended: false,
    };
    let medium_cs = Program::lockbench(Lock::Mutex, 32, 2_000, 200);
    let shared_long_cs = LockBench {
        lock: Lock::Shared,
        threads: 8,
        procs: 4,
        cs: 20_000,
        out: 2_000,
        uncontended: false,
    };
    // A server held out at a size of its own, against 2 workers: whether the count costs it
    // is the counterfactual's to say (2026-12-01).
    let server_held_out = |name, what, program, counterfactual| Case {
        name,
        what,
        expect: NotLockStorm,
        program,
        quota: None,
        split: HeldOut,
        checks: &[NoCostlierPerWorkOrOversubscribed],
        miss: None,
        counterfactual: Some(counterfactual),
    };
    vec![
        Case {
            name: "sysbench-mutex-storm",
            what: "sysbench threads: 64 threads on one pthread mutex, yielding while they hold it",
            expect: LockStorm,
            program: Sysbench {
                threads: 64,
                locks: 1,
            },
            quota: None,
            split: Tuning,
            checks: &[StormByConstruction, ThreadsQueueOnFutexes],
            miss: None,
            // The threads cut to the allowed CPUs (2 here), as inside the quota: a lock per thread
            // left 64 threads yielding, 4.1× once and 0.77× in a CI run (tests/CORPUS.md).
            counterfactual: Some(Sysbench {
                threads: 2,
                locks: 1,
            }),
        },
        Case {
            name: "stress-ng-semaphore",
            what: "stress-ng --sem: 64 threads posting and taking one POSIX semaphore; the \
                   kernel shows them runnable, not asleep on it",
            expect: NotLockStorm,
            program: Cmd(&["stress-ng", "--sem", "1", "--sem-procs", "64", "-t", "60"]),
            quota: None,
            split: Tuning,
            checks: &[
                AtLeast(Runnable, PerAllowedCpu(4.0)),
                Below(FutexSleeping, PerAllowedCpu(1.0)),
            ],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "lock-pi-convoy",
            what: "perf bench futex lock-pi, 64 threads: a PI futex handed from waiter to waiter",
            expect: LockStorm,
            program: Cmd(&["perf", "bench", "futex", "lock-pi", "-t", "64", "-r", "60"]),
            quota: None,
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes, CpusPartlyIdle, SummarySays("convoy")],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "jvm-fair-lock-convoy",
            what: "JVM fair ReentrantLock, 64 threads: every release unparks the next waiter",
            expect: LockStorm,
            program: Java {
                mode: "fair",
                threads: 64,
                rate: None,
            },
            quota: None,
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes, CpusPartlyIdle, SummarySays("convoy")],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "jvm-synchronized-storm",
            what: "JVM `synchronized` monitor, 64 threads on busy CPUs",
            expect: LockStorm,
            program: Java {
                mode: "storm",
                threads: 64,
                rate: None,
            },
            quota: None,
            split: Tuning,
            checks: &[StormByConstruction, ThreadsQueueOnFutexes],
            miss: None,
            counterfactual: Some(Java {
                mode: "stormfree",
                threads: 64,
                rate: None,
            }),
        },
        // The Go storms are judged by the Go runtime's own clock of its goroutines' mutex
        // waits (agent/src/diagnose/rules/gostorm.rs); its line was chosen on this storm and
        // its counterfactual (goroutines waiting per CPU: 16 against 0), tests/CORPUS.md.
        Case {
            name: "go-mutex-storm",
            what: "Go sync.Mutex, 64 goroutines, GOMAXPROCS=16 on 2 CPUs, 200-iteration \
                   critical section, 200 outside: the goroutines wait in the Go scheduler, \
                   the futex hand-offs are its Ms'",
            expect: LockStorm,
            program: go_storm.clone(),
            quota: None,
            split: Tuning,
            checks: &[
                LockBound,
                GoStorm,
                SizingNamed {
                    setting: "GOMAXPROCS=16",
                    advice: "GOMAXPROCS=2",
                },
            ],
            miss: None,
            counterfactual: Some(go_storm.uncontended()),
        },
        Case {
            name: "go-mutex-per-goroutine",
            what: "the Go storm's program with a sync.Mutex per goroutine (its counterfactual): \
                   64 goroutines, GOMAXPROCS=16 on 2 CPUs, no goroutine waits for another",
            expect: NotLockStorm,
            program: go_storm.uncontended(),
            quota: None,
            split: Tuning,
            checks: &[],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "quota-mutex-storm",
            what: "sysbench threads: 32 threads on one pthread mutex in a 0.5-CPU CFS quota",
            expect: LockStorm,
            program: Sysbench {
                threads: 32,
                locks: 1,
            },
            quota: Some(0.5),
            split: Tuning,
            checks: &[
                StormByConstruction,
                ThreadsTakeTurnsOnFutexes,
                Throttled,
                QuotaStorm,
            ],
            miss: None,
            // The threads cut to the allowed CPUs, not a lock per thread: sysbench `threads`
            // yields inside its lock, and 32 threads yielding in a 0.5-CPU quota cost about
            // what the hand-offs do, so a lock per thread did 0.89–1.37× the work (unsettled,
            // tests/CORPUS.md); one thread does ~6.5×.
            counterfactual: Some(Sysbench {
                threads: 1,
                locks: 1,
            }),
        },
        Case {
            name: "quota-jvm-storm",
            what: "JVM `synchronized` monitor, 32 threads in a 0.5-CPU CFS quota",
            expect: LockStorm,
            program: Java {
                mode: "storm",
                threads: 32,
                rate: None,
            },
            quota: Some(0.5),
            split: Tuning,
            checks: &[
                StormByConstruction,
                ThreadsTakeTurnsOnFutexes,
                Throttled,
                QuotaStorm,
            ],
            miss: None,
            // The threads cut to the quota's one CPU, as for the sysbench quota storm: a
            // monitor per thread (the counterfactual before 2026-11-27) read 1.10–1.12× on an
            // AMD EPYC guest, at the bar, as 32 threads in half a CPU cost about what the
            // monitor's hand-offs do.
            counterfactual: Some(Java {
                mode: "storm",
                threads: 1,
                rate: None,
            }),
        },
        Case {
            name: "cpu-oversubscription",
            what: "stress-ng --cpu 32: CPU-bound processes, no lock",
            expect: NotLockStorm,
            program: Cmd(&["stress-ng", "--cpu", "32", "-t", "60"]),
            quota: None,
            split: Tuning,
            checks: &[
                AtLeast(Runnable, PerAllowedCpu(4.0)),
                FindingOf(&["runqueue_saturation", "thread_oversubscription"]),
            ],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "quota-cpu-bound",
            what: "stress-ng --cpu 8 in a 0.5-CPU quota: throttled, no lock",
            expect: NotLockStorm,
            program: Cmd(&["stress-ng", "--cpu", "8", "-t", "60"]),
            quota: Some(0.5),
            split: Tuning,
            checks: &[Throttled, FindingOf(&["cpu_throttling"])],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "jvm-idle-pool-on-timers",
            what: "JVM pool of 64 threads parked 2 ms at a time (LockSupport.parkNanos)",
            expect: NotLockStorm,
            program: Java {
                mode: "timers",
                threads: 64,
                rate: None,
            },
            quota: None,
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "jvm-queue-modest-rate",
            what: "JVM ThreadPoolExecutor, 64 workers fed 500 tasks/s",
            expect: NotLockStorm,
            program: Java {
                mode: "queue",
                threads: 64,
                rate: Some(500),
            },
            quota: None,
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes, Below(CpuCores, PerAllowedCpu(0.25))],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "futex-no-waiters",
            what: "perf bench futex hash, 64 threads: futex waits that return at once, no waiter",
            expect: NotLockStorm,
            program: Cmd(&["perf", "bench", "futex", "hash", "-t", "64", "-r", "60"]),
            quota: None,
            split: Tuning,
            checks: &[Below(FutexSleeping, PerAllowedCpu(1.0))],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "stress-ng-futex",
            what: "stress-ng --futex 2: a waker and a waiter per worker",
            expect: NotLockStorm,
            program: Cmd(&["stress-ng", "--futex", "2", "-t", "60"]),
            quota: None,
            split: Tuning,
            checks: &[Below(Threads, PerAllowedCpu(4.0))],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "jvm-two-thread-handoff",
            what: "JVM SynchronousQueue ping-pong between 2 threads",
            expect: NotLockStorm,
            program: Java {
                mode: "handoff",
                threads: 2,
                rate: None,
            },
            quota: None,
            split: Tuning,
            checks: &[AtLeast(FutexSleeping, Absolute(1.0))],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "hackbench-messaging",
            what: "perf bench sched messaging -t: 320 threads passing messages over sockets",
            expect: NotLockStorm,
            program: Cmd(&[
                "perf",
                "bench",
                "sched",
                "messaging",
                "-t",
                "-g",
                "8",
                "-l",
                "2000000",
            ]),
            quota: None,
            split: Tuning,
            checks: &[AtLeast(OtherSleeping, PerAllowedCpu(2.0))],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "redis-under-load",
            what: "redis-server under redis-benchmark (50 clients, SET/GET): I/O-bound",
            expect: NotLockStorm,
            program: RedisUnderLoad,
            quota: None,
            split: Tuning,
            checks: &[AtLeast(CpuCores, Absolute(0.3))],
            miss: None,
            counterfactual: None,
        },
        // Held out, but for the quota short-section storm (the quota storm the thresholds
        // for storms inside quotas may be chosen on) and the long section on busy CPUs (the
        // convoy at the saturation line the hand-off rate's slope was chosen on). Each is
        // grounded in its counterfactual; lockbench's is the same program with a lock per
        // thread.
        Case {
            name: "lockbench-short-cs-storm",
            what: "lockbench: 32 threads on one pthread mutex, 50-iteration critical section, \
                   50 outside, on busy CPUs",
            expect: LockStorm,
            program: short_cs.clone(),
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            miss: None,
            counterfactual: Some(short_cs.uncontended()),
        },
        Case {
            name: "lockbench-long-cs-storm",
            what: "lockbench: 32 threads on one pthread mutex, 20000-iteration critical \
                   section, 2000 outside, on busy CPUs: a convoy",
            expect: LockStorm,
            program: long_cs.clone(),
            quota: None,
            split: Tuning,
            checks: &[LockBound, ThreadsQueueOnFutexes],
            miss: None,
            counterfactual: Some(long_cs.uncontended()),
        },
        Case {
            name: "jvm-long-cs-convoy",
            what: "JVM non-fair ReentrantLock, 32 threads, 20000-iteration critical section, \
                   2000 outside, on busy CPUs: a convoy of another runtime near the saturation \
                   line",
            expect: LockStorm,
            program: Java {
                mode: "convoy",
                threads: 32,
                rate: None,
            },
            quota: None,
            split: HeldOut,
            checks: &[LockBound, ThreadsQueueOnFutexes],
            miss: None,
            counterfactual: Some(Java {
                mode: "convoyfree",
                threads: 32,
                rate: None,
            }),
        },
        Case {
            name: "jvm-longer-cs-convoy",
            what: "JVM non-fair ReentrantLock, 32 threads, 200000-iteration critical section, \
                   20000 outside, on busy CPUs: a slower convoy near the saturation line",
            expect: LockStorm,
            program: Java {
                mode: "convoy",
                threads: 32,
                rate: Some(200_000),
            },
            quota: None,
            split: HeldOut,
            checks: &[LockBound, ThreadsQueueOnFutexes],
            miss: None,
            counterfactual: Some(Java {
                mode: "convoyfree",
                threads: 32,
                rate: Some(200_000),
            }),
        },
        Case {
            name: "quota-lockbench-short-cs-storm",
            what: "lockbench: 32 threads on one pthread mutex, 50-iteration critical section, \
                   50 outside, in a 0.5-CPU CFS quota",
            expect: LockStorm,
            program: short_cs.clone(),
            quota: Some(0.5),
            split: Tuning,
            checks: &[
                LockBound,
                ThreadsTakeTurnsOnFutexes,
                Throttled,
                VerdictByCpusWantedUnderEmulation,
                QuotaStorm,
            ],
            miss: None,
            counterfactual: Some(short_cs.uncontended()),
        },
        Case {
            name: "quota-lockbench-long-cs",
            what: "lockbench: 32 threads on one pthread mutex, 20000-iteration critical \
                   section, 2000 outside, in a 0.5-CPU CFS quota: the quota binds before the \
                   lock does",
            expect: NotLockStorm,
            program: long_cs.clone(),
            quota: Some(0.5),
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes, Throttled, QuotaBoundConvoy],
            miss: None,
            counterfactual: Some(long_cs.uncontended()),
        },
        Case {
            name: "quota-jvm-longer-cs-convoy",
            what: "JVM non-fair ReentrantLock, 32 threads, 200000-iteration critical section, \
                   20000 outside, in a 0.5-CPU CFS quota: another runtime's convoy that the \
                   quota binds before the lock does",
            expect: NotLockStorm,
            program: Java {
                mode: "convoy",
                threads: 32,
                rate: Some(200_000),
            },
            quota: Some(0.5),
            split: Tuning,
            checks: &[ThreadsQueueOnFutexes, Throttled, QuotaBoundConvoy],
            miss: None,
            counterfactual: Some(Java {
                mode: "convoyfree",
                threads: 32,
                rate: Some(200_000),
            }),
        },
        Case {
            name: "lockbench-rwlock-writers",
            what: "lockbench: 32 threads taking one pthread rwlock as writers, 50-iteration \
                   critical section, 50 outside",
            expect: LockStorm,
            program: rwlock.clone(),
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            miss: None,
            counterfactual: Some(rwlock.uncontended()),
        },
        Case {
            name: "lockbench-adaptive-mutex",
            what: "lockbench: 32 threads on one PTHREAD_MUTEX_ADAPTIVE_NP mutex (spins, then \
                   sleeps), 50-iteration critical section, 50 outside",
            expect: LockStorm,
            program: adaptive.clone(),
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            miss: None,
            counterfactual: Some(adaptive.uncontended()),
        },
        Case {
            name: "lockbench-process-shared-mutex",
            what: "lockbench: one PTHREAD_PROCESS_SHARED mutex in shared memory, 4 processes × \
                   8 threads, 50-iteration critical section, 50 outside",
            expect: LockStorm,
            program: shared.clone(),
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            miss: None,
            counterfactual: Some(shared.uncontended()),
        },
        Case {
            name: "go-http-gomaxprocs-16",
            what: "Go net/http server without a lock in its handler, GOMAXPROCS=16 on 2 CPUs, \
                   under keep-alive load (64 clients): a runtime sized for a bigger node",
            expect: NotLockStorm,
            program: GoHttpUnderLoad {
                gomaxprocs: 16,
                clients: 64,
            },
            quota: None,
            split: HeldOut,
            checks: &[
                FindingOf(&["runtime_sizing"]),
                CpuPerWorkOverCounterfactual(1.1),
            ],
            miss: None,
            counterfactual: Some(GoHttpUnderLoad {
                gomaxprocs: 2,
                clients: 64,
            }),
        },
        // Held out from the Go storm's lines (chosen on go-mutex-storm and its counterfactual):
        // other critical sections, and pools of goroutines waiting for work on a sync.Cond
        // whose queue's mutex they take (the Go shape of the pools issue #41 reports).
        // A named miss until 2026-12-01 (tests/CORPUS.md, "The Go storm near its line"): on
        // the Intel guest its queue lay near the line and the rule said `possible`; since, the
        // mutex's share of the CPU (47–58% on the AMD guest) decides near the line.
        Case {
            name: "go-mutex-tiny-cs",
            what: "Go sync.Mutex, 64 goroutines, GOMAXPROCS=16 on 2 CPUs, a one-iteration \
                   critical section and nothing outside (issue #41: one goroutine does 4.5× \
                   the work)",
            expect: LockStorm,
            program: go_tiny_cs.clone(),
            quota: None,
            split: HeldOut,
            checks: &[LockBound, GoStorm],
            miss: None,
            counterfactual: Some(go_tiny_cs.uncontended()),
        },
        // Not lock-bound: its counterfactual does 0.97–1.09× (medians 1.03, 1.06 of 5 pairs;
        // 0.99× once), though the runtime's clock counts 14–23 goroutines per CPU waiting for
        // the mutex. A named miss until 2026-12-01, when the Go storm gained its cost: the
        // mutex takes 0.8–2.2% of its CPU (tests/CORPUS.md, "Go storms by what the mutex
        // costs the CPUs").
        Case {
            name: "go-mutex-long-outside",
            what: "Go sync.Mutex, 64 goroutines, GOMAXPROCS=16 on 2 CPUs, 100-iteration \
                   critical section, 1000 outside",
            expect: NotLockStorm,
            program: go_long_outside.clone(),
            quota: None,
            split: HeldOut,
            checks: &[NotLockBound],
            miss: None,
            counterfactual: Some(go_long_outside.uncontended()),
        },
        Case {
            name: "go-cond-pool-64",
            what: "Go pool of 64 goroutines waiting on a sync.Cond for 1000-iteration tasks \
                   queued under one mutex by a producer spending 10000 per task",
            expect: NotLockStorm,
            program: go(64, 1000, 10000, true),
            quota: None,
            split: HeldOut,
            // Its pool of 2 did 1.12–1.15× the work on the Intel VM (tests/CORPUS.md).
            checks: &[NotLockBoundOrOversubscribed],
            miss: None,
            counterfactual: Some(go(2, 1000, 10000, true)),
        },
        Case {
            name: "go-cond-pool-busy",
            what: "Go pool of 64 goroutines waiting on a sync.Cond for 20000-iteration tasks \
                   queued under one mutex by a producer spending 20000 per task: the workers \
                   busy, the queue's mutex taken by every task",
            expect: NotLockStorm,
            program: go(64, 20000, 20000, true),
            quota: None,
            split: HeldOut,
            checks: &[NotLockBound],
            miss: None,
            counterfactual: Some(go(2, 20000, 20000, true)),
        },
        // Held out from the rule for convoys inside a spent quota (`QuotaBound`), chosen on
        // quota-lockbench-long-cs and quota-jvm-longer-cs-convoy (the two it was built for)
        // and the tuning quota storms: convoys of other shapes the quota binds first, and
        // storms of other locks inside the same quota.
        Case {
            name: "quota-shared-long-cs",
            what: "lockbench: one PTHREAD_PROCESS_SHARED mutex, 4 processes × 8 threads, \
                   20000-iteration critical section, 2000 outside, in a 0.5-CPU CFS quota: a \
                   convoy across processes that the quota binds first",
            expect: NotLockStorm,
            program: shared_long_cs.clone(),
            quota: Some(0.5),
            split: HeldOut,
            checks: &[ThreadsQueueOnFutexes, Throttled, QuotaBoundConvoy],
            miss: None,
            counterfactual: Some(shared_long_cs.uncontended()),
        },
        Case {
            name: "quota-medium-cs",
            what: "lockbench: 32 threads on one pthread mutex, 2000-iteration critical \
                   section, 200 outside, in a 0.5-CPU CFS quota: a convoy handing off ten \
                   times as often as the long one, still bound by the quota",
            expect: NotLockStorm,
            program: medium_cs.clone(),
            quota: Some(0.5),
            split: HeldOut,
            checks: &[ThreadsQueueOnFutexes, Throttled, QuotaBoundConvoy],
            miss: None,
            counterfactual: Some(medium_cs.uncontended()),
        },
        Case {
            name: "quota-adaptive-mutex",
            what: "lockbench: 32 threads on one PTHREAD_MUTEX_ADAPTIVE_NP mutex, 50-iteration \
                   critical section, 50 outside, in a 0.5-CPU CFS quota",
            expect: LockStorm,
            program: adaptive.clone(),
            quota: Some(0.5),
            split: HeldOut,
            checks: &[LockBound, ThreadsTakeTurnsOnFutexes, Throttled, QuotaStorm],
            miss: None,
            counterfactual: Some(adaptive.uncontended()),
        },
        Case {
            name: "quota-rwlock-writers",
            what: "lockbench: 32 threads taking one pthread rwlock as writers, 50-iteration \
                   critical section, 50 outside, in a 0.5-CPU CFS quota",
            expect: LockStorm,
            program: rwlock.clone(),
            quota: Some(0.5),
            split: HeldOut,
            checks: &[LockBound, ThreadsTakeTurnsOnFutexes, Throttled, QuotaStorm],
            miss: None,
            counterfactual: Some(rwlock.uncontended()),
        },
        // Pools waiting for work on a condition variable, fed by one thread that limits their
        // work (issue #41): the queue's mutex is hot (the woken worker reacquires it inside
        // its condition wait), yet 2 workers do about what 64 do. The C pool and Node's
        // 100 µs tasks are tuning (the condition-wait share was chosen on them); Node's
        // 400 µs tasks are held out.
        Case {
            name: "condvar-pool-64",
            what: "lockbench: a pool of 64 workers waiting on a pthread condition variable for \
                   tasks of 20000 iterations, fed by one producer spending 12000 per task",
            expect: NotLockStorm,
            program: Program::lockbench(Lock::Pool, 64, 20_000, 12_000),
            quota: None,
            split: Tuning,
            checks: &[NotLockBound],
            miss: None,
            counterfactual: Some(Program::lockbench(Lock::Pool, 2, 20_000, 12_000)),
        },
        Case {
            name: "node-libuv-pool-100us",
            what: "Node.js: a libuv pool of 64 threads running ~100 µs pbkdf2 tasks the event \
                   loop keeps in flight",
            expect: NotLockStorm,
            program: NodePool {
                threads: 64,
                iterations: 100,
            },
            quota: None,
            split: Tuning,
            checks: &[NotLockBoundOrOversubscribed],
            miss: None,
            counterfactual: Some(NodePool {
                threads: 2,
                iterations: 100,
            }),
        },
        Case {
            name: "node-libuv-pool-400us",
            what: "Node.js: a libuv pool of 64 threads running ~400 µs pbkdf2 tasks the event \
                   loop keeps in flight",
            expect: NotLockStorm,
            program: NodePool {
                threads: 64,
                iterations: 400,
            },
            quota: None,
            split: HeldOut,
            checks: &[NotLockBoundOrOversubscribed],
            miss: None,
            counterfactual: Some(NodePool {
                threads: 2,
                iterations: 400,
            }),
        },
        // Issue #41's JVM executors, 2026-11-28. Held out (no threshold was chosen on them).
        // The busy pool of 64 and the fixed-rate pool of 200 were misses until the JVM's own
        // thread dumps told their workers waiting for work from a lock's waiters (2026-11-30,
        // evening: no threshold changed; tests/CORPUS.md); the pool of 200 fed as fast as its
        // queue takes is a named miss, its premise unsettled.
        Case {
            name: "jvm-busy-pool-64",
            what: "JVM ThreadPoolExecutor of 64 workers fed CPU-bound tasks (20000 iterations) \
                   by one producer as fast as its bounded queue takes them",
            expect: NotLockStorm,
            program: Java {
                mode: "smallpool",
                threads: 64,
                rate: Some(20_000),
            },
            quota: None,
            split: HeldOut,
            checks: &[NotLockBound],
            miss: Some(
                "its premise sits on the bar on the Intel VM (a rerun of the corpus, \
                 2026-12-01): its lock made uncontended did 1.11× (5 pairs 1.08–1.12) against \
                 the 1.1× a not-lock-bound case may gain; the verdict, none, was right \
                 (tests/CORPUS.md)",
            ),
            // The queue's lock made uncontended: each worker a queue of its own (1.03–1.05×
            // by hand; 2 workers do 0.85–0.93×).
            counterfactual: Some(Java {
                mode: "ownpool",
                threads: 64,
                rate: Some(20_000),
            }),
        },
        Case {
            name: "jvm-busy-pool-200",
            what: "JVM ThreadPoolExecutor of 200 workers (a servlet container's default) fed \
                   tasks of 5000 iterations by one producer as fast as its bounded queue takes \
                   them",
            expect: LockStorm,
            program: Java {
                mode: "smallpool",
                threads: 200,
                rate: Some(5_000),
            },
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            miss: Some(
                "its premise differs by CPU kind: called a storm, rightly if its queue's lock \
                 limits it, and that lock made uncontended did 1.38–1.62× on the Intel VM by \
                 hand (1.10–1.19× in one CI run there), 0.97–1.02× on the AMD one \
                 (tests/CORPUS.md)",
            ),
            // The queue's lock made uncontended: each worker a queue of its own does
            // 1.41–1.44× by hand (2 workers 1.32–1.39× through the harness, before).
            counterfactual: Some(Java {
                mode: "ownpool",
                threads: 200,
                rate: Some(5_000),
            }),
        },
        Case {
            name: "jvm-queue-200-workers",
            what: "JVM ThreadPoolExecutor of 200 workers on a LinkedBlockingQueue fed 20000 \
                   tasks/s by one producer: the producer's rate is the work",
            expect: NotLockStorm,
            program: Java {
                mode: "queue",
                threads: 200,
                rate: Some(20_000),
            },
            quota: None,
            split: HeldOut,
            checks: &[],
            miss: None,
            counterfactual: None,
        },
        // Virtual threads (tests/CORPUS.md, "Virtual threads"): judged by the JVM's own
        // figures — its scheduler's remounts, in the share of parked virtual threads waiting
        // for a lock — which the kernel cannot see. The line was chosen on the first two.
        Case {
            name: "jvm-virtual-lock-storm",
            what: "256 JVM virtual threads take one ReentrantLock around 200 iterations and do \
                   200 outside it",
            expect: LockStorm,
            program: VirtualJava {
                mode: "lock",
                threads: 256,
                inside: 200,
                outside: 200,
            },
            quota: None,
            split: Tuning,
            // A lock each: 2.2–3.3× by hand (AMD).
            counterfactual: Some(VirtualJava {
                mode: "ownlock",
                threads: 256,
                inside: 200,
                outside: 200,
            }),
            checks: &[LockBound, VirtualStorm],
            miss: None,
        },
        Case {
            name: "jvm-virtual-lock-calm",
            what: "256 JVM virtual threads take one ReentrantLock around 20 iterations and do \
                   2000 outside it: nearly all wait in its queue, the lock costs nothing",
            expect: NotLockStorm,
            program: VirtualJava {
                mode: "lock",
                threads: 256,
                inside: 20,
                outside: 2000,
            },
            quota: None,
            split: Tuning,
            // A lock each: 1.0× by hand.
            counterfactual: Some(VirtualJava {
                mode: "ownlock",
                threads: 256,
                inside: 20,
                outside: 2000,
            }),
            checks: &[NotLockBound],
            miss: None,
        },
        Case {
            name: "jvm-virtual-queue-pool",
            what: "256 JVM virtual threads take tasks of 2000 iterations from one \
                   LinkedBlockingQueue a platform thread fills: a pool waiting for work",
            expect: NotLockStorm,
            program: VirtualJava {
                mode: "queue",
                threads: 256,
                inside: 2000,
                outside: 200,
            },
            quota: None,
            split: HeldOut,
            // Two consumers (the threads cut to the CPUs): 0.1× by hand — the producer waits
            // on the small queue instead.
            counterfactual: Some(VirtualJava {
                mode: "queue",
                threads: 2,
                inside: 2000,
                outside: 200,
            }),
            checks: &[NotLockBound],
            miss: None,
        },
        Case {
            name: "jvm-virtual-http",
            what: "the JDK's HTTP server with a virtual thread per request, each request a \
                   fixed piece of CPU work, nothing shared in its own code, under 64 keep-alive \
                   clients",
            // Not lock-bound: on 2 platform threads it spends 0.76–1.09× its CPU a request.
            // Tuning since 2026-12-01: it was called a storm in 2 of 3 runs (virtual threads
            // queued on the JDK server's connection set), and the virtual-thread rule's
            // carrier gate was drawn on its figures (tests/CORPUS.md).
            expect: NotLockStorm,
            program: VirtualHttp {
                work: 50_000,
                threads: HttpThreads::Virtual,
            },
            quota: None,
            split: Tuning,
            checks: &[NoCostlierPerWorkOrOversubscribed],
            miss: None,
            // The same server on 2 platform threads: the JDK server's monitors taken by at most
            // two at once.
            counterfactual: Some(VirtualHttp {
                work: 50_000,
                threads: HttpThreads::Platform(2),
            }),
        },
        // Written down before their first run (2026-12-01), after the carrier gate: the same
        // server with a tenth of the work a request (ten times the requests), and a storm of a
        // quarter as many virtual threads as the tuning storm. The server was called a
        // critical storm in 2 of 3 runs on a response stream's monitor, and the hand-off line
        // was then drawn on what the hand-offs cost: it is tuning now (tests/CORPUS.md).
        Case {
            name: "jvm-virtual-http-small-requests",
            what: "the JDK's HTTP server with a virtual thread per request, each request 5,000 \
                   iterations of CPU work, under 64 keep-alive clients",
            expect: NotLockStorm,
            program: VirtualHttp {
                work: 5_000,
                threads: HttpThreads::Virtual,
            },
            quota: None,
            split: Tuning,
            checks: &[NoCostlierPerWorkOrOversubscribed],
            // Its premise was ambiguous against 2 platform threads (1.02–1.17× the CPU a
            // request, AMD), which change the threads' kind as well as the locks' sharing;
            // against its own virtual threads at most 2 in the handler at once (the response
            // stream's monitor under it shared by at most 2) it spent 0.81–0.97× (medians of
            // four runs, Intel, 2026-12-01; tests/CORPUS.md).
            miss: None,
            counterfactual: Some(VirtualHttp {
                work: 5_000,
                threads: HttpThreads::VirtualAdmitted(2),
            }),
        },
        Case {
            name: "jvm-virtual-lock-storm-64",
            what: "64 JVM virtual threads take one ReentrantLock around 200 iterations and do \
                   200 outside it",
            expect: LockStorm,
            program: VirtualJava {
                mode: "lock",
                threads: 64,
                inside: 200,
                outside: 200,
            },
            quota: None,
            split: HeldOut,
            counterfactual: Some(VirtualJava {
                mode: "ownlock",
                threads: 64,
                inside: 200,
                outside: 200,
            }),
            checks: &[LockBound, VirtualStorm],
            miss: None,
        },
        // Held out, written down before their first run (2026-12-01), after the hand-off line
        // was drawn on cost: the server at a tenth of that work again (the most hand-offs a
        // second of the three), and a storm on a shorter section.
        Case {
            name: "jvm-virtual-http-tiny-requests",
            what: "the JDK's HTTP server with a virtual thread per request, each request 500 \
                   iterations of CPU work, under 64 keep-alive clients",
            expect: NotLockStorm,
            program: VirtualHttp {
                work: 500,
                threads: HttpThreads::Virtual,
            },
            quota: None,
            split: HeldOut,
            checks: &[NoCostlierPerWorkOrOversubscribed],
            miss: Some(
                "its premise flips one run in ten: against its own virtual threads at most 2 \
                 in the handler at once it spent 0.69–1.05× the CPU a request in ten runs and \
                 1.17× in an eleventh (pairs 0.53–1.33×, a quarter of them over the 1.1× bar), \
                 with the pairs run until the bar is settled; its verdict, none, was the same \
                 in every run on record. Right in 21 of 22 (10 of 11 on the Intel VM, 11 of 11 \
                 on the AMD one, pairs 0.42–1.73× there; tests/CORPUS.md), but a CI run must \
                 not turn on a one-in-ten draw of the measure",
            ),
            // Its virtual threads, at most 2 in the handler at once: the response stream's
            // monitor under it shared by at most 2, the threads' kind unchanged.
            counterfactual: Some(VirtualHttp {
                work: 500,
                threads: HttpThreads::VirtualAdmitted(2),
            }),
        },
        Case {
            name: "jvm-virtual-lock-storm-50",
            what: "256 JVM virtual threads take one ReentrantLock around 50 iterations and do 50 \
                   outside it",
            expect: LockStorm,
            program: VirtualJava {
                mode: "lock",
                threads: 256,
                inside: 50,
                outside: 50,
            },
            quota: None,
            split: HeldOut,
            counterfactual: Some(VirtualJava {
                mode: "ownlock",
                threads: 256,
                inside: 50,
                outside: 50,
            }),
            checks: &[LockBound, VirtualStorm],
            miss: None,
        },
        Case {
            name: "jvm-small-pool",
            what: "JVM ThreadPoolExecutor of 2 workers fed small tasks by one producer as fast \
                   as its bounded queue takes them",
            expect: NotLockStorm,
            program: Java {
                mode: "smallpool",
                threads: 2,
                rate: None,
            },
            quota: None,
            split: HeldOut,
            checks: &[NotLockBound, AtLeast(Threads, PerAllowedCpu(4.0))],
            miss: None,
            counterfactual: Some(Java {
                mode: "smallpool",
                threads: 1,
                rate: None,
            }),
        },
        // Issue #41 item 5: third-party servers from Debian's packages, loaded from outside
        // their cgroups, each grounded in its counterfactual. Held out when first written
        // (2026-11-30, no threshold chosen on them). memcached and nginx with 64 workers got
        // the lock verdict right but not the thread count's cost; `runtime_sizing` now reads
        // their pools (2026-12-01), its lines set from the same kind of figures, so they are
        // tuning, and the same servers at other sizes are held out in their place
        // (tests/CORPUS.md, "memcached's and nginx's pools sized").
        Case {
            name: "memcached-64-threads",
            what: "memcached with 64 worker threads under 64 keep-alive clients (set, get)",
            expect: NotLockStorm,
            program: Memcached { threads: 64 },
            quota: None,
            split: Tuning,
            checks: &[
                NoCostlierPerWorkOrOversubscribed,
                SizingNamed {
                    setting: "-t 64",
                    advice: "Start memcached with -t 2 ",
                },
            ],
            miss: None,
            counterfactual: Some(Memcached { threads: 2 }),
        },
        Case {
            name: "nginx-64-workers",
            what: "nginx with 64 worker processes under 64 keep-alive clients",
            expect: NotLockStorm,
            program: Nginx { workers: 64 },
            quota: None,
            split: Tuning,
            checks: &[
                NoCostlierPerWorkOrOversubscribed,
                SizingNamed {
                    setting: "worker_processes 64",
                    advice: "Set worker_processes 2;",
                },
            ],
            miss: None,
            counterfactual: Some(Nginx { workers: 2 }),
        },
        // The same servers at other sizes, written down before their first run under the
        // agent (2026-12-01): the check asks the cost named where it is clear and not named
        // where it is absent.
        server_held_out(
            "memcached-16-threads",
            "memcached with 16 worker threads under 64 keep-alive clients (set, get)",
            Memcached { threads: 16 },
            Memcached { threads: 2 },
        ),
        // memcached's default of 4 threads, held out until it was wrong once on the Intel VM
        // (CI of 2026-12-01: runtime_sizing said its 4 threads cost it where 2 spent the same
        // CPU a request, 1.00×; the AMD VM read 1.09–1.25× in ten runs). Mended on it — a
        // pool on its count's line is `possible`, the cost not said — so tuning now, and
        // memcached-8-threads is held out in its place (tests/CORPUS.md). Mended on it again
        // after the CI of 2026-12-03 (AMD): starved of CPU by its load, its loops woke for 70 µs
        // each and were not named, where the pairs measured 1.14×; on the line a busy pool is
        // `possible` whatever a wake-up carries.
        Case {
            split: Tuning,
            ..server_held_out(
                "memcached-4-threads",
                "memcached with its default 4 worker threads under 64 keep-alive clients",
                Memcached { threads: 4 },
                Memcached { threads: 2 },
            )
        },
        // Written down before its first run under the agent (2026-12-02), after the line's
        // band was drawn: 4 loops per CPU, above the band, where the cost is said. Right in 8
        // of its first 10 runs with its premise on three pairs (two medians at 1.04× and
        // 1.05×), in 10 of 10 once the pairs settle it (1.07–1.16×; tests/CORPUS.md).
        server_held_out(
            "memcached-8-threads",
            "memcached with 8 worker threads under 64 keep-alive clients",
            Memcached { threads: 8 },
            Memcached { threads: 2 },
        ),
        server_held_out(
            "nginx-16-workers",
            "nginx with 16 worker processes under 64 keep-alive clients",
            Nginx { workers: 16 },
            Nginx { workers: 2 },
        ),
        // A servlet container with its default pool of 200 (issue #41 item 5, 2026-11-30):
        // written down before its first run under the agent. By hand, 2 workers answered
        // 0.84–0.91× the requests of 200 at the same CPU a request (8-s runs after a 3-s
        // warm-up); through the harness, where the load shares the CPUs, 0.75–1.76×: its
        // premise is the CPU a request (1.33–2.05× once, 1.08× since: unsettled), or its
        // thread count's cost named. Called a storm until the JVM's thread dumps told its idle
        // workers from a lock's queue, and its workers queued on `LinkedBlockingQueue`'s take
        // lock from a lock's waiters (2026-11-30, evening): mended on it, so tuning, no longer
        // held out. A named miss from 2026-12-01 to 12-02 (a `possible` storm silenced its
        // oversubscription), mended on it again (tests/CORPUS.md).
        Case {
            name: "tomcat-200-threads",
            what: "embedded Apache Tomcat 11 with its default pool of 200 workers, each \
                   request a fixed piece of CPU work, under 64 keep-alive clients",
            expect: NotLockStorm,
            program: Tomcat { threads: 200 },
            quota: None,
            split: Tuning,
            checks: &[NoCostlierPerWorkOrOversubscribed],
            miss: None,
            counterfactual: Some(Tomcat { threads: 2 }),
        },
        // A tokio service (issue #41 item 5, 2026-11-30), written down before its first run
        // under the agent. By hand, 2 workers answered 0.88–0.95× the requests of 64 at the
        // same CPU a request (8-s runs). Tuning, not held out: its first run found that Rust's
        // v0 names hid std's condition wait from the waiter's kind, and the agent was mended
        // on it (tests/CORPUS.md).
        Case {
            name: "tokio-64-workers",
            what: "a tokio HTTP service on a runtime of 64 workers, each request a fixed \
                   piece of CPU work on its worker, under 64 keep-alive clients",
            expect: NotLockStorm,
            program: Tokio { workers: 64 },
            quota: None,
            split: Tuning,
            checks: &[NoCostlierPerWorkOrOversubscribed],
            miss: None,
            counterfactual: Some(Tokio { workers: 2 }),
        },
        Case {
            name: "redis-io-threads-4",
            what: "redis-server with 4 I/O threads (reads too) on 2 CPUs under 64 keep-alive \
                   clients: its I/O threads and main thread spin-wait for each other",
            expect: NotLockStorm,
            program: RedisIoThreads { io_threads: 4 },
            quota: None,
            split: HeldOut,
            checks: &[
                NotLockBoundOrOversubscribed,
                SizingNamed {
                    setting: "io-threads 4",
                    advice: "Set io-threads 1",
                },
            ],
            miss: None,
            counterfactual: Some(RedisIoThreads { io_threads: 1 }),
        },
        // PostgreSQL's lock waits are judged by its own lock-wait sites (probes::pglock) on the
        // kernel rule's queue line, drawn on no PostgreSQL program; these two try it on a
        // storm of another shape and on the calm counterfactual before the held-out row.
        Case {
            name: "postgres-two-hot-rows",
            what: "PostgreSQL under pgbench: 16 connections each updating one of two rows, \
                   durability off",
            expect: LockStorm,
            program: Postgres {
                clients: 16,
                hot_rows: 2,
                own_rows: false,
            },
            quota: None,
            split: Tuning,
            checks: &[LockBound],
            miss: None,
            counterfactual: Some(Program::Postgres {
                clients: 16,
                hot_rows: 2,
                own_rows: true,
            }),
        },
        Case {
            name: "postgres-row-per-client",
            what: "PostgreSQL under pgbench: 32 connections each updating a row of its own \
                   (the hot row's counterfactual), durability off",
            expect: NotLockStorm,
            program: Postgres {
                clients: 32,
                hot_rows: 1,
                own_rows: true,
            },
            quota: None,
            split: Tuning,
            checks: &[],
            miss: None,
            counterfactual: None,
        },
        Case {
            name: "postgres-hot-row",
            what: "PostgreSQL under pgbench: 32 connections updating the same row, durability \
                   off",
            expect: LockStorm,
            program: Postgres {
                clients: 32,
                hot_rows: 1,
                own_rows: false,
            },
            quota: None,
            split: HeldOut,
            checks: &[LockBound],
            // A named miss until 2026-12-02 (a backend waits for the row on its latch, in
            // epoll_wait, out of the kernel rule's sight); judged since by PostgreSQL's own
            // lock-wait sites, on a line drawn on the two tuning cases above.
            miss: None,
            counterfactual: Some(Program::Postgres {
                clients: 32,
                hot_rows: 1,
                own_rows: true,
            }),
        },
    ]
}

/// What the kernel says the case's threads did over the judged window.
#[derive(Clone, Debug, Default)]
pub struct KernelView {
    /// Mean threads in the cgroup.
    pub threads: f64,
    /// Mean threads asleep in a futex wait (`wchan` names a futex function).
    pub futex_sleeping: f64,
    /// Mean threads running or runnable (state R).
    pub runnable: f64,
    /// Mean threads asleep elsewhere (I/O, poll, nanosleep, …).
    pub other_sleeping: f64,
    /// CPU time of the cgroup per second (its `cpu.stat`).
    pub cpu_cores: f64,
    /// Under a quota, the share of its enforcement periods in which it ran out (`nr_throttled`
    /// against `nr_periods` of the quota's `cpu.stat`): the share of the time the cgroup stood
    /// throttled at a period's end. (The throttled *time* is summed over CPUs: a quota throttled
    /// in every period on 2 CPUs can show up to 2 s of it per second.)
    pub throttled_share: Option<f64>,
    /// Times per second the cgroup's threads gave up their CPU of their own accord (the sum of
    /// their `voluntary_ctxt_switches` in `/proc/<tid>/status` across the window): every sleep,
    /// a futex wait among them. Unlike the sampled states it counts what happened between the
    /// samples, so a throttled quota, which freezes its threads runnable, cannot hide the
    /// sleeps taken while it ran.
    pub voluntary_switches_per_second: f64,
    /// The most threads one sample found asleep in futex waits at once.
    pub futex_peak: f64,
    pub samples: u32,
}

/// One judged run of a case.
#[derive(Debug)]
pub struct Outcome {
    /// A lock_storm finding that says a storm (not one near a line: `possible`).
    pub lock_storm: bool,
    /// A lock_storm finding that says `possible`: a figure near its gate's line.
    pub possible_storm: bool,
    /// Every finding's kind about the case's cgroup.
    pub kinds: Vec<String>,
    /// The lock_storm finding, when there is one.
    pub storm_finding: Option<Finding>,
    /// Every finding about the case's cgroup.
    pub findings: Vec<Finding>,
    /// The rule's figures for the cgroup (`checked.lock_storm`), when it had futex waits.
    pub figures: Option<StormCheck>,
    pub kernel: KernelView,
    /// The CPUs the case may use.
    pub allowed: f64,
    /// Work per second over the judged window (operations, tasks or requests answered), for
    /// programs that report their work: with the agent attached.
    pub work_per_second: Option<f64>,
    /// For a case with a counterfactual, the same run's work per second over the
    /// `MEASURE_SECONDS` before the agent attached: what the counterfactual is compared with.
    pub alone_work_per_second: Option<f64>,
    /// Work per second of the case's counterfactual over the same span of its life.
    pub counterfactual_work_per_second: Option<f64>,
    /// The counterfactual's gain (its work per second over the program's) in each pair of runs
    /// measured: the judged run's first, then, were it near a premise bar or its reading alone
    /// disturbed, the pairs run again (`premise_gains`). Empty for a case without a counterfactual, or where it is not run.
    pub premise_gains: Vec<f64>,
    /// What `stormwatch run` said of the same running program, when asked
    /// ([`RUN_VERDICT_ENV`]).
    pub run_verdict: Option<RunVerdict>,
    /// The CPU per unit of work of the program alone over its counterfactual's, in the judged
    /// run's own pair (measured over the same spans as their work per second): the first of
    /// [`cpu_per_work_ratios`]. `None` with noise, or without a counterfactual.
    pub judged_cost_ratio: Option<f64>,
}

/// Set (to anything) to judge the virtual-thread cases as `diagnose` does by default, without
/// the JSON dump (`--jvm-virtual-threads`): by their scheduler's counter alone, which says at
/// most a `possible` storm, so that a storm case fails its test with what was said — a hand
/// measure of the default path (tests/CORPUS.md), not a CI one.
pub const VIRTUAL_COUNTER_ONLY_ENV: &str = "STORMWATCH_CORPUS_VIRTUAL_COUNTER_ONLY";

/// Set (to anything) to have [`run`] also ask the daemon for its verdict on each case (`cargo
/// xtask corpus --run`): about a minute more per run.
pub const RUN_VERDICT_ENV: &str = "STORMWATCH_CORPUS_RUN";

/// `stormwatch run`'s verdict on a case: its `stormwatch_finding{kind="lock_storm"}` series
/// for the case's cgroup, `info` being a possible storm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunVerdict {
    Storm,
    Possible,
    None,
}

/// Starts the daemon (its default configuration, but a 1-s interval:
/// [`crate::daemon::Daemon::start`]) beside the running case once `diagnose` is done, waits
/// until its diagnosis window has filled (and 3 s), and reads its verdict. The cases' programs
/// run 60 s: the window must end before they do, so the futex probes, which the daemon attaches
/// on demand, cover only part of it (as when a storm starts under a running daemon).
fn run_verdict(rel: &str, virtual_threads: bool) -> RunVerdict {
    let daemon = if virtual_threads {
        crate::daemon::Daemon::start_configured("jvm_virtual_threads = true\n")
    } else {
        crate::daemon::Daemon::start(&[])
    };
    let window = stormwatch::config::DEFAULT_DIAGNOSIS_WINDOW_SECONDS;
    std::thread::sleep(Duration::from_secs_f64(window + 3.0));
    let metrics = daemon.metrics();
    let at = |severity| {
        crate::daemon::sample_with(
            &metrics,
            "stormwatch_finding",
            &[
                ("kind", "lock_storm"),
                ("cgroup", rel),
                ("severity", severity),
            ],
        )
        .is_some()
    };
    if at("warning") || at("critical") {
        RunVerdict::Storm
    } else if at("info") {
        RunVerdict::Possible
    } else {
        RunVerdict::None
    }
}

impl Outcome {
    /// The findings of `kind` about the case's cgroup.
    pub fn findings_of(&self, kind: &str) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.kind == kind).collect()
    }

    /// How many times the work per second of the case's program the counterfactual does (both
    /// without the agent): the median over the pairs of runs measured.
    pub fn counterfactual_gain(&self) -> Option<f64> {
        (!self.premise_gains.is_empty()).then(|| median(self.premise_gains.clone()))
    }

    /// A figure of the rule's for the cgroup (`figure` picks it), or NaN when the rule had
    /// nothing to judge or could not compute it.
    pub fn figure(&self, figure: impl Fn(&StormCheck) -> Option<f64>) -> f64 {
        self.figures.as_ref().and_then(figure).unwrap_or(f64::NAN)
    }
}

/// The median of the finite figures in `v` (the upper one of an even count), NaN when none.
pub fn median(v: Vec<f64>) -> f64 {
    crate::stats::median(v.into_iter().filter(|x| x.is_finite()), f64::total_cmp)
        .unwrap_or(f64::NAN)
}

/// A case's premise, from its counterfactual's gain: lock-bound when the counterfactual (the
/// lock made uncontended, or the threads cut to the allowed CPUs) does at least this many times
/// the work per second. Measured on the 2-vCPU guest (tests/CORPUS.md), the lock-bound cases gain
/// 1.2–7× (the adaptive and the process-shared mutexes 1.22× and 1.24× in the held-out runs, 2.6×
/// and 3.7× on a quieter machine) and the others 0.57–1.12×: the bars sit between the two groups.
/// Beside a CPU-bound neighbour the short critical sections gain only ~1.1×; their tests then
/// fail on the premise, not the verdict.
pub const LOCK_BOUND_GAIN: f64 = 1.15;
/// Not lock-bound: the counterfactual does no more than this many times the work per second.
/// Between the two bars a case's premise is unsettled and its test fails.
pub const NO_CLEAR_GAIN: f64 = 1.1;
/// A server's CPU per unit of work within this many times its counterfactual's: its thread
/// count costs it nothing a finding may claim (the pairs' median varies by a few percent).
pub const NO_COST: f64 = 1.05;
/// A first pair of runs whose gain lies within this factor of either bar does not settle the
/// premise: one pair's gain varies by ±~7% from run to run (quota-medium-cs 0.97–1.12× over
/// eleven runs, against its bar of 1.1×).
pub const NEAR_A_BAR: f64 = 1.1;
/// How many pairs of runs a premise near a bar is judged on, by their median gain.
pub const PAIRS_NEAR_A_BAR: usize = 5;

const SETTLE: Duration = Duration::from_secs(3);
const DIAGNOSE_SECONDS: u32 = 10;
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// How long the work of a case with a counterfactual, and of the counterfactual, is measured
/// for, once settled.
const MEASURE_SECONDS: Duration = Duration::from_secs(4);
/// How long a program may take to print its first progress line.
const FIRST_REPORT: Duration = Duration::from_secs(15);

/// The temporary directory the corpus programs (tests/corpus) are built into, once per process
/// and each kind only when a case needs it: a kernel matrix guest has the host's gcc and JDK
/// but not its Go toolchain, and its cases use none of the Go programs.
fn build_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory for the corpus builds"))
        .path()
}

fn corpus_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// The JVM classes: the classpath of `java Corpus`.
fn java_classes() -> &'static Path {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let javac = tool("javac", "apt-get install openjdk-17-jdk-headless");
        // The source is UTF-8; a guest without a locale would read it as ASCII.
        let status = Command::new(javac)
            .args(["-encoding", "UTF-8", "-d"])
            .arg(build_dir())
            .arg(corpus_source().join("Corpus.java"))
            .status()
            .expect("running javac");
        assert!(status.success(), "javac Corpus.java failed: {status}");
    });
    build_dir()
}

/// The `bin` directory of the newest JDK of 21 or later under /usr/lib/jvm (virtual threads
/// need one: this machine kind has Temurin 25 there, beside Debian's OpenJDK 17).
pub fn jdk21() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/jvm")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let release = std::fs::read_to_string(e.path().join("release")).ok()?;
                let version = release
                    .lines()
                    .find_map(|l| l.strip_prefix("JAVA_VERSION=\""))?;
                let major: u32 = version.split(['.', '"']).next()?.parse().ok()?;
                let bin = e.path().join("bin");
                (major >= 21 && bin.join("javac").is_file()).then_some((major, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin).expect(
            "no JDK of 21 or later under /usr/lib/jvm (virtual threads need one; this machine \
             kind has Temurin 25 there)",
        )
    })
}

/// The classpath of `java VirtualThreads` and `java VirtualHttpServer`: compiled with that JDK, Corpus.java's work and
/// progress lines from the source path.
pub fn virtual_classes() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a directory for the classes");
        let status = Command::new(jdk21().join("javac"))
            .args(["-encoding", "UTF-8", "-d"])
            .arg(dir.path())
            .arg("-sourcepath")
            .arg(corpus_source())
            .arg(corpus_source().join("VirtualThreads.java"))
            .arg(corpus_source().join("VirtualHttpServer.java"))
            .status()
            .expect("running javac");
        assert!(
            status.success(),
            "javac VirtualThreads.java failed: {status}"
        );
        dir
    })
    .path()
}

/// A binary of this package (`src/bin`), beside the running one.
fn sibling_binary(name: &str) -> PathBuf {
    let bin = crate::profile_dir().join(name);
    assert!(
        bin.is_file(),
        "{} does not exist: build this package's binaries (`cargo build --release -p \
         stormwatch-tests --bins`)",
        bin.display()
    );
    bin
}

/// The embedded Tomcat's classpath: its jars fetched by Maven (`tests/corpus/tomcat/pom.xml`),
/// Corpus.java's classes, and `TomcatServer` compiled against both.
fn tomcat_classpath() -> &'static str {
    static CP: OnceLock<String> = OnceLock::new();
    CP.get_or_init(|| {
        let src = corpus_source().join("tomcat");
        let (lib, classes) = (build_dir().join("tomcat-lib"), build_dir().join("tomcat"));
        let status = Command::new(tool("mvn", "apt-get install maven"))
            .args(["-q", "-B", "-f"])
            .arg(src.join("pom.xml"))
            .arg("dependency:copy-dependencies")
            .arg(format!("-DoutputDirectory={}", lib.display()))
            .status()
            .expect("running mvn");
        assert!(
            status.success(),
            "mvn could not fetch Tomcat's jars: {status}"
        );
        // Against Corpus.java's classes: the servlet's work is `Corpus.burn`.
        let cp = format!("{}/*:{}", lib.display(), java_classes().display());
        let status = Command::new(tool("javac", "apt-get install openjdk-17-jdk-headless"))
            .args(["-encoding", "UTF-8", "-cp", &cp, "-d"])
            .arg(&classes)
            .arg(src.join("TomcatServer.java"))
            .status()
            .expect("running javac");
        assert!(status.success(), "javac TomcatServer.java failed: {status}");
        format!("{cp}:{}", classes.display())
    })
}

/// The variable naming a directory where the Go programs are already built (`gomutex`,
/// `httpserver`, `httpload`): the kernel matrix's guests, whose read-only view of the host and
/// emulated CPUs make building them there slow or impossible, run the host's builds.
pub const PREBUILT_GO_ENV: &str = "STORMWATCH_TEST_GO_PROGRAMS";

/// The Go programs this package's tests run (tests/corpus/*/main.go), as
/// tests/corpus/build-go.sh builds them.
pub const GO_PROGRAMS: [&str; 3] = ["gomutex", "httpserver", "httpload"];

/// One of the Go programs ([`GO_PROGRAMS`]), built.
pub fn go_program(name: &str) -> PathBuf {
    go_programs().join(name)
}

/// Builds the Go programs into `dir` (with the host's Go toolchain), by
/// tests/corpus/build-go.sh, which xtask runs for the kernel matrix's guests too.
pub fn build_go_programs(dir: &Path) {
    tool("go", "the Go toolchain (https://go.dev/dl)");
    let status = Command::new("sh")
        .arg(corpus_source().join("build-go.sh"))
        .arg(dir)
        .status()
        .expect("running tests/corpus/build-go.sh");
    assert!(
        status.success(),
        "tests/corpus/build-go.sh {} failed: {status}",
        dir.display()
    );
}

/// The Go storm, HTTP server and load generator: prebuilt where [`PREBUILT_GO_ENV`] says.
fn go_programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os(PREBUILT_GO_ENV) {
            let dir = PathBuf::from(dir);
            for program in GO_PROGRAMS {
                assert!(
                    dir.join(program).is_file(),
                    "{PREBUILT_GO_ENV}={}: no {program} there",
                    dir.display()
                );
            }
            return dir;
        }
        build_go_programs(build_dir());
        build_dir().to_owned()
    })
}

/// lockbench, with frame pointers (the corpus's) and without (`lockbench-nofp`, for the
/// call-site tests: their stacks unwind by call-frame information alone).
fn lockbench() -> &'static Path {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let gcc = tool("gcc", "apt-get install gcc");
        for (name, frame_pointers) in [
            ("lockbench", "-fno-omit-frame-pointer"),
            ("lockbench-nofp", "-fomit-frame-pointer"),
        ] {
            let status = Command::new(&gcc)
                .args(["-O2", "-g", frame_pointers, "-pthread", "-o"])
                .arg(build_dir().join(name))
                .arg(corpus_source().join("lockbench.c"))
                .status()
                .expect("running gcc");
            assert!(
                status.success(),
                "gcc lockbench.c ({name}) failed: {status}"
            );
        }
    });
    build_dir()
}

/// Every corpus program, built.
fn built() -> &'static Path {
    java_classes();
    go_programs();
    lockbench()
}

/// Where the corpus programs are built (`lockbench`, `lockbench-nofp`, `gomutex`, …, and the
/// JVM classes: the classpath of `java Corpus`).
pub fn built_programs() -> &'static Path {
    built()
}

/// A CFS quota around a test cgroup, removed on drop: on a hybrid host a cgroup with the same
/// relative path on the v1 `cpu` hierarchy (as kubelet places a pod), on pure v2 `cpu.max`.
pub struct Quota {
    v1_dir: Option<PathBuf>,
    stat: PathBuf,
}

impl Quota {
    /// Puts the program in a CPU controller group of its own, as the kubelet puts every pod
    /// (the v1 `cpu` controller at the cgroup's path on a hybrid host, the v2 cgroup's own on
    /// a pure v2 one), with a quota of `cpus` when given. Without a group of its own a case's
    /// threads would each weigh as much as the agent's one in the scheduler: 64 busy threads
    /// left `diagnose` 1/65 of a CPU, and a 10-s window took 28 s to run (0.8 s of CPU,
    /// futex-no-waiters, 2026-11-29), where a node's pods are groups and the agent gets its
    /// group's share.
    pub fn apply(cmd: &mut Command, cgroup: &TestCgroup, cpus: Option<f64>) -> Self {
        let period = 100_000u64;
        let quota = cpus.map(|cpus| (cpus * period as f64) as u64);
        match cgroupfs::v1_root("cpu") {
            Some(root) => {
                let dir = root.join(cgroup.rel_path().trim_start_matches('/'));
                std::fs::create_dir(&dir).unwrap_or_else(|e| {
                    panic!("creating the v1 cpu cgroup {}: {e}", dir.display())
                });
                if let Some(quota) = quota {
                    std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())
                        .expect("writing cpu.cfs_period_us");
                    std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
                        .expect("writing cpu.cfs_quota_us");
                }
                join_before_exec(cmd, &dir.join("cgroup.procs"));
                Self {
                    stat: dir.join("cpu.stat"),
                    v1_dir: Some(dir),
                }
            }
            None => {
                let control = v2_root().join("cgroup.subtree_control");
                let enabled = std::fs::read_to_string(&control).unwrap_or_default();
                if !enabled.split_whitespace().any(|c| c == "cpu") {
                    std::fs::write(&control, "+cpu")
                        .unwrap_or_else(|e| panic!("enabling the cpu controller: {e}"));
                }
                if let Some(quota) = quota {
                    std::fs::write(cgroup.path().join("cpu.max"), format!("{quota} {period}"))
                        .unwrap_or_else(|e| panic!("writing cpu.max of the test cgroup: {e}"));
                }
                Self {
                    stat: cgroup.path().join("cpu.stat"),
                    v1_dir: None,
                }
            }
        }
    }

    /// The quota's `cpu.stat` (v1 controller's, or the v2 cgroup's).
    pub fn stat(&self) -> &Path {
        &self.stat
    }

    /// Enforcement periods and throttled periods so far (`nr_periods`, `nr_throttled`).
    fn periods(&self) -> (f64, f64) {
        CpuStat::read(&self.stat).periods()
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        let Some(dir) = &self.v1_dir else { return };
        for _ in 0..200 {
            match std::fs::remove_dir(dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(25)),
            }
        }
        eprintln!("cannot remove {}", dir.display());
    }
}

/// Kills the process group of a child on drop.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this child leads.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The command that starts `program`; `listen` is the address a server is to listen on,
/// `scratch` a directory of the run's own for its files (configuration, database).
fn command(program: &Program, listen: &str, scratch: &Path) -> Command {
    let mut cmd = match program {
        Program::Cmd(argv) => {
            let mut c = Command::new(tool(argv[0], "cargo xtask setup"));
            c.args(&argv[1..]);
            c
        }
        Program::Java {
            mode,
            threads,
            rate,
        } => {
            let mut c = Command::new(tool("java", "apt-get install openjdk-17-jre-headless"));
            c.arg("-cp")
                .arg(java_classes())
                .args(["Corpus", mode, &threads.to_string(), "60"]);
            if let Some(r) = rate {
                c.arg(r.to_string());
            }
            c
        }
        Program::VirtualJava {
            mode,
            threads,
            inside,
            outside,
        } => {
            let mut c = Command::new(jdk21().join("java"));
            c.arg("-cp").arg(virtual_classes()).args([
                "VirtualThreads",
                mode,
                &threads.to_string(),
                "60",
                &inside.to_string(),
                &outside.to_string(),
            ]);
            c
        }
        Program::GoMutex {
            gomaxprocs,
            goroutines,
            inside,
            outside,
            own,
            pool,
        } => {
            let mut c = Command::new(go_programs().join("gomutex"));
            c.env("GOMAXPROCS", gomaxprocs.to_string()).args([
                "-goroutines",
                &goroutines.to_string(),
                "-inside",
                &inside.to_string(),
                "-outside",
                &outside.to_string(),
                "-seconds",
                "60",
            ]);
            if *own {
                c.arg("-own");
            }
            if *pool {
                c.arg("-pool");
            }
            c
        }
        Program::Sysbench { threads, locks } => {
            let mut c = Command::new(tool("sysbench", "apt-get install sysbench"));
            c.args(["threads", "--time=60", "--report-interval=1"])
                .arg(format!("--threads={threads}"))
                .arg(format!("--thread-locks={locks}"))
                .arg("run");
            c
        }
        Program::RedisUnderLoad => {
            let mut c = Command::new(tool("redis-server", "apt-get install redis-server"));
            c.args(["--port", "0", "--unixsocket"])
                .arg(redis_socket())
                .args(["--save", "", "--appendonly", "no"]);
            c
        }
        Program::LockBench {
            lock,
            threads,
            procs,
            cs,
            out,
            uncontended,
        } => {
            let mut c = Command::new(lockbench().join("lockbench"));
            c.args(["--lock", lock.flag()])
                .args(["--threads", &threads.to_string()])
                .args(["--procs", &procs.to_string()])
                .args(["--cs", &cs.to_string()])
                .args(["--out", &out.to_string()])
                .args(["--seconds", "60"]);
            if *uncontended {
                c.arg("--uncontended");
            }
            c
        }
        Program::NodePool {
            threads,
            iterations,
        } => {
            let mut c = Command::new(tool("node", "apt-get install nodejs"));
            c.env("UV_THREADPOOL_SIZE", threads.to_string())
                .arg(corpus_source().join("nodepool.js"))
                .args([&iterations.to_string(), "60"]);
            c
        }
        Program::GoHttpUnderLoad { gomaxprocs, .. } => {
            let mut c = Command::new(go_programs().join("httpserver"));
            c.env("GOMAXPROCS", gomaxprocs.to_string())
                .args(["-listen", listen]);
            c
        }
        Program::Memcached { threads } => {
            let (host, port) = listen.split_once(':').expect("host:port");
            let mut c = Command::new(tool("memcached", "apt-get install memcached"));
            c.args(["-u", "root", "-l", host, "-p", port, "-c", "1024", "-t"])
                .arg(threads.to_string());
            c
        }
        Program::Nginx { workers } => {
            let conf = scratch.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(scratch, listen, *workers))
                .expect("writing the nginx configuration");
            let mut c = Command::new(tool("nginx", "apt-get install nginx-light"));
            c.arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(scratch.join("error.log"));
            c
        }
        Program::RedisIoThreads { io_threads } => {
            let (host, port) = listen.split_once(':').expect("host:port");
            let mut c = Command::new(tool("redis-server", "apt-get install redis-server"));
            c.args(["--bind", host, "--port", port, "--io-threads"])
                .arg(io_threads.to_string())
                .args([
                    "--io-threads-do-reads",
                    "yes",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]);
            c
        }
        Program::Postgres { .. } => postgres_server(scratch),
        Program::Tokio { workers } => {
            let mut c = Command::new(sibling_binary("tokio_http"));
            c.arg(listen).args([&workers.to_string(), "50000"]);
            c
        }
        Program::VirtualHttp { work, threads } => {
            let mut c = Command::new(jdk21().join("java"));
            c.arg("-cp").arg(virtual_classes()).args([
                "VirtualHttpServer",
                listen,
                &work.to_string(),
            ]);
            match threads {
                HttpThreads::Virtual => {}
                HttpThreads::Platform(n) => {
                    c.arg(format!("platform:{n}"));
                }
                HttpThreads::VirtualAdmitted(n) => {
                    c.arg(format!("virtual:{n}"));
                }
            }
            c
        }
        Program::Tomcat { threads } => {
            let mut c = Command::new(tool("java", "apt-get install openjdk-17-jre-headless"));
            c.args(["-cp", tomcat_classpath(), "TomcatServer", listen])
                .args([&threads.to_string(), "50000"]);
            c
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(if program.prints_progress() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null())
        .process_group(0);
    cmd
}

/// The load a program is run under, from outside its cgroup (redis-benchmark, httpload,
/// pgbench).
fn load(program: &Program, listen: &str, scratch: &Path) -> Option<Command> {
    let mut c = match program {
        Program::RedisUnderLoad => {
            let mut c = Command::new(tool("redis-benchmark", "apt-get install redis-tools"));
            c.arg("-s")
                .arg(redis_socket())
                .args(["-c", "50", "-n", "100000000", "-t", "set,get", "-q"])
                .stdout(Stdio::null());
            c
        }
        Program::GoHttpUnderLoad { clients, .. } => httpload(listen, *clients, "http"),
        Program::Nginx { .. }
        | Program::Tomcat { .. }
        | Program::Tokio { .. }
        | Program::VirtualHttp { .. } => httpload(listen, 64, "http"),
        Program::Memcached { .. } => httpload(listen, 64, "memcache"),
        Program::RedisIoThreads { .. } => httpload(listen, 64, "redis"),
        Program::Postgres {
            clients,
            hot_rows,
            own_rows,
        } => pgbench(scratch, *clients, *hot_rows, *own_rows),
        _ => return None,
    };
    c.stdin(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    Some(c)
}

/// tests/corpus/httpload with `clients` keep-alive clients speaking `proto` to `listen`.
fn httpload(listen: &str, clients: u32, proto: &str) -> Command {
    let mut c = Command::new(go_programs().join("httpload"));
    c.args(["-addr", listen, "-proto", proto])
        .args(["-clients", &clients.to_string()])
        .args(["-seconds", "120"])
        .stdout(Stdio::piped());
    c
}

/// An nginx configuration for the corpus: `workers` worker processes, every request answered
/// `200 ok` from the configuration, every file in `dir`.
fn nginx_conf(dir: &Path, listen: &str, workers: u32) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 1024; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n\
         server {{ listen {listen}; location / {{ return 200 \"ok\\n\"; }} }}\n}}\n"
    )
}

/// Debian's PostgreSQL server binaries (the newest major version installed).
pub fn postgres_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path().join("bin").join(name)))
        .filter(|p| p.is_file())
        .collect();
    versions.sort_by_key(|p| {
        p.ancestors()
            .nth(2)
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
    });
    versions.pop().unwrap_or_else(|| {
        panic!("PostgreSQL's {name} is not installed; install it with `apt-get install postgresql`")
    })
}

/// Makes a fresh PostgreSQL cluster in `dir` (owned by the `postgres` user, whom the server
/// must run as) and the command that serves it on a socket in `dir` only, durability off.
pub fn postgres_server(dir: &Path) -> Command {
    let data = dir.join("data");
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .expect("running chown");
    assert!(chown.success(), "chown of {} failed", dir.display());
    let as_postgres = |bin: PathBuf| {
        let mut c = Command::new(tool("setpriv", "apt-get install util-linux"));
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--",
        ])
        .arg(bin);
        c
    };
    let initdb = as_postgres(postgres_bin("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["--auth=trust", "-U", "postgres", "--no-sync"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running initdb");
    assert!(initdb.success(), "initdb of {} failed", data.display());
    let mut c = as_postgres(postgres_bin("postgres"));
    c.arg("-D").arg(&data).arg("-k").arg(dir).args([
        "-c",
        "listen_addresses=",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        "max_connections=200",
        "-c",
        "shared_buffers=64MB",
    ]);
    c
}

/// pgbench against the server on `dir`'s socket, once it answers: the tables made (scale 1:
/// 100,000 rows), then `clients` connections each updating one row a transaction — row 1, or
/// with `own_rows` a row of each client's own — reporting every second.
pub fn pgbench(dir: &Path, clients: u32, hot_rows: u32, own_rows: bool) -> Command {
    let row = if own_rows {
        ":client_id + 1".to_owned()
    } else {
        format!("random(1, {})", hot_rows.max(1))
    };
    let script = dir.join("update.sql");
    std::fs::write(
        &script,
        format!(
            "\\set aid {row}\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = \
             :aid;\n"
        ),
    )
    .expect("writing the pgbench script");
    let (pgbench, ready) = (
        tool("pgbench", "apt-get install postgresql"),
        tool("pg_isready", "apt-get install postgresql"),
    );
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(
            "until \"$1\" -q -h \"$2\"; do sleep 0.1; done; \
             \"$0\" -h \"$2\" -U postgres -i -s 1 -q postgres >/dev/null 2>&1 || exit 1; \
             exec \"$0\" -h \"$2\" -U postgres -n -c \"$3\" -j 2 -T 120 -P 1 -f \"$4\" \
             postgres 2>&1",
        )
        .arg(pgbench)
        .arg(ready)
        .arg(dir)
        .arg(clients.to_string())
        .arg(script)
        .stdout(Stdio::piped());
    c
}

/// A free TCP port on the loopback address, for a server to listen on (released at once for
/// the server to bind; another process taking it in between would fail the case loudly).
fn free_loopback_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    addr.to_string()
}

/// A program's work so far, from the last progress line it printed: `{"ops":N,"seconds":S}`
/// (lockbench, Corpus.java's smallpool) or `{"requests":N,"seconds":S}` (httpload), `N` done
/// in the `S` seconds since it started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub done: f64,
    pub seconds: f64,
}

impl Work {
    /// The work per second of a program whose progress lines come on `out`, over `seconds`
    /// from its first line at or after `settle` seconds; `None` when it stops printing first.
    pub fn rate_over(out: impl std::io::Read, settle: f64, seconds: f64) -> Option<f64> {
        let mut first: Option<Work> = None;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let Some(w) = Work::parse(&line) else {
                continue;
            };
            match first {
                None if w.seconds >= settle => first = Some(w),
                Some(f) if w.seconds >= f.seconds + seconds => return w.rate_since(Some(f)),
                _ => {}
            }
        }
        None
    }

    fn parse(line: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Self {
            done: v.get("ops").or_else(|| v.get("requests"))?.as_f64()?,
            seconds: v["seconds"].as_f64()?,
        })
    }

    /// The work after a sysbench per-second report, `[ 3s ] thds: 32 eps: 580.96 …`: its
    /// events per second over the interval since the report before (`earlier`, or the start),
    /// added to that report's work.
    ///
    /// pgbench's per-second reports, `progress: 4.0 s, 16855.5 tps, lat 1.788 ms …`, the same
    /// way (its transactions per second over the interval).
    fn after_report(earlier: Option<Work>, line: &str) -> Option<Self> {
        let (seconds, eps) = if let Some(rest) = line.strip_prefix("progress: ") {
            let (seconds, rest) = rest.split_once(" s, ")?;
            (seconds, rest.split_once(" tps")?.0)
        } else {
            let (seconds, rest) = line.strip_prefix('[')?.split_once("s ]")?;
            (
                seconds,
                rest.split_once("eps:")?.1.split_whitespace().next()?,
            )
        };
        let seconds: f64 = seconds.trim().parse().ok()?;
        let eps: f64 = eps.trim().parse().ok()?;
        let earlier = earlier.unwrap_or(Work {
            done: 0.0,
            seconds: 0.0,
        });
        (seconds > earlier.seconds).then_some(Work {
            done: earlier.done + eps * (seconds - earlier.seconds),
            seconds,
        })
    }

    /// Work per second from `earlier` (the program's start when it had printed nothing yet)
    /// to `self`; `None` without a second progress line in between.
    fn rate_since(self, earlier: Option<Work>) -> Option<f64> {
        let earlier = earlier.unwrap_or(Work {
            done: 0.0,
            seconds: 0.0,
        });
        (self.seconds > earlier.seconds)
            .then(|| (self.done - earlier.done) / (self.seconds - earlier.seconds))
    }
}

/// The last progress line of a program's stdout, read by a thread of its own until it closes.
#[derive(Clone, Default)]
struct Progress(Arc<Mutex<Option<Work>>>);

impl Progress {
    fn follow(out: ChildStdout) -> Self {
        let progress = Self::default();
        let last = Arc::clone(&progress.0);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut last = last.lock().expect("the progress lock");
                if let Some(w) = Work::parse(&line).or_else(|| Work::after_report(*last, &line)) {
                    *last = Some(w);
                }
            }
        });
        progress
    }

    fn last(&self) -> Option<Work> {
        *self.0.lock().expect("the progress lock")
    }
}

fn redis_socket() -> PathBuf {
    std::env::temp_dir().join(format!("sw-corpus-redis-{}.sock", std::process::id()))
}

use std::os::unix::process::CommandExt as _;

/// The system calls a thread sleeps in when it waits on a futex: `futex(2)` (plain, bitset and
/// PI waits: a PI waiter sleeps in the kernel's rt_mutex code, so the wait channel would not
/// say futex), `futex_waitv(2)` and `futex_wait(2)` (455 on every architecture since the
/// syscall table was unified; the libc crate does not name it yet).
const FUTEX_WAIT_SYSCALLS: [libc::c_long; 3] = [libc::SYS_futex, libc::SYS_futex_waitv, 455];

/// Each of the cgroup's threads' `voluntary_ctxt_switches`, by thread id.
fn voluntary_switches(cgroup: &Path) -> HashMap<String, u64> {
    let tids = std::fs::read_to_string(cgroup.join("cgroup.threads")).unwrap_or_default();
    tids.split_whitespace()
        .filter_map(|tid| {
            let n = process_status(tid.parse().ok()?)?.voluntary_ctxt_switches?;
            Some((tid.to_owned(), n))
        })
        .collect()
}

/// Samples the cgroup's threads until `stop`.
fn sample(cgroup: PathBuf, stop: Arc<AtomicBool>) -> KernelView {
    let mut v = KernelView::default();
    let (started, before) = (Instant::now(), voluntary_switches(&cgroup));
    while !stop.load(Ordering::Relaxed) {
        let tids = std::fs::read_to_string(cgroup.join("cgroup.threads")).unwrap_or_default();
        let mut in_futex_now = 0.0;
        for tid in tids.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).unwrap_or_default();
            // The state is the first field after the parenthesised name.
            let Some(state) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
            else {
                continue;
            };
            v.threads += 1.0;
            match state {
                "R" => v.runnable += 1.0,
                _ => {
                    // The system call the thread is blocked in: its number, first.
                    let call =
                        std::fs::read_to_string(format!("/proc/{tid}/syscall")).unwrap_or_default();
                    let in_futex = call
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<libc::c_long>().ok())
                        .is_some_and(|n| FUTEX_WAIT_SYSCALLS.contains(&n));
                    if in_futex {
                        in_futex_now += 1.0;
                    } else {
                        v.other_sleeping += 1.0;
                    }
                }
            }
        }
        v.futex_sleeping += in_futex_now;
        v.futex_peak = v.futex_peak.max(in_futex_now);
        v.samples += 1;
        std::thread::sleep(SAMPLE_EVERY);
    }
    // A thread that was not there at the start counts from its birth; one that left before the
    // end is not counted (an undercount: the premises that read this ask for at least a rate).
    let switches: u64 = voluntary_switches(&cgroup)
        .into_iter()
        .map(|(tid, n)| n.saturating_sub(before.get(&tid).copied().unwrap_or(0)))
        .sum();
    v.voluntary_switches_per_second = switches as f64 / started.elapsed().as_secs_f64();
    let n = f64::from(v.samples.max(1));
    v.threads /= n;
    v.futex_sleeping /= n;
    v.runnable /= n;
    v.other_sleeping /= n;
    v
}

/// A corpus case running in its cgroup (with its quota and its load), stopped on drop.
pub struct Running {
    // Dropped in this order: the load, the workload, its files, the quota, then the cgroup.
    _load: Option<Group>,
    _workload: Group,
    /// The run's own files (a server's configuration and data), removed once it has stopped.
    _scratch: tempfile::TempDir,
    pub quota: Option<Quota>,
    /// The CPU controller group of a case without a quota ([`Quota::apply`]).
    _cpu_group: Option<Quota>,
    pub cgroup: TestCgroup,
    _hog: Option<Group>,
    /// The progress lines of the program, or of its load, when it reports its work.
    progress: Option<Progress>,
}

impl Running {
    /// The program's work so far, as of its last progress line.
    pub fn work(&self) -> Option<Work> {
        self.progress.as_ref()?.last()
    }

    /// The program's work as of its first progress line, waiting up to [`FIRST_REPORT`] for
    /// one; `None` if it printed none by then.
    fn first_report(&self) -> Option<Work> {
        let asked = Instant::now();
        while self.work().is_none() && asked.elapsed() < FIRST_REPORT {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.work()
    }

    /// The program's work per second over the next `span` (it waits that long), from its
    /// first progress line on: a program still starting (a JVM in a small quota) is given up
    /// to [`FIRST_REPORT`] to print one, so that its start-up is not counted as its work.
    fn work_per_second_over(&self, span: Duration, what: &str) -> f64 {
        self.measure_over(span, what).work_per_second
    }

    /// The CPU time its cgroup spends per unit of the program's work over the next `span` (it
    /// waits that long), from its first progress line on: what a unit of work costs it, whatever
    /// share of the CPUs a load generator outside the cgroup leaves it.
    fn cpu_seconds_per_work_over(&self, span: Duration, what: &str) -> f64 {
        self.measure_over(span, what).cpu_seconds_per_work
    }

    /// Both of the above over one `span`.
    fn measure_over(&self, span: Duration, what: &str) -> Measured {
        let (from, cpu_from) = (self.first_report(), self.cgroup.cpu_usage_seconds());
        std::thread::sleep(span);
        let (to, cpu_to) = (self.work(), self.cgroup.cpu_usage_seconds());
        let no_work = || panic!("{what} reported no work over {span:?}");
        let done = to
            .map(|to| to.done - from.map_or(0.0, |f| f.done))
            .filter(|d| *d > 0.0)
            .unwrap_or_else(no_work);
        Measured {
            work_per_second: to
                .and_then(|to| to.rate_since(from))
                .unwrap_or_else(no_work),
            cpu_seconds_per_work: (cpu_to - cpu_from) / done,
        }
    }
}

/// A program's work per second over a span, and the CPU time its cgroup spent per unit of it.
#[derive(Clone, Copy, Debug)]
struct Measured {
    work_per_second: f64,
    cpu_seconds_per_work: f64,
}

/// Starts `case` in a fresh cgroup and lets it settle. With `noise`, a `stress-ng --cpu 1`
/// runs beside it, outside its cgroup.
pub fn start(case: &Case, noise: bool) -> Running {
    launch(case, &case.program, "", noise, SETTLE)
}

/// Starts `program` as `case` runs (its quota, its load, the neighbour with `noise`) in a fresh
/// cgroup named after the case and `suffix`, and waits `settle`.
fn launch(case: &Case, program: &Program, suffix: &str, noise: bool, settle: Duration) -> Running {
    let cgroup = TestCgroup::new(&format!("corpus-{}{suffix}", case.name));
    let hog = noise.then(|| {
        let mut c = Command::new(tool("stress-ng", "apt-get install stress-ng"));
        c.args(["--cpu", "1", "-t", "120"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        Group(c.spawn().expect("starting the stress-ng --cpu 1 neighbour"))
    });
    let listen = match program {
        Program::GoHttpUnderLoad { .. }
        | Program::Memcached { .. }
        | Program::Nginx { .. }
        | Program::Tomcat { .. }
        | Program::Tokio { .. }
        | Program::VirtualHttp { .. }
        | Program::RedisIoThreads { .. } => free_loopback_address(),
        _ => String::new(),
    };
    let scratch = tempfile::Builder::new()
        .prefix(&format!("sw-corpus-{}{suffix}-", case.name))
        .tempdir()
        .expect("a scratch directory for the case");
    let mut cmd = command(program, &listen, scratch.path());
    let group = Quota::apply(&mut cmd, &cgroup, case.quota);
    let (quota, cpu_group) = match case.quota {
        Some(_) => (Some(group), None),
        None => (None, Some(group)),
    };
    join_before_exec(&mut cmd, &cgroup.path().join("cgroup.procs"));
    let mut workload = Group(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", case.name)),
    );
    let mut progress = workload.0.stdout.take().map(Progress::follow);
    let load = load(program, &listen, scratch.path()).map(|mut c| {
        std::thread::sleep(Duration::from_millis(500));
        let mut load = Group(
            c.spawn()
                .unwrap_or_else(|e| panic!("cannot start the load of {}: {e}", case.name)),
        );
        if let Some(out) = load.0.stdout.take() {
            progress = Some(Progress::follow(out));
        }
        load
    });
    if program.prepares_under_load() {
        // Its load fills the database first: the case settles from its first report on.
        let started = Instant::now();
        while progress.as_ref().and_then(Progress::last).is_none()
            && started.elapsed() < FIRST_REPORT
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(settle);
    Running {
        _load: load,
        _workload: workload,
        _scratch: scratch,
        quota,
        _cpu_group: cpu_group,
        cgroup,
        _hog: hog,
        progress,
    }
}

/// Runs the case's counterfactual (if it has one) alone, as the case runs, and measures its
/// work per second once settled, over `MEASURE_SECONDS`.
pub fn counterfactual_work_per_second(case: &Case, noise: bool) -> Option<f64> {
    measure_counterfactual(case, noise).map(|m| m.work_per_second)
}

fn measure_counterfactual(case: &Case, noise: bool) -> Option<Measured> {
    let program = case
        .counterfactual
        .as_ref()
        .filter(|_| timings_are_real())?;
    let running = launch(case, program, "-counterfactual", noise, SETTLE);
    Some(running.measure_over(
        MEASURE_SECONDS,
        &format!("the counterfactual of {} ({program:?})", case.name),
    ))
}

/// How many times the CPU time per unit of work the program spends that its counterfactual does,
/// in each pair of runs (the program started alone, its counterfactual after it, as the case
/// runs): where a load generator shares the CPUs with the program, its cost per unit of work,
/// not its work per second, says what the counterfactual saves (issue #41: the Go server's
/// requests per second at GOMAXPROCS=2 against 16 drew 0.88–1.66×, its CPU per request
/// 1.36–1.45× at 16). Pairs are run until their median's interval among the check's bars
/// (`interval`) is decided ([`settle_between`]): three at least, [`PAIRS_NEAR_A_BAR`] at most —
/// with the server on one CPU and its load generator on the other a pair scatters by ±30% on
/// the Intel VM (jvm-virtual-http-tiny-requests, tests/CORPUS.md), and three pairs' median
/// crossed a bar in one run of six. Empty where timings are not real or the case has no
/// counterfactual.
///
/// The judged run's own pair (`o`: the program measured alone before the agent attached, its
/// counterfactual after it stopped, each as a pair here runs them) is the first, where it was
/// run without noise: one pair less to run for each server (two launches, settled and
/// measured, as above).
pub fn cpu_per_work_ratios(case: &Case, o: &Outcome, interval: impl Fn(f64) -> usize) -> Vec<f64> {
    let Some(counterfactual) = case.counterfactual.as_ref().filter(|_| timings_are_real()) else {
        return Vec::new();
    };
    let mut ratios: Vec<f64> = o.judged_cost_ratio.into_iter().collect();
    settle_between(&mut ratios, interval, || {
        let program = launch(case, &case.program, "-cost", false, SETTLE)
            .cpu_seconds_per_work_over(MEASURE_SECONDS, case.name);
        let instead = launch(case, counterfactual, "-cost-counterfactual", false, SETTLE)
            .cpu_seconds_per_work_over(
                MEASURE_SECONDS,
                &format!("the counterfactual of {} ({counterfactual:?})", case.name),
            );
        program / instead
    });
    ratios
}

/// The counterfactual's gain in each pair of runs the premise is judged on: the judged run's
/// `first` pair (the program's work per second before the agent attached, the counterfactual's);
/// when its gain lies near a bar ([`NEAR_A_BAR`]), on either side of it, more pairs until
/// [`PAIRS_NEAR_A_BAR`], each the program started again alone and its counterfactual after it, so
/// that the median, not one draw, settles the premise.
///
/// More pairs too where the first one's reading of the program alone was disturbed: the
/// program did more than [`NEAR_A_BAR`] times that work per second while the agent watched it
/// (`judged`), which the agent's probes do not cause — node-libuv-pool-400us in a CI run
/// (2026-11-28, AMD): 8,572/s alone, 10,900/s judged, its counterfactual 1.42× the first and
/// 1.11× the second, where five pairs had read 0.98–1.29×.
fn premise_gains(
    case: &Case,
    noise: bool,
    first: Option<(f64, f64)>,
    judged: Option<f64>,
) -> Vec<f64> {
    let Some((alone, counterfactual)) = first else {
        return Vec::new();
    };
    let mut gains = vec![counterfactual / alone];
    // A server judged by its CPU per request (`cpu_per_work_ratios`, which measures its own
    // pairs) is not judged by work per second, which its load generator's share of the CPUs
    // sways: its first pair is reported, and no more are run for it (about 4 minutes of CI;
    // go-http-gomaxprocs-16's four more pairs near a bar took a minute, and no check read them).
    if case.checks.iter().any(|c| {
        matches!(
            c,
            Check::NoCostlierPerWorkOrOversubscribed | Check::CpuPerWorkOverCounterfactual(_)
        )
    }) {
        return gains;
    }
    let near = |g: f64| {
        [LOCK_BOUND_GAIN, NO_CLEAR_GAIN]
            .iter()
            .any(|&bar| near_a_bar(bar, g))
    };
    let disturbed = judged.is_some_and(|j| j > alone * NEAR_A_BAR);
    if disturbed {
        eprintln!(
            "{}: {alone:.0}/s alone before the agent, {:.0}/s while judged: the first pair's \
             reading alone was disturbed",
            case.name,
            judged.unwrap_or(f64::NAN)
        );
    }
    if near(gains[0]) || disturbed {
        settle_premise(&mut gains, || {
            let alone = launch(case, &case.program, "-again", noise, SETTLE)
                .work_per_second_over(MEASURE_SECONDS, case.name);
            let counterfactual = counterfactual_work_per_second(case, noise)
                .expect("a counterfactual run once runs again");
            counterfactual / alone
        });
        eprintln!(
            "{}: first gain {:.2}× unsettled (near a premise bar, or its reading alone \
             disturbed): {} pairs measured of at most {PAIRS_NEAR_A_BAR}, {:.2?}",
            case.name,
            gains[0],
            gains.len(),
            gains
        );
    }
    gains
}

/// Whether one pair's `gain` lies within [`NEAR_A_BAR`] of `bar`, on either side: too near
/// for one pair to settle which side the premise is on.
pub fn near_a_bar(bar: f64, gain: f64) -> bool {
    gain >= bar / NEAR_A_BAR && gain <= bar * NEAR_A_BAR
}

/// Measures more pairs of runs (`pair`: one pair's gain) until those in `gains` decide the
/// premise (`premise_decided`, with the work-per-second bars: [`work_premise`]): at most
/// [`PAIRS_NEAR_A_BAR`] in all, judged by their median.
pub fn settle_premise(gains: &mut Vec<f64>, pair: impl FnMut() -> f64) {
    settle_between(gains, work_premise, pair);
}

/// As [`settle_premise`], with the intervals a check's own bars cut (`interval`: which one a
/// gain lies in, ordered as the gains are).
pub fn settle_between(
    gains: &mut Vec<f64>,
    interval: impl Fn(f64) -> usize,
    mut pair: impl FnMut() -> f64,
) {
    while !premise_decided(gains, &interval) {
        gains.push(pair());
    }
}

/// The premise a work-per-second gain says: 0 not lock-bound (≤ [`NO_CLEAR_GAIN`]), 1 between
/// the bars, 2 lock-bound (≥ [`LOCK_BOUND_GAIN`]).
pub fn work_premise(gain: f64) -> usize {
    if gain >= LOCK_BOUND_GAIN {
        2
    } else if gain <= NO_CLEAR_GAIN {
        0
    } else {
        1
    }
}

/// Which interval of a server's CPU per unit of work over its counterfactual's `ratio` lies in
/// among the `bars` (ascending) a check's outcome turns on: how many of them it exceeds.
/// `Check::NoCostlierPerWorkOrOversubscribed` turns on [`NO_CLEAR_GAIN`] where the agent names
/// no thread cost and on [`NO_COST`] where a finding says the count costs; a bar the outcome
/// does not turn on is not settled (its pairs would only cost CI time).
pub fn bars_exceeded(bars: &[f64], ratio: f64) -> usize {
    bars.iter().filter(|&&bar| ratio > bar).count()
}

/// Whether the pairs measured so far already decide what the median of
/// [`PAIRS_NEAR_A_BAR`] pairs would, the premise's intervals given by `interval` (ordered as
/// the gains are). Once a majority of the pairs to be run lies in one interval the median of
/// all of them lies there too, whatever the rest read, and the median of those measured (the
/// upper one of an even count) as well: the pairs left could not change the premise, and are
/// not run.
fn premise_decided(gains: &[f64], interval: impl Fn(f64) -> usize) -> bool {
    if gains.len() >= PAIRS_NEAR_A_BAR {
        return true;
    }
    let majority = PAIRS_NEAR_A_BAR / 2 + 1;
    let mut intervals: Vec<usize> = gains.iter().map(|&g| interval(g)).collect();
    intervals.sort_unstable();
    intervals.windows(majority).any(|w| w[0] == w[majority - 1])
}

/// Whether this machine's timings are the programs' own: not in the kernel matrix's guests,
/// which run under software emulation (`xtask/src/kernels/guest.rs` sets
/// `STORMWATCH_TEST_EMULATED` there). There a sysbench storm's counterfactual did 0.11× and
/// 0.47× the work of the storm it does 1.2–1.4× of on the host: a counterfactual is neither
/// run nor compared in a guest.
pub fn timings_are_real() -> bool {
    std::env::var_os("STORMWATCH_TEST_EMULATED").is_none()
}

/// Runs `case` once and judges it with `diagnose`, then runs its counterfactual (but where
/// [`timings_are_real`] says not). With `noise`,
/// a `stress-ng --cpu 1` runs beside both, outside their cgroups.
pub fn run(case: &Case, noise: bool) -> Outcome {
    let running = start(case, noise);
    let alone = case
        .counterfactual
        .is_some()
        .then(|| running.measure_over(MEASURE_SECONDS, case.name));
    let alone_work_per_second = alone.map(|m| m.work_per_second);
    let (cgroup, quota) = (&running.cgroup, running.quota.as_ref());
    // A JVM's virtual threads are dumped only where asked (agent/src/config.rs,
    // `jvm_virtual_threads`): for the cases that run them, unless their scheduler's counter
    // alone is to be judged ([`VIRTUAL_COUNTER_ONLY_ENV`]).
    let virtual_threads =
        case.program.runs_virtual_threads() && std::env::var_os(VIRTUAL_COUNTER_ONLY_ENV).is_none();
    let duration = DIAGNOSE_SECONDS.to_string();
    let mut args = vec!["diagnose", "--duration", &duration, "--json"];
    if virtual_threads {
        args.push("--jvm-virtual-threads");
    }
    let diagnose = Agent::start(&args);
    let started = Instant::now();
    let work0 = running.work();
    let cpu0 = cgroup.cpu_usage_seconds();
    let periods0 = quota.map(Quota::periods);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (path, stop) = (cgroup.path().to_path_buf(), Arc::clone(&stop));
        std::thread::spawn(move || sample(path, stop))
    };
    let out = diagnose.finish_output();
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut kernel = sampler.join().expect("the sampler thread");
    kernel.cpu_cores = (cgroup.cpu_usage_seconds() - cpu0) / secs;
    kernel.throttled_share = quota.zip(periods0).map(|(q, (p0, t0))| {
        let (p1, t1) = q.periods();
        (t1 - t0) / (p1 - p0).max(1.0)
    });
    let work_per_second = running.progress.as_ref().map(|p| {
        p.last()
            .and_then(|w| w.rate_since(work0))
            .unwrap_or_else(|| panic!("{} reported no work while it was judged", case.name))
    });

    let text = out.stdout_text();
    // `STORMWATCH_CORPUS_KEEP=DIR` keeps each judged run's document (`<case>.<n>.json`), to see
    // every figure the rule judged.
    if let Some(dir) = std::env::var_os("STORMWATCH_CORPUS_KEEP") {
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let n = (0..)
            .find(|n| !dir.join(format!("{}.{n}.json", case.name)).exists())
            .expect("a free name");
        let _ = std::fs::write(dir.join(format!("{}.{n}.json", case.name)), &text);
    }
    let report: Diagnosis = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "diagnose --json printed no document the tests can read ({e}):\n{text}\nstderr:\n{}",
            out.stderr.join("\n")
        )
    });
    let about = report.findings_about(cgroup.rel_path());
    let storm_finding = about.iter().find(|f| f.kind == "lock_storm").cloned();
    let figures = report.storm_figures(cgroup.rel_path());
    let kinds = about.iter().map(|f| f.kind.clone()).collect();
    let run_verdict =
        std::env::var_os(RUN_VERDICT_ENV).map(|_| run_verdict(cgroup.rel_path(), virtual_threads));
    // The judged run stops before its counterfactual starts: they never share the CPUs.
    drop(running);
    let counterfactual = measure_counterfactual(case, noise);
    let counterfactual_work_per_second = counterfactual.map(|m| m.work_per_second);
    let judged_cost_ratio = alone
        .zip(counterfactual)
        .filter(|_| !noise)
        .map(|(a, c)| a.cpu_seconds_per_work / c.cpu_seconds_per_work);
    let premise_gains = premise_gains(
        case,
        noise,
        alone_work_per_second.zip(counterfactual_work_per_second),
        work_per_second,
    );
    let possible_storm = storm_finding
        .as_ref()
        .is_some_and(|f| f.context("verdict") == Some("possible"));
    Outcome {
        lock_storm: storm_finding.is_some() && !possible_storm,
        possible_storm,
        kinds,
        storm_finding,
        findings: about,
        figures,
        kernel,
        allowed: case.quota.unwrap_or(cpus() as f64).min(cpus() as f64),
        work_per_second,
        alone_work_per_second,
        counterfactual_work_per_second,
        premise_gains,
        run_verdict,
        judged_cost_ratio,
    }
}

/// A one-line account of an outcome, for messages and the corpus table.
pub fn describe(case: &Case, o: &Outcome) -> String {
    let k = &o.kernel;
    format!(
        "{}: expected {:?}, found {} (findings {:?}); rule: handoffs/s per CPU {:.0} (needs {:.0}), \
         queued per CPU {:.1}, futex share of off-CPU {:.2}, timeouts {:.2}, runnable per CPU \
         {:.2}, CPUs wanted {:.2}, hand-offs per CPU-second used {:.0}; kernel: {:.0} threads, \
         {:.1} asleep in futex (at most {:.0} at once), {:.1} runnable, {:.1} asleep elsewhere, \
         {:.0} sleeps/s, {:.2} CPUs used{}{}{}",
        case.name,
        case.expect,
        if o.lock_storm {
            "lock_storm"
        } else if o.possible_storm {
            "a possible lock_storm (near a line)"
        } else {
            "no lock_storm"
        },
        o.kinds,
        o.figure(|f| f.handoffs_per_cpu_second),
        o.figure(|f| f.required_handoffs_per_cpu_second),
        o.figure(|f| f.queued_threads_per_cpu),
        o.figure(|f| f.futex_blocked_share),
        o.figure(|f| f.futex_timeout_share),
        o.figure(|f| f.runnable_per_cpu),
        o.figure(|f| f.cpus_wanted),
        o.figure(|f| f.handoffs_per_cpu_second_used),
        k.threads,
        k.futex_sleeping,
        k.futex_peak,
        k.runnable,
        k.other_sleeping,
        k.voluntary_switches_per_second,
        k.cpu_cores,
        k.throttled_share
            .map(|t| format!(", throttled {:.0}%", 100.0 * t))
            .unwrap_or_default(),
        // A runtime's own figure, where its rule said the storm (or a possible one).
        o.storm_finding
            .as_ref()
            .and_then(|f| f
                .evidence
                .get("pg_lock_waiting_backends_per_cpu")
                .copied()?)
            .map(|w| format!("; PostgreSQL backends waiting for a lock per CPU {w:.2}"))
            .unwrap_or_default(),
        o.work_per_second
            .map(|w| {
                let counterfactual = o
                    .alone_work_per_second
                    .zip(o.counterfactual_work_per_second)
                    .map(|(a, c)| {
                        let again = match (o.premise_gains.len(), o.counterfactual_gain()) {
                            (2.., Some(g)) => format!(
                                "; near a bar, median ×{g:.2} of {} pairs {:.2?}",
                                o.premise_gains.len(),
                                o.premise_gains
                            ),
                            _ => String::new(),
                        };
                        format!(
                            ", before the agent {a:.0}/s, counterfactual {c:.0}/s (×{:.2}{again})",
                            c / a
                        )
                    })
                    .unwrap_or_default();
                format!("; work {w:.0}/s judged{counterfactual}")
            })
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::{
        LOCK_BOUND_GAIN, NO_CLEAR_GAIN, NO_COST, PAIRS_NEAR_A_BAR, Work, bars_exceeded, median,
        premise_decided, work_premise,
    };

    /// A server's cost premise where both of its bars matter.
    fn cost_premise(ratio: f64) -> usize {
        bars_exceeded(&[NO_COST, NO_CLEAR_GAIN], ratio)
    }

    /// Every sequence of five gains drawn from `readings` (on, between and either side of the
    /// bars `interval` cuts): stopping where `premise_decided` says must give the premise all
    /// five give. Returns how many sequences stopped early.
    fn stopping_keeps_the_premise(readings: &[f64], interval: fn(f64) -> usize) -> usize {
        let n = readings.len();
        let mut stopped_early = 0;
        for code in 0..n.pow(PAIRS_NEAR_A_BAR as u32) {
            let all: Vec<f64> = (0..PAIRS_NEAR_A_BAR)
                .map(|i| readings[code / n.pow(i as u32) % n])
                .collect();
            let mut measured = vec![all[0]];
            while !premise_decided(&measured, interval) {
                measured.push(all[measured.len()]);
            }
            assert_eq!(
                interval(median(measured.clone())),
                interval(median(all.clone())),
                "stopped at {measured:?} of {all:?}"
            );
            stopped_early += usize::from(measured.len() < PAIRS_NEAR_A_BAR);
        }
        stopped_early
    }

    #[test]
    fn pairs_stop_only_once_the_rest_could_not_change_the_premise() {
        let work = [0.9, NO_CLEAR_GAIN, 1.12, LOCK_BOUND_GAIN, 1.4];
        assert!(stopping_keeps_the_premise(&work, work_premise) > 0);
        let cost = [0.9, NO_COST, 1.07, NO_CLEAR_GAIN, 1.3];
        assert!(stopping_keeps_the_premise(&cost, cost_premise) > 0);
        // Three alike decide: the rule does save runs.
        assert!(premise_decided(&[1.05, 1.05, 1.05], work_premise));
        assert!(!premise_decided(&[1.05, 1.2, 1.05, 1.2], work_premise));
        // A server's cost: three pairs on either side of NO_COST do not decide it.
        assert!(!premise_decided(&[1.04, 1.09, 1.13], cost_premise));
        assert!(premise_decided(&[1.12, 1.3, 1.16], cost_premise));
        // A bar the outcome does not turn on is not settled: three pairs always decide.
        let no_bars = |r| bars_exceeded(&[], r);
        assert!(premise_decided(&[0.7, 1.3, 1.05], no_bars));
        assert!(!premise_decided(&[1.04, 1.09], no_bars));
    }

    #[test]
    fn sysbench_reports_add_up_to_its_events() {
        let first = Work::after_report(None, "[ 1s ] thds: 32 eps: 500.00 lat (ms,95%): 2.52");
        assert_eq!(
            first,
            Some(Work {
                done: 500.0,
                seconds: 1.0
            })
        );
        let third = Work::after_report(first, "[ 3s ] thds: 32 eps: 250.50 lat (ms,95%): 2.43");
        assert_eq!(
            third,
            Some(Work {
                done: 1001.0,
                seconds: 3.0
            })
        );
        assert_eq!(Work::after_report(third, "[ 3s ] thds: 32 eps: 1.00"), None);
        assert_eq!(Work::after_report(third, "Threads started!"), None);
    }

    #[test]
    fn pgbench_reports_add_up_to_its_transactions() {
        let first = Work::after_report(
            None,
            "progress: 1.0 s, 16000.5 tps, lat 1.788 ms stddev 2.016, 0 failed",
        );
        assert_eq!(
            first,
            Some(Work {
                done: 16000.5,
                seconds: 1.0
            })
        );
        let second = Work::after_report(first, "progress: 2.5 s, 1000.0 tps, lat 1.9 ms");
        assert_eq!(
            second,
            Some(Work {
                done: 17500.5,
                seconds: 2.5
            })
        );
        assert_eq!(Work::after_report(second, "progress: 2.5 s, 9.0 tps"), None);
        assert_eq!(Work::after_report(second, "pgbench (15.18)"), None);
    }
}
