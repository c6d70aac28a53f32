//! Snapshots of sessions on disk: what a sandbox wrote of its session's state when the session
//! was closed without a caller (idle timeout, room made under `max_sessions`, the bridge's
//! exit) or forked (`runtime.fork`), kept in `<state_dir>/sessions/` for the next call that
//! names the session, which restores it in a new sandbox (`"resumed": "snapshot"`).
//!
//! The bytes are the sandbox's own (its runtime's pickles, docs/protocol.md "Snapshots"): the
//! host never unpickles them, only stores them and sends them back to a sandbox of the same
//! session (same identity, same name). Beside each snapshot, a listing (`<digest>.json`) of
//! whose it is and what the runtime said it holds (names kept and lost, sizes), bounded and
//! shown only through `text::visible`.
//!
//! Bounds: one snapshot is at most `snapshot_max_size` bytes (counted as they arrive: a sandbox
//! that sends more is cut off and nothing is kept), each at most `snapshot_ttl` old, its listing
//! at most [`LISTING_BUDGET`] bytes (cut when written). The store is shared: every byte in the
//! directory counts toward `snapshot_store_size` (snapshots, their listings, files being
//! written, and files that cannot be read as a snapshot of this store's), and each identity's
//! snapshots toward its own share of it ([`Share`]). A snapshot that does not fit makes room
//! among its own identity's snapshots only, oldest first: one identity never removes another's,
//! and when the others' fill the store the newcomer is refused ([`Full`]). Files are made 0600
//! in a 0700 directory, written under a temporary name and renamed whole, and opened without
//! following links; the name of a file is a digest of its key, so no name the model chose is
//! ever a path. Everything in the directory is listed ([`scan`]), expires, and is removable.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bridge_core::clock::now_secs;
use bridge_core::config::Config;
use bridge_core::identity::SessionKey;
use bridge_core::statefile;

mod listing;
mod store;
pub use listing::{
    DIR, Info, LISTING_BUDGET, Listing, LostName, MAX_SNAPSHOTS, dir, lost_name, remove,
};
use listing::{MAX_LISTING, MAX_WHY, cut, paths};
use store::make_room;
pub use store::{Full, Share, Store, Stored, Unreadable, list, remove_file, scan};

