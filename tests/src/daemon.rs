//! `stormwatch run` from a test: start it on a free loopback port, scrape it, stop it; and the
//! HTTP client (ureq), file and polling helpers that go with it.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::agent_bin;

/// How long the daemon may take to load and attach its probes.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// SIGTERM to exit.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(2);

// ---- helpers --------------------------------------------------------------------------------

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port on 127.0.0.1")
}

/// Writes `text` to `name` in `dir` (a `tempfile::TempDir` in the tests) and returns its path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// A response: the body as text ([`http_get`]) or as sent ([`http_get_bytes`]).
pub struct HttpResponse<B = String> {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: B,
}

impl<B> HttpResponse<B> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The tests' and benchmarks' HTTP client (ureq, plain HTTP): a connection per request, no
/// header but `Host` and those asked for (no `Accept`, no `User-Agent`, no `Accept-Encoding`,
/// so a body is what the server sends by default), any status a response rather than an error.
fn client() -> &'static ureq::Agent {
    static CLIENT: std::sync::OnceLock<ureq::Agent> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .accept(ureq::config::AutoHeaderValue::None)
            .user_agent(ureq::config::AutoHeaderValue::None)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_send_request(Some(Duration::from_secs(2)))
            .timeout_recv_response(Some(Duration::from_secs(10)))
            .timeout_recv_body(Some(Duration::from_secs(10)))
            .build()
            .into()
    })
}

/// An `Authorization: Basic` header's value for `user` and `password`.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// GET `path` on `addr` with `headers`; the body as sent (a compressed body stays compressed).
pub fn http_get_bytes(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse<Vec<u8>>> {
    // One connection per request, closed by the server once it has answered: a test that
    // counts the server's open connections must not find a finished scrape's still held.
    let mut request = client()
        .get(format!("http://{addr}{path}"))
        .header("Connection", "close");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = request.call().map_err(std::io::Error::other)?;
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_owned(), v)
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(std::io::Error::other)?;
    Ok(HttpResponse {
        status: response.status().as_u16(),
        headers,
        body,
    })
}

/// GET `path` on `addr` (with `Accept: accept` when given), the body as text.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> std::io::Result<HttpResponse> {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    let r = http_get_bytes(addr, path, &headers)?;
    Ok(HttpResponse {
        status: r.status,
        headers: r.headers,
        body: String::from_utf8_lossy(&r.body).into_owned(),
    })
}

/// Percent-encodes a query string value.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `f` every 200 ms until it returns `Some`, or panics after `timeout` with `what`.
#[track_caller]
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A command that the project's setup installs; fails with how to install it when missing.
pub fn tool(name: &str, install: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed (or not on PATH); install it with `{install}` \
                 (`cargo xtask setup` does)"
            )
        })
}

// ---- the daemon ----------------------------------------------------------------------------

