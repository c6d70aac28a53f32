//! Files the code writes under `/workspace/out/`, copied to the host after each call so that the
//! client can read them as MCP resources.
//!
//! The copy goes through the engine's archive API (`GET /containers/{id}/archive`), never a host
//! volume: the container has no path to the host, and the host reads a tar the engine wrote. The
//! code controls everything in that tar but its framing, so each entry is judged before a byte of
//! it lands: only regular files, names that are UTF-8 with no `..`, no absolute or empty part and
//! no control character, within `file_cap`, `files_per_call` and `files_total`. What is kept goes
//! to the session's own directory under the state dir, under a number the bridge chose (the
//! code's name never becomes a host path), and the directory goes with the session (reset,
//! close, idle reap, shutdown; [`OutStore`]'s `Drop` too).
//!
//! Whether to copy at all is decided by the session (`Session::collect_files`) from the runtime's
//! digest of the directory (every entry's name, mode, size, mtime, ctime, inode), since a copy is
//! a request to the engine worth about forty warm calls. Once copied, what changed is decided
//! per file: the engine's archive is the one listing that cannot disagree with what is copied,
//! and a file whose bytes (sha256) equal the kept copy's is not announced again. A lying digest
//! only withholds the sandbox's own files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures::StreamExt;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};

use crate::config::Config;

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
    pub mime: String,
    pub size: u64,
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
    pub fn from_config(c: &Config) -> Self {
        Caps {
            file: c.file_cap.0,
            per_call: c.files_per_call as usize,
            total: c.files_total.0,
        }
    }

    /// Bytes read from one archive at most: every kept byte can be replaced once (the old copy
    /// stays until the new one is whole), plus a header and padding per entry.
    fn read_limit(&self) -> u64 {
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
    ) -> Result<OutFile, String> {
        let size = data.len() as u64;
        if size > caps.file {
            return Err(format!(
                "it is {size} bytes, over the {} bytes of `file_cap`",
                caps.file
            ));
        }
        let total = {
            let inner = self.inner.lock().unwrap();
            inner.total - inner.files.get(name).map_or(0, |k| k.file.size)
        };
        if total + size > caps.total {
            return Err(format!(
                "the session's kept files would pass `files_total` ({} bytes)",
                caps.total
            ));
        }
        match keep(self, &mut &data[..], name, size, None, session) {
            Ok(Some(file)) => Ok(file),
            Ok(None) => unreachable!("nothing to compare with"),
            Err(KeepError::Short) => Err("it could not be written whole".into()),
            Err(KeepError::Io(e)) => Err(e.to_string()),
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
        if pid != std::process::id() && crate::procfs::running_since(pid).is_none() {
            tracing::info!(dir = %d.path().display(), "removing files out of a bridge that is gone");
            let _ = std::fs::remove_dir_all(d.path());
        }
    }
}

/// What one copy brought: the files new or changed in this call, and what was skipped and why.
#[derive(Debug, Default)]
pub struct Report {
    pub new: Vec<OutFile>,
    pub notices: Vec<String>,
}

/// Skipped entries of one reason: how many, and the first few names.
#[derive(Default)]
struct Skipped {
    count: usize,
    names: Vec<String>,
}

#[derive(Default)]
struct Skips(BTreeMap<String, Skipped>);

impl Skips {
    fn add(&mut self, reason: impl Into<String>, raw: &[u8]) {
        let s = self.0.entry(reason.into()).or_default();
        s.count += 1;
        if s.names.len() < 3 {
            let lossy = String::from_utf8_lossy(raw);
            let cut = crate::text::floor_char_boundary(&lossy, 80);
            s.names.push(format!("{:?}", &lossy[..cut]));
        }
    }

    fn into_notices(self) -> Vec<String> {
        self.0
            .into_iter()
            .map(|(reason, s)| {
                let mut n = format!(
                    "{OUT_DIR}: skipped {} {reason}: {}",
                    s.count,
                    s.names.join(", ")
                );
                if s.count > s.names.len() {
                    let _ = write!(n, " and {} more", s.count - s.names.len());
                }
                n
            })
            .collect()
    }
}

