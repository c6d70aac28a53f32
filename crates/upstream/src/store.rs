//! The persisted tool catalog: every server's tool list in `<state_dir>/catalog.json`, so a
//! bridge that starts again answers searches, docs and the typed proxies' signatures without
//! starting the servers (code mode's first search would otherwise start every configured server).
//!
//! An entry is keyed by [`definition_digest`], a SHA-256 of what decides which program answers
//! (command, args, the *names* of env variables and headers, env file, cwd, url): a changed
//! definition is a miss. The file holds that digest, never a value of the definition, and
//! records the name/version the server reported when the list was taken; a server that reports
//! another one at its next start has its entry replaced by the refresh that follows every start.
//!
//! The file is bounded ([`MAX_FILE_BYTES`]: the oldest entries go first; one server's entry over
//! [`MAX_ENTRY_BYTES`] is not kept), written atomically (a temporary file in the same directory,
//! fsynced, renamed over) with mode 0600, and read leniently: a corrupt, foreign or oversized
//! file is a warning and is rebuilt. Two bridges of the same user share it: every write takes
//! an advisory lock on `catalog.lock`, re-reads the file and merges it (newest entry per key
//! wins), so neither loses what the other wrote, and a reader never sees half a file.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::Tool;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::discovery::ServerEntry;

/// The catalog file's name in the state dir.
pub const CATALOG_FILE: &str = "catalog.json";
/// The lock file serializing writers (its content is irrelevant).
const LOCK_FILE: &str = "catalog.lock";
/// The most the file may hold; larger files are not read (a warning, then a rebuild), and writes
/// drop the oldest entries to stay under it.
pub const MAX_FILE_BYTES: usize = 32 << 20;
/// The most one server's entry may take; a larger tool list is served live and not kept.
pub const MAX_ENTRY_BYTES: usize = 4 << 20;
/// How long a queued write waits for more entries to write with it.
const WRITE_DELAY: Duration = Duration::from_millis(200);
/// What the file says it is; anything else is foreign.
const FORMAT: &str = "mcp-code-bridge tool catalog";
const VERSION: u32 = 1;

/// What a server said it was in its `initialize` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// The implementation's name (`serverInfo.name`), which need not be its configured name.
    pub name: String,
    /// Its version (`serverInfo.version`).
    pub version: String,
}

/// One server's stored tool list.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredEntry {
    /// The server's configured name when the entry was written (for people reading the file).
    pub server: String,
    /// The name/version the server reported, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<ServerIdentity>,
    /// When the list was taken from the server, seconds since the epoch.
    pub updated_at: u64,
    /// The tool list, as the server gave it.
    pub tools: Vec<Tool>,
}

#[derive(Serialize, Deserialize)]
struct CatalogFile {
    format: String,
    version: u32,
    entries: BTreeMap<String, StoredEntry>,
}

/// Why the catalog file could not be read (a warning: the catalog is rebuilt) or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file exists but could not be opened or read, or is not a regular file (a FIFO,
    /// device, socket or symbolic link in its place).
    #[error("cannot read the tool catalog {path}: {source}")]
    Read {
        /// The catalog file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is over [`MAX_FILE_BYTES`]; it is not read.
    #[error("the tool catalog {path} is larger than {} MiB", MAX_FILE_BYTES >> 20)]
    TooLarge {
        /// The catalog file.
        path: PathBuf,
    },
    /// The file is not JSON, or not a catalog's shape.
    #[error("the tool catalog {path} is not valid: {reason}")]
    Corrupt {
        /// The catalog file.
        path: PathBuf,
        /// The JSON parser's error.
        reason: String,
    },
    /// The file is JSON of another format, or a catalog of another version.
    #[error("{path} is not a tool catalog of this bridge (format {found:?})")]
    Foreign {
        /// The catalog file.
        path: PathBuf,
        /// The format it names ("none" without one), or this format with its other version.
        found: String,
    },
    /// The state directory, the lock file or the catalog could not be created, locked or
    /// written; what the bridge holds in memory is unchanged.
    #[error("cannot write the tool catalog {path}: {source}")]
    Write {
        /// The catalog file.
        path: PathBuf,
        /// The operating system's error (for the lock, its message names the lock file).
        source: std::io::Error,
    },
}

