//! The web config file: TLS and basic authentication for the metrics endpoint, in the format of
//! the Prometheus exporters' exporter-toolkit (`--web.config.file`), so that one file and one
//! habit serve every exporter of a node:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # PEM: the certificate chain
//!   key_file: server.key           # PEM: its private key (PKCS#8, PKCS#1 or SEC1)
//!   client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
//!   client_ca_file: ca.crt         # the CAs that sign the scrapers' certificates
//!   min_version: TLS12             # TLS12 (default) or TLS13
//!   max_version: TLS13
//! basic_auth_users:                # user: bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//!   prometheus: $2y$10$...
//! ```
//!
//! Relative paths are relative to the file's directory, as exporter-toolkit reads them. A key
//! this implementation does not support (cipher_suites, http_server_config, …) is refused by
//! name rather than ignored: a setting that silently does nothing is a hole in a security
//! review. The files are read again when one of them changes (certificate rotation needs no
//! restart); a change that does not load is logged and the last good settings stay.
//!
//! Authentication guards `/metrics`; `/healthz` and `/readyz` (which say only "ok" or
//! "ready") stay open, so that the kubelet's probes need no credentials. A wrong password
//! costs the agent little ([`Active::check`]): values seen before are answered from caches,
//! and new ones are checked one at a time, at a bounded rate, in a short line that clients
//! with recent failures cannot hold against the others.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use serde::Deserialize;
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, RootCertStore, ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
        server::WebPkiClientVerifier,
    },
};

use crate::files;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    tls_server_config: Option<TlsServerConfig>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsServerConfig {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_auth_type: ClientAuth,
    client_ca_file: Option<PathBuf>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
enum ClientAuth {
    #[default]
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, PartialOrd)]
enum TlsVersion {
    TLS12,
    TLS13,
}

/// What the web config says, loaded: the TLS acceptor (certificates read, key checked) and the
/// users.
pub struct Active {
    pub tls: Option<TlsAcceptor>,
    users: BTreeMap<String, String>,
    /// `Authorization` values that verified: bcrypt costs tens of milliseconds by design, and
    /// a scraper sends the same header every scrape. Bounded; emptied on reload.
    verified: Mutex<HashSet<String>>,
    /// Checked against when the user is unknown, so that a wrong user name takes as long to
    /// refuse as a wrong password.
    decoy: String,
    /// What keeps wrong passwords cheap: the values that failed, who is waiting for a check,
    /// and when the next may start.
    limiter: Mutex<Limiter>,
    /// Tells the line a check ended or its order changed.
    turns: tokio::sync::Notify,
    /// bcrypt checks made, and the most at once (for the tests).
    #[cfg(test)]
    hashes: Hashes,
}

#[cfg(test)]
#[derive(Default)]
struct Hashes {
    made: std::sync::atomic::AtomicUsize,
    running: std::sync::atomic::AtomicUsize,
    most_at_once: std::sync::atomic::AtomicUsize,
}

const VERIFIED_CACHE: usize = 64;

/// `Authorization` values remembered as wrong (by a keyed 64-bit hash): answered 401 without
/// hashing again.
const FAILED_CACHE: usize = 1024;
/// Clients (source addresses) waiting for a bcrypt check, at most: one place each, so that
/// one client's flood is one place in the line.
const WAITING: usize = 8;
/// After a check that failed, the next waits this many times as long as it took: checks that
/// fail use at most a fifth of one CPU, whoever sends them.
const COOLDOWN: u32 = 4;
/// A client whose check failed this recently waits behind those whose did not, and gives its
/// place up to them when the line is full: a scraper's first check is not stuck behind a
/// flood of wrong passwords from other addresses.
const SUSPECT_FOR: Duration = Duration::from_secs(60);
/// Clients remembered as having failed, at most.
const SUSPECTS: usize = 4096;

/// Whether an `Authorization` header admits a request.
#[derive(Debug, PartialEq)]
pub enum Auth {
    Allowed,
    Denied,
    /// The value needs a bcrypt check, and the line for one is full (or holds this client
    /// already): try again later (429).
    Busy,
}

/// Where a client stands in the line for a check.
#[derive(Debug, PartialEq)]
enum Turn {
    /// Its check may start now.
    Now,
    Wait,
    /// Pushed out of the line by a client that did not fail recently.
    Out,
}

