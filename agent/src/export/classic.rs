//! The classic Prometheus text format (version 0.0.4), converted from the OpenMetrics text that
//! prometheus-client writes (it only writes OpenMetrics).
//!
//! The two differ in a few places, each handled here:
//! - `# EOF` and `# UNIT` do not exist in the classic format: dropped.
//! - A counter family is named without `_total` in OpenMetrics (`# TYPE x counter`, samples
//!   `x_total`); the classic format names the family by its samples: `# TYPE x_total counter`.
//!   Likewise an info family `x` (samples `x_info`) becomes the gauge `x_info`.
//! - `unknown` is `untyped`; `stateset` is a gauge; `gaugehistogram` has no equivalent and
//!   becomes `untyped`.
//! - `_created` samples (counter, histogram and summary creation times) are dropped.
//! - Exemplars (` # {…} value [timestamp]` after a sample) are dropped.
//! - Timestamps are seconds (a float) in OpenMetrics and milliseconds (an integer) here.
//! - HELP text escapes `"` in OpenMetrics but not here.

use std::fmt::Write as _;

/// The OpenMetrics type of the family being read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Info,
    Histogram,
    Summary,
    Other,
}

/// The classic name and type of an OpenMetrics family.
fn classic_family(name: &str, om_type: &str) -> (String, &'static str, Kind) {
    match om_type {
        "counter" => (format!("{name}_total"), "counter", Kind::Counter),
        "info" => (format!("{name}_info"), "gauge", Kind::Info),
        "gauge" | "stateset" => (name.to_owned(), "gauge", Kind::Other),
        "histogram" => (name.to_owned(), "histogram", Kind::Histogram),
        "summary" => (name.to_owned(), "summary", Kind::Summary),
        _ => (name.to_owned(), "untyped", Kind::Other),
    }
}

/// OpenMetrics HELP escapes `\\`, `\n` and `\"`; the classic format only `\\` and `\n`.
fn help_text(om: &str) -> String {
    om.replace("\\\"", "\"")
}

/// A sample line split into its parts: `name`, `{labels}` (with the braces, or empty), value,
/// and timestamp; the exemplar, if any, is left out.
fn split_sample(line: &str) -> Option<(&str, &str, &str, Option<&str>)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = "";
    if rest.starts_with('{') {
        // The closing brace, skipping quoted label values (which may contain `}` and `\"`).
        let (mut in_quotes, mut escaped, mut end) = (false, false, None);
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        labels = &rest[..=end];
        rest = &rest[end + 1..];
    }
    let mut tokens = rest.split_whitespace();
    let value = tokens.next()?;
    let timestamp = tokens.next().filter(|t| *t != "#");
    Some((name, labels, value, timestamp))
}

/// Converts an OpenMetrics text exposition to the Prometheus text format 0.0.4.
pub fn from_openmetrics(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // A HELP line waits for its TYPE line, which says how to name the family.
    let mut pending_help: Option<(&str, &str)> = None;
    let mut family: Option<(&str, Kind)> = None;
    let flush = |out: &mut String, pending: &mut Option<(&str, &str)>| {
        if let Some((name, text)) = pending.take() {
            let _ = writeln!(out, "# HELP {name} {}", help_text(text));
        }
    };
    for line in om.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            let (keyword, rest) = comment.split_once(' ').unwrap_or((comment, ""));
            match keyword {
                "HELP" => {
                    flush(&mut out, &mut pending_help);
                    pending_help = Some(rest.split_once(' ').unwrap_or((rest, "")));
                }
                "TYPE" => {
                    let (name, om_type) = rest.split_once(' ').unwrap_or((rest, "unknown"));
                    let (classic_name, classic_type, kind) = classic_family(name, om_type.trim());
                    match pending_help.take() {
                        Some((help_name, text)) if help_name == name => {
                            let _ = writeln!(out, "# HELP {classic_name} {}", help_text(text));
                        }
                        other => {
                            let mut other = other;
                            flush(&mut out, &mut other);
                        }
                    }
                    let _ = writeln!(out, "# TYPE {classic_name} {classic_type}");
                    family = Some((name, kind));
                }
                // EOF, UNIT, and anything else: nothing in the classic format.
                _ => {}
            }
            continue;
        }
        flush(&mut out, &mut pending_help);
        if line.trim().is_empty() {
            continue;
        }
        let Some((name, labels, value, timestamp)) = split_sample(line) else {
            log::debug!("classic format: dropping unparsable line {line:?}");
            continue;
        };
        if let Some((family_name, kind)) = family
            && matches!(kind, Kind::Counter | Kind::Histogram | Kind::Summary)
            && name.strip_prefix(family_name) == Some("_created")
        {
            continue;
        }
        out.push_str(name);
        out.push_str(labels);
        out.push(' ');
        out.push_str(value);
        if let Some(ts) = timestamp.and_then(|t| t.parse::<f64>().ok()) {
            let _ = write!(out, " {}", (ts * 1000.0).round() as i64);
        }
        out.push('\n');
    }
    flush(&mut out, &mut pending_help);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_by_their_samples() {
        let om = "# HELP sw_migrations Migrations.\n# TYPE sw_migrations counter\n\
                  sw_migrations_total{cgroup=\"/a\"} 3\nsw_migrations_created{cgroup=\"/a\"} 1.7e9\n\
                  # EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP sw_migrations_total Migrations.\n# TYPE sw_migrations_total counter\n\
             sw_migrations_total{cgroup=\"/a\"} 3\n"
        );
    }

    #[test]
    fn info_unknown_units_exemplars_and_timestamps() {
        let om = "# HELP sw_build The \\\"version\\\".\n# TYPE sw_build info\n\
                  sw_build_info{version=\"1\"} 1\n\
                  # HELP sw_lat_seconds Latency.\n# TYPE sw_lat_seconds histogram\n\
                  # UNIT sw_lat_seconds seconds\n\
                  sw_lat_seconds_bucket{le=\"0.1\"} 2 # {trace_id=\"a}b\"} 0.05 123.4\n\
                  sw_lat_seconds_bucket{le=\"+Inf\"} 3\nsw_lat_seconds_count 3\n\
                  sw_lat_seconds_sum 0.3 1700000000.5\nsw_lat_seconds_created 17\n\
                  # TYPE sw_x unknown\nsw_x{a=\"} # {\\\"\"} NaN\n# EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP sw_build_info The \"version\".\n# TYPE sw_build_info gauge\n\
             sw_build_info{version=\"1\"} 1\n\
             # HELP sw_lat_seconds Latency.\n# TYPE sw_lat_seconds histogram\n\
             sw_lat_seconds_bucket{le=\"0.1\"} 2\nsw_lat_seconds_bucket{le=\"+Inf\"} 3\n\
             sw_lat_seconds_count 3\nsw_lat_seconds_sum 0.3 1700000000500\n\
             # TYPE sw_x untyped\nsw_x{a=\"} # {\\\"\"} NaN\n"
        );
    }

    #[test]
    fn gauges_pass_through_and_eof_goes() {
        let om = "# HELP g A gauge.\n# TYPE g gauge\ng 1.5\ng{a=\"b\"} -2\n# EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP g A gauge.\n# TYPE g gauge\ng 1.5\ng{a=\"b\"} -2\n"
        );
    }
}
