//! The snapshot store's accounting: each identity's [`Share`] of `snapshot_store_size`, room made
//! among its own snapshots only ([`Full`] when that is not enough), and everything in the
//! directory listed, expired and removable ([`scan`]).

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::listing::{LISTING_BUDGET, Listing, MAX_LISTING, MAX_SNAPSHOTS, STALE_TMP, dir, remove};
use bridge_core::clock::now_secs;
use bridge_core::config::Config;
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::statefile;

/// A snapshot refused because the store is full of other identities' snapshots (and files
/// being written): said to the model and the log as it is.
#[derive(Debug, thiserror::Error)]
#[error(
    "the snapshot store is full: snapshot_store_size = {cap} bytes holds {others} bytes of other identities' snapshots and files being written, and this snapshot is {size} bytes; it was not kept (another identity's snapshots are never removed to make room: they expire after snapshot_ttl, or `mcp-code-bridge sessions rm` removes them)"
)]
pub struct Full {
    /// `snapshot_store_size`, in bytes.
    pub cap: u64,
    /// Bytes other identities' snapshots and files being written take.
    pub others: u64,
    /// The snapshot's size in bytes.
    pub size: u64,
}

/// What one identity may keep: a share of `snapshot_store_size` in the proportion of its live
/// sessions to all (`http.max_sessions_per_identity` of `max_sessions`), never less than one
/// snapshot of `snapshot_max_size`; and as many snapshots in the same proportion of
/// [`MAX_SNAPSHOTS`]. The local user (stdio, `serve` without authentication) is the only one of
/// its bridge: its share is the whole store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The bytes it may keep.
    pub bytes: u64,
    /// The snapshots it may keep.
    pub count: usize,
}

impl Share {
    /// `owner`'s share under `config` (see the type's text).
    pub fn of(config: &Config, owner: &Identity) -> Share {
        let cap = config.snapshot_store_size.0;
        if *owner == Identity::Local {
            return Share {
                bytes: cap,
                count: MAX_SNAPSHOTS,
            };
        }
        let max = u64::from(config.max_sessions.max(1));
        let per = u64::from(config.http.max_sessions_per_identity).min(max);
        let bytes = (u128::from(cap) * u128::from(per) / u128::from(max)) as u64;
        Share {
            bytes: bytes
                .max(config.snapshot_max_size.0 + LISTING_BUDGET as u64)
                .min(cap),
            count: ((MAX_SNAPSHOTS as u64 * per / max) as usize).max(1),
        }
    }
}

/// Make room for `key`'s snapshot of `size` bytes (the snapshot and its listing; `tmp` is its
/// file, not counted twice): past its identity's [`Share`], or past `snapshot_store_size` or
/// [`MAX_SNAPSHOTS`] for the whole store, that identity's oldest snapshots go, and only
/// those. When they are not enough, [`Full`]: nothing is removed for a snapshot not kept.
pub(super) fn make_room(
    config: &Config,
    key: &SessionKey,
    size: u64,
    tmp: &Path,
) -> io::Result<()> {
    let store = scan(&config.state_dir, config.snapshot_ttl.0);
    let cap = config.snapshot_store_size.0;
    let share = Share::of(config, key.owner());
    let skip = tmp.file_name();
    let mut total: u64 = store.bytes() - store.temporary_bytes_of(skip);
    let mut count = store.listings.len() + store.unreadable.len();
    let mut mine: Vec<&Stored> = store
        .listings
        .iter()
        .filter(|s| s.listing.key().owner() == key.owner())
        .collect();
    let mut mine_bytes: u64 = mine.iter().map(|s| s.bytes).sum();
    let mut doomed: Vec<&Stored> = Vec::new();
    while !mine.is_empty()
        && (mine_bytes + size > share.bytes
            || mine.len() >= share.count
            || total + size > cap
            || count >= MAX_SNAPSHOTS)
    {
        let oldest = mine.remove(0);
        mine_bytes -= oldest.bytes;
        total -= oldest.bytes;
        count -= 1;
        doomed.push(oldest);
    }
    if total + size > cap || count >= MAX_SNAPSHOTS || mine_bytes + size > share.bytes {
        return Err(io::Error::other(Full {
            cap,
            others: total - mine_bytes,
            size,
        }));
    }
    for old in doomed {
        let key = old.listing.key();
        tracing::info!(session = %crate::name::shown(&key), bytes = old.bytes, "removing this identity's oldest session snapshot to stay within its share of snapshot_store_size");
        remove(&config.state_dir, &key);
    }
    Ok(())
}

/// A snapshot in the store, and the bytes its two files take.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its listing.
    pub listing: Listing,
    /// The bytes its two files take.
    pub bytes: u64,
    /// When its listing was written, to the file system's precision (`written_at` is in
    /// seconds): which of two snapshots of one second is the older.
    written: SystemTime,
}

/// A file of the store that is no readable snapshot: a listing too large, not JSON, of another
/// name than its key's, or of a session name no call can name; a snapshot without its listing;
/// any other file. Counted, listed, expired (`snapshot_ttl` after it was last written) and
/// removed (`sessions prune`, or `sessions rm` by its file name) like the rest.
#[derive(Debug, Clone, Serialize)]
pub struct Unreadable {
    /// Its file name in the store.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Seconds since the epoch.
    pub modified: u64,
    /// Why it is no readable snapshot.
    pub why: String,
}

/// Everything in the store: snapshots (oldest first), unreadable files, and temporary files
/// (a snapshot or listing being written, a fork's snapshot waiting for its `fork` call).
#[derive(Debug, Default)]
pub struct Store {
    /// The snapshots, oldest first.
    pub listings: Vec<Stored>,
    /// Files that are no readable snapshot.
    pub unreadable: Vec<Unreadable>,
    /// Files being written.
    pub temporary: Vec<Unreadable>,
}