/// A running `stormwatch run`, killed on drop if still running.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    stderr: Option<JoinHandle<Vec<String>>>,
    /// The config file of [`Daemon::start_configured`], kept while the daemon runs.
    config_dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts `stormwatch run --listen 127.0.0.1:<free port> --interval 1 <extra>` and waits
    /// for /readyz to answer 200.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_until(extra, |addr| {
            http_get(addr, "/readyz", None).is_ok_and(|r| r.status == 200)
        })
    }

    /// Starts `stormwatch run` as [`Daemon::start`] does, and waits until `ready` says so
    /// (for a daemon that speaks TLS, say).
    pub fn start_until(extra: &[&str], ready: impl Fn(SocketAddr) -> bool) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut child = Command::new(agent_bin())
            .args(["run", "--listen", &addr.to_string(), "--interval", "1"])
            .args(extra)
            .env_remove("STORMWATCH_LISTEN")
            .env_remove("STORMWATCH_INTERVAL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", agent_bin().display()));
        let err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            BufReader::new(err)
                .lines()
                .map_while(Result::ok)
                .inspect(|l| eprintln!("[stormwatch run] {l}"))
                .collect()
        });
        let mut daemon = Self {
            child,
            addr,
            stderr: Some(stderr),
            config_dir: None,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                let lines = daemon.stderr.take().unwrap().join().unwrap_or_default();
                panic!(
                    "stormwatch run exited ({status}) before it was ready; stderr:\n{}",
                    lines.join("\n")
                );
            }
            if ready(daemon.addr) {
                return daemon;
            }
            assert!(
                Instant::now() < deadline,
                "stormwatch run on {addr} was not ready within {READY_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts `stormwatch run --config FILE` with `toml` as the file, as [`Daemon::start`] does.
    pub fn start_configured(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = write_file(dir.path(), "run.toml", toml);
        let mut daemon = Self::start(&["--config", config.to_str().expect("a UTF-8 path")]);
        daemon.config_dir = Some(dir);
        daemon
    }

    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        http_get(self.addr, path, None)
    }

    /// The classic text exposition.
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics").expect("GET /metrics");
        assert_eq!(r.status, 200, "GET /metrics: {}", r.body);
        r.body
    }

    /// Sends `signal`, waits for the exit, and returns the status and how long it took.
    pub fn stop(self, signal: i32) -> (ExitStatus, Duration) {
        let (status, took, _) = self.stop_logged(signal);
        (status, took)
    }

    /// [`Daemon::stop`], with every line the daemon wrote to stderr.
    pub fn stop_logged(mut self, signal: i32) -> (ExitStatus, Duration, Vec<String>) {
        let pid = self.child.id() as i32;
        let sent = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "kill({pid}, {signal})"
        );
        let deadline = sent + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the daemon") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit after signal {signal}"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = sent.elapsed();
        let lines = self
            .stderr
            .take()
            .map(|stderr| stderr.join().unwrap_or_default())
            .unwrap_or_default();
        (status, took, lines)
    }

    /// Sends `signal` and leaves the daemon running (for a signal it must survive).
    pub fn signal(&self, signal: i32) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "kill({pid}, {signal})"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A sample's value in a classic exposition: the first line that starts with `series`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The values of the samples of `metric` in a classic exposition whose labels include all of
/// `labels`.
fn samples_with<'t>(
    text: &'t str,
    metric: &'t str,
    labels: &'t [(&str, &str)],
) -> impl Iterator<Item = f64> + 't {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(move |l| {
            labels.iter().all(|(k, v)| {
                let pair = format!("{k}=\"{v}\"");
                l.contains(&format!("{{{pair}")) || l.contains(&format!(",{pair}"))
            })
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The value of the first sample of `metric` whose labels include all of `labels`.
pub fn sample_with(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples_with(text, metric, labels).next()
}

/// The `stormwatch_finding` sample of `kind` about the cgroup `rel` (its path under the v2
/// root): `Some` while the daemon reports that finding.
pub fn finding(text: &str, kind: &str, rel: &str) -> Option<f64> {
    sample_with(
        text,
        "stormwatch_finding",
        &[("kind", kind), ("cgroup", rel)],
    )
}

/// The sum of the samples of `metric` whose labels include all of `labels` (a counter's series
/// over the labels left out); `None` when there is none.
pub fn sum_with(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples_with(text, metric, labels).reduce(|a, b| a + b)
}

/// The per-packet network probes, which `run` attaches on demand (`net_packet_probes`).
pub const PACKET_PROBES: [&str; 2] = ["net:net_dev_start_xmit", "net:netif_receive_skb"];

/// `stormwatch_probe_attached` of the probe on `tracepoint`.
pub fn probe_attached(text: &str, tracepoint: &str) -> Option<f64> {
    sample_with(
        text,
        "stormwatch_probe_attached",
        &[("tracepoint", tracepoint)],
    )
}

/// Whether the probe on each of `tracepoints` has `stormwatch_probe_attached` = `want`.
pub fn all_attached<'a>(
    text: &str,
    tracepoints: impl IntoIterator<Item = &'a str>,
    want: f64,
) -> bool {
    tracepoints
        .into_iter()
        .all(|tp| probe_attached(text, tp) == Some(want))
}

/// Panics unless `promtool check metrics` (Debian package `prometheus`) has nothing to say
/// about `exposition` (the classic text format).
#[track_caller]
pub fn assert_promtool_clean(exposition: &str) {
    let promtool = tool("promtool", "apt-get install -y prometheus");
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    check
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(exposition.as_bytes())
        .expect("feeding promtool");
    let out = check.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
