//! The Prometheus exporter behind `stormwatch run`.
//!
//! The collection loop (`stormwatch run`) owns the pipeline: every interval it reads a
//! window, adds it to per-cgroup running totals ([`state`]), runs the diagnosis rules over a
//! sliding window ([`diagnosis`]), and renders the exposition once in both text formats
//! ([`metrics`], [`classic`]). The HTTP handlers ([`server`]) only hand out the last rendering.

pub mod classic;
pub mod metrics;
pub mod network;
pub mod server;
pub mod state;

use axum::body::Bytes;

/// One rendering of the exposition, in both formats.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// OpenMetrics 1.0 text, as prometheus-client writes it.
    pub openmetrics: Bytes,
    /// The Prometheus text format 0.0.4, converted from it.
    pub classic: Bytes,
}
