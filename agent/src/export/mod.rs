//! The Prometheus exporter behind `stormwatch run`.
//!
//! The collection loop (`stormwatch run`) owns the pipeline: every interval it reads a
//! window, adds it to per-cgroup running totals ([`state`]), runs the diagnosis rules over a
//! sliding window ([`crate::diagnose::session`]). The first scrape after a collection renders
//! the exposition, in OpenMetrics ([`metrics`]); the HTTP handlers ([`server`]) hand out that
//! rendering, converted to the classic text format ([`classic`]) and gzip-compressed only when
//! a scraper asks: at most once per collection whatever the number of scrapers, never when none
//! asks.

pub mod classic;
pub mod encode;
pub mod families;
pub mod labels;
pub mod metrics;
pub mod network;
pub mod server;
pub mod state;
pub mod web;

use std::{io::Write as _, sync::OnceLock};

use axum::body::Bytes;

/// A text format of the exposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Classic,
}

/// One rendering of the exposition: the OpenMetrics text, and the variants scrapers asked for,
/// each made at most once (by the first scrape that wants it) and kept until the next
/// collection replaces the whole rendering. The classic text is not kept when only its gzip
/// form was asked for: one full-size copy (the OpenMetrics source) stays, whatever is served.
#[derive(Debug)]
pub struct Rendered {
    openmetrics: Bytes,
    classic: OnceLock<Bytes>,
    openmetrics_gzip: OnceLock<Bytes>,
    classic_gzip: OnceLock<Bytes>,
}

impl Rendered {
    pub fn new(openmetrics: impl Into<Bytes>) -> Self {
        Self {
            openmetrics: openmetrics.into(),
            classic: OnceLock::new(),
            openmetrics_gzip: OnceLock::new(),
            classic_gzip: OnceLock::new(),
        }
    }

    /// The exposition in `format`, gzip-compressed when `gzip`.
    pub fn body(&self, format: Format, gzip: bool) -> Bytes {
        match (format, gzip) {
            (Format::OpenMetrics, false) => self.openmetrics.clone(),
            (Format::OpenMetrics, true) => self
                .openmetrics_gzip
                .get_or_init(|| compress(&self.openmetrics))
                .clone(),
            (Format::Classic, false) => self.classic_text().clone(),
            (Format::Classic, true) => self
                .classic_gzip
                .get_or_init(|| match self.classic.get() {
                    Some(text) => compress(text),
                    // Converted only to be compressed: the text is dropped afterwards.
                    None => compress(self.convert().as_bytes()),
                })
                .clone(),
        }
    }

    fn classic_text(&self) -> &Bytes {
        self.classic.get_or_init(|| self.convert().into())
    }

    fn convert(&self) -> String {
        // prometheus-client writes UTF-8 only.
        let om = std::str::from_utf8(&self.openmetrics).unwrap_or_default();
        classic::from_openmetrics(om)
    }
}

/// gzip at the fastest level: Prometheus text shrinks about tenfold even so (label sets repeat
/// on every line), for a fraction of the CPU of the default level.
fn compress(text: &[u8]) -> Bytes {
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(text);
    gz.finish().unwrap_or_default().into()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn gunzip(b: &[u8]) -> String {
        let mut out = String::new();
        flate2::read::GzDecoder::new(b)
            .read_to_string(&mut out)
            .expect("a gzip stream");
        out
    }

    #[test]
    fn every_variant_is_the_same_exposition() {
        let om = "# HELP sw_x Things.\n# TYPE sw_x counter\nsw_x_total{a=\"b\"} 3\n# EOF\n";
        let r = Rendered::new(om);
        let classic = classic::from_openmetrics(om);
        assert_eq!(r.body(Format::OpenMetrics, false), om.as_bytes());
        assert_eq!(gunzip(&r.body(Format::OpenMetrics, true)), om);
        assert_eq!(gunzip(&r.body(Format::Classic, true)), classic);
        assert!(r.classic.get().is_none(), "no classic text kept for gzip");
        assert_eq!(r.body(Format::Classic, false), classic.as_bytes());
        // Cached: the same bytes (not a new compression) for the next scrape.
        let a = r.body(Format::Classic, true);
        let b = r.body(Format::Classic, true);
        assert_eq!(a.as_ptr(), b.as_ptr());
    }
}