impl bridge_core::error::Hinted for StoreError {
    fn hint(&self) -> Option<bridge_core::error::Hint> {
        match self {
            StoreError::Write { .. } => Some(bridge_core::error::Hint::sentence(
                "Searches still work but start servers; check that state_dir is writable.",
            )),
            _ => Some(bridge_core::error::Hint::sentence(
                "It is rebuilt as servers are listed (`mcp-code-bridge servers --refresh` rebuilds it at once).",
            )),
        }
    }
}

pub use bridge_core::clock::now_secs;

/// The key of a server's entry: SHA-256 over what decides which program answers and how. Env
/// and header *values* are left out (they are secrets, and changing a token does not change the
/// tools); everything is taken as written, before `${VAR}` expansion, so no secret is resolved
/// for this. The description is left out: it is ours, not the server's.
pub fn definition_digest(entry: &ServerEntry) -> String {
    #[derive(Serialize)]
    struct Key<'a> {
        command: &'a Option<String>,
        args: &'a [String],
        env: Vec<&'a String>,
        env_file: &'a Option<PathBuf>,
        cwd: &'a Option<PathBuf>,
        url: &'a Option<String>,
        headers: Vec<&'a String>,
    }
    let key = Key {
        command: &entry.command,
        args: &entry.args,
        env: entry.env.keys().collect(),
        env_file: &entry.env_file,
        cwd: &entry.cwd,
        url: &entry.url,
        headers: entry.headers.keys().collect(),
    };
    let bytes = serde_json::to_vec(&key).expect("plain data serializes");
    hex::encode(Sha256::digest(&bytes))
}

/// The catalog of one state dir: what was read at start-up, plus what this bridge learned.
pub struct Store {
    dir: PathBuf,
    entries: Mutex<BTreeMap<String, StoredEntry>>,
    /// One writer of this process at a time (the file lock orders processes).
    write: Mutex<()>,
    /// A write is queued (see [`Store::put_soon`]).
    pending: AtomicBool,
}

impl Store {
    /// Read `<dir>/catalog.json`. Nothing there is an empty catalog; an unreadable, corrupt,
    /// foreign or oversized file is a warning and an empty catalog (the next write replaces it).
    pub fn open(dir: &Path) -> Store {
        let path = dir.join(CATALOG_FILE);
        let entries = match read_file(&path) {
            Ok(Some(entries)) => entries,
            Ok(None) => BTreeMap::new(),
            Err(e) => {
                tracing::warn!("{}", bridge_core::error::Hinted::message(&e));
                BTreeMap::new()
            }
        };
        Store {
            dir: dir.to_path_buf(),
            entries: Mutex::new(entries),
            write: Mutex::new(()),
            pending: AtomicBool::new(false),
        }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(CATALOG_FILE)
    }

    /// The stored entry of a key, if any.
    pub fn get(&self, key: &str) -> Option<StoredEntry> {
        self.entries.lock().unwrap().get(key).cloned()
    }

    /// How many entries are held.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record an entry and write the file (blocking: call from a blocking thread). An entry over
    /// [`MAX_ENTRY_BYTES`] is not kept.
    pub fn put(&self, key: &str, entry: StoredEntry) -> Result<(), StoreError> {
        if self.remember(key, entry) {
            self.flush()?;
        }
        Ok(())
    }

    /// Record an entry in memory; false when it is over [`MAX_ENTRY_BYTES`] (not kept).
    fn remember(&self, key: &str, entry: StoredEntry) -> bool {
        let size = serde_json::to_vec(&entry).map(|v| v.len()).unwrap_or(0);
        if size > MAX_ENTRY_BYTES {
            tracing::warn!(
                server = %entry.server,
                "the tool list is {} KiB, over the {} MiB a catalog entry may take; it is not kept",
                size >> 10,
                MAX_ENTRY_BYTES >> 20
            );
            return false;
        }
        self.entries.lock().unwrap().insert(key.to_string(), entry);
        true
    }

