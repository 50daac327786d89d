//! The lock-storm corpus, repeated: how often each case gets its verdict, on a quiet machine or
//! beside a `stress-ng --cpu 1` (`--noise`). Run by `cargo xtask corpus`; prints a Markdown
//! table (case, split, expected, right / runs, median figures, median work per second: judged,
//! before the agent attached, and of the counterfactual) for agent/DIAGNOSIS.md and
//! tests/CORPUS.md.
//!
//!   corpus [--repeat N] [--noise] [--run] [--case NAME]...
//!
//! With `--run`, `stormwatch run` is also asked for its verdict on each run of each case (about
//! 35 s more per run), and a last column says in how many runs it agreed with `diagnose`.

use stormwatch_tests::{
    corpus::{self, Expect, Outcome, RunVerdict, Split, median},
    report::StormCheck,
};

/// Whether `run` said what `diagnose` did of a run; `None` when `run` was not asked.
fn run_agrees(o: &Outcome) -> Option<bool> {
    let said = match o.run_verdict? {
        RunVerdict::Storm => (true, false),
        RunVerdict::Possible => (false, true),
        RunVerdict::None => (false, false),
    };
    Some(said == (o.lock_storm, o.possible_storm))
}

/// The median of figures that not every case has ("–" when it has none).
fn median_of(v: impl Iterator<Item = Option<f64>>) -> String {
    let v: Vec<f64> = v.flatten().collect();
    if v.is_empty() {
        "–".to_owned()
    } else {
        format!("{:.0}", median(v))
    }
}

fn main() {
    let mut repeat = 10u32;
    let mut noise = false;
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--repeat" => {
                repeat = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--repeat N")
            }
            "--noise" => noise = true,
            // SAFETY: set before any thread is started.
            "--run" => unsafe { std::env::set_var(corpus::RUN_VERDICT_ENV, "1") },
            "--case" => only.push(args.next().expect("--case NAME")),
            other => panic!("unknown argument {other}"),
        }
    }
    let cases: Vec<_> = corpus::cases()
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| o == c.name))
        .collect();
    println!(
        "| workload | split | expected | right | hand-offs/s per CPU | needed | queued per CPU | \
         futex share of off-CPU | CPUs wanted | hand-offs per CPU-second used | kernel: threads \
         asleep in futex | kernel: sleeps/s | CPUs used | work/s | work/s before the agent | counterfactual work/s | `run` agrees |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_stable = true;
    for case in &cases {
        let mut right = 0;
        let mut outcomes = Vec::new();
        for _ in 0..repeat {
            let o = corpus::run(case, noise);
            eprintln!("{}", corpus::describe(case, &o));
            if let Some(v) = o.run_verdict {
                eprintln!("{}: stormwatch run said {v:?}", case.name);
            }
            if o.lock_storm == (case.expect == Expect::LockStorm) {
                right += 1;
            }
            outcomes.push(o);
        }
        let m = |figure: fn(&StormCheck) -> Option<f64>| {
            median(outcomes.iter().map(|o| o.figure(figure)).collect())
        };
        all_stable &= right * 10 >= repeat * 9;
        println!(
            "| {} ({}) | {} | {} | {right}/{repeat} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} | {:.0} \
             | {:.1} | {:.0} | {:.2} | {} | {} | {} | {} |",
            case.name,
            case.what,
            match case.split {
                Split::Tuning => "tuning",
                Split::HeldOut => "held-out",
            },
            match case.expect {
                Expect::LockStorm => "lock_storm",
                Expect::NotLockStorm => "none",
            },
            m(|f| f.handoffs_per_cpu_second),
            m(|f| f.required_handoffs_per_cpu_second),
            m(|f| f.queued_threads_per_cpu),
            m(|f| f.futex_blocked_share),
            m(|f| f.cpus_wanted),
            m(|f| f.handoffs_per_cpu_second_used),
            median(outcomes.iter().map(|o| o.kernel.futex_sleeping).collect()),
            median(
                outcomes
                    .iter()
                    .map(|o| o.kernel.voluntary_switches_per_second)
                    .collect()
            ),
            median(outcomes.iter().map(|o| o.kernel.cpu_cores).collect()),
            median_of(outcomes.iter().map(|o| o.work_per_second)),
            median_of(outcomes.iter().map(|o| o.alone_work_per_second)),
            median_of(outcomes.iter().map(|o| o.counterfactual_work_per_second)),
            {
                let agreed: Vec<bool> = outcomes.iter().filter_map(run_agrees).collect();
                if agreed.is_empty() {
                    "–".to_owned()
                } else {
                    format!("{}/{}", agreed.iter().filter(|a| **a).count(), agreed.len())
                }
            },
        );
    }
    if !all_stable {
        eprintln!("some case got its verdict in fewer than 9 of 10 runs");
        std::process::exit(1);
    }
}