impl Store {
    /// The bytes every file of the store takes.
    pub fn bytes(&self) -> u64 {
        self.listings.iter().map(|s| s.bytes).sum::<u64>()
            + self.unreadable.iter().map(|u| u.bytes).sum::<u64>()
            + self.temporary.iter().map(|u| u.bytes).sum::<u64>()
    }

    fn temporary_bytes_of(&self, name: Option<&std::ffi::OsStr>) -> u64 {
        let Some(name) = name.and_then(|n| n.to_str()) else {
            return 0;
        };
        self.temporary
            .iter()
            .filter(|t| t.file == name)
            .map(|t| t.bytes)
            .sum()
    }
}

fn mtime_secs(m: &fs::Metadata) -> u64 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Everything in the store, as [`Store`] sorts it. On the way, what has expired goes: snapshots
/// past their time (and listings whose snapshot is missing), temporary files older than
/// [`STALE_TMP`] (a writer that died), unreadable files older than `ttl`.
pub fn scan(state_dir: &Path, ttl: Duration) -> Store {
    let d = dir(state_dir);
    let mut store = Store::default();
    let Ok(entries) = fs::read_dir(&d) else {
        return store;
    };
    let now = now_secs();
    let mut names: Vec<String> = Vec::new();
    let mut odd: Vec<(String, String)> = Vec::new();
    for e in entries.flatten().take(4 * MAX_SNAPSHOTS) {
        match e.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(raw) => odd.push((
                raw.to_string_lossy().into_owned(),
                "its name is not UTF-8".into(),
            )),
        }
    }
    names.sort();
    let mut seen_snaps: HashSet<String> = HashSet::new();
    let unreadable = |name: &str, why: &str| -> Option<Unreadable> {
        let m = fs::symlink_metadata(d.join(name)).ok()?;
        Some(Unreadable {
            file: name.to_string(),
            bytes: m.len(),
            modified: mtime_secs(&m),
            why: why.to_string(),
        })
    };
    for name in &names {
        let path = d.join(name);
        if name.starts_with(".tmp") {
            let Some(t) = unreadable(name, "being written") else {
                continue;
            };
            if now.saturating_sub(t.modified) > STALE_TMP.as_secs() {
                let _ = fs::remove_file(&path);
                continue;
            }
            store.temporary.push(t);
            continue;
        }
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        let snap = d.join(format!("{stem}.snap"));
        let listing = match statefile::read_own(&path, MAX_LISTING) {
            None => Err("its listing is larger than the store reads, or not a file of this user's"),
            Some(t) => match serde_json::from_str::<Listing>(&t) {
                Err(_) => Err("its listing is not one this version reads"),
                Ok(l) if stem != super::listing::stem(&l.key()) => {
                    Err("its listing names another session than its file name")
                }
                Ok(l) if crate::name::check_session_name(&l.session).is_err() => {
                    Err("its listing names a session no call can name")
                }
                Ok(l) => Ok(l),
            },
        };
        let listing = match listing {
            Ok(l) => l,
            Err(why) => {
                store.unreadable.extend(unreadable(name, why));
                continue;
            }
        };
        let snap_meta = fs::symlink_metadata(&snap).ok().filter(|m| m.is_file());
        let Some(snap_meta) = snap_meta.filter(|_| listing.expires > now) else {
            let _ = fs::remove_file(&snap);
            let _ = fs::remove_file(&path);
            continue;
        };
        seen_snaps.insert(format!("{stem}.snap"));
        let json_meta = fs::symlink_metadata(&path).ok();
        store.listings.push(Stored {
            listing,
            bytes: snap_meta.len() + json_meta.as_ref().map_or(0, |m| m.len()),
            written: json_meta
                .and_then(|m| m.modified().ok())
                .unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    for name in &names {
        if name.starts_with(".tmp") || name.ends_with(".json") || seen_snaps.contains(name) {
            continue;
        }
        let why = if name.ends_with(".snap") {
            "a snapshot without a readable listing"
        } else {
            "not a file of the store's"
        };
        store.unreadable.extend(unreadable(name, why));
    }
    for (name, why) in odd {
        store.unreadable.push(Unreadable {
            file: name,
            bytes: 0,
            modified: now,
            why,
        });
    }
    // Unreadable files expire as snapshots do, from when they were last written.
    store.unreadable.retain(|u| {
        let expired = now.saturating_sub(u.modified) > ttl.as_secs();
        if expired {
            let _ = fs::remove_file(d.join(&u.file));
        }
        !expired
    });
    store
        .listings
        .sort_by_key(|s| (s.listing.written_at, s.written));
    store
}

/// Every snapshot's listing, oldest first (see [`scan`]).
pub fn list(state_dir: &Path) -> Vec<Listing> {
    scan(state_dir, MAX_TTL)
        .listings
        .into_iter()
        .map(|s| s.listing)
        .collect()
}

/// The longest `snapshot_ttl` the configuration takes: unreadable files are older than any
/// snapshot could be past it.
const MAX_TTL: Duration = Duration::from_secs(366 * 86_400);

/// Remove a file of the store by its name (an unreadable or temporary file `sessions list`
/// shows); whether it was there. Only a plain name of the directory: no path.
pub fn remove_file(state_dir: &Path, file: &str) -> bool {
    if file.is_empty() || file.contains('/') || file == "." || file == ".." {
        return false;
    }
    let path = dir(state_dir).join(file);
    fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir()) && fs::remove_file(path).is_ok()
}
