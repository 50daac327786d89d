//! The HTTP side: `/metrics`, `/healthz`, `/readyz`. Handlers only read what the collection
//! loop published (the exporter's state and two flags): a scrape never reads a BPF map, never
//! triggers a collection, and never fails.
//!
//! The exposition is rendered by the first scrape after a collection, not by the collection:
//! with Prometheus scraping every 15 s and collections every 5 s, two renderings in three
//! would be thrown away unread, and between scrapes no rendering is held in memory.
//!
//! The endpoint is reachable by any pod of the node's network, so no client may hold it
//! ([`Limits`]): a request's head must arrive within the header timeout (which also closes an
//! idle keep-alive connection after that long), a request is answered within the request
//! timeout, a connection that moves no byte either way for the idle timeout is closed (a
//! client that does not read its response), request heads are capped at
//! [`MAX_HEADER_BYTES`] and bodies refused, and at most `max_connections` are open at once,
//! plus two that serve only the health probes. A new connection beyond that is not refused:
//! an idle one of the client holding the most slots makes room for it, so that a client
//! holding connections it never uses only pushes out its own (see `slots` for who goes, and
//! the count and log of it). TLS and basic authentication come from a web
//! config file ([`super::web`]).

use std::{
    future::Future,
    net::IpAddr,
    pin::{Pin, pin},
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, HeaderValue, Request, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore, watch},
};
use tower::ServiceExt as _;

use super::{
    Format, Rendered,
    web::{Active, Auth, WebConfig},
};

mod negotiate;
mod profiles;
mod slots;

use negotiate::header_list;
pub use negotiate::{
    CLASSIC_CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, wants_gzip, wants_openmetrics,
};
pub use profiles::LockProfiles;

use slots::{Activity, Decision, InFlight, Lane, PROBE_DEADLINE, Table};
pub use slots::{REASONS as DROP_REASONS, Shed};

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
    /// The last diagnosis window's lock profiles.
    profiles: RwLock<Arc<LockProfiles>>,
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
            profiles: RwLock::default(),
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
        "not found: try /metrics, /healthz, /readyz or /debug/pprof/lock\n",
    )
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(profiles::PATH, get(profiles::index))
        .route(&format!("{}/{{file}}", profiles::PATH), get(profiles::one))
        .fallback(not_found)
        .with_state(shared)
}

/// The most a request's head (request line and headers) may take; a longer one is answered
/// 431 by hyper and the connection closed. 16 KiB is twice what Prometheus' longest
/// `Authorization` and `Accept` headers need.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long clients may take, and how many may be connected.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// From the connection's opening (or the end of its previous response) to the end of a
    /// request's head; the TLS handshake gets as long.
    pub header_timeout: Duration,
    /// From a request's head to its response's head.
    pub request_timeout: Duration,
    /// No byte read or written for this long: the connection is closed.
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// A TCP stream that records when it last moved a byte.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

/// What every request goes through before the routes: no body, credentials for `/metrics`
/// and the lock profiles (checked as [`Active::check`] says: wrong ones are cheap to refuse).
async fn admit(
    req: &Request<hyper::body::Incoming>,
    active: &Arc<Active>,
    client: IpAddr,
) -> Option<Response> {
    let headers = req.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        return Some(plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted\n",
        ));
    }
    let path = req.uri().path();
    if !(path == "/metrics" || path.starts_with(profiles::PATH)) || !active.requires_auth() {
        return None;
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match active.check(authorization, client).await {
        Auth::Allowed => None,
        Auth::Denied => {
            let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n");
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"stormwatch\""),
            );
            Some(r)
        }
        Auth::Busy => {
            let mut r = plain(
                StatusCode::TOO_MANY_REQUESTS,
                "too many password checks waiting: try again later\n",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Some(r)
        }
    }
}

/// A response body that keeps its request counted in flight until it has been sent: until
/// then the connection has something to lose.
struct Sending {
    body: axum::body::Body,
    _in_flight: Option<InFlight>,
}

impl http_body::Body for Sending {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self._in_flight = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a connection on a probe slot may ask for.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// One connection, TLS or not, until it ends, times out, is closed to make room, or the
/// server closes; it leaves the table as it ends.
async fn connection(
    stream: TcpStream,
    client: IpAddr,
    lane: Lane,
    ctx: Arc<Server>,
    activity: Arc<Activity>,
    closing: watch::Receiver<bool>,
    slot: Slot,
) {
    let _slot = slot;
    let io = Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let active = ctx.web.current();
    let handshake = match lane {
        Lane::Main => ctx.limits.header_timeout,
        Lane::Probe => ctx.limits.header_timeout.min(PROBE_DEADLINE),
    };
    match active.tls.clone() {
        None => http(io, client, lane, &ctx, active, closing, activity).await,
        Some(acceptor) => match tokio::time::timeout(handshake, acceptor.accept(io)).await {
            Ok(Ok(tls)) => http(tls, client, lane, &ctx, active, closing, activity).await,
            Ok(Err(err)) => log::debug!("TLS handshake: {err}"),
            Err(_) => log::debug!("TLS handshake: timed out"),
        },
    }
}

/// Leaves the table when the connection's task ends (or is cancelled).
struct Slot {
    id: u64,
    table: Arc<Mutex<Table>>,
    _task: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.id);
    }
}

