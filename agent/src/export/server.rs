//! The HTTP side: `/metrics`, `/healthz`, `/readyz`. Handlers only read what the collection
//! loop published (the exporter's state and two flags): a scrape never reads a BPF map, never
//! triggers a collection, and never fails.
//!
//! The exposition is rendered by the first scrape after a collection, not by the collection:
//! with Prometheus scraping every 15 s and collections every 5 s, two renderings in three
//! would be thrown away unread, and between scrapes no rendering is held in memory.

use std::{
    future::Future,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use super::{Format, Rendered};

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long `/healthz` waits for the first collection (loading and attaching the probes).
const STARTUP_ALLOWANCE: Duration = Duration::from_secs(120);

/// Makes a rendering of the current state.
pub type Render = Box<dyn Fn() -> Rendered + Send + Sync>;

/// What the collection loop publishes for the handlers.
pub struct Shared {
    render: Render,
    /// The last rendering and the state generation it shows; `None` until a scrape asks.
    rendered: RwLock<Option<(u64, Arc<Rendered>)>>,
    /// Bumped by the collection loop each time the state changes.
    generation: AtomicU64,
    /// Held while rendering, so that scrapes arriving together render once.
    rendering: Mutex<()>,
    ready: AtomicBool,
    started: Instant,
    /// Milliseconds from `started` to the end of the last collection loop run; `u64::MAX`
    /// before the first.
    last_run_ms: AtomicU64,
    /// `/healthz` fails when the loop has not run for this long.
    stale_after: Duration,
}

impl Shared {
    /// `render` renders the state as it is when called (it must read a consistent state: the
    /// collection changes it under one lock).
    pub fn new(interval: Duration, render: impl Fn() -> Rendered + Send + Sync + 'static) -> Self {
        Self {
            render: Box::new(render),
            rendered: RwLock::new(None),
            generation: AtomicU64::new(0),
            rendering: Mutex::new(()),
            ready: AtomicBool::new(false),
            started: Instant::now(),
            last_run_ms: AtomicU64::new(u64::MAX),
            stale_after: (interval * 3).max(Duration::from_secs(10)),
        }
    }

    /// The state changed (a collection ran): the next scrape renders it afresh. The previous
    /// rendering is dropped now, so that it holds no memory until then.
    pub fn publish(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let previous = self
            .rendered
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(previous);
        // The previous exposition and the windows it was made from are megabytes: without
        // this, resident memory follows the largest collection ever made.
        crate::memory::release_free_memory();
    }

    /// The rendering of the current state: the cached one, or a new one.
    pub fn current(&self) -> Arc<Rendered> {
        let cached = || {
            let generation = self.generation.load(Ordering::Acquire);
            self.rendered
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .filter(|(g, _)| *g == generation)
                .map(|(_, r)| Arc::clone(r))
        };
        if let Some(r) = cached() {
            return r;
        }
        let _one = self
            .rendering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Another scrape may have rendered while this one waited.
        if let Some(r) = cached() {
            return r;
        }
        // Read before rendering: if a collection changes the state meanwhile, this rendering is
        // cached under the older generation and the next scrape renders again.
        let generation = self.generation.load(Ordering::Acquire);
        let rendered = Arc::new((self.render)());
        *self
            .rendered
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some((generation, Arc::clone(&rendered)));
        rendered
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The collection loop ran (whether or not the collection succeeded).
    pub fn ran(&self) {
        let ms = self
            .started
            .elapsed()
            .as_millis()
            .min(u128::from(u64::MAX - 1)) as u64;
        self.last_run_ms.store(ms, Ordering::Release);
    }

    /// Whether the loop ran recently (or, before its first run, whether start-up is still
    /// within its allowance).
    pub fn is_healthy(&self) -> bool {
        let now = self.started.elapsed();
        match self.last_run_ms.load(Ordering::Acquire) {
            u64::MAX => now < STARTUP_ALLOWANCE,
            ms => now.saturating_sub(Duration::from_millis(ms)) <= self.stale_after,
        }
    }
}

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
fn header_list(headers: &HeaderMap, name: header::HeaderName) -> String {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let rendered = shared.current();
    let (format, content_type) = if wants_openmetrics(&header_list(&headers, header::ACCEPT)) {
        (Format::OpenMetrics, OPENMETRICS_CONTENT_TYPE)
    } else {
        (Format::Classic, CLASSIC_CONTENT_TYPE)
    };
    let gzip = wants_gzip(&header_list(&headers, header::ACCEPT_ENCODING));
    // The first scrape after a collection renders, and the first of a variant converts or
    // compresses it: milliseconds on this worker, which only serves scrapes and probes.
    let body = rendered.body(format, gzip);
    let mut response = (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::VARY,
                HeaderValue::from_static("Accept, Accept-Encoding"),
            ),
        ],
        body,
    )
        .into_response();
    if gzip {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

async fn healthz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.is_healthy() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the collection loop has not run recently\n",
        )
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the probes are not attached (yet, or any more)\n",
        )
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found: try /metrics, /healthz or /readyz\n",
    )
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(shared)
}