    /// Record an entry now and write the file soon, on a blocking thread: entries recorded
    /// meanwhile (a cold search lists many servers; a server may send `list_changed` often) are
    /// written together, so at most one write waits while one runs.
    pub fn put_soon(self: &Arc<Self>, key: &str, entry: StoredEntry) {
        if !self.remember(key, entry) || self.pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let store = self.clone();
        let write = move || {
            std::thread::sleep(WRITE_DELAY);
            store.pending.store(false, Ordering::SeqCst);
            if let Err(e) = store.flush() {
                tracing::warn!("{}", bridge_core::error::Hinted::message(&e));
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(write);
            }
            Err(_) => write(),
        }
    }

    /// Merge with the file on disk under the lock and write the result atomically.
    pub fn flush(&self) -> Result<(), StoreError> {
        let _one = self.write.lock().unwrap();
        let path = self.path();
        let werr = |source| StoreError::Write {
            path: path.clone(),
            source,
        };
        create_private_dir(&self.dir).map_err(werr)?;
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = bridge_core::statefile::open_lock(&lock_path).map_err(|e| {
            werr(std::io::Error::new(
                e.kind(),
                format!("its lock {}: {e}", lock_path.display()),
            ))
        })?;
        bridge_core::flock::lock_exclusive(&lock).map_err(werr)?;
        // What another bridge wrote since: newest entry per key wins. A broken file has nothing
        // to keep (it was warned about at open).
        let on_disk = read_file(&path).ok().flatten().unwrap_or_default();
        let merged = {
            let mut mine = self.entries.lock().unwrap();
            for (k, theirs) in on_disk {
                match mine.get(&k) {
                    Some(m) if m.updated_at >= theirs.updated_at => {}
                    _ => {
                        mine.insert(k, theirs);
                    }
                }
            }
            bound(&mut mine);
            CatalogFile {
                format: FORMAT.to_string(),
                version: VERSION,
                entries: mine.clone(),
            }
        };
        let bytes = serde_json::to_vec(&merged).expect("plain data serializes");
        write_atomically(&path, &bytes).map_err(werr)?;
        drop(lock);
        Ok(())
    }
}

/// Drop the oldest entries until the file fits in [`MAX_FILE_BYTES`] (with room for the
/// envelope).
fn bound(entries: &mut BTreeMap<String, StoredEntry>) {
    let budget = MAX_FILE_BYTES - 1024;
    let mut sizes: Vec<(u64, String, usize)> = entries
        .iter()
        .map(|(k, e)| {
            let n = serde_json::to_vec(e).map(|v| v.len()).unwrap_or(0) + k.len() + 8;
            (e.updated_at, k.clone(), n)
        })
        .collect();
    let mut total: usize = sizes.iter().map(|s| s.2).sum();
    sizes.sort();
    for (_, k, n) in sizes {
        if total <= budget {
            break;
        }
        entries.remove(&k);
        total -= n;
    }
}

