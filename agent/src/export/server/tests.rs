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

/// A client that asks for a large response and reads none of it moves no byte: it is
/// closed after the idle timeout, not held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_is_closed_when_idle() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: usize = 32 << 20;
    const IDLE: u64 = 1;
    let body = format!("# {}\n# EOF\n", "x".repeat(BODY));
    let shared = Arc::new(Shared::new(Duration::from_secs(1), move || {
        Rendered::new(body.clone())
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        header_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(IDLE),
        max_connections: 4,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        shared,
        Arc::new(WebConfig::none()),
        limits,
        Arc::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(addr).await.unwrap();
    client
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
        .await
        .expect("the server closed the connection: reading ends");
    assert!(
        read.is_err() || got.len() < BODY,
        "the stalled response was cut off ({} of {BODY} bytes read)",
        got.len()
    );
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server stops once its connections are gone")
        .unwrap()
        .unwrap();
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

/// A server on 127.0.0.1 with `limits`, serving `body` as the exposition; stop it with the sender.
async fn server_with(
    limits: Limits,
    body: String,
    shed: Arc<Shed>,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let shared = Arc::new(Shared::new(Duration::from_secs(1), move || {
        Rendered::new(body.clone())
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        shared,
        Arc::new(WebConfig::none()),
        limits,
        shed,
        async {
            let _ = stop_rx.await;
        },
    ));
    (addr, stop_tx, server)
}

/// A connection to `addr` from the loopback address `from`, with a small receive buffer.
async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Sends `GET path` on `stream` and reads the whole answer (the server closes after it).
async fn ask(mut stream: TcpStream, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Every slot has a response in flight that its client reads, slowly: nothing can be closed
/// to make room. A new connection still gets `/healthz` and `/readyz` answered (on a probe
/// slot), and anything else a 503, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_slot_is_busy_the_probes_are_still_answered() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: usize = 32 << 20;
    let limits = Limits {
        header_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 2,
    };
    let shed = Arc::new(Shed::default());
    let body = format!("# {}\n# EOF\n", "x".repeat(BODY));
    let (addr, stop, server) = server_with(limits, body, Arc::clone(&shed)).await;
    // Two clients (one slot each: their share is one) read their large responses slowly.
    let reading = Arc::new(AtomicBool::new(true));
    let mut readers = Vec::new();
    for from in [[127, 0, 0, 2], [127, 0, 0, 3]] {
        let mut s = connect_from(from, addr).await;
        // OpenMetrics: the rendering as it is, without a conversion.
        s.write_all(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
        )
        .await
        .unwrap();
        let reading = Arc::clone(&reading);
        readers.push(tokio::spawn(async move {
            let mut buf = [0_u8; 1024];
            let mut got = 0;
            while reading.load(Ordering::Relaxed) {
                got += tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                    .await
                    .expect("the response keeps coming")
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            got
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for from in [[127, 0, 0, 2], [127, 0, 0, 4]] {
        let answer = ask(connect_from(from, addr).await, "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = ask(connect_from(from, addr).await, "/readyz").await;
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "not ready yet, but answered: {answer}"
        );
        assert!(answer.contains("probes are not attached"), "{answer}");
        let answer = ask(connect_from(from, addr).await, "/metrics").await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.contains("serves only /healthz and /readyz"),
            "{answer}"
        );
    }
    assert_eq!(
        shed.totals(),
        [0, 0, 2],
        "two /metrics on probe slots, nothing closed"
    );
    reading.store(false, Ordering::Relaxed);
    for r in readers {
        assert!(r.await.unwrap() > 0, "the slow readers were served");
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server stops once its connections are gone")
        .unwrap()
        .unwrap();
}

/// A client that holds connections it never uses only ever pushes out its own: another
/// address's scrape is answered, and the connections closed for it are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_idle_connections_pushes_out_only_its_own() {
    let limits = Limits {
        header_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 4,
    };
    let shed = Arc::new(Shed::default());
    let (addr, stop, server) =
        server_with(limits, "sw_up 1\n# EOF\n".into(), Arc::clone(&shed)).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(connect_from([127, 0, 0, 2], addr).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its share (two) held, the rest pushed out its own older ones.
    for _ in 0..5 {
        let answer = ask(connect_from([127, 0, 0, 3], addr).await, "/metrics").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nsw_up 1\n"), "{answer}");
    }
    assert_eq!(shed.totals(), [8, 0, 0]);
    // From the same address, a scrape replaces one of them too.
    let answer = ask(connect_from([127, 0, 0, 2], addr).await, "/healthz").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(shed.totals(), [9, 0, 0]);
    drop(held);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server stops once its connections are gone")
        .unwrap()
        .unwrap();
}
