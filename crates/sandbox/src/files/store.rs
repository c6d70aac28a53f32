//! Where a session's kept files are: their names and URIs, the bounds of copying out, and the
//! store on the host ([`OutStore`]) that owns every kept file's bytes and accounting.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};

use bridge_core::config::Config;

/// The directory the code writes its results to.
pub const OUT_DIR: &str = "/workspace/out";
/// Where, under [`OUT_DIR`], the parts of an exec's output too long for its result are kept
/// whole (`<exec>.<part>.txt`).
pub const KEPT_DIR: &str = ".outputs";
/// The URI of a kept file is this, the session's name and the file's name (both
/// percent-encoded). The name only, not its owner: whoever reads the URI is the owner, so under
/// `serve` the reader's identity completes the key, and another identity's URI names nothing.
pub const URI_PREFIX: &str = "resource://mcp-code-bridge/files/";
/// Entries read from one archive at most (directories and skipped ones included): bounds the
/// work of a directory of many tiny files, whose bytes alone the read limit would let through.
pub const MAX_ENTRIES: usize = 20_000;
/// How long one copy may take; what was not read by then is named in a notice.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(30);

/// What is escaped in a URI's parts: controls, space and the characters URIs reserve; `/` is
/// escaped in the session, kept in a file's name (its subdirectories).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b']')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');
const SESSION_SEGMENT: &AsciiSet = &SEGMENT.add(b'/');

/// One file copied out, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFile {
    /// Path under `/workspace/out`, e.g. `plots/trend.png`.
    pub name: String,
    /// Its media type, guessed from its name.
    pub mime: String,
    /// Its size in bytes.
    pub size: u64,
    /// The resource URI a client reads it by (`resources/read`).
    pub uri: String,
}

/// The file's URI in session `session`.
pub fn uri(session: &str, name: &str) -> String {
    format!(
        "{URI_PREFIX}{}/{}",
        utf8_percent_encode(session, SESSION_SEGMENT),
        utf8_percent_encode(name, SEGMENT)
    )
}

/// `(session, name)` of a file URI; `None` when `uri` is not one.
pub fn parse_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (session, name) = rest.split_once('/')?;
    let session = percent_decode_str(session).decode_utf8().ok()?.into_owned();
    let name = percent_decode_str(name).decode_utf8().ok()?.into_owned();
    Some((session, name))
}

/// The three bounds of copying out.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Largest file kept (`file_cap`).
    pub file: u64,
    /// New or changed files kept per call (`files_per_call`).
    pub per_call: usize,
    /// Bytes kept per session (`files_total`).
    pub total: u64,
}

impl Caps {
    /// The bounds `c` sets (`file_cap`, `files_total`).
    pub fn from_config(c: &Config) -> Self {
        Caps {
            file: c.file_cap.0,
            per_call: c.files_per_call as usize,
            total: c.files_total.0,
        }
    }

    /// Bytes read from one archive at most: every kept byte can be replaced once (the old copy
    /// stays until the new one is whole), plus a header and padding per entry.
    pub(super) fn read_limit(&self) -> u64 {
        self.total
            .saturating_add(self.file)
            .saturating_add(MAX_ENTRIES as u64 * 1024)
    }
}

struct Kept {
    file: OutFile,
    sha256: [u8; 32],
    path: PathBuf,
}

#[derive(Default)]
struct Inner {
    files: BTreeMap<String, Kept>,
    total: u64,
    next: u64,
}

