//! Whole stacks of sampled hand-offs, for lock profiles (`report::pprof`): per cgroup, each
//! waiter's stack (from the site that waited out to its callers) with the waits it stands for,
//! and each waker's stack with the waits its wakes ended — the two sides of the lock, as the
//! call sites ([`super::handoffs`]) name them one frame each.
//!
//! A stack is keyed by its frames' names (not addresses: a profile sums the same code across
//! processes of a container), the machinery it waited or woke in, and what the holder did
//! while it held the lock (on CPU, preempted, asleep), so that a profile can be split by it.
//! The figures are of sampled hand-offs, as the call sites' are: shares, not totals.

use std::collections::HashMap;

use super::user::{Frame, UserSite};

/// The most distinct stacks kept per cgroup in a window; past it, samples are counted under
/// one stack that says so ([`OVERFLOW_FRAME`]). The sampler's budget (100 wakes a second on
/// the node) keeps far fewer in a window of ordinary length.
pub const MAX_STACKS: usize = 512;
/// The one frame of the stack that stands for the samples past [`MAX_STACKS`].
pub const OVERFLOW_FRAME: &str = "[stacks past the profile's bound]";

/// One frame of a profile's stack, named as far as it could be.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackFrame {
    /// The function (a Java method as `Class.method`), or `[unknown]`-style text that says
    /// what it is in.
    pub function: String,
    /// The binary's file name, or `JIT` for a JVM's (or other runtime's) compiled code.
    pub module: Option<String>,
    /// `file:line`, where it was looked up (the site's frame, in the one-off commands).
    pub location: Option<String>,
}

impl StackFrame {
    fn of(f: &Frame) -> Self {
        let function = match (&f.name, f.module.as_deref()) {
            (Some(n), _) => n.clone(),
            (None, Some("JIT")) => "[JIT code without a perf map entry]".to_owned(),
            (None, Some(m)) => format!("[unknown in {m}]"),
            (None, None) => "[unknown]".to_owned(),
        };
        Self {
            function,
            module: f.module.clone(),
            location: f.location.clone(),
        }
    }

    /// Whether it is a JIT's compiled code: such a frame may hold methods inlined into it,
    /// which a frame walk does not see (perf maps name the outermost method only).
    pub fn is_jit(&self) -> bool {
        self.module.as_deref() == Some("JIT")
    }
}

/// Which side of a hand-off a stack is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// It waited for the lock.
    Waiter,
    /// It let the lock go and woke the waiter.
    Waker,
}

/// What the lock's holder did while it held the lock, over a sampled hand-off: the waker is
/// the holder, and its hold is known when it had itself been handed the lock by a wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    /// It stayed on its CPU.
    OnCpu,
    /// It was switched out involuntarily (preempted, or its cgroup throttled).
    Preempted,
    /// It slept while it held the lock.
    Asleep,
    /// Both.
    PreemptedAndAsleep,
}

impl Holder {
    pub fn of(hold_known: bool, preempted: bool, asleep: bool) -> Option<Self> {
        hold_known.then_some(match (preempted, asleep) {
            (false, false) => Self::OnCpu,
            (true, false) => Self::Preempted,
            (false, true) => Self::Asleep,
            (true, true) => Self::PreemptedAndAsleep,
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::OnCpu => "on_cpu",
            Self::Preempted => "preempted",
            Self::Asleep => "asleep",
            Self::PreemptedAndAsleep => "preempted_and_asleep",
        }
    }
}

/// What a stack is kept by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub side: Side,
    /// Innermost (the site) first.
    pub frames: Vec<StackFrame>,
    /// The lock machinery the site called (`pthread_mutex_lock`, `sync.(*Mutex).Lock`, …).
    pub lock_function: Option<String>,
    /// The holder's part, where its hold is on record.
    pub holder: Option<Holder>,
}

/// The samples a stack stands for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackValues {
    /// Futex waits sampled with this stack as the waiter's.
    pub waits: u64,
    /// Those waits' time.
    pub wait_ns: u64,
    /// Futex wakes sampled with this stack as the waker's (they handed the lock on).
    pub wakes: u64,
    /// The time of the waits those wakes ended.
    pub woken_wait_ns: u64,
    /// Go: sampled `Lock` calls that found the mutex held (its uprobes' samples, taken in
    /// bursts and not timed: another sample than the futex hand-offs', so counted apart).
    pub go_contended_locks: u64,
    /// Go: sampled `Unlock` calls that handed the mutex on.
    pub go_handing_unlocks: u64,
}

impl StackValues {
    pub fn add(&mut self, o: &Self) {
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
        self.wakes += o.wakes;
        self.woken_wait_ns += o.woken_wait_ns;
        self.go_contended_locks += o.go_contended_locks;
        self.go_handing_unlocks += o.go_handing_unlocks;
    }
}

/// A cgroup's sampled stacks, both sides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockStacks {
    pub stacks: HashMap<StackKey, StackValues>,
}

impl LockStacks {
    /// Adds `v` under the stack of `frames` (innermost first, from the site out) on `side`.
    pub fn record(
        &mut self,
        side: Side,
        site: &UserSite,
        frames: &[Frame],
        holder: Option<Holder>,
        v: StackValues,
    ) {
        // A side with nothing unwound (its stack unreadable, its process gone) still counts,
        // under one frame that says why.
        let frames = if frames.is_empty() {
            vec![StackFrame {
                function: format!("[{}]", site.unnamed.as_deref().unwrap_or("not unwound")),
                module: None,
                location: None,
            }]
        } else {
            frames.iter().map(StackFrame::of).collect()
        };
        let key = StackKey {
            side,
            frames,
            lock_function: site.lock_function.clone(),
            holder,
        };
        self.add_one(key, &v);
    }