/// The bookkeeping that keeps wrong passwords cheap ([`Active::check`]); time is passed in.
struct Limiter {
    keys: std::hash::RandomState,
    /// Keys of the values that failed, and their order (the oldest is forgotten first).
    failed: HashSet<u64>,
    failed_order: std::collections::VecDeque<u64>,
    /// Clients waiting for a check: whether they failed recently, and their arrival.
    line: std::collections::HashMap<IpAddr, (bool, u64)>,
    arrivals: u64,
    /// A check is running.
    running: bool,
    /// No check starts before this.
    next_start: Instant,
    /// When each client last failed a check.
    suspects: std::collections::HashMap<IpAddr, Instant>,
    /// The longest the line was (for the tests).
    #[cfg(test)]
    longest: usize,
}

impl Limiter {
    fn new() -> Self {
        Self {
            keys: std::hash::RandomState::new(),
            failed: HashSet::new(),
            failed_order: std::collections::VecDeque::new(),
            line: std::collections::HashMap::new(),
            arrivals: 0,
            running: false,
            next_start: Instant::now(),
            suspects: std::collections::HashMap::new(),
            #[cfg(test)]
            longest: 0,
        }
    }

    /// The key of a value: its hash, keyed at random per load (an attacker cannot aim at a
    /// collision, and no password is kept).
    fn key(&self, value: &str) -> u64 {
        use std::hash::BuildHasher as _;
        self.keys.hash_one(value)
    }

    fn has_failed(&self, key: u64) -> bool {
        self.failed.contains(&key)
    }

    fn is_suspect(&self, client: IpAddr, now: Instant) -> bool {
        self.suspects
            .get(&client)
            .is_some_and(|t| now.saturating_duration_since(*t) < SUSPECT_FOR)
    }

    /// A place in the line for `client`, if it has none and there is room (a client that did
    /// not fail recently makes room by pushing out the last one that did); whether it got one.
    fn enter(&mut self, client: IpAddr, now: Instant) -> bool {
        if self.line.contains_key(&client) {
            return false;
        }
        let suspect = self.is_suspect(client, now);
        if self.line.len() >= WAITING {
            let last_suspect = self
                .line
                .iter()
                .filter(|(_, (s, _))| *s)
                .max_by_key(|(_, (_, arrival))| *arrival)
                .map(|(c, _)| *c);
            match last_suspect {
                Some(c) if !suspect => {
                    self.line.remove(&c);
                }
                _ => return false,
            }
        }
        self.line.insert(client, (suspect, self.arrivals));
        self.arrivals += 1;
        #[cfg(test)]
        {
            self.longest = self.longest.max(self.line.len());
        }
        true
    }

    /// Whether `client`'s check may start: none running, and it is first in line (those that
    /// did not fail recently first, then by arrival). If so, it leaves the line and runs.
    fn turn(&mut self, client: IpAddr) -> Turn {
        let Some(mine) = self.line.get(&client).copied() else {
            return Turn::Out;
        };
        if self.running || self.line.values().any(|other| *other < mine) {
            return Turn::Wait;
        }
        self.line.remove(&client);
        self.running = true;
        Turn::Now
    }

    fn leave(&mut self, client: IpAddr) {
        self.line.remove(&client);
    }

    /// The running check ended at `now`: it hashed `key` for `client`, which took `took`.
    fn checked(&mut self, key: u64, client: IpAddr, allowed: bool, took: Duration, now: Instant) {
        self.running = false;
        if allowed {
            return;
        }
        self.next_start = self.next_start.max(now + took * COOLDOWN);
        if self.failed.insert(key) {
            self.failed_order.push_back(key);
            if self.failed_order.len() > FAILED_CACHE
                && let Some(oldest) = self.failed_order.pop_front()
            {
                self.failed.remove(&oldest);
            }
        }
        if self.suspects.len() >= SUSPECTS && !self.suspects.contains_key(&client) {
            self.suspects
                .retain(|_, t| now.saturating_duration_since(*t) < SUSPECT_FOR);
            if self.suspects.len() >= SUSPECTS {
                self.suspects.clear();
            }
        }
        self.suspects.insert(client, now);
    }
}

