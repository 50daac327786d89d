//! Content negotiation for `/metrics`: the exposition format (OpenMetrics or the classic
//! text format) from `Accept`, gzip from `Accept-Encoding`.

use axum::http::{HeaderMap, header};

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The quality value of a media range's parameters (`;q=0.5`), 1 when absent.
fn quality(params: &str) -> f64 {
    params
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .map_or(1.0, |q| q.clamp(0.0, 1.0))
}

/// Content negotiation: OpenMetrics when the client accepts it at least as much as the
/// classic text format (`text/plain`, or what a wildcard covers); else the classic format.
pub fn wants_openmetrics(accept: &str) -> bool {
    let (mut openmetrics, mut classic) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let (media, params) = range.split_once(';').unwrap_or((range, ""));
        let q = quality(params);
        match media.trim().to_ascii_lowercase().as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= classic
}

/// Content coding: gzip when the client accepts it (explicitly or through `*`) at least as
/// much as the uncompressed body (`identity`, acceptable unless refused).
pub fn wants_gzip(accept_encoding: &str) -> bool {
    let (mut gzip, mut any, mut identity) = (None, None, None);
    for coding in accept_encoding.split(',') {
        let (name, params) = coding.split_once(';').unwrap_or((coding, ""));
        let q = quality(params);
        let slot = match name.trim().to_ascii_lowercase().as_str() {
            "gzip" | "x-gzip" => &mut gzip,
            "*" => &mut any,
            "identity" => &mut identity,
            _ => continue,
        };
        *slot = Some(slot.unwrap_or(0.0_f64).max(q));
    }
    let gzip = gzip.or(any).unwrap_or(0.0);
    let identity = identity.or(any.filter(|q| *q == 0.0)).unwrap_or(1.0);
    gzip > 0.0 && gzip >= identity
}

/// All values of a header, joined as one list.
pub(super) fn header_list(headers: &HeaderMap, name: header::HeaderName) -> String {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
}