/// What every connection shares.
struct Server {
    router: Router,
    web: Arc<WebConfig>,
    limits: Limits,
    shed: Arc<Shed>,
}

async fn http<I>(
    io: I,
    client: IpAddr,
    lane: Lane,
    ctx: &Arc<Server>,
    active: Arc<Active>,
    mut closing: watch::Receiver<bool>,
    activity: Arc<Activity>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &ctx.limits;
    let request_timeout = limits.request_timeout;
    let served = Arc::clone(ctx);
    let busy = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let in_flight = InFlight::start(&busy);
        let ctx = Arc::clone(&served);
        let active = Arc::clone(&active);
        async move {
            let response = if lane == Lane::Probe && !is_probe(req.uri().path()) {
                ctx.shed.count(&ctx.shed.probe_only);
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "every connection slot is busy: this one serves only /healthz and /readyz\n",
                )
            } else {
                // The password check's wait in line counts against the timeout too.
                let answer = async {
                    if let Some(refused) = admit(&req, &active, client).await {
                        return refused;
                    }
                    match ctx
                        .router
                        .clone()
                        .oneshot(req.map(axum::body::Body::new))
                        .await
                    {
                        Ok(r) => r,
                        Err(never) => match never {},
                    }
                };
                match tokio::time::timeout(request_timeout, answer).await {
                    Ok(r) => r,
                    Err(_) => plain(StatusCode::SERVICE_UNAVAILABLE, "request timed out\n"),
                }
            };
            Ok::<_, std::convert::Infallible>(response.map(|body| Sending {
                body,
                _in_flight: Some(in_flight),
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .max_buf_size(MAX_HEADER_BYTES);
    match lane {
        Lane::Main => builder
            .header_read_timeout(limits.header_timeout)
            .keep_alive(true),
        // One request, whose head must come at once: nothing to hold.
        Lane::Probe => builder
            .header_read_timeout(limits.header_timeout.min(PROBE_DEADLINE))
            .keep_alive(false),
    };
    let idle_timeout = match lane {
        Lane::Main => limits.idle_timeout,
        Lane::Probe => limits.idle_timeout.min(PROBE_DEADLINE),
    };
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    let mut told_to_close = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(err) = r {
                    log::debug!("HTTP connection: {err}");
                }
                return;
            }
            changed = closing.changed(), if !told_to_close => {
                told_to_close = true;
                if changed.is_err() || *closing.borrow() {
                    // Finish the request in flight, then close.
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = activity.idle_for(idle_timeout) => {
                log::debug!("HTTP connection idle for {idle_timeout:?}: closed");
                return;
            }
        }
    }
}

/// The most connection tasks alive at once, counted to wait for them at shutdown: far more
/// than the table ever holds (`max_connections` plus the probe slots, plus the few that were
/// closed to make room and have not been dropped yet).
const TASKS: u32 = 1 << 24;

/// Serves until `stop` completes; then stops accepting, and returns once the connections have
/// finished their requests in flight. `shed` counts the connections closed to stay within
/// `max_connections` (`slots`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    web: Arc<WebConfig>,
    limits: Limits,
    shed: Arc<Shed>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ctx = Arc::new(Server {
        router: router(shared),
        web,
        limits: limits.clone(),
        shed: Arc::clone(&shed),
    });
    let table = Arc::new(Mutex::new(Table::new(limits.max_connections)));
    let tasks = Arc::new(Semaphore::new(TASKS as usize));
    let (closing_tx, closing_rx) = watch::channel(false);
    let logger = tokio::spawn(slots::log_shedding(
        Arc::clone(&shed),
        limits.max_connections,
        closing_rx.clone(),
        |line| log::warn!("{line}"),
    ));
    let mut stop = pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or the like: back off rather than spin.
                    log::warn!("HTTP server: accept: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let client = peer.ip().to_canonical();
        let activity = Arc::new(Activity::new());
        let admitted = {
            let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
            match (
                t.decide(client, Instant::now()),
                Arc::clone(&tasks).try_acquire_owned(),
            ) {
                (Decision::Admit { lane, evict }, Ok(task)) => {
                    if let Some(id) = evict {
                        t.evict(id);
                        shed.count(&shed.evicted);
                    }
                    let id = t.insert(client, lane, Arc::clone(&activity));
                    Some((lane, id, task))
                }
                _ => None,
            }
        };
        let Some((lane, id, task)) = admitted else {
            drop(stream);
            shed.count(&shed.refused);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let slot = Slot {
            id,
            table: Arc::clone(&table),
            _task: task,
        };
        let handle = tokio::spawn(connection(
            stream,
            client,
            lane,
            Arc::clone(&ctx),
            activity,
            closing_rx.clone(),
            slot,
        ));
        table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_abort(id, handle.abort_handle());
        // Let the new connection read its request before the next one is taken: under a
        // flood of new connections it must not become the oldest idle one unread.
        tokio::task::yield_now().await;
    }
    drop(listener);
    let _ = closing_tx.send(true);
    // Every connection task holds a permit until it ends.
    let _all = tasks.acquire_many(TASKS).await;
    let _ = logger.await;
    Ok(())
}

#[cfg(test)]
mod tests;
