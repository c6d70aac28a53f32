//! What a snapshot's listing says (whose it is, why it was written, what it holds), and where
//! a key's files are: the leaf both the snapshots' files (`snapshots.rs`) and the store's
//! accounting (`store.rs`) read.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use bridge_core::identity::{Identity, SessionKey};

/// The directory of snapshots under the state dir.
pub const DIR: &str = "sessions";
/// Snapshots kept at most, whatever their size (each is two files).
pub const MAX_SNAPSHOTS: usize = 10_000;
/// Largest listing read back.
pub(super) const MAX_LISTING: u64 = 256 << 10;
/// Largest listing written: its lists are cut (and counted in `more`) to fit.
pub const LISTING_BUDGET: usize = 64 << 10;
/// Names of a listing kept at most (kept and lost each), and their longest spelling.
pub(super) const MAX_NAMES: usize = 200;
pub(super) const MAX_NAME: usize = 200;
pub(super) const MAX_WHY: usize = 300;
/// A temporary file older than this is a writer's that died: removed by the next `scan`.
pub(super) const STALE_TMP: Duration = Duration::from_secs(3600);

/// One name the snapshot could not keep, and why (as the sandbox said).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LostName {
    /// The variable's name.
    pub name: String,
    #[serde(rename = "type")]
    /// Its type's name.
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// Why it could not be kept, as the sandbox said (may be empty).
    pub why: String,
}

/// What the sandbox said of its snapshot (the `info` of its last `snap` frame), bounded.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Info {
    #[serde(default)]
    /// The names kept (at most [`MAX_NAMES`]).
    pub names: Vec<String>,
    #[serde(default)]
    /// Modules imported again on restore, by the name they were bound to.
    pub modules: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    /// The names that could not be kept.
    pub lost: Vec<LostName>,
    /// Names left out of `names` and `lost` past [`MAX_NAMES`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: u64,
    #[serde(default)]
    /// Cells (closures' variables) kept.
    pub cells: u64,
    /// The largest values, by size: a refused snapshot's notice names them.
    #[serde(default)]
    pub largest: Vec<(String, u64)>,
    #[serde(default)]
    /// The pickler that wrote it (`pickle`, `cloudpickle`).
    pub pickler: String,
}

/// `s` cut to `max` bytes at a character boundary.
pub(super) fn cut(s: &str, max: usize) -> String {
    s[..bridge_core::text::floor_char_boundary(s, max)].to_string()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Info {
    /// The `info` object of a `snap` frame, taken field by field: anything of the wrong shape
    /// is left out, strings are cut, lists bounded.
    pub fn from_frame(v: Option<&Value>) -> Info {
        let Some(v) = v else {
            return Info::default();
        };
        let text = |v: &Value, max: usize| v.as_str().map(|s| cut(s, max));
        let mut info = Info::default();
        let mut more = ["more_names", "more_lost"]
            .iter()
            .filter_map(|k| v.get(k).and_then(Value::as_u64))
            .fold(0u64, u64::saturating_add);
        if let Some(names) = v.get("names").and_then(Value::as_array) {
            more = more.saturating_add(names.len().saturating_sub(MAX_NAMES) as u64);
            info.names = names
                .iter()
                .take(MAX_NAMES)
                .filter_map(|n| text(n, MAX_NAME))
                .collect();
        }
        if let Some(lost) = v.get("lost").and_then(Value::as_array) {
            more = more.saturating_add(lost.len().saturating_sub(MAX_NAMES) as u64);
            info.lost = lost.iter().take(MAX_NAMES).filter_map(lost_name).collect();
        }
        if let Some(modules) = v.get("modules").and_then(Value::as_object) {
            info.modules = modules
                .iter()
                .take(MAX_NAMES)
                .filter_map(|(k, m)| Some((cut(k, MAX_NAME), text(m, MAX_NAME)?)))
                .collect();
        }
        if let Some(largest) = v.get("largest").and_then(Value::as_array) {
            info.largest = largest
                .iter()
                .take(5)
                .filter_map(|l| Some((text(l.get("name")?, MAX_NAME)?, l.get("size")?.as_u64()?)))
                .collect();
        }
        info.cells = v.get("cells").and_then(Value::as_u64).unwrap_or(0);
        info.pickler = v
            .get("pickler")
            .and_then(|p| text(p, 32))
            .unwrap_or_default();
        info.more = more;
        info
    }

    /// The names lost, as the notice and `_meta` show them: `name (type)`.
    pub fn lost_names(&self) -> Vec<String> {
        self.lost.iter().map(LostName::shown).collect()
    }
}

/// A lost name of a frame (`{name, type, why}`), if it has a name.
pub fn lost_name(v: &Value) -> Option<LostName> {
    let text = |k: &str, max: usize| v.get(k).and_then(Value::as_str).map(|s| cut(s, max));
    Some(LostName {
        name: text("name", MAX_NAME)?,
        kind: text("type", MAX_NAME).unwrap_or_default(),
        why: text("why", MAX_WHY).unwrap_or_default(),
    })
}

impl LostName {
    /// `name (type)`, as notices list it.
    pub fn shown(&self) -> String {
        if self.kind.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.kind)
        }
    }
}