/// Gives a client's place in the line back when it leaves it (its check started, or it was
/// abandoned), and tells the others.
struct Waiting<'a> {
    active: &'a Active,
    client: IpAddr,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.active.limiter().leave(self.client);
        self.active.turns.notify_waiters();
    }
}

/// The running check: when it ends (even abandoned by its request), the next may start.
struct Running {
    active: Arc<Active>,
    client: IpAddr,
    /// What it hashed, whether that was right, and how long it took; `None` before it hashed.
    hashed: Option<(u64, bool, Duration)>,
}

impl Running {
    fn hashed(&mut self, key: u64, allowed: bool, took: Duration) {
        self.hashed = Some((key, allowed, took));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut limiter = self.active.limiter();
        match self.hashed {
            Some((key, allowed, took)) => {
                limiter.checked(key, self.client, allowed, took, Instant::now());
            }
            None => limiter.running = false,
        }
        drop(limiter);
        self.active.turns.notify_waiters();
    }
}

impl Active {
    fn open() -> Self {
        Self {
            tls: None,
            users: BTreeMap::new(),
            verified: Mutex::new(HashSet::new()),
            decoy: String::new(),
            limiter: Mutex::new(Limiter::new()),
            turns: tokio::sync::Notify::new(),
            #[cfg(test)]
            hashes: Hashes::default(),
        }
    }

    pub fn requires_auth(&self) -> bool {
        !self.users.is_empty()
    }

    fn limiter(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_verified(&self, value: &str) -> bool {
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(value)
    }

    /// The answer the caches give, without hashing: `None` when a bcrypt check is needed.
    fn cached(&self, value: &str, key: u64) -> Option<Auth> {
        if self.is_verified(value) {
            Some(Auth::Allowed)
        } else if self.limiter().has_failed(key) {
            Some(Auth::Denied)
        } else {
            None
        }
    }

    /// Checks an `Authorization` header value from `client` against the users (always allowed
    /// when none are configured).
    ///
    /// bcrypt is slow on purpose, so a flood of wrong passwords must not become a flood of
    /// bcrypt checks: values seen before are answered from the caches (verified; or failed,
    /// 401 without hashing); one check runs at a time, on the blocking pool (off the worker
    /// that serves the scrapes and probes), and after one that failed the next waits
    /// `COOLDOWN` times as long; a client has one place in the line, which holds
    /// `WAITING` clients (others get [`Auth::Busy`]), those that did not fail recently first.
    pub async fn check(self: &Arc<Self>, authorization: Option<&str>, client: IpAddr) -> Auth {
        if self.users.is_empty() {
            return Auth::Allowed;
        }
        let Some(value) = authorization else {
            return Auth::Denied;
        };
        let key = self.limiter().key(value);
        if let Some(answer) = self.cached(value, key) {
            return answer;
        }
        let Some((user, password)) = basic_credentials(value) else {
            return Auth::Denied;
        };
        if !self.limiter().enter(client, Instant::now()) {
            return Auth::Busy;
        }
        // Someone may have been pushed out.
        self.turns.notify_waiters();
        let waiting = Waiting {
            active: self,
            client,
        };
        loop {
            let notified = self.turns.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.limiter().turn(client) {
                Turn::Now => break,
                Turn::Out => return Auth::Busy,
                Turn::Wait => {}
            }
            notified.await;
        }
        let mut running = Running {
            active: Arc::clone(self),
            client,
            hashed: None,
        };
        drop(waiting);
        let start = self.limiter().next_start;
        tokio::time::sleep_until(start.into()).await;
        // Another request may have checked the same value meanwhile.
        if let Some(answer) = self.cached(value, key) {
            return answer;
        }
        let value = value.to_owned();
        let checked = tokio::task::spawn_blocking(move || {
            // The check ends (and the next may start) when the hashing does, even if the
            // request is abandoned meanwhile.
            let started = Instant::now();
            let allowed = running.active.verify(&user, &password);
            if allowed {
                let mut c = running
                    .active
                    .verified
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if c.len() >= VERIFIED_CACHE {
                    c.clear();
                }
                c.insert(value);
            }
            running.hashed(key, allowed, started.elapsed());
            allowed
        })
        .await;
        if matches!(checked, Ok(true)) {
            Auth::Allowed
        } else {
            Auth::Denied
        }
    }

    /// The bcrypt check: the user's hash, or the decoy's for an unknown user (as slow).
    fn verify(&self, user: &str, password: &str) -> bool {
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            let h = &self.hashes;
            h.made.fetch_add(1, SeqCst);
            let now = h.running.fetch_add(1, SeqCst) + 1;
            h.most_at_once.fetch_max(now, SeqCst);
        }
        let right = bcrypt::verify(password, hash).unwrap_or(false);
        #[cfg(test)]
        self.hashes
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        right && known
    }
}

