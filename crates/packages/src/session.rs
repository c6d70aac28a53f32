//! What the bridge keeps of one session's installs, in its package directory: what it
//! installed, and what was refused there (by set, and by each normalized name), so that a
//! refusal is never asked or resolved again however it is spelt.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PackageError, store};

use bridge_core::config::{PackagesConfig, Requirement};
use bridge_core::protocol::Target;

/// The file in a session's package directory where the bridge keeps what it installed there
/// (the sandbox can read it, not write it).
const STATE_FILE: &str = ".mcp-code-bridge-installs.json";
/// Refusals one session remembers (refused again unasked): names, and sets, each.
const MAX_REMEMBERED_REFUSALS: usize = 256;

/// One installed distribution, as `runtime.install` returns it and the session's state keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Installed {
    /// The distribution's normalized name (PEP 503).
    pub name: String,
    /// Its version.
    pub version: String,
    /// The SHA-256 (hex) of the wheel it came from.
    pub sha256: String,
    /// Unpacked bytes.
    pub size: u64,
    /// Files and directories it unpacked to.
    #[serde(default)]
    pub entries: u64,
    /// Taken from the host's cache (no download).
    pub cached: bool,
    /// Named by an install (not only a dependency).
    pub requested: bool,
}

impl Installed {
    pub(super) fn charged(&self) -> u64 {
        super::unpack::Cost {
            bytes: self.size,
            entries: self.entries,
        }
        .charged()
    }
}

/// What the bridge keeps of one session's installs, in its package directory.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct SessionState {
    pub(super) installed: Vec<Installed>,
    /// Keys of requirement sets refused in this session, with the rule that refused them.
    pub(super) refused: BTreeMap<String, String>,
    /// Names (PEP 503) refused in this session, asked for or among the distributions the user
    /// declined, with the rule: however a later install spells them, it is refused unasked
    /// and unresolved.
    #[serde(default)]
    pub(super) refused_names: BTreeMap<String, String>,
    /// Questions put to the user in this session ([`MAX_QUESTIONS`]).
    #[serde(default)]
    pub(super) asked: u32,
}

impl SessionState {
    pub(super) fn read(dir: &Path) -> SessionState {
        use std::io::Read;
        let mut text = String::new();
        let ok = bridge_core::statefile::open_read(&dir.join(STATE_FILE))
            .ok()
            .and_then(|f| f.take(16 << 20).read_to_string(&mut text).ok());
        ok.and_then(|_| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    pub(super) fn write(&self, dir: &Path, tmp: &Path) -> Result<(), PackageError> {
        let path = dir.join(STATE_FILE);
        let text = serde_json::to_vec(self).expect("the state serializes");
        store::write_atomic(tmp, &path, &text).map_err(|source| PackageError::Io {
            what: "could not write",
            path: path.clone(),
            source,
        })?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444));
        Ok(())
    }

    /// What the session's installs are charged against `packages.max_size`: bytes and
    /// entries ([`store::Cost::charged`]).
    pub(super) fn charged(&self) -> u64 {
        self.installed.iter().map(Installed::charged).sum()
    }
}

/// The key of a requirement set for one target and one source of packages: the same install
/// in another session of the same image finds the resolution made before.
pub(super) fn set_key(reqs: &[Requirement], target: &Target, config: &PackagesConfig) -> String {
    let mut texts: Vec<String> = reqs.iter().map(canonical).collect();
    texts.sort_unstable();
    texts.dedup();
    let mut h = Sha256::new();
    for part in [
        serde_json::to_string(&texts).unwrap_or_default(),
        serde_json::to_string(target).unwrap_or_default(),
        config.index_url.clone(),
        format!("{:?}{}", config.find_links, config.offline),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// Remember a refusal: the set's key, and each of `names` (normalized), so that neither the
/// same set nor any of the names is asked about or resolved again in this session.
/// A requirement as one spelling: its normalized name, then the rest (extras and version
/// clauses) lower-cased without spaces, extras sorted.
fn canonical(r: &Requirement) -> String {
    let t = r.text.trim();
    let rest = t.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let rest: String = rest
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    let (extras, clauses) = match rest.strip_prefix('[').and_then(|r| r.split_once(']')) {
        Some((extras, clauses)) => {
            let mut e: Vec<String> = extras
                .split(',')
                .filter(|x| !x.is_empty())
                .map(bridge_core::config::packages::normalize)
                .collect();
            e.sort_unstable();
            e.dedup();
            (format!("[{}]", e.join(",")), clauses.to_string())
        }
        None => (String::new(), rest),
    };
    format!("{}{extras}{clauses}", r.name)
}

pub(super) fn remember_refusal<'n>(
    state: &mut SessionState,
    key: &str,
    names: impl IntoIterator<Item = &'n str>,
    rule: &str,
    dir: &Path,
    root: &Path,
) {
    if state.refused.len() < MAX_REMEMBERED_REFUSALS {
        state.refused.insert(key.to_string(), rule.to_string());
    }
    for name in names {
        if state.refused_names.len() >= MAX_REMEMBERED_REFUSALS {
            break;
        }
        state
            .refused_names
            .entry(bridge_core::config::packages::normalize(name))
            .or_insert_with(|| rule.to_string());
    }
    let _ = state.write(dir, &root.join("tmp"));
}
