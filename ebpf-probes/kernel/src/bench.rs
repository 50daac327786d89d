//! Empty programs on every tracepoint the probes attach: the benchmark's floor, i.e. what
//! merely attaching a program to a hook costs (`xtask bench --programs` measures each of our
//! programs against the empty one on its hook) — tp_btf programs where ours are tp_btf, classic
//! tracepoint programs on the futex system calls, whose probes are classic. Never attached by
//! the agent in normal use (the hidden families `empty-sched`, `empty-net`, `empty-locks`,
//! `empty-futex`).

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};

#[btf_tracepoint(function = "sched_switch")]
pub fn bench_empty_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn bench_empty_wakeup(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn bench_empty_wakeup_new(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_waking")]
pub fn bench_empty_waking(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn bench_empty_xmit(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "netif_receive_skb")]
pub fn bench_empty_receive(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn bench_empty_kfree_skb(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "contention_begin")]
pub fn bench_empty_lock_begin(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn bench_empty_lock_end(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[tracepoint]
pub fn bench_empty_futex_enter(_ctx: TracePointContext) -> i32 {
    0
}

#[tracepoint]
pub fn bench_empty_futex_exit(_ctx: TracePointContext) -> i32 {
    0
}