/// `Basic base64(user:password)` → (user, password).
fn basic_credentials(value: &str) -> Option<(String, String)> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The files whose change means a reload, with their modification times.
type Stamp = Vec<(PathBuf, Option<SystemTime>)>;

fn stamp(paths: &[PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            (
                p.clone(),
                std::fs::metadata(p).and_then(|m| m.modified()).ok(),
            )
        })
        .collect()
}

/// The web config of a running server: what it says now, reloaded when a file changes.
pub struct WebConfig {
    path: Option<PathBuf>,
    state: RwLock<(Stamp, Arc<Active>)>,
}

impl WebConfig {
    /// No web config: plain HTTP, no authentication.
    pub fn none() -> Self {
        Self {
            path: None,
            state: RwLock::new((Vec::new(), Arc::new(Active::open()))),
        }
    }

    /// Loads `path`; every error is one line that names the file and what is wrong.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let (files, active) = load(path)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            state: RwLock::new((stamp(&files), Arc::new(active))),
        })
    }

    /// The settings for a new connection: the current ones, reloaded first if a file changed.
    pub fn current(&self) -> Arc<Active> {
        let Some(path) = &self.path else {
            return Arc::clone(&self.state.read().unwrap_or_else(PoisonError::into_inner).1);
        };
        {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            let files: Vec<PathBuf> = state.0.iter().map(|(p, _)| p.clone()).collect();
            if stamp(&files) == state.0 {
                return Arc::clone(&state.1);
            }
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match load(path) {
            Ok((files, active)) => {
                log::info!("web config {}: reloaded", path.display());
                *state = (stamp(&files), Arc::new(active));
            }
            Err(err) => {
                // Keep serving with the last good settings; do not log again until a file
                // changes once more.
                log::warn!("{err:#}; keeping the previous settings");
                let files: Vec<PathBuf> = state.0.iter().map(|(p, _)| p.clone()).collect();
                state.0 = stamp(&files);
            }
        }
        Arc::clone(&state.1)
    }

    /// Whether the server speaks TLS (as loaded at start).
    pub fn tls(&self) -> bool {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .tls
            .is_some()
    }
}

/// Reads and checks the web config at `path`: the files it names (for change detection) and
/// the loaded settings.
fn load(path: &Path) -> anyhow::Result<(Vec<PathBuf>, Active)> {
    let shown = path.display();
    let text = files::read_text(path, files::Kind::WebConfig)
        .map_err(|e| anyhow::anyhow!(e.about("web config file", path)))?;
    let file: WebConfigFile = if text.trim().is_empty() {
        WebConfigFile::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "web config file {shown}: {}",
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })?
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files = vec![path.to_path_buf()];
    let mut active = Active::open();
    if let Some(tls) = &file.tls_server_config {
        let (acceptor, read) =
            tls_acceptor(tls, dir).with_context(|| format!("web config file {shown}"))?;
        active.tls = Some(acceptor);
        files.extend(read);
    }
    if let Some(users) = file.basic_auth_users.filter(|u| !u.is_empty()) {
        for (user, hash) in &users {
            if user.contains(':') {
                bail!("web config file {shown}: basic_auth_users: user {user:?} contains ':'");
            }
            // An invalid hash is an error now, not a refusal of every scrape later.
            bcrypt::verify("", hash).map_err(|e| {
                anyhow::anyhow!(
                    "web config file {shown}: basic_auth_users: {user}: not a bcrypt hash ({e})"
                )
            })?;
        }
        // The decoy costs what the users' hashes cost.
        let cost = users
            .values()
            .filter_map(|h| h.get(4..6)?.parse::<u32>().ok())
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST);
        active.decoy = bcrypt::hash("stormwatch-decoy", cost).context("a decoy bcrypt hash")?;
        active.users = users;
    }
    Ok((files, active))
}