    fn add_one(&mut self, key: StackKey, v: &StackValues) {
        if let Some(e) = self.stacks.get_mut(&key) {
            e.add(v);
            return;
        }
        if Self::is_overflow(&key) {
            self.stacks.entry(key).or_default().add(v);
            return;
        }
        // The stacks kept, not counting the (at most two: a side each) that stand for the rest.
        let overflow = [Side::Waiter, Side::Waker]
            .into_iter()
            .filter(|&side| self.stacks.contains_key(&Self::overflow_key(side)))
            .count();
        let key = if self.stacks.len() - overflow >= MAX_STACKS {
            Self::overflow_key(key.side)
        } else {
            key
        };
        self.stacks.entry(key).or_default().add(v);
    }

    fn overflow_key(side: Side) -> StackKey {
        StackKey {
            side,
            frames: vec![StackFrame {
                function: OVERFLOW_FRAME.to_owned(),
                module: None,
                location: None,
            }],
            lock_function: None,
            holder: None,
        }
    }

    fn is_overflow(k: &StackKey) -> bool {
        k.frames.len() == 1
            && k.frames[0].function == OVERFLOW_FRAME
            && k.frames[0].module.is_none()
    }

    pub fn add(&mut self, o: &Self) {
        // In a stable order, so that which stacks fall past the bound does not depend on a
        // hash map's.
        let mut all: Vec<_> = o.stacks.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        for (k, v) in all {
            self.add_one(k.clone(), v);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Whether it holds Go `sync.Mutex` samples.
    pub fn has_go_mutex(&self) -> bool {
        self.stacks
            .values()
            .any(|v| v.go_contended_locks + v.go_handing_unlocks > 0)
    }

    /// Whether samples fell past [`MAX_STACKS`].
    pub fn overflowed(&self) -> bool {
        self.stacks.keys().any(Self::is_overflow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: Option<&str>, module: &str) -> Frame {
        Frame {
            name: name.map(str::to_owned),
            location: None,
            module: Some(module.to_owned()),
            lookup: None,
        }
    }

    fn site() -> UserSite {
        UserSite {
            function: Some("worker".into()),
            lock_function: Some("pthread_mutex_lock".into()),
            location: None,
            module: Some("lockbench".into()),
            unnamed: None,
        }
    }

    #[test]
    fn the_same_stack_adds_up_and_unnamed_frames_say_where_they_are() {
        let mut s = LockStacks::default();
        let frames = [
            frame(Some("worker"), "lockbench"),
            frame(None, "libc.so.6"),
            frame(None, "JIT"),
        ];
        let v = StackValues {
            waits: 1,
            wait_ns: 10,
            ..Default::default()
        };
        s.record(Side::Waiter, &site(), &frames, Some(Holder::OnCpu), v);
        s.record(Side::Waiter, &site(), &frames, Some(Holder::OnCpu), v);
        s.record(Side::Waiter, &site(), &frames, Some(Holder::Asleep), v);
        assert_eq!(s.stacks.len(), 2);
        let (k, v) = s
            .stacks
            .iter()
            .find(|(k, _)| k.holder == Some(Holder::OnCpu))
            .unwrap();
        assert_eq!((v.waits, v.wait_ns), (2, 20));
        let names: Vec<_> = k.frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(
            names,
            [
                "worker",
                "[unknown in libc.so.6]",
                "[JIT code without a perf map entry]"
            ]
        );
        assert!(k.frames[2].is_jit() && !k.frames[0].is_jit());
        assert_eq!(k.lock_function.as_deref(), Some("pthread_mutex_lock"));
    }

    #[test]
    fn a_side_with_nothing_unwound_counts_under_why() {
        let mut s = LockStacks::default();
        let v = StackValues {
            waits: 1,
            ..Default::default()
        };
        s.record(
            Side::Waiter,
            &UserSite::unnamed("its stack could not be read"),
            &[],
            None,
            v,
        );
        let k = s.stacks.keys().next().unwrap();
        assert_eq!(k.frames.len(), 1);
        assert_eq!(k.frames[0].function, "[its stack could not be read]");
    }

    #[test]
    fn stacks_past_the_bound_are_counted_under_one_that_says_so() {
        let mut s = LockStacks::default();
        let v = StackValues {
            wakes: 1,
            woken_wait_ns: 5,
            ..Default::default()
        };
        for i in 0..MAX_STACKS + 10 {
            let f = [frame(Some(&format!("f{i}")), "bin")];
            s.record(Side::Waker, &site(), &f, None, v);
        }
        assert_eq!(s.stacks.len(), MAX_STACKS + 1);
        let over = s
            .stacks
            .iter()
            .find(|(k, _)| k.frames[0].function == OVERFLOW_FRAME)
            .expect("the overflow stack");
        assert_eq!(over.1.wakes, 10);
        // Nothing lost: every wake is in some stack.
        assert_eq!(
            s.stacks.values().map(|v| v.wakes).sum::<u64>(),
            (MAX_STACKS + 10) as u64
        );
        // Adding a full set to another keeps the bound and the sum.
        let mut t = LockStacks::default();
        t.add(&s);
        t.add(&s);
        assert_eq!(t.stacks.len(), MAX_STACKS + 1);
        assert_eq!(
            t.stacks.values().map(|v| v.wakes).sum::<u64>(),
            2 * (MAX_STACKS + 10) as u64
        );
    }
}
