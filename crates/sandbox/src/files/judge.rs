//! Judging a tar of `/workspace/out` (the engine's, or the runtime's under gVisor): each entry
//! before a byte of it lands, only regular files with safe names, within the caps, kept under a
//! number the bridge chose in the session's own directory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read};
use std::sync::Arc;

use bollard::Docker;
use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures::StreamExt;

use super::store::{
    COPY_TIMEOUT, Caps, KeepError, MAX_ENTRIES, OUT_DIR, OutFile, OutStore, sha256_of,
};

/// What one copy brought: the files new or changed in this call, and what was skipped and why.
#[derive(Debug, Default)]
pub struct Report {
    /// The files new or changed in this call, kept on the host.
    pub new: Vec<OutFile>,
    /// What was skipped, and why, for the model.
    pub notices: Vec<String>,
}

/// Skipped entries of one reason: how many, and the first few names.
#[derive(Default)]
pub(super) struct Skipped {
    count: usize,
    names: Vec<String>,
}

#[derive(Default)]
pub(super) struct Skips(BTreeMap<String, Skipped>);

impl Skips {
    fn add(&mut self, reason: impl Into<String>, raw: &[u8]) {
        let s = self.0.entry(reason.into()).or_default();
        s.count += 1;
        if s.names.len() < 3 {
            let lossy = String::from_utf8_lossy(raw);
            let cut = bridge_core::text::floor_char_boundary(&lossy, 80);
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
pub(super) fn relative(raw: &[u8]) -> Option<&[u8]> {
    let raw = raw.strip_prefix(b"./").unwrap_or(raw);
    let rest = raw.strip_prefix(b"out")?;
    if rest.is_empty() {
        return Some(rest);
    }
    rest.strip_prefix(b"/")
}

/// Why an entry's path gives no safe name ([`sanitize`]), as the notice of skipped files says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeName {
    /// The path is not UTF-8.
    #[error("names that are not UTF-8")]
    NotUtf8,
    /// Absolute, with an empty, `.` or `..` part, a control character, or too long.
    #[error("unsafe names (absolute, empty parts, `.`/`..`, control characters or too long)")]
    Unsafe,
}

/// A safe name from an entry's relative path, or why there is none.
pub fn sanitize(rel: &[u8]) -> Result<String, UnsafeName> {
    let s = std::str::from_utf8(rel).map_err(|_| UnsafeName::NotUtf8)?;
    let s = s.strip_suffix('/').unwrap_or(s);
    if s.is_empty()
        || s.starts_with('/')
        || s.len() > 1024
        || s.chars().any(|c| c.is_control())
        || s.split('/')
            .any(|p| p.is_empty() || p == "." || p == ".." || p.len() > 255)
    {
        return Err(UnsafeName::Unsafe);
    }
    Ok(s.to_string())
}

pub(super) fn kind_reason(t: tar::EntryType) -> &'static str {
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
    let file_cap = bridge_core::config::Size(caps.file);
    let total_cap = bridge_core::config::Size(caps.total);
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
                skips.add(reason.to_string(), &raw);
                continue;
            }
        };
        let size = entry.size();
        if size > caps.file {
            skips.add(format!("files larger than file_cap = {file_cap}"), &raw);
            continue;
        }
        let (prev_size, prev_sha) = store.held(&name);
        let total_after = store.total() - prev_size + size;
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
        match store.keep(&mut entry, &name, size, prev_sha, session) {
            Ok(Some(f)) => report.new.push(f),
            Ok(None) => {}
            Err(KeepError::Short) => skips.add(
                "files that changed while being copied (write them whole, then run again)",
                &raw,
            ),
            Err(KeepError::Io(e)) => {
                tracing::warn!(dir = %store.dir().display(), "could not keep a file of {OUT_DIR}: {e}");
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

/// Copy `/workspace/out` of `container` into `store`: the archive streamed from the engine, at
/// most [`Caps::read_limit`] bytes and [`COPY_TIMEOUT`], judged entry by entry on a blocking
/// thread. A missing directory is no file and no notice.
pub(crate) async fn collect(
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
pub(crate) async fn judge<S, B>(
    stream: S,
    store: Arc<OutStore>,
    session: &str,
    caps: Caps,
) -> Report
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