/// A snapshot's listing: whose it is, when it was written, why, and what it holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Listing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The identity it belongs to under `serve`; none for the local user's.
    pub identity: Option<String>,
    /// The session's name.
    pub session: String,
    /// The snapshot's size in bytes.
    pub size: u64,
    /// Seconds since the epoch.
    pub written_at: u64,
    /// Seconds since the epoch when it expires (`snapshot_ttl`).
    pub expires: u64,
    /// What closed the session: `idle`, `max_sessions`, `exit`, `fork`.
    pub why: String,
    #[serde(default)]
    /// What the sandbox said it holds.
    pub info: Info,
    /// Set aside: a restore of it failed (why), so it is never restored again; listed, kept
    /// until it expires or is removed (`sessions rm`), or replaced by a newer snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_aside: Option<String>,
}

impl Listing {
    /// As written to disk: at most [`LISTING_BUDGET`] bytes, its lists halved (what is left
    /// out counted in `info.more`) until it fits.
    pub(super) fn to_bounded_json(&self) -> Vec<u8> {
        let mut l = self.clone();
        loop {
            let json = serde_json::to_vec(&l).expect("a listing serializes");
            let i = &mut l.info;
            if json.len() <= LISTING_BUDGET
                || (i.names.is_empty() && i.lost.is_empty() && i.modules.is_empty())
            {
                return json;
            }
            let before = i.names.len() + i.lost.len() + i.modules.len();
            i.names.truncate(i.names.len() / 2);
            i.lost.truncate(i.lost.len() / 2);
            let keep = i.modules.len() / 2;
            while i.modules.len() > keep {
                i.modules.pop_last();
            }
            let after = i.names.len() + i.lost.len() + i.modules.len();
            i.more = i.more.saturating_add((before - after) as u64);
        }
    }

    /// The key of the session it belongs to.
    pub fn key(&self) -> SessionKey {
        SessionKey::new(
            self.identity
                .clone()
                .map_or(Identity::Local, Identity::Named),
            self.session.clone(),
        )
    }
}

/// The directory of snapshots of `state_dir`.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR)
}

/// The file name of `key`'s snapshot, without extension: a digest of identity and name (as
/// JSON, so that no local name equals an identity's session).
pub(super) fn stem(key: &SessionKey) -> String {
    let canonical = serde_json::to_vec(&(key.owner().name(), key.name())).expect("strings");
    hex::encode(&Sha256::digest(&canonical)[..16])
}

pub(super) fn paths(state_dir: &Path, key: &SessionKey) -> (PathBuf, PathBuf) {
    let d = dir(state_dir);
    let s = stem(key);
    (d.join(format!("{s}.snap")), d.join(format!("{s}.json")))
}

/// Remove `key`'s snapshot; whether there was one.
pub fn remove(state_dir: &Path, key: &SessionKey) -> bool {
    let (snap, listing) = paths(state_dir, key);
    let a = fs::remove_file(&listing).is_ok();
    let b = fs::remove_file(&snap).is_ok();
    a || b
}
