//! Empty programs on the scheduler tracepoints: the benchmark's floor, i.e. what merely
//! attaching a tp_btf program to the four tracepoints the scheduler probes use costs. Never
//! attached by the agent in normal use.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

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