/// The entry's path relative to `/workspace/out`: the engine names entries after the
/// directory's last part (`out/...`). `None` for an entry outside it; empty for the directory.
fn relative(raw: &[u8]) -> Option<&[u8]> {
    let raw = raw.strip_prefix(b"./").unwrap_or(raw);
    let rest = raw.strip_prefix(b"out")?;
    if rest.is_empty() {
        return Some(rest);
    }
    rest.strip_prefix(b"/")
}

/// A safe name from an entry's relative path, or why there is none.
pub fn sanitize(rel: &[u8]) -> Result<String, &'static str> {
    let s = std::str::from_utf8(rel).map_err(|_| "names that are not UTF-8")?;
    let s = s.strip_suffix('/').unwrap_or(s);
    if s.is_empty()
        || s.starts_with('/')
        || s.len() > 1024
        || s.chars().any(|c| c.is_control())
        || s.split('/')
            .any(|p| p.is_empty() || p == "." || p == ".." || p.len() > 255)
    {
        return Err(
            "unsafe names (absolute, empty parts, `.`/`..`, control characters or too long)",
        );
    }
    Ok(s.to_string())
}

fn kind_reason(t: tar::EntryType) -> &'static str {
    match t {
        tar::EntryType::Symlink => {
            "symbolic links (only regular files are copied out; links are never followed)"
        }
        tar::EntryType::Link => {
            "hard links (only regular files are copied out; links are never followed)"
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            "device files (only regular files are copied out)"
        }
        tar::EntryType::Fifo => "fifos (only regular files are copied out)",
        _ => "special entries (only regular files are copied out)",
    }
}

fn sha256_of(mut r: impl Read, mut sink: impl Write) -> io::Result<(u64, [u8; 32])> {
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

/// Read one archive of `/workspace/out` into `store`, for session `session`. Synchronous (the
/// `tar` crate is): the caller runs it on a blocking thread and bounds `tar`'s bytes.
pub fn extract<R: Read>(tar: R, store: &OutStore, session: &str, caps: &Caps) -> Report {
    let mut report = Report::default();
    let mut skips = Skips::default();
    let mut archive = tar::Archive::new(tar);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => {
            report
                .notices
                .push(format!("{OUT_DIR} could not be read: {e}"));
            return report;
        }
    };
    let file_cap = crate::config::Size(caps.file);
    let total_cap = crate::config::Size(caps.total);
    for (i, entry) in entries.enumerate() {
        if i >= MAX_ENTRIES {
            report.notices.push(format!(
                "{OUT_DIR} holds more than {MAX_ENTRIES} entries; the rest was not read"
            ));
            break;
        }
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                report.notices.push(format!(
                    "the copy of {OUT_DIR} stopped early ({e}); files after that point were not copied"
                ));
                break;
            }
        };
        let raw = entry.path_bytes().into_owned();
        let kind = entry.header().entry_type();
        let Some(rel) = relative(&raw) else {
            skips.add("entries outside the directory", &raw);
            continue;
        };
        if rel.is_empty() || kind.is_dir() {
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            skips.add(kind_reason(kind), &raw);
            continue;
        }
        let name = match sanitize(rel) {
            Ok(n) => n,
            Err(reason) => {
                skips.add(reason, &raw);
                continue;
            }
        };
        let size = entry.size();
        if size > caps.file {
            skips.add(format!("files larger than file_cap = {file_cap}"), &raw);
            continue;
        }
        let (prev_size, prev_sha) = {
            let inner = store.inner.lock().unwrap();
            match inner.files.get(&name) {
                Some(k) => (k.file.size, Some(k.sha256)),
                None => (0, None),
            }
        };
        let total_after = store.inner.lock().unwrap().total - prev_size + size;
        let over_count = report.new.len() >= caps.per_call;
        let over_total = total_after > caps.total;
        if over_count || over_total {
            // Read through to tell an unchanged file (no notice) from one that is refused.
            match sha256_of(&mut entry, io::sink()) {
                Ok((n, sha)) if n == size && Some(sha) == prev_sha => continue,
                Ok(_) => {}
                Err(e) => {
                    report.notices.push(format!(
                        "the copy of {OUT_DIR} stopped early ({e}); files after that point were not copied"
                    ));
                    break;
                }
            }
            if over_count {
                skips.add(
                    format!(
                        "files beyond files_per_call = {} (they come with a later call)",
                        caps.per_call
                    ),
                    &raw,
                );
            } else {
                skips.add(
                    format!(
                        "files that would pass files_total = {total_cap} for this session (reset the session to free it)"
                    ),
                    &raw,
                );
            }
            continue;
        }
        match keep(store, &mut entry, &name, size, prev_sha, session) {
            Ok(Some(f)) => report.new.push(f),
            Ok(None) => {}
            Err(KeepError::Short) => skips.add(
                "files that changed while being copied (write them whole, then run again)",
                &raw,
            ),
            Err(KeepError::Io(e)) => {
                tracing::warn!(dir = %store.dir.display(), "could not keep a file of {OUT_DIR}: {e}");
                report.notices.push(format!(
                    "the copy of {OUT_DIR} stopped early ({e}); files after that point were not copied"
                ));
                break;
            }
        }
    }
    report.notices.extend(skips.into_notices());
    report
}

