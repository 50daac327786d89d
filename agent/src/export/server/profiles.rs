//! The lock profiles `run` serves (`report::pprof`): each container's over the last diagnosis
//! window, behind the same TLS and credentials as `/metrics` (a profile names the code a
//! container runs).
//!
//! - `GET /debug/pprof/lock`: the index, one line per container: its name, then the path of
//!   its profile.
//! - `GET /debug/pprof/lock/<file>`: the profile (`application/octet-stream`, gzip-compressed
//!   `profile.proto`), as `go tool pprof https://user:pass@node:9477/debug/pprof/lock/<file>`
//!   reads it.

use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError},
    time::SystemTime,
};

use axum::{
    extract::{Path, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

use super::Shared;
use crate::report::pprof::Encoded;

/// Where the profiles are served.
pub const PATH: &str = "/debug/pprof/lock";

/// The profiles of one diagnosis window.
#[derive(Default)]
pub struct LockProfiles {
    /// When the window ended; `None` before the first judgement.
    pub end: Option<SystemTime>,
    /// By file name.
    pub files: BTreeMap<String, Encoded>,
}

impl Shared {
    /// The lock profiles of the window just judged (they replace the last window's).
    pub fn set_profiles(&self, p: LockProfiles) {
        *self
            .profiles
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(p);
    }

    pub fn profiles(&self) -> Arc<LockProfiles> {
        Arc::clone(&self.profiles.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl LockProfiles {
    pub fn new(end: SystemTime, profiles: Vec<Encoded>) -> Self {
        Self {
            end: Some(end),
            files: profiles.into_iter().map(|e| (e.file.clone(), e)).collect(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.files
            .values()
            .map(|e| (e.gz.len() + e.file.len() + e.container.len()) as u64)
            .sum()
    }

    fn index(&self) -> String {
        let mut s = match self.end {
            None => "# no diagnosis window judged yet\n".to_owned(),
            Some(end) => format!(
                "# lock profiles of the diagnosis window that ended at {} s (Unix time): \
                 container, then its profile (pprof format; `go tool pprof -top <URL>`)\n",
                end.duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            ),
        };
        if self.end.is_some() && self.files.is_empty() {
            s.push_str("# no container had sampled hand-offs in it\n");
        }
        for e in self.files.values() {
            s.push_str(&format!("{}\t{PATH}/{}\n", e.container, e.file));
        }
        s
    }
}

pub async fn index(State(shared): State<Arc<Shared>>) -> Response {
    let text = shared.profiles().index();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

pub async fn one(State(shared): State<Arc<Shared>>, Path(file): Path<String>) -> Response {
    let profiles = shared.profiles();
    let Some(e) = profiles.files.get(&file) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no lock profile {file} in the last diagnosis window: see {PATH}\n"),
        )
            .into_response();
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        e.gz.clone(),
    )
        .into_response()
}
