//! The sessions keepers hold for a state dir (`park`, `resume`): listed (`sessions list`,
//! `doctor`), counted toward `max_sessions`, and ended before their time (`sessions rm` and
//! `prune`, and room for a new session when `max_sessions` is reached).
//!
//! Each parked session has a listing, `<state_dir>/engine/sessions/<digest>.json` (0600 in the
//! 0700 directory): the [`Meta`] its keeper was given, written by the bridge that parked it and
//! removed by the keeper with its socket (in the keeper directory, `park::socket_of`). A
//! listing whose socket is gone is stale and never shown.
//!
//! Ending one goes through its keeper, as a resume does ([`park::claim`]): the keeper hands its
//! connection to one claimant only, so a session is never both resumed and ended.

use std::path::Path;

use super::park::{self, Meta, Slot};

/// A session a keeper holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Parked {
    /// The identity it belongs to under `serve`; none for the local user's.
    pub identity: Option<String>,
    /// Its name, as the model gave it.
    pub session: String,
    /// Its container's id.
    pub container: String,
    /// Seconds since the epoch when it was parked, and when its keeper ends it.
    pub parked_at: u64,
    /// Seconds since the epoch when its keeper ends it.
    pub expires: u64,
    /// Milliseconds since the epoch of its last call.
    pub used_at_ms: u64,
}

impl Parked {
    fn of(meta: &Meta) -> Option<Parked> {
        let key = meta.session.as_deref()?;
        let (identity, session) = match key.rsplit_once('/') {
            Some((id, name)) => (Some(id.to_string()), name.to_string()),
            None => (None, key.to_string()),
        };
        Some(Parked {
            identity,
            session,
            container: meta.container_id.clone(),
            parked_at: meta.parked_at,
            expires: meta.expires,
            used_at_ms: meta.used_at_ms,
        })
    }

    /// The session's key, as `SessionKey` shows it (`identity/name`, or the name alone).
    pub fn key(&self) -> String {
        match &self.identity {
            Some(id) => format!("{id}/{}", self.session),
            None => self.session.clone(),
        }
    }
}

/// How many sessions keepers hold in `state_dir` (their listings whose socket is there; a
/// keeper whose time is over removes both).
pub fn parked_sessions(state_dir: &Path) -> usize {
    list(state_dir).len()
}

/// The sessions parked in `state_dir`, least recently used first.
pub fn list(state_dir: &Path) -> Vec<Parked> {
    let dir = state_dir.join("engine").join("sessions");
    let mut out: Vec<Parked> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let parked = Parked::of(&park::read_listing(&p)?)?;
            let key = parked.key();
            // A listing where its key puts it, whose keeper's socket is there.
            (park::listing_of(state_dir, &key) == p
                && park::socket_of(state_dir, &Slot::Session(key)).exists())
            .then_some(parked)
        })
        .collect();
    out.sort_by(|a, b| (a.used_at_ms, &a.container).cmp(&(b.used_at_ms, &b.container)));
    out
}

/// End the session parked under `key` (as [`Parked::key`] shows it) before its time: taken from
/// its keeper, its container and package directory removed. Blocking (the engine is asked to
/// remove the container, up to 30 s). `None` when no keeper holds it (any more).
pub fn end(state_dir: &Path, key: &str) -> Option<Parked> {
    let (meta, fd) = park::claim(state_dir, &Slot::Session(key.to_string()))?;
    // Its attach connection closes: the runtime reads the end of its stdin and exits.
    drop(fd);
    park::remove_parked(&meta);
    Parked::of(&meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_the_identity_and_the_session_apart() {
        let meta = |key: &str| Meta {
            container_id: "c".repeat(64),
            name: "n".into(),
            python: "3.14".into(),
            target: None,
            packages: std::path::PathBuf::from("/x"),
            spec: String::new(),
            endpoint: String::new(),
            expires: 20,
            session: Some(key.into()),
            podman: None,
            parked_at: 10,
            used_at_ms: 9_000,
        };
        let p = Parked::of(&meta("alice@example.com/default")).unwrap();
        assert_eq!(p.identity.as_deref(), Some("alice@example.com"));
        assert_eq!(p.session, "default");
        assert_eq!(p.key(), "alice@example.com/default");
        // An identity may hold '/'; a session name never does.
        let p = Parked::of(&meta("https://idp/sub/s1")).unwrap();
        assert_eq!(
            (p.identity.as_deref(), p.session.as_str()),
            (Some("https://idp/sub"), "s1")
        );
        let p = Parked::of(&meta("work")).unwrap();
        assert_eq!((p.identity, p.session.as_str()), (None, "work"));
        let mut pool = meta("x");
        pool.session = None;
        assert!(
            Parked::of(&pool).is_none(),
            "the pool's sandbox is no session"
        );
    }

    #[test]
    fn a_stale_or_foreign_listing_is_not_shown() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("engine").join("sessions");
        std::fs::create_dir_all(&dir).unwrap();
        // A listing that is not JSON.
        std::fs::write(dir.join("b.json"), b"not json").unwrap();
        // A listing whose keeper's socket is gone.
        let meta = serde_json::json!({
            "container_id": "c", "name": "n", "python": "3.14", "target": null,
            "packages": "/x", "spec": "", "endpoint": "", "expires": 20,
            "session": "s", "podman": null
        });
        let listing = park::listing_of(tmp.path(), "s");
        std::fs::write(&listing, meta.to_string()).unwrap();
        assert!(
            park::read_listing(&listing).is_some(),
            "a listing as the bridge writes it"
        );
        assert!(list(tmp.path()).is_empty());
    }
}