/// Serves until `stop` completes; then stops accepting and lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(shared))
        .with_graceful_shutdown(stop)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_like_prometheus_expects() {
        // What Prometheus 2.x sends.
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0;q=0.5,\
             application/openmetrics-text;version=0.0.1;q=0.4,\
             text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
        ));
        assert!(wants_openmetrics("application/openmetrics-text"));
        assert!(wants_openmetrics(
            "Application/OpenMetrics-Text; version=1.0.0"
        ));
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(!wants_openmetrics(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(!wants_openmetrics(
            "text/plain, application/openmetrics-text;q=0.1"
        ));
        assert!(!wants_openmetrics("application/openmetrics-text;q=0"));
    }

    #[test]
    fn gzip_when_accepted() {
        // What Prometheus sends.
        assert!(wants_gzip("gzip"));
        assert!(wants_gzip("gzip, deflate, br"));
        assert!(wants_gzip("GZip;q=0.8, identity;q=0.5"));
        assert!(wants_gzip("*"));
        assert!(wants_gzip("x-gzip"));
        assert!(!wants_gzip(""), "no header: identity");
        assert!(!wants_gzip("identity"));
        assert!(!wants_gzip("deflate, br"));
        assert!(!wants_gzip("gzip;q=0"));
        assert!(
            !wants_gzip("gzip;q=0, *"),
            "refused explicitly, whatever * says"
        );
        assert!(!wants_gzip("gzip;q=0.5, identity"), "identity preferred");
        assert!(wants_gzip("identity;q=0, *"));
    }

    async fn scrape(shared: &Arc<Shared>, headers: &[(header::HeaderName, &str)]) -> Response {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        metrics(State(Arc::clone(shared)), map).await
    }

    async fn body_of(r: Response) -> Vec<u8> {
        axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec()
    }

    #[tokio::test]
    async fn metrics_negotiates_format_and_encoding() {
        use std::io::Read as _;
        let om = "# HELP sw_x Things.\n# TYPE sw_x counter\nsw_x_total 3\n# EOF\n";
        let classic = super::super::classic::from_openmetrics(om);
        let shared = Arc::new(Shared::new(Duration::from_secs(1), move || {
            Rendered::new(om)
        }));
        let gunzip = |b: &[u8]| {
            let mut s = String::new();
            flate2::read::GzDecoder::new(b)
                .read_to_string(&mut s)
                .unwrap();
            s
        };

        let r = scrape(&shared, &[]).await;
        assert_eq!(r.headers()[header::CONTENT_TYPE], CLASSIC_CONTENT_TYPE);
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(body_of(r).await, classic.as_bytes());

        let r = scrape(&shared, &[(header::ACCEPT_ENCODING, "gzip")]).await;
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(r.headers()[header::CONTENT_TYPE], CLASSIC_CONTENT_TYPE);
        assert_eq!(gunzip(&body_of(r).await), classic);

        let prometheus = [
            (
                header::ACCEPT,
                "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
            ),
            (header::ACCEPT_ENCODING, "gzip"),
        ];
        let r = scrape(&shared, &prometheus).await;
        assert_eq!(r.headers()[header::CONTENT_TYPE], OPENMETRICS_CONTENT_TYPE);
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(gunzip(&body_of(r).await), om);

        let r = scrape(&shared, &[(header::ACCEPT, prometheus[0].1)]).await;
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(body_of(r).await, om.as_bytes());
    }

    /// One rendering per collection, made by the first scrape that needs it; none before.
    #[test]
    fn renders_once_per_collection_when_scraped() {
        let count = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&count);
        let shared = Shared::new(Duration::from_secs(1), move || {
            let n = counted.fetch_add(1, Ordering::AcqRel) + 1;
            Rendered::new(format!("sw_renders {n}\n# EOF\n"))
        });
        let text = |r: Arc<Rendered>| r.body(Format::OpenMetrics, false);
        assert_eq!(
            count.load(Ordering::Acquire),
            0,
            "nothing rendered before a scrape"
        );
        assert_eq!(text(shared.current()), "sw_renders 1\n# EOF\n");
        assert_eq!(text(shared.current()), "sw_renders 1\n# EOF\n");
        shared.publish();
        shared.publish();
        assert_eq!(
            count.load(Ordering::Acquire),
            1,
            "collections do not render"
        );
        assert_eq!(text(shared.current()), "sw_renders 2\n# EOF\n");
        assert_eq!(text(shared.current()), "sw_renders 2\n# EOF\n");
        assert_eq!(count.load(Ordering::Acquire), 2);
    }

    #[test]
    fn health_and_readiness() {
        let shared = Shared::new(Duration::from_secs(1), || Rendered::new("# EOF\n"));
        assert!(shared.is_healthy(), "healthy while starting");
        assert!(!shared.is_ready());
        shared.ran();
        shared.set_ready(true);
        assert!(shared.is_healthy() && shared.is_ready());
        // A loop that last ran long ago.
        shared.last_run_ms.store(0, Ordering::Release);
        let stale = Shared {
            started: Instant::now() - Duration::from_secs(11),
            ..shared
        };
        assert!(!stale.is_healthy());
    }
}