/// The entries of a catalog file; `None` when there is no file. Opened by
/// `bridge_core::statefile::open_read`: a FIFO, device, socket or symbolic link in its place is an
/// error (a warning, and the file is replaced at the next write), never a read that waits.
fn read_file(path: &Path) -> Result<Option<BTreeMap<String, StoredEntry>>, StoreError> {
    let file = match bridge_core::statefile::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| StoreError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(StoreError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    // The envelope first, so a foreign JSON file is told from a broken catalog.
    #[derive(Deserialize)]
    struct Envelope {
        format: Option<String>,
    }
    let envelope: Envelope = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if envelope.format.as_deref() != Some(FORMAT) {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            found: envelope.format.unwrap_or_else(|| "none".into()),
        });
    }
    let file: CatalogFile = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if file.version != VERSION {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            found: format!("{FORMAT} version {}", file.version),
        });
    }
    Ok(Some(file.entries))
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Write `bytes` to a temporary file next to `path` (0600, fsynced) and rename it over `path`:
/// readers see the old file or the new one, never a part.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("catalog"),
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // The mode above is masked by the umask only towards less access; make it exact.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "description": "d",
            "inputSchema": {"type": "object"}
        }))
        .unwrap()
    }

    fn entry(server: &str, at: u64, tools: &[&str]) -> StoredEntry {
        StoredEntry {
            server: server.into(),
            reported: None,
            updated_at: at,
            tools: tools.iter().map(|t| tool(t)).collect(),
        }
    }

    #[test]
    fn digest_ignores_secret_values_and_sees_definition_changes() {
        let mut a = ServerEntry {
            command: Some("uvx".into()),
            args: vec!["mcp-server-time".into()],
            ..Default::default()
        };
        a.env.insert("TOKEN".into(), "one".into());
        let d = definition_digest(&a);
        let mut b = a.clone();
        b.env.insert("TOKEN".into(), "two".into());
        b.description = Some("other words".into());
        assert_eq!(definition_digest(&b), d);
        b.args.push("--local-timezone=UTC".into());
        assert_ne!(definition_digest(&b), d);
        let mut c = a.clone();
        c.env.insert("OTHER".into(), "x".into());
        assert_ne!(definition_digest(&c), d);
    }

    #[test]
    fn two_stores_merge_and_the_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let one = Store::open(dir.path());
        let two = Store::open(dir.path());
        one.put("a", entry("a", 10, &["x"])).unwrap();
        two.put("b", entry("b", 11, &["y"])).unwrap();
        // An older entry from one does not replace a newer one from the other.
        two.put("a", entry("a", 12, &["z"])).unwrap();
        one.put("a", entry("a", 5, &["old"])).unwrap();
        let three = Store::open(dir.path());
        assert_eq!(three.len(), 2);
        assert_eq!(three.get("a").unwrap().tools[0].name, "z");
        assert_eq!(three.get("b").unwrap().tools[0].name, "y");
        let mode = std::fs::metadata(three.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn queued_writes_are_written_together() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(Store::open(dir.path()));
        for i in 0..20u64 {
            s.put_soon(&format!("k{i}"), entry("s", i, &["t"]));
        }
        // Outside a runtime each write happens at once; inside, one write carries them all.
        assert_eq!(Store::open(dir.path()).len(), 20);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(Store::open(dir.path()));
        rt.block_on(async {
            for i in 0..20u64 {
                s.put_soon(&format!("k{i}"), entry("s", i, &["t"]));
            }
        });
        drop(rt); // waits for the blocking write
        assert_eq!(Store::open(dir.path()).len(), 20);
    }

    #[test]
    fn corrupt_and_foreign_files_are_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CATALOG_FILE);
        for junk in [
            &b"{\"format\": \"mcp-code-br"[..],
            b"{\"name\": \"x\"}",
            b"\0\xff",
        ] {
            std::fs::write(&path, junk).unwrap();
            assert!(read_file(&path).is_err());
            let s = Store::open(dir.path());
            assert!(s.is_empty());
            s.put("k", entry("k", 1, &["t"])).unwrap();
            assert_eq!(Store::open(dir.path()).len(), 1);
        }
    }

    #[test]
    fn the_file_stays_bounded_dropping_the_oldest() {
        let mut m = BTreeMap::new();
        let big = "x".repeat(1 << 20);
        for i in 0..40u64 {
            let mut e = entry("s", i, &["t"]);
            e.tools[0].description = Some(big.clone().into());
            m.insert(format!("k{i:02}"), e);
        }
        bound(&mut m);
        let size: usize = m
            .values()
            .map(|e| serde_json::to_vec(e).unwrap().len())
            .sum();
        assert!(size <= MAX_FILE_BYTES, "{size}");
        assert!(m.contains_key("k39") && !m.contains_key("k00"));
        // One entry over the per-entry bound is not kept.
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path());
        let mut huge = entry("h", 1, &["t"]);
        huge.tools[0].description = Some("y".repeat(MAX_ENTRY_BYTES + 1).into());
        s.put("h", huge).unwrap();
        assert!(s.get("h").is_none());
    }
}