/// Why a file could not be kept on the host (its size, the session's total, the disk).
#[derive(Debug, thiserror::Error)]
pub enum KeepFailed {
    /// The file alone is larger than `file_cap`.
    #[error("it is {size} bytes, over the {cap} bytes of `file_cap`")]
    TooLarge {
        /// The file's size in bytes.
        size: u64,
        /// `file_cap`, in bytes.
        cap: u64,
    },
    /// With it, the session's kept files would pass `files_total`.
    #[error("the session's kept files would pass `files_total` ({total} bytes)")]
    OverTotal {
        /// `files_total`, in bytes.
        total: u64,
    },
    /// Fewer bytes were written than were given.
    #[error("it could not be written whole")]
    Short,
    /// The disk refused it.
    #[error("{0}")]
    Io(#[source] io::Error),
}

/// A session's kept files: their directory on the host and what each is.
pub struct OutStore {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl OutStore {
    /// The store of container `container_id`; its directory is made at the first kept file.
    pub fn new(state_dir: &Path, container_id: &str) -> Self {
        let short: String = container_id.chars().take(16).collect();
        OutStore {
            dir: state_dir
                .join("files")
                .join(format!("{}-{short}", std::process::id())),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Every kept file, by name.
    pub fn list(&self) -> Vec<OutFile> {
        let inner = self.inner.lock().unwrap();
        inner.files.values().map(|k| k.file.clone()).collect()
    }

    /// A kept file and its bytes.
    pub fn read(&self, name: &str) -> io::Result<Option<(OutFile, Vec<u8>)>> {
        let (file, path) = {
            let inner = self.inner.lock().unwrap();
            match inner.files.get(name) {
                Some(k) => (k.file.clone(), k.path.clone()),
                None => return Ok(None),
            }
        };
        // Bounded by what was kept (at most file_cap): never more than the recorded size.
        let mut bytes = Vec::with_capacity(file.size as usize);
        std::fs::File::open(&path)?
            .take(file.size)
            .read_to_end(&mut bytes)?;
        Ok(Some((file, bytes)))
    }

    /// Keep `data` as file `name` (a part of an exec's output the bridge keeps whole, see
    /// `sandbox::output::Fit`), within the same caps as a file copied out. The runtime writes
    /// the same bytes under `/workspace/out`, so the next copy finds them equal and does not
    /// announce them again.
    pub fn put(
        &self,
        name: &str,
        data: &[u8],
        session: &str,
        caps: &Caps,
    ) -> Result<OutFile, KeepFailed> {
        let size = data.len() as u64;
        if size > caps.file {
            return Err(KeepFailed::TooLarge {
                size,
                cap: caps.file,
            });
        }
        let total = {
            let inner = self.inner.lock().unwrap();
            inner.total - inner.files.get(name).map_or(0, |k| k.file.size)
        };
        if total + size > caps.total {
            return Err(KeepFailed::OverTotal { total: caps.total });
        }
        match self.keep(&mut &data[..], name, size, None, session) {
            Ok(Some(file)) => Ok(file),
            Ok(None) => unreachable!("nothing to compare with"),
            Err(KeepError::Short) => Err(KeepFailed::Short),
            Err(KeepError::Io(e)) => Err(KeepFailed::Io(e)),
        }
    }

    /// Forget every file and remove the directory.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap();
        *inner = Inner::default();
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), "could not remove a session's files: {e}");
        }
    }

    /// The size and digest of the kept copy of `name`, if there is one.
    pub(super) fn held(&self, name: &str) -> (u64, Option<[u8; 32]>) {
        let inner = self.inner.lock().unwrap();
        match inner.files.get(name) {
            Some(k) => (k.file.size, Some(k.sha256)),
            None => (0, None),
        }
    }

    /// Bytes kept for the session.
    pub(super) fn total(&self) -> u64 {
        self.inner.lock().unwrap().total
    }

    /// The session's directory on the host.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write one entry to a fresh file of the store; `None` when it equals the kept copy.
    pub(super) fn keep(
        &self,
        entry: &mut impl Read,
        name: &str,
        size: u64,
        prev_sha: Option<[u8; 32]>,
        session: &str,
    ) -> Result<Option<OutFile>, KeepError> {
        self.ensure_dir().map_err(KeepError::Io)?;
        let n = {
            let mut inner = self.inner.lock().unwrap();
            inner.next += 1;
            inner.next
        };
        let path = self.dir.join(n.to_string());
        // A number the bridge chose, created new (never an existing file or link), owner-only.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(KeepError::Io)?;
        let result = sha256_of(entry.take(size), &mut f);
        drop(f);
        let (written, sha) = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                    KeepError::Short
                } else {
                    KeepError::Io(e)
                });
            }
        };
        if written != size {
            let _ = std::fs::remove_file(&path);
            return Err(KeepError::Short);
        }
        if Some(sha) == prev_sha {
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        let file = OutFile {
            name: name.to_string(),
            mime: mime_guess::from_path(name)
                .first_or_octet_stream()
                .essence_str()
                .to_string(),
            size,
            uri: uri(session, name),
        };
        let mut inner = self.inner.lock().unwrap();
        if let Some(old) = inner.files.remove(name) {
            inner.total -= old.file.size;
            let _ = std::fs::remove_file(&old.path);
        }
        inner.total += size;
        inner.files.insert(
            name.to_string(),
            Kept {
                file: file.clone(),
                sha256: sha,
                path,
            },
        );
        Ok(Some(file))
    }

    fn ensure_dir(&self) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
    }
}

impl Drop for OutStore {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Remove the kept files of bridges that are gone (killed before they could clean up): the
/// directories under `<state_dir>/files/` whose `<pid>-` prefix names no running process.
/// Another live bridge's are left alone.
pub fn reap_orphans(state_dir: &Path) {
    let Ok(dirs) = std::fs::read_dir(state_dir.join("files")) else {
        return;
    };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && bridge_core::procfs::running_since(pid).is_none() {
            tracing::info!(dir = %d.path().display(), "removing files out of a bridge that is gone");
            let _ = std::fs::remove_dir_all(d.path());
        }
    }
}

pub(super) enum KeepError {
    /// The entry gave fewer bytes than its header said.
    Short,
    Io(io::Error),
}

pub(super) fn sha256_of(mut r: impl Read, mut sink: impl Write) -> io::Result<(u64, [u8; 32])> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        sink.write_all(&buf[..k])?;
        n += k as u64;
    }
    Ok((n, h.finalize().into()))
}