fn relative_to(dir: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// A PEM file the web config names (`what` is its key), read with a bound.
fn pem(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    files::read(path, files::Kind::WebConfig).map_err(|e| anyhow::anyhow!(e.about(what, path)))
}

fn tls_acceptor(tls: &TlsServerConfig, dir: &Path) -> anyhow::Result<(TlsAcceptor, Vec<PathBuf>)> {
    let cert_file = relative_to(dir, &tls.cert_file);
    let key_file = relative_to(dir, &tls.key_file);
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem(&cert_file, "cert_file")?)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("cert_file {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        bail!("cert_file {}: no certificate in it", cert_file.display());
    }
    let key = PrivateKeyDer::from_pem_slice(&pem(&key_file, "key_file")?)
        .map_err(|e| anyhow::anyhow!("key_file {}: {e}", key_file.display()))?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (TlsVersion::TLS12, &rustls::version::TLS12),
        (TlsVersion::TLS13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| {
        tls.min_version.is_none_or(|min| *v >= min) && tls.max_version.is_none_or(|max| *v <= max)
    })
    .map(|(_, v)| v)
    .collect();
    if versions.is_empty() {
        bail!("min_version is above max_version");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .context("TLS versions")?;
    let mut files = vec![cert_file, key_file.clone()];
    let builder = match (tls.client_auth_type, &tls.client_ca_file) {
        (ClientAuth::NoClientCert, None) => builder.with_no_client_auth(),
        (ClientAuth::NoClientCert, Some(_)) => {
            bail!("client_ca_file is set but client_auth_type is NoClientCert")
        }
        (_, None) => bail!(
            "client_auth_type {:?} needs client_ca_file",
            tls.client_auth_type
        ),
        (auth, Some(ca)) => {
            let ca = relative_to(dir, ca);
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem(&ca, "client_ca_file")?) {
                let cert =
                    cert.map_err(|e| anyhow::anyhow!("client_ca_file {}: {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| anyhow::anyhow!("client_ca_file {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            }
            .build()
            .map_err(|e| anyhow::anyhow!("client_ca_file {}: {e}", ca.display()))?;
            files.push(ca);
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| anyhow::anyhow!("key_file {}: {e}", key_file.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), files))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn error_of(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "web.yml", text);
        match WebConfig::load(&p) {
            Ok(_) => panic!("{text:?} loaded"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn errors_are_one_line_and_name_the_problem() {
        let e =
            error_of("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: []\n");
        assert!(e.contains("unknown field `cipher_suites`"), "{e}");
        let e = error_of("http_server_config:\n  http2: false\n");
        assert!(e.contains("unknown field `http_server_config`"), "{e}");
        let e = error_of("basic_auth_users:\n  alice: plaintext\n");
        assert!(e.contains("alice: not a bcrypt hash"), "{e}");
        let e = error_of("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n");
        assert!(e.contains("cert_file") && e.contains("missing.crt"), "{e}");
        let e = error_of("tls_server_config: [\n");
        assert!(e.contains("web config file"), "{e}");
        for e in [
            e,
            error_of("basic_auth_users:\n  alice: plaintext\n"),
            error_of("nonsense: 1\n"),
        ] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let missing = match WebConfig::load(Path::new("/nonexistent/web.yml")) {
            Ok(_) => panic!("a missing file loaded"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            missing.starts_with("cannot read web config file /nonexistent/web.yml"),
            "{missing}"
        );
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn client(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, n))
    }

    #[tokio::test]
    async fn an_empty_file_is_plain_http_without_auth() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&write(dir.path(), "web.yml", "")).unwrap();
        assert!(!web.tls());
        assert_eq!(web.current().check(None, CLIENT).await, Auth::Allowed);
    }

    /// A web config with one user (bcrypt at the lowest cost, for speed).
    fn with_user(dir: &Path, user: &str, password: &str) -> PathBuf {
        let hash = bcrypt::hash(password, 4).unwrap();
        write(
            dir,
            "web.yml",
            &format!("basic_auth_users:\n  {user}: '{hash}'\n"),
        )
    }

    fn header(user: &str, password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    fn hashes_made(active: &Active) -> usize {
        active.hashes.made.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn basic_auth_checks_user_and_password() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&with_user(dir.path(), "prometheus", "s3cret")).unwrap();
        let active = web.current();
        assert!(active.requires_auth());
        let check = |value: Option<String>| {
            let active = Arc::clone(&active);
            async move { active.check(value.as_deref(), CLIENT).await }
        };
        assert_eq!(
            check(Some(header("prometheus", "s3cret"))).await,
            Auth::Allowed
        );
        // Cached, and still right.
        assert_eq!(
            check(Some(header("prometheus", "s3cret"))).await,
            Auth::Allowed
        );
        assert_eq!(
            check(Some(header("prometheus", "wrong"))).await,
            Auth::Denied
        );
        assert_eq!(check(Some(header("eve", "s3cret"))).await, Auth::Denied);
        assert_eq!(check(None).await, Auth::Denied);
        assert_eq!(check(Some("Bearer abc".into())).await, Auth::Denied);
        assert_eq!(check(Some("Basic !!!".into())).await, Auth::Denied);
        assert_eq!(
            hashes_made(&active),
            3,
            "the right password once, the wrong one, the unknown user (the decoy)"
        );
    }

    /// Issue #40, item 4: every wrong password was hashed again, in parallel.
    #[tokio::test]
    async fn a_wrong_password_is_hashed_once_then_refused_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&with_user(dir.path(), "prometheus", "s3cret")).unwrap();
        let active = web.current();
        for _ in 0..50 {
            assert_eq!(
                active
                    .check(Some(&header("prometheus", "wrong")), CLIENT)
                    .await,
                Auth::Denied
            );
            assert_eq!(
                active.check(Some(&header("eve", "guess")), CLIENT).await,
                Auth::Denied
            );
        }
        assert_eq!(hashes_made(&active), 2);
        // The right password is not refused for the wrong ones cached.
        assert_eq!(
            active
                .check(Some(&header("prometheus", "s3cret")), CLIENT)
                .await,
            Auth::Allowed
        );
        assert_eq!(hashes_made(&active), 3);
    }

    /// Ten clients at once, each sending passwords never seen until three are refused: one
    /// check at a time, one place in line per client, at most `WAITING` clients in line; the
    /// others are told to come back (429) without a hash. A scraper's first check, from an
    /// address of its own, gets through the flood.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checks_run_one_at_a_time_one_per_client_and_few_wait() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&with_user(dir.path(), "prometheus", "s3cret")).unwrap();
        let active = web.current();
        let mut flood = Vec::new();
        for c in 0..10_u8 {
            let active = Arc::clone(&active);
            flood.push(tokio::spawn(async move {
                let (mut denied, mut busy) = (0, 0);
                for i in 0.. {
                    let guess = header("prometheus", &format!("guess{c}-{i}"));
                    match active.check(Some(&guess), client(c)).await {
                        Auth::Denied => denied += 1,
                        Auth::Busy => busy += 1,
                        Auth::Allowed => panic!("a guess was allowed"),
                    }
                    if denied == 3 {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                (denied, busy)
            }));
        }
        while hashes_made(&active) < WAITING + 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            active
                .check(Some(&header("prometheus", "s3cret")), client(200))
                .await,
            Auth::Allowed
        );
        let mut busy = 0;
        for f in flood {
            busy += f.await.unwrap().1;
        }
        assert!(busy > 0, "some were told to come back");
        let longest = active.limiter().longest;
        assert!(
            longest <= WAITING,
            "at most {WAITING} clients in line ({longest})"
        );
        let most = active
            .hashes
            .most_at_once
            .load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(most, 1, "one bcrypt check at a time");
        assert_eq!(
            hashes_made(&active),
            31,
            "three per client, and the scraper's"
        );
        let limiter = active.limiter();
        assert!(
            limiter.line.is_empty() && !limiter.running,
            "every place given back"
        );
    }

    #[test]
    fn the_line_has_one_place_per_client_and_few_places() {
        let now = Instant::now();
        let mut l = Limiter::new();
        assert!(l.enter(client(1), now));
        assert!(!l.enter(client(1), now), "one place per client");
        for i in 2..=WAITING as u8 {
            assert!(l.enter(client(i), now));
        }
        assert!(!l.enter(client(100), now), "the line is full");
        l.leave(client(1));
        assert!(l.enter(client(100), now));
        // First come, first served; one at a time.
        assert_eq!(l.turn(client(100)), Turn::Wait);
        assert_eq!(l.turn(client(2)), Turn::Now);
        assert_eq!(l.turn(client(3)), Turn::Wait, "one check at a time");
        l.checked(7, client(2), true, Duration::ZERO, now);
        assert_eq!(l.turn(client(3)), Turn::Now);
        assert_eq!(l.turn(client(42)), Turn::Out, "not in line");
    }

    #[test]
    fn clients_that_failed_recently_wait_behind_the_others_and_make_room_for_them() {
        let now = Instant::now();
        let mut l = Limiter::new();
        // Eight addresses failed a moment ago, and wait again.
        for i in 1..=WAITING as u8 {
            l.checked(u64::from(i), client(i), false, Duration::ZERO, now);
            assert!(l.enter(client(i), now));
        }
        l.checked(50, client(50), false, Duration::ZERO, now);
        assert!(
            !l.enter(client(50), now),
            "another that failed gets no place"
        );
        // A scraper's first check: the last of them makes room, and it goes first.
        assert!(l.enter(client(200), now));
        assert_eq!(l.turn(client(WAITING as u8)), Turn::Out);
        assert_eq!(l.turn(client(1)), Turn::Wait);
        assert_eq!(l.turn(client(200)), Turn::Now);
        l.checked(0, client(200), true, Duration::ZERO, now);
        assert_eq!(l.turn(client(1)), Turn::Now);
        // A minute on, a failure is forgotten.
        let later = now + SUSPECT_FOR;
        assert!(!l.is_suspect(client(1), later));
        assert!(l.is_suspect(client(1), later - Duration::from_secs(1)));
    }

    #[test]
    fn a_failed_check_delays_the_next_and_is_remembered_a_while() {
        let mut l = Limiter::new();
        let now = Instant::now();
        let took = Duration::from_millis(50);
        l.checked(1, client(1), true, took, now);
        assert!(
            l.next_start <= now,
            "a right password costs the next nothing"
        );
        assert!(!l.has_failed(1));
        assert!(!l.is_suspect(client(1), now));
        l.checked(2, client(2), false, took, now);
        assert_eq!(l.next_start, now + took * COOLDOWN);
        assert!(l.has_failed(2));
        assert!(l.is_suspect(client(2), now));
        // The most recent failures are kept, the oldest forgotten first.
        for key in 3..3 + FAILED_CACHE as u64 {
            l.checked(key, client(2), false, Duration::ZERO, now);
        }
        assert!(!l.has_failed(2));
        assert!(l.has_failed(3) && l.has_failed(2 + FAILED_CACHE as u64));
        assert_eq!(l.failed.len(), FAILED_CACHE);
        assert_eq!(l.failed_order.len(), FAILED_CACHE);
        // The delay never moves back.
        assert_eq!(l.next_start, now + took * COOLDOWN);
        // The clients remembered are bounded too.
        for i in 0..2 * SUSPECTS as u32 {
            l.checked(0, IpAddr::from(i.to_be_bytes()), false, Duration::ZERO, now);
        }
        assert!(l.suspects.len() <= SUSPECTS);
    }

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_change_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let p = with_user(dir.path(), "a", "one");
        let web = WebConfig::load(&p).unwrap();
        assert!(web.current().requires_auth());
        // Rewrites the file with a modification time `later` seconds ahead: times can be
        // coarse, and the change must be visible.
        let rewrite = |text: &str, later: u64| {
            std::fs::write(&p, text).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(SystemTime::now() + std::time::Duration::from_secs(later))
                .unwrap();
        };
        rewrite("", 5);
        assert!(!web.current().requires_auth(), "reloaded: no users");
        rewrite("basic_auth_users: [\n", 10);
        assert!(
            !web.current().requires_auth(),
            "a broken file keeps the last good settings"
        );
    }
}