enum KeepError {
    /// The entry gave fewer bytes than its header said.
    Short,
    Io(io::Error),
}

/// Write one entry to a fresh file of the store; `None` when it equals the kept copy.
fn keep(
    store: &OutStore,
    entry: &mut impl Read,
    name: &str,
    size: u64,
    prev_sha: Option<[u8; 32]>,
    session: &str,
) -> Result<Option<OutFile>, KeepError> {
    store.ensure_dir().map_err(KeepError::Io)?;
    let n = {
        let mut inner = store.inner.lock().unwrap();
        inner.next += 1;
        inner.next
    };
    let path = store.dir.join(n.to_string());
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
    let mut inner = store.inner.lock().unwrap();
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

/// Copy `/workspace/out` of `container` into `store`: the archive streamed from the engine, at
/// most [`Caps::read_limit`] bytes and [`COPY_TIMEOUT`], judged entry by entry on a blocking
/// thread. A missing directory is no file and no notice.
pub async fn collect(
    docker: &Docker,
    container: &str,
    store: Arc<OutStore>,
    session: &str,
    caps: Caps,
) -> Report {
    let opts = DownloadFromContainerOptionsBuilder::default()
        .path(OUT_DIR)
        .build();
    let mut stream = Box::pin(docker.download_from_container(container, Some(opts)));
    // The first chunk tells a missing directory (404) from an archive.
    let first = match tokio::time::timeout(COPY_TIMEOUT, stream.next()).await {
        Ok(None) => return Report::default(),
        Ok(Some(Ok(b))) => b,
        Ok(Some(Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }))) => return Report::default(),
        Ok(Some(Err(e))) => {
            tracing::warn!(container, "could not copy {OUT_DIR}: {e}");
            return Report {
                new: Vec::new(),
                notices: vec![format!("{OUT_DIR} could not be copied out: {e}")],
            };
        }
        Err(_) => {
            return Report {
                new: Vec::new(),
                notices: vec![format!(
                    "{OUT_DIR} was not copied out: the engine did not answer within {}s",
                    COPY_TIMEOUT.as_secs()
                )],
            };
        }
    };
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&timed_out);
    let deadline = tokio::time::sleep(COPY_TIMEOUT);
    let rest = futures::stream::once(async move { Ok::<_, bollard::errors::Error>(first) })
        .chain(stream)
        .take_until(async move {
            deadline.await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .map(|r| r.map_err(io::Error::other))
        .boxed();
    let mut report = judge(rest, store, session, caps).await;
    if timed_out.load(std::sync::atomic::Ordering::SeqCst) {
        report.notices.push(format!(
            "the copy of {OUT_DIR} took more than {}s and was stopped",
            COPY_TIMEOUT.as_secs()
        ));
    }
    report
}

/// Judge a tar of `/workspace/out` as it streams in (the engine's archive, or the runtime's
/// `tar` frames under gVisor: [`TarFeed`]): at most [`Caps::read_limit`] bytes,
/// entry by entry with [`extract`] on a blocking thread.
pub async fn judge<S, B>(stream: S, store: Arc<OutStore>, session: &str, caps: Caps) -> Report
where
    S: futures::Stream<Item = io::Result<B>> + Send + Unpin + 'static,
    B: tokio_util::bytes::Buf + Send + 'static,
{
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let limit = caps.read_limit();
    let session = session.to_string();
    match tokio::task::spawn_blocking(move || {
        let mut limited = reader.take(limit);
        let mut report = extract(&mut limited, &store, &session, &caps);
        if limited.limit() == 0 {
            report.notices.push(format!(
                "{OUT_DIR} was larger than {} bytes; the rest was not read",
                limit
            ));
        }
        report
    })
    .await
    {
        Ok(r) => r,
        Err(e) => Report {
            new: Vec::new(),
            notices: vec![format!("{OUT_DIR} could not be copied out: {e}")],
        },
    }
}

/// What the host asks the runtime for when it copies `/workspace/out` through the channel: at
/// most this many bytes of tar (the read limit, so an honest runtime stops where the host
/// would), for at most this many seconds (less than [`COPY_TIMEOUT`], so that its last frame
/// arrives before the host gives up).
pub fn frames_request(caps: &Caps) -> (u64, u64) {
    (caps.read_limit(), COPY_TIMEOUT.as_secs() - 5)
}

/// `tar` frames read at most in one copy: one per 64 KiB of the read limit and 1024 more (the
/// runtime sends pieces of 1 MiB), so a runtime sending tiny frames cannot keep the host busy
/// beyond its bytes.
pub fn max_tar_frames(caps: &Caps) -> u64 {
    caps.read_limit() / (64 << 10) + 1024
}

/// One `tar` frame of a copy through the runtime's channel, as [`TarFeed::feed`] takes it.
pub enum TarPiece {
    Data(String),
    /// The runtime's last frame, and why it stopped early, if it says.
    End(Option<String>),
}

/// A copy of `/workspace/out` from the runtime's `tar` frames (under gVisor): the caller reads
/// the frames off the session's channel within [`COPY_TIMEOUT`] and feeds them here, while the
/// future [`tar_feed`] returns judges the tar. The runtime writes the tar's framing too, so
/// nothing is trusted beyond what the engine's archive was: the same [`judge`] and [`extract`],
/// the same read limit, and at most [`max_tar_frames`] frames. Bad base64 ends the tar there
/// (what followed is not copied); a lying runtime so only withholds or garbles its own files.
pub struct TarFeed {
    tx: Option<tokio::sync::mpsc::Sender<io::Result<io::Cursor<Vec<u8>>>>>,
    bytes: u64,
    frames: u64,
    limit: u64,
    max_frames: u64,
    notices: Vec<String>,
}

/// A [`TarFeed`] and the judging of what it is fed, which ends when the feed is finished.
pub fn tar_feed(
    store: Arc<OutStore>,
    session: String,
    caps: Caps,
) -> (TarFeed, impl Future<Output = Report> + Send + 'static) {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<io::Cursor<Vec<u8>>>>(4);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed();
    let feed = TarFeed {
        tx: Some(tx),
        bytes: 0,
        frames: 0,
        limit: caps.read_limit(),
        max_frames: max_tar_frames(&caps),
        notices: Vec::new(),
    };
    (
        feed,
        async move { judge(stream, store, &session, caps).await },
    )
}

impl TarFeed {
    /// Take one frame; false when the copy is over (its end, or a bound).
    pub async fn feed(&mut self, piece: TarPiece) -> bool {
        use base64::Engine as _;
        self.frames += 1;
        let data = match piece {
            TarPiece::End(None) => return false,
            TarPiece::End(Some(why)) => {
                let cut = crate::text::floor_char_boundary(&why, 300);
                self.notices.push(format!(
                    "the sandbox stopped sending {OUT_DIR} early: {:?}",
                    &why[..cut]
                ));
                return false;
            }
            TarPiece::Data(d) => d,
        };
        if self.frames > self.max_frames {
            self.notices.push(format!(
                "the sandbox sent {OUT_DIR} in more than {} pieces; the rest was not read",
                self.max_frames
            ));
            return false;
        }
        // Judged to its end already: the rest is read and dropped, up to the runtime's end.
        let Some(sink) = &self.tx else { return true };
        let mut raw = match base64::engine::general_purpose::STANDARD.decode(data) {
            Ok(r) => r,
            Err(e) => {
                let _ = sink
                    .send(Err(io::Error::other(format!(
                        "a piece was not base64: {e}"
                    ))))
                    .await;
                self.tx = None;
                return true;
            }
        };
        let room = self.limit - self.bytes;
        let full = raw.len() as u64 >= room;
        raw.truncate(room as usize);
        self.bytes += raw.len() as u64;
        if sink.send(Ok(io::Cursor::new(raw))).await.is_err() {
            self.tx = None;
        }
        // At the read limit: the runtime stops there too.
        !full
    }

    /// The copy ended without the runtime's last frame: `why` (the time is up, the sandbox is
    /// gone).
    pub fn stop(&mut self, why: String) {
        self.notices.push(why);
    }

    /// End the tar (what was not fed is not read) and hand back the feed's notices.
    pub fn finish(mut self) -> Vec<String> {
        self.tx = None;
        std::mem::take(&mut self.notices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            file: 1000,
            per_call: 3,
            total: 2500,
        }
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h
    }

    /// A tar as the engine would send it, with names written raw (no checks of `tar`'s builder).
    fn archive(entries: &[(&[u8], tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = header(*kind, data.len() as u64);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                h.set_size(0);
                h.set_link_name("/etc/passwd").unwrap();
            }
            // Raw name bytes into the header, bypassing set_path's own refusals.
            let field = &mut h.as_old_mut().name;
            field.fill(0);
            field[..name.len()].copy_from_slice(name);
            h.set_cksum();
            let body: &[u8] = if h.entry_size().unwrap() == 0 {
                &[]
            } else {
                data
            };
            b.append(&h, body).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn store() -> (tempfile::TempDir, OutStore) {
        let d = tempfile::tempdir().unwrap();
        let s = OutStore::new(d.path(), "abc");
        (d, s)
    }

    fn host_files(s: &OutStore) -> Vec<String> {
        let mut v: Vec<String> = match std::fs::read_dir(&s.dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => vec![],
        };
        v.sort();
        v
    }

    #[test]
    fn regular_files_are_kept_under_numbers_and_read_back_byte_for_byte() {
        let (_d, s) = store();
        let t = archive(&[
            (b"out/", tar::EntryType::Directory, b""),
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/plots/p.png", tar::EntryType::Regular, b"\x89PNG...."),
        ]);
        let r = extract(&t[..], &s, "default", &caps());
        assert!(r.notices.is_empty(), "{:?}", r.notices);
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.csv", "plots/p.png"]);
        assert_eq!(r.new[0].mime, "text/csv");
        assert_eq!(r.new[1].mime, "image/png");
        assert_eq!(r.new[0].size, 8);
        assert_eq!(
            r.new[1].uri,
            "resource://mcp-code-bridge/files/default/plots/p.png"
        );
        assert_eq!(host_files(&s), ["1", "2"]);
        let (_, bytes) = s.read("a.csv").unwrap().unwrap();
        assert_eq!(bytes, b"x,y\n1,2\n");
        // The same bytes again are not new; changed bytes are.
        let t2 = archive(&[
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/plots/p.png", tar::EntryType::Regular, b"\x89PNG!!!!"),
        ]);
        let r = extract(&t2[..], &s, "default", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["plots/p.png"]);
        assert_eq!(s.read("plots/p.png").unwrap().unwrap().1, b"\x89PNG!!!!");
        assert_eq!(host_files(&s), ["1", "4"], "the replaced copy was removed");
    }

    #[test]
    fn links_devices_fifos_and_unsafe_names_are_skipped_with_a_notice() {
        let (d, s) = store();
        let t = archive(&[
            (b"out/passwd", tar::EntryType::Symlink, b""),
            (b"out/hard", tar::EntryType::Link, b""),
            (b"out/null", tar::EntryType::Char, b""),
            (b"out/pipe", tar::EntryType::Fifo, b""),
            (b"out/../../evil", tar::EntryType::Regular, b"evil"),
            (b"/etc/evil", tar::EntryType::Regular, b"evil"),
            (b"out//etc/evil", tar::EntryType::Regular, b"evil"),
            (b"out/\xff\xfe.txt", tar::EntryType::Regular, b"evil"),
            (b"out/a\nb", tar::EntryType::Regular, b"evil"),
            (b"out/ok.txt", tar::EntryType::Regular, b"ok"),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok.txt"]);
        let all = r.notices.join("\n");
        for want in [
            "skipped 1 symbolic links",
            "skipped 1 hard links",
            "skipped 1 device files",
            "skipped 1 fifos",
            "skipped 1 names that are not UTF-8",
            "skipped 3 unsafe names",
            "skipped 1 entries outside the directory",
        ] {
            assert!(all.contains(want), "{want:?} not in {all}");
        }
        assert_eq!(host_files(&s), ["1"]);
        // Nothing was written beside the store's directory.
        let mut top: Vec<_> = std::fs::read_dir(d.path().join("files"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(top.len(), 1);
        top.clear();
        assert!(!d.path().join("evil").exists());
    }

    #[test]
    fn the_three_caps_each_skip_with_a_notice_naming_them() {
        let (_d, s) = store();
        let big = vec![b'a'; 1001];
        let k = vec![b'b'; 900];
        let t = archive(&[
            (b"out/big.bin", tar::EntryType::Regular, &big),
            (b"out/1", tar::EntryType::Regular, &k),
            (b"out/2", tar::EntryType::Regular, &k),
            (b"out/3", tar::EntryType::Regular, &k),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        assert_eq!(r.new.len(), 2);
        let all = r.notices.join("\n");
        assert!(
            all.contains("skipped 1 files larger than file_cap = 1000"),
            "{all}"
        );
        assert!(all.contains("files_total"), "{all}");
        let (_d, s) = store();
        let t = archive(&[
            (b"out/a", tar::EntryType::Regular, b"1"),
            (b"out/b", tar::EntryType::Regular, b"2"),
            (b"out/c", tar::EntryType::Regular, b"3"),
            (b"out/d", tar::EntryType::Regular, b"4"),
            (b"out/e", tar::EntryType::Regular, b"5"),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        assert_eq!(r.new.len(), 3);
        let all = r.notices.join("\n");
        assert!(
            all.contains("skipped 2 files beyond files_per_call = 3"),
            "{all}"
        );
        // The next call brings the rest; the kept ones are not announced again.
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["d", "e"]);
    }

    #[test]
    fn a_truncated_archive_keeps_nothing_partial() {
        let (_d, s) = store();
        let data = vec![b'z'; 900];
        let mut t = archive(&[
            (b"out/ok", tar::EntryType::Regular, b"fine"),
            (b"out/cut", tar::EntryType::Regular, &data),
        ]);
        t.truncate(512 * 3 + 100);
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        assert!(
            r.notices.join("\n").contains("changed while being copied"),
            "{:?}",
            r.notices
        );
        assert_eq!(host_files(&s), ["1"]);
    }

    fn b64(b: &[u8]) -> TarPiece {
        use base64::Engine as _;
        TarPiece::Data(base64::engine::general_purpose::STANDARD.encode(b))
    }

    /// Feed `pieces` as the runtime's `tar` frames; the report, with the feed's notices.
    fn feed_all(s: &Arc<OutStore>, caps: Caps, pieces: Vec<TarPiece>) -> Report {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (mut feed, judged) = tar_feed(Arc::clone(s), "s".into(), caps);
                let reading = async {
                    for p in pieces {
                        if !feed.feed(p).await {
                            break;
                        }
                    }
                    feed.finish()
                };
                let (mut r, n) = futures::join!(judged, reading);
                r.notices.extend(n);
                r
            })
    }

    #[test]
    fn a_tar_through_the_channel_is_judged_as_the_engines_archive() {
        let t = archive(&[
            (b"out/", tar::EntryType::Directory, b""),
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/passwd", tar::EntryType::Symlink, b""),
            (b"out/../evil", tar::EntryType::Regular, b"evil"),
        ]);
        let (_d, s) = store();
        let s = Arc::new(s);
        // In pieces of any size, the last one the end.
        let mut pieces: Vec<TarPiece> = t.chunks(700).map(b64).collect();
        pieces.push(TarPiece::End(None));
        let r = feed_all(&s, caps(), pieces);
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.csv"]);
        let all = r.notices.join("\n");
        assert!(all.contains("skipped 1 symbolic links"), "{all}");
        assert!(all.contains("skipped 1 unsafe names"), "{all}");
        assert_eq!(s.read("a.csv").unwrap().unwrap().1, b"x,y\n1,2\n");
    }

    #[test]
    fn a_lying_runtime_only_garbles_its_own_files() {
        let t = archive(&[
            (b"out/ok", tar::EntryType::Regular, b"fine"),
            (b"out/later", tar::EntryType::Regular, b"never"),
        ]);
        // Bad base64 after the first entry: what came before is kept, nothing after.
        let (_d, s) = store();
        let s = Arc::new(s);
        let r = feed_all(
            &s,
            caps(),
            vec![
                b64(&t[..1024]),
                TarPiece::Data("not base64!".into()),
                b64(&t[1024..]),
                TarPiece::End(Some("it says \u{1b}[2J why".into())),
            ],
        );
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        let all = r.notices.join("\n");
        assert!(all.contains("stopped early"), "{all}");
        // Its words are quoted, escapes and all.
        assert!(all.contains("\\u{1b}[2J why"), "{all}");
        // More bytes than the read limit: the rest is not read, whatever the runtime sends.
        let (_d, s) = store();
        let s = Arc::new(s);
        let small = Caps {
            file: 1000,
            per_call: 3,
            total: 0,
        };
        let limit = small.read_limit() as usize;
        let big = vec![b'a'; limit + 4096];
        let t = archive(&[(b"out/big", tar::EntryType::Regular, &big)]);
        let r = feed_all(&s, small, vec![b64(&t), b64(&t)]);
        assert!(
            r.notices.join("\n").contains("the rest was not read"),
            "{:?}",
            r.notices
        );
        // More frames than the bound: the rest is not read.
        let (_d, s) = store();
        let s = Arc::new(s);
        let many: Vec<TarPiece> = (0..=max_tar_frames(&small))
            .map(|_| TarPiece::Data(String::new()))
            .collect();
        let r = feed_all(&s, small, many);
        assert!(
            r.notices
                .join("\n")
                .contains("pieces; the rest was not read"),
            "{:?}",
            r.notices
        );
        assert!(r.new.is_empty());
    }

    #[test]
    fn clear_removes_the_directory() {
        let (_d, s) = store();
        let t = archive(&[(b"out/a", tar::EntryType::Regular, b"1")]);
        extract(&t[..], &s, "s", &caps());
        assert!(s.dir.exists());
        let dir = s.dir.clone();
        drop(s);
        assert!(!dir.exists());
    }

    #[test]
    fn the_files_of_a_bridge_that_is_gone_are_reaped_and_a_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let gone = d.path().join("files").join(format!("{}-abc", u32::MAX - 1));
        let live = d
            .path()
            .join("files")
            .join(format!("{}-abc", std::process::id()));
        for dir in [&gone, &live] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("1"), b"x").unwrap();
        }
        reap_orphans(d.path());
        assert!(!gone.exists());
        assert!(live.join("1").exists());
    }

    #[test]
    fn uris_round_trip_odd_sessions_and_names() {
        let u = uri("a/b c", "dir/x y#?.csv");
        assert_eq!(
            u,
            "resource://mcp-code-bridge/files/a%2Fb%20c/dir/x%20y%23%3F.csv"
        );
        assert_eq!(
            parse_uri(&u),
            Some(("a/b c".to_string(), "dir/x y#?.csv".to_string()))
        );
        assert_eq!(parse_uri("resource://mcp-code-bridge/capabilities"), None);
    }
}
