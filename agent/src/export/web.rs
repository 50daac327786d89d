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
//! "ready") stay open, so that the kubelet's probes need no credentials.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::SystemTime,
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
}

const VERIFIED_CACHE: usize = 64;

/// Whether an `Authorization` header admits a request.
#[derive(Debug, PartialEq)]
pub enum Auth {
    Allowed,
    Denied,
}

impl Active {
    fn open() -> Self {
        Self {
            tls: None,
            users: BTreeMap::new(),
            verified: Mutex::new(HashSet::new()),
            decoy: String::new(),
        }
    }

    pub fn requires_auth(&self) -> bool {
        !self.users.is_empty()
    }

    /// Checks an `Authorization` header value against the users (always allowed when none
    /// are configured).
    pub fn check(&self, authorization: Option<&str>) -> Auth {
        if self.users.is_empty() {
            return Auth::Allowed;
        }
        let Some(value) = authorization else {
            return Auth::Denied;
        };
        let cache = || self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if cache().contains(value) {
            return Auth::Allowed;
        }
        let Some((user, password)) = basic_credentials(value) else {
            return Auth::Denied;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        if bcrypt::verify(&password, hash).unwrap_or(false) && known {
            let mut c = cache();
            if c.len() >= VERIFIED_CACHE {
                c.clear();
            }
            c.insert(value.to_owned());
            Auth::Allowed
        } else {
            Auth::Denied
        }
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

    #[test]
    fn an_empty_file_is_plain_http_without_auth() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&write(dir.path(), "web.yml", "")).unwrap();
        assert!(!web.tls());
        assert_eq!(web.current().check(None), Auth::Allowed);
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

    #[test]
    fn basic_auth_checks_user_and_password() {
        let dir = tempfile::tempdir().unwrap();
        let web = WebConfig::load(&with_user(dir.path(), "prometheus", "s3cret")).unwrap();
        let active = web.current();
        assert!(active.requires_auth());
        let header = |user: &str, password: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )
        };
        assert_eq!(
            active.check(Some(&header("prometheus", "s3cret"))),
            Auth::Allowed
        );
        // Cached, and still right.
        assert_eq!(
            active.check(Some(&header("prometheus", "s3cret"))),
            Auth::Allowed
        );
        assert_eq!(
            active.check(Some(&header("prometheus", "wrong"))),
            Auth::Denied
        );
        assert_eq!(active.check(Some(&header("eve", "s3cret"))), Auth::Denied);
        assert_eq!(active.check(None), Auth::Denied);
        assert_eq!(active.check(Some("Bearer abc")), Auth::Denied);
        assert_eq!(active.check(Some("Basic !!!")), Auth::Denied);
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