/// Why a snapshot was not received or restored, said for the model and the log.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// The sandbox's runtime refused (what it said, made visible).
    #[error("{why}")]
    Refused {
        /// What the runtime said, made visible.
        why: String,
    },
    /// A piece the sandbox sent was not base64.
    #[error("a piece of the snapshot was not base64")]
    NotBase64,
    /// The sandbox sent more than `snapshot_max_size` (`limit` bytes).
    #[error("the sandbox sent more than snapshot_max_size ({limit} bytes)")]
    TooLarge {
        /// `snapshot_max_size`, in bytes.
        limit: u64,
    },
    /// The snapshot's temporary file could not be written.
    #[error("the snapshot could not be written: {0}")]
    Write(#[source] io::Error),
    /// The stored snapshot could not be read.
    #[error("the snapshot could not be read: {0}")]
    Read(#[source] io::Error),
    /// The sandbox's channel closed before it answered.
    #[error("its sandbox is gone")]
    Gone,
    /// The sandbox did not answer a restore within `secs` seconds.
    #[error("the sandbox did not restore it within {secs}s")]
    Timeout {
        /// The bound, in seconds.
        secs: u64,
    },
    /// The blocking task that read the snapshot failed.
    #[error("{0}")]
    Task(#[source] tokio::task::JoinError),
}

/// The directory, made 0700 when missing; refused when it is not this user's directory.
fn ensure_dir(state_dir: &Path) -> io::Result<PathBuf> {
    let d = dir(state_dir);
    match fs::DirBuilder::new()
        .mode(0o700)
        .recursive(false)
        .create(&d)
    {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = fs::symlink_metadata(&d)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
        return Err(io::Error::other(format!(
            "{} is not a directory of this user's; remove it",
            d.display()
        )));
    }
    Ok(d)
}

/// A snapshot being received: a temporary file in the snapshots' directory, bounded.
pub struct Receiving {
    file: File,
    tmp: PathBuf,
    size: u64,
    limit: u64,
    failed: Option<Failed>,
}

impl Receiving {
    /// Begin receiving a snapshot of at most `limit` bytes into a temporary file of the store under `state_dir`.
    pub fn new(state_dir: &Path, limit: u64) -> io::Result<Receiving> {
        let d = ensure_dir(state_dir)?;
        let mut random = [0u8; 12];
        getrandom::fill(&mut random).expect("the OS random source");
        let tmp = d.join(format!(".tmp-{}", hex::encode(random)));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        Ok(Receiving {
            file,
            tmp,
            size: 0,
            limit,
            failed: None,
        })
    }

    /// Take the next piece (base64). Past the limit, or a piece that is not base64, nothing
    /// more is written and [`Receiving::finish`] fails.
    pub fn push(&mut self, data: &str) {
        if self.failed.is_some() {
            return;
        }
        use base64::Engine as _;
        let bytes = match base64::engine::general_purpose::STANDARD.decode(data) {
            Ok(b) => b,
            Err(_) => {
                self.failed = Some(Failed::NotBase64);
                return;
            }
        };
        self.size += bytes.len() as u64;
        if self.size > self.limit {
            self.failed = Some(Failed::TooLarge { limit: self.limit });
            return;
        }
        if let Err(e) = self.file.write_all(&bytes) {
            self.failed = Some(Failed::Write(e));
        }
    }

    /// The snapshot received whole, to be kept by [`Received::keep`].
    pub fn finish(mut self, info: Info) -> Result<Received, Failed> {
        if let Some(why) = self.failed.take() {
            return Err(why);
        }
        self.file.sync_data().map_err(Failed::Write)?;
        Ok(Received {
            tmp: Some(std::mem::take(&mut self.tmp)),
            size: self.size,
            info,
        })
    }

    /// Bytes taken so far.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// A snapshot received whole and not kept yet; removed if dropped.
#[derive(Debug)]
pub struct Received {
    tmp: Option<PathBuf>,
    /// Its size in bytes.
    pub size: u64,
    /// What the sandbox said it holds.
    pub info: Info,
}

impl Received {
    /// Keep it as `key`'s snapshot (replacing any), after making room for it among its own
    /// identity's snapshots ([`make_room`]). Returns its listing; [`Full`] (as the error's
    /// inner error) when the store has no room for it that is this identity's to make.
    pub fn keep(mut self, config: &Config, key: &SessionKey, why: &str) -> io::Result<Listing> {
        let state_dir = &config.state_dir;
        let tmp = self.tmp.take().expect("kept once");
        let (snap, listing_path) = paths(state_dir, key);
        let now = now_secs();
        let listing = Listing {
            identity: key.owner().name().map(str::to_string),
            session: key.name().to_string(),
            size: self.size,
            written_at: now,
            expires: now + config.snapshot_ttl.0.as_secs(),
            why: why.to_string(),
            info: std::mem::take(&mut self.info),
            set_aside: None,
        };
        let json = listing.to_bounded_json();
        let result = (|| {
            remove(state_dir, key);
            make_room(config, key, self.size + json.len() as u64, &tmp)?;
            fs::rename(&tmp, &snap)?;
            statefile::write_atomic(&dir(state_dir), &listing_path, &json)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&snap);
        }
        result.map(|()| listing)
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// `key`'s snapshot listing, when one is kept and not expired (set aside or not).
pub fn find(state_dir: &Path, key: &SessionKey) -> Option<Listing> {
    let (snap, listing_path) = paths(state_dir, key);
    let listing: Listing =
        serde_json::from_str(&statefile::read_own(&listing_path, MAX_LISTING)?).ok()?;
    if listing.key() != *key {
        return None;
    }
    if listing.expires <= now_secs() {
        remove(state_dir, key);
        return None;
    }
    fs::symlink_metadata(&snap)
        .ok()?
        .is_file()
        .then_some(listing)
}

/// `key`'s snapshot taken for a restore: moved out of the store under a temporary name (one
/// rename, so of two bridges restoring the same session at once only one gets it; the other
/// finds nothing), opened as a regular file of this user's (never through a link) no larger
/// than `limit`. `Ok(None)` when another took it first. Dropped, the taken file is removed;
/// [`Taken::set_aside`] returns it to the store, never to be restored again.
pub fn take(state_dir: &Path, key: &SessionKey, limit: u64) -> io::Result<Option<Taken>> {
    let (snap, listing_path) = paths(state_dir, key);
    let listing = statefile::read_own(&listing_path, MAX_LISTING)
        .and_then(|t| serde_json::from_str::<Listing>(&t).ok());
    let mut random = [0u8; 12];
    getrandom::fill(&mut random).expect("the OS random source");
    let tmp = dir(state_dir).join(format!(".tmp-{}", hex::encode(random)));
    match fs::rename(&snap, &tmp) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    let _ = fs::remove_file(&listing_path);
    let mut taken = Taken {
        tmp,
        snap,
        listing_path,
        listing,
        file: None,
        size: 0,
    };
    let file = statefile::open_read(&taken.tmp)?;
    let meta = file.metadata()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(io::Error::other("the snapshot is not this user's file"));
    }
    if meta.len() > limit {
        return Err(io::Error::other(format!(
            "the snapshot is {} bytes, over snapshot_max_size ({limit} bytes)",
            meta.len()
        )));
    }
    taken.size = meta.len();
    taken.file = Some(file);
    Ok(Some(taken))
}

/// A snapshot taken out of the store for a restore (see [`take`]).
pub struct Taken {
    tmp: PathBuf,
    snap: PathBuf,
    listing_path: PathBuf,
    listing: Option<Listing>,
    file: Option<File>,
    /// Its size in bytes.
    pub size: u64,
}

impl Taken {
    /// Its file, to read once.
    pub fn file(&mut self) -> Option<File> {
        self.file.take()
    }

    /// Back into the store, set aside (a restore of it failed: `why`): listed as such and
    /// never restored again, until it expires or is removed, unless a newer snapshot of the
    /// session was kept meanwhile (then it goes).
    pub fn set_aside(mut self, why: &str) {
        self.file = None;
        if fs::symlink_metadata(&self.snap).is_ok() {
            return;
        }
        let Some(mut listing) = self.listing.take() else {
            return;
        };
        listing.set_aside = Some(bridge_core::text::visible(&cut(why, MAX_WHY)).into_owned());
        if fs::rename(&self.tmp, &self.snap).is_ok()
            && let Some(dir) = self.listing_path.parent()
        {
            let _ = statefile::write_atomic(dir, &self.listing_path, &listing.to_bounded_json());
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Read the next piece of a snapshot (at most `max` bytes), base64, for a `restore_data` frame;
/// `None` at its end.
pub fn next_piece(file: &mut File, max: usize) -> io::Result<Option<String>> {
    use base64::Engine as _;
    let mut buf = Vec::with_capacity(max);
    file.take(max as u64).read_to_end(&mut buf)?;
    if buf.is_empty() {
        return Ok(None);
    }
    Ok(Some(base64::engine::general_purpose::STANDARD.encode(&buf)))
}

#[cfg(test)]
mod tests {
    use super::listing::{MAX_NAME, MAX_NAMES};
    use super::*;
    use bridge_core::config::Size;
    use bridge_core::identity::Identity;
    use std::time::Duration;

    fn config(dir: &Path) -> Config {
        Config {
            state_dir: dir.to_path_buf(),
            snapshot_store_size: Size(1 << 20),
            ..Config::default()
        }
    }

    fn receive(dir: &Path, bytes: &[u8], limit: u64) -> Result<Received, Failed> {
        use base64::Engine as _;
        let mut r = Receiving::new(dir, limit).unwrap();
        for chunk in bytes.chunks(3) {
            r.push(&base64::engine::general_purpose::STANDARD.encode(chunk));
        }
        r.finish(Info::default())
    }

    #[test]
    fn kept_under_a_digest_found_by_its_key_only_and_removed() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        let a = SessionKey::new(Identity::Named("alice".into()), "s");
        let local = SessionKey::local("alice/s");
        let l = receive(t.path(), b"abcd", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        assert_eq!(l.size, 4);
        assert!(find(t.path(), &a).is_some());
        assert!(
            find(t.path(), &local).is_none(),
            "a local name spelled as an identity's key"
        );
        let mode = fs::metadata(dir(t.path())).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        for e in fs::read_dir(dir(t.path())).unwrap() {
            assert_eq!(e.unwrap().metadata().unwrap().mode() & 0o777, 0o600);
        }
        // Taken once: a second taker finds nothing; set aside, it is there again, as such.
        let mut taken = take(t.path(), &a, 100).unwrap().unwrap();
        assert_eq!(taken.size, 4);
        assert!(take(t.path(), &a, 100).unwrap().is_none());
        assert!(find(t.path(), &a).is_none());
        let piece = next_piece(&mut taken.file().unwrap(), 3).unwrap().unwrap();
        assert_eq!(piece, "YWJj");
        taken.set_aside("it failed");
        assert!(find(t.path(), &a).is_some_and(|l| l.set_aside.is_some()));
        assert!(take(t.path(), &a, 3).is_err(), "larger than the limit");
        // A restore that worked: the taken file goes.
        receive(t.path(), b"abcd", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        drop(take(t.path(), &a, 100).unwrap().unwrap());
        assert!(find(t.path(), &a).is_none());
        receive(t.path(), b"abcd", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        assert!(remove(t.path(), &a));
        assert!(find(t.path(), &a).is_none());
        assert_eq!(fs::read_dir(dir(t.path())).unwrap().count(), 0);
    }

    #[test]
    fn over_the_limit_nothing_is_kept_and_the_store_drops_the_oldest() {
        let t = tempfile::tempdir().unwrap();
        let c = Config {
            snapshot_store_size: Size(2600),
            ..config(t.path())
        };
        let err = receive(t.path(), b"0123456789", 5).unwrap_err().to_string();
        assert!(err.contains("more than snapshot_max_size"), "{err}");
        assert_eq!(
            fs::read_dir(dir(t.path())).unwrap().count(),
            0,
            "the temporary file went"
        );
        let a = SessionKey::local("a");
        let b = SessionKey::local("b");
        let c_key = SessionKey::local("c");
        for k in [&a, &b] {
            receive(t.path(), &[7; 1000], 5000)
                .unwrap()
                .keep(&c, k, "idle")
                .unwrap();
            std::thread::sleep(Duration::from_millis(1100));
        }
        // Each is 1000 bytes and its listing: a third is over 2600, and a (the local user's
        // oldest) goes.
        receive(t.path(), &[7; 1000], 5000)
            .unwrap()
            .keep(&c, &c_key, "idle")
            .unwrap();
        assert!(find(t.path(), &a).is_none());
        assert!(find(t.path(), &b).is_some() && find(t.path(), &c_key).is_some());
        let store = scan(t.path(), Duration::from_secs(60));
        let on_disk: u64 = fs::read_dir(dir(t.path()))
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert_eq!(store.bytes(), on_disk, "every byte counted");
        assert!(store.bytes() <= 2600);
    }

    fn named(who: &str, name: &str) -> SessionKey {
        SessionKey::new(Identity::Named(who.into()), name)
    }

    #[test]
    fn an_identity_makes_room_among_its_own_and_a_full_store_refuses_the_newcomer() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Config {
            snapshot_store_size: Size(300_000),
            snapshot_max_size: Size(100_000),
            max_sessions: 2,
            ..config(t.path())
        };
        c.http.max_sessions_per_identity = 1;
        // Half the store, but never less than one snapshot and its listing's budget.
        let share = Share::of(&c, &Identity::Named("bob".into()));
        assert_eq!(share.bytes, 100_000 + LISTING_BUDGET as u64);
        assert_eq!(Share::of(&c, &Identity::Local).bytes, 300_000);
        let keep = |k: &SessionKey| {
            let r = receive(t.path(), &[1; 100_000], 100_000)
                .unwrap()
                .keep(&c, k, "fork");
            std::thread::sleep(Duration::from_millis(1100));
            r
        };
        keep(&named("alice", "a1")).unwrap();
        keep(&named("bob", "b1")).unwrap();
        // Past bob's share: bob's own oldest goes, never alice's.
        keep(&named("bob", "b2")).unwrap();
        assert!(find(t.path(), &named("bob", "b1")).is_none());
        assert!(find(t.path(), &named("alice", "a1")).is_some());
        // Carol's share is free, but the store holds 200 KB of others' and hers would pass
        // 300 KB: refused, and nothing of anyone's removed.
        let err = keep(&named("carol", "c1")).unwrap_err();
        let full = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<Full>())
            .unwrap_or_else(|| panic!("{err}"));
        assert!(full.others > 200_000 && full.size > 100_000, "{full:?}");
        assert!(
            err.to_string().contains("never removed to make room"),
            "{err}"
        );
        let left: Vec<String> = list(t.path()).iter().map(|l| l.key().to_string()).collect();
        assert_eq!(left, ["alice/a1", "bob/b2"]);
        // A file that is no snapshot counts too: with it, alice's next one is refused as well
        // (her own oldest is not enough room).
        fs::write(dir(t.path()).join("planted"), vec![0u8; 150_000]).unwrap();
        let store = scan(t.path(), Duration::from_secs(60));
        assert_eq!(store.unreadable.len(), 1);
        assert_eq!(store.unreadable[0].why, "not a file of the store's");
        assert!(keep(&named("alice", "a2")).is_err());
        assert!(remove_file(t.path(), "planted"));
        assert!(!remove_file(t.path(), "../x"));
        keep(&named("alice", "a2")).unwrap();
        assert!(find(t.path(), &named("alice", "a1")).is_none());
    }

    #[test]
    fn a_listing_is_bounded_when_written_and_one_past_the_rule_is_unreadable() {
        let t = tempfile::tempdir().unwrap();
        let c = Config {
            snapshot_store_size: Size(10 << 20),
            ..config(t.path())
        };
        let junk: Vec<String> = (0..200)
            .map(|i| format!("{}{i}", "\u{1}".repeat(195)))
            .collect();
        let info = Info::from_frame(Some(&serde_json::json!({
            "names": junk,
            "lost": junk.iter().map(|j| serde_json::json!({"name": j, "type": j, "why": "\u{2}".repeat(300)})).collect::<Vec<_>>(),
            "modules": junk.iter().map(|j| (j.clone(), serde_json::json!(j))).collect::<serde_json::Map<_, _>>(),
        })));
        let a = SessionKey::local("a");
        let mut r = receive(t.path(), b"x", 100).unwrap();
        r.info = info;
        r.keep(&c, &a, "fork").unwrap();
        let (_, listing) = paths(t.path(), &a);
        let len = fs::metadata(&listing).unwrap().len();
        assert!(len <= LISTING_BUDGET as u64, "{len}");
        let l = find(t.path(), &a).unwrap();
        assert!(l.info.more > 500, "{}", l.info.more);
        // A listing whose session no call can name (written by an older version, or by hand):
        // unreadable, counted, not a snapshot.
        let bad = SessionKey::local("../x");
        let (snap, bad_listing) = paths(t.path(), &bad);
        let mut l = l.clone();
        l.session = "../x".into();
        fs::write(&bad_listing, serde_json::to_vec(&l).unwrap()).unwrap();
        fs::write(&snap, b"y").unwrap();
        let store = scan(t.path(), Duration::from_secs(60));
        assert_eq!(store.listings.len(), 1);
        let whys: Vec<&str> = store.unreadable.iter().map(|u| u.why.as_str()).collect();
        assert!(
            whys.contains(&"its listing names a session no call can name")
                && whys.contains(&"a snapshot without a readable listing"),
            "{whys:?}"
        );
        // Expired as snapshots do: after `ttl` from when they were written.
        assert_eq!(scan(t.path(), Duration::ZERO).unreadable.len(), 2);
        std::thread::sleep(Duration::from_millis(1100));
        let store = scan(t.path(), Duration::ZERO);
        assert!(store.unreadable.is_empty());
        assert_eq!(store.listings.len(), 1);
    }

    #[test]
    fn a_snapshot_set_aside_is_kept_listed_and_said_so() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        let c = Config {
            snapshot_store_size: Size(1 << 20),
            ..c
        };
        let a = SessionKey::local("a");
        receive(t.path(), b"abcd", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        let taken = take(t.path(), &a, 100).unwrap().unwrap();
        taken.set_aside("the sandbox did not restore it within 5s");
        let l = find(t.path(), &a).unwrap();
        assert_eq!(
            l.set_aside.as_deref(),
            Some("the sandbox did not restore it within 5s")
        );
        assert_eq!(list(t.path())[0].set_aside, l.set_aside);
    }

    #[test]
    fn an_expired_snapshot_is_neither_found_nor_listed_and_its_files_go() {
        let t = tempfile::tempdir().unwrap();
        let c = Config {
            snapshot_ttl: bridge_core::config::Secs(Duration::ZERO),
            ..config(t.path())
        };
        let a = SessionKey::local("a");
        receive(t.path(), b"x", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        assert!(list(t.path()).is_empty());
        assert!(find(t.path(), &a).is_none());
        assert_eq!(fs::read_dir(dir(t.path())).unwrap().count(), 0);
    }

    #[test]
    fn a_link_planted_as_a_snapshot_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        let a = SessionKey::local("a");
        receive(t.path(), b"x", 100)
            .unwrap()
            .keep(&c, &a, "idle")
            .unwrap();
        let (snap, _) = paths(t.path(), &a);
        fs::remove_file(&snap).unwrap();
        let secret = t.path().join("secret");
        fs::write(&secret, b"secret").unwrap();
        std::os::unix::fs::symlink(&secret, &snap).unwrap();
        assert!(take(t.path(), &a, 100).is_err());
        assert!(find(t.path(), &a).is_none());
        assert!(
            list(t.path()).is_empty(),
            "a listing whose snapshot is a link is dropped"
        );
        assert_eq!(fs::read(&secret).unwrap(), b"secret");
    }

    #[test]
    fn the_sandboxs_info_is_bounded() {
        let names: Vec<String> = (0..500).map(|i| format!("n{i}")).collect();
        let v = serde_json::json!({
            "names": names,
            "lost": [{"name": "g".repeat(1000), "type": "generator", "why": "no"}, 7],
            "largest": [{"name": "df", "size": 80}],
            "modules": {"pd": "pandas"},
            "cells": 3,
        });
        let info = Info::from_frame(Some(&v));
        assert_eq!(info.names.len(), MAX_NAMES);
        assert_eq!(info.more, 300);
        assert_eq!(info.lost.len(), 1);
        assert!(info.lost[0].name.len() <= MAX_NAME);
        assert_eq!(info.largest, vec![("df".to_string(), 80)]);
        assert_eq!(info.modules["pd"], "pandas");
    }
}
