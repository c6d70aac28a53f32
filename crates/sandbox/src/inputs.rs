//! Files in: the user's declared `[[inputs]]` copied into a sandbox at its start: a tar the
//! bridge writes, streamed into a process the engine runs in the sandbox as its user
//! (`exec`: the image's `python3` with [`extract_script`]), which unpacks it into `/data`. So no host
//! path is ever mounted, the code sees copies it cannot write back, the files are the sandbox
//! user's under every host identity (the engine's archive API writes as the host's root, which a
//! sandbox's own user namespace does not map: its tmpfs refuses such a file with EOVERFLOW), and
//! what they take of the tmpfs is charged to the sandbox's memory, as the code's own files are.
//!
//! Only the declared paths are read. The walk never follows a symbolic link below a declared
//! path (a link could point anywhere on the host: links are skipped and counted), takes regular
//! files and directories only, opens each file with `O_NOFOLLOW` and sends the size it had when
//! opened (a file that shrinks meanwhile is padded, one that grows is cut: the notice says so).
//! The copy is bounded: `inputs_size` bytes of file data (the tmpfs it fills has that size),
//! [`MAX_ENTRIES`] entries, and [`COPY_TIMEOUT`]. What is skipped, and a declared path that is
//! missing, becomes a notice of the session's first call; the session starts anyway.
//!
//! The tar is written on the blocking pool into a pipe whose other end is the process's stdin,
//! so at most the pipe's buffer is held in memory, whatever the inputs' size.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use bollard::exec::StartExecResults;
use bollard::models::ExecConfig;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::io::SyncIoBridge;

use bridge_core::config::Config;
use bridge_core::config::inputs::{InputEntry, ROOT};

/// Most entries (files and directories) copied in all.
pub const MAX_ENTRIES: usize = 100_000;
/// Longest a copy may take before it is abandoned (the session starts without the rest).
pub const COPY_TIMEOUT: Duration = Duration::from_secs(120);
/// Pipe between the tar writer and the process's stdin.
const PIPE: usize = 256 << 10;
/// Most of the unpacking process's output kept for the notice.
const OUTPUT_KEPT: usize = 2 << 10;

/// What the sandbox runs (`python3 -I -S -c`) to unpack the tar on its stdin into [`ROOT`],
/// as the sandbox's user: each read takes what the pipe holds (the raw file), so the end of the
/// archive ends it even where the engine passes on no end of input; the `data` filter (Python
/// 3.12, and the security releases of 3.8-3.11) refuses any entry that would land outside
/// `ROOT`, though the bridge writes none; and its own alarm ends it after [`COPY_TIMEOUT`].
fn extract_script() -> String {
    format!(
        "import signal, sys, tarfile\n\
         signal.alarm({secs})\n\
         kw = {{'filter': 'data'}} if hasattr(tarfile, 'data_filter') else {{}}\n\
         with tarfile.open(fileobj=sys.stdin.buffer.raw, mode='r|') as t:\n    t.extractall({ROOT:?}, **kw)\n",
        secs = COPY_TIMEOUT.as_secs()
    )
}

/// What the walk skipped or could not do, for the notice.
#[derive(Debug, Default)]
pub struct Report {
    /// Files copied in.
    pub files: u64,
    /// Bytes copied in.
    pub bytes: u64,
    /// What was skipped, and why, for the model.
    pub notices: Vec<String>,
    links: u64,
    special: u64,
    over_cap: u64,
    changed: Vec<String>,
    unreadable: Vec<String>,
}

impl Report {
    fn finish(&mut self) {
        if self.links > 0 {
            self.notices.push(format!(
                "inputs: {} symbolic link(s) not copied (links inside an input are never followed)",
                self.links
            ));
        }
        if self.special > 0 {
            self.notices.push(format!(
                "inputs: {} device(s), fifo(s) or socket(s) not copied (only files and directories are)",
                self.special
            ));
        }
        if self.over_cap > 0 {
            self.notices.push(format!(
                "inputs: {} file(s) not copied: the inputs would exceed inputs_size or {MAX_ENTRIES} entries; raise inputs_size or declare less",
                self.over_cap
            ));
        }
        if !self.changed.is_empty() {
            self.notices.push(format!(
                "inputs: changed while copied, so the copy may be cut or padded: {}",
                first(&self.changed)
            ));
        }
        if !self.unreadable.is_empty() {
            self.notices.push(format!(
                "inputs: not readable by the bridge: {}",
                first(&self.unreadable)
            ));
        }
    }
}

fn first(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
    match names.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

/// Copy the declared inputs into container `id`; the notices for its first call.
pub(crate) async fn copy_in(docker: &Docker, id: &str, config: &Config) -> Vec<String> {
    if config.inputs.is_empty() {
        return Vec::new();
    }
    let (reader, writer) = tokio::io::duplex(PIPE);
    let inputs = config.inputs.clone();
    let cap = config.inputs_size.0;
    let owner = owner_ids(&config.container_user);
    let walk = tokio::task::spawn_blocking(move || {
        let mut report = Report::default();
        let mut builder = tar::Builder::new(SyncIoBridge::new(writer));
        builder.mode(tar::HeaderMode::Deterministic);
        let written = write_all(&mut builder, &inputs, cap, owner, &mut report)
            .and_then(|()| builder.into_inner().map(drop));
        (written, report)
    });
    let t0 = std::time::Instant::now();
    let unpacked = tokio::time::timeout(
        COPY_TIMEOUT,
        unpack(docker, id, &config.container_user, reader),
    )
    .await;
    let (written, mut report) = match walk.await {
        Ok(r) => r,
        Err(e) => (Err(io::Error::other(e.to_string())), Report::default()),
    };
    report.finish();
    match unpacked {
        Err(_) => report.notices.push(format!(
            "inputs: the copy into the sandbox took more than {} s and was stopped; some inputs are missing",
            COPY_TIMEOUT.as_secs()
        )),
        Ok(Err(why)) => report.notices.push(format!(
            "inputs: the copy into the sandbox failed ({why}); the inputs are missing or incomplete. Is inputs_size large enough?"
        )),
        Ok(Ok(())) => {
            if let Err(e) = written {
                report
                    .notices
                    .push(format!("inputs: the copy stopped early: {e}"));
            }
        }
    }
    tracing::info!(
        container = %&id[..id.len().min(12)],
        files = report.files,
        bytes = report.bytes,
        ms = t0.elapsed().as_millis() as u64,
        notices = report.notices.len(),
        "inputs copied in"
    );
    for n in &report.notices {
        tracing::warn!("{n}");
    }
    report.notices
}

/// Why the unpacking in the sandbox did not finish.
#[derive(Debug, thiserror::Error)]
enum UnpackError {
    #[error("the engine refused to run the unpacking: {0}")]
    Create(bollard::errors::Error),
    #[error("the engine did not start the unpacking: {0}")]
    Start(bollard::errors::Error),
    #[error("the engine started the unpacking detached")]
    Detached,
    #[error("the engine did not say how the unpacking ended: {0}")]
    Inspect(bollard::errors::Error),
    /// Its exit status (none if the engine had none) and the last line it wrote, made visible.
    #[error("unpacking in the sandbox exited with {}{}", .code.map_or("no status".to_string(), |c| c.to_string()), if .said.is_empty() { String::new() } else { format!(": {}", .said) })]
    Exited { code: Option<i64>, said: String },
}

/// Run [`extract_script`] in container `id` as `user` with `tar` on its stdin, and wait for it.
async fn unpack(
    docker: &Docker,
    id: &str,
    user: &str,
    mut tar: tokio::io::DuplexStream,
) -> Result<(), UnpackError> {
    let exec = docker
        .create_exec(
            id,
            ExecConfig {
                cmd: Some(vec![
                    "python3".into(),
                    "-I".into(),
                    "-S".into(),
                    "-c".into(),
                    extract_script(),
                ]),
                user: Some(user.to_string()),
                working_dir: Some("/".into()),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                ..Default::default()
            },
        )
        .await
        .map_err(UnpackError::Create)?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(UnpackError::Start)?
    else {
        return Err(UnpackError::Detached);
    };
    // The tar in, then the end of input; the process may end first (at the archive's end
    // marker), and a write refused then is no failure: its exit status says.
    let feed = async move {
        let _ = tokio::io::copy(&mut tar, &mut input).await;
        let _ = input.shutdown().await;
    };
    let drain = async move {
        let mut said = Vec::new();
        while let Some(chunk) = output.next().await {
            match chunk {
                Ok(out) => {
                    let bytes = out.into_bytes();
                    let room = OUTPUT_KEPT.saturating_sub(said.len());
                    said.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Err(_) => break,
            }
        }
        said
    };
    let ((), said) = tokio::join!(feed, drain);
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(UnpackError::Inspect)?
        .exit_code;
    match code {
        Some(0) => Ok(()),
        code => {
            let said = String::from_utf8_lossy(&said);
            let last = said.trim().lines().last().unwrap_or("");
            Err(UnpackError::Exited {
                code,
                said: bridge_core::text::visible(last).into_owned(),
            })
        }
    }
}

/// The uid and gid the tar's headers give the files (those of `container_user` when numeric,
/// else nobody): the unpacking, as the sandbox's user, makes every file that user's whatever
/// the headers say, so the code can read them whatever the modes on the host.
fn owner_ids(user: &str) -> (u64, u64) {
    let mut parts = user.split(':').map(|p| p.parse::<u64>().ok());
    let uid = parts.next().flatten().unwrap_or(65534);
    let gid = parts.next().flatten().unwrap_or(uid);
    (uid, gid)
}

fn write_all<W: io::Write>(
    builder: &mut tar::Builder<W>,
    inputs: &[InputEntry],
    cap: u64,
    owner: (u64, u64),
    report: &mut Report,
) -> io::Result<()> {
    let mut walker = Walker {
        builder,
        cap,
        owner,
        entries: 0,
        report,
    };
    for input in inputs {
        let host = input.host_path();
        let rel = input.relative();
        // Parents of the sandbox path, so `/data/a/b` works when only `/data` exists.
        let mut parent = String::new();
        for part in rel
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            parent = if parent.is_empty() {
                part.to_string()
            } else {
                format!("{parent}/{part}")
            };
            walker.dir(&parent)?;
        }
        // The declared path itself is the user's choice: a link there is followed.
        match std::fs::metadata(&host) {
            Ok(m) if m.is_dir() => walker.tree(&host, &rel)?,
            Ok(m) if m.is_file() => walker.file(&host, &rel, &m)?,
            Ok(_) => walker.report.notices.push(format!(
                "input {}: not a file or directory; not copied",
                input.host
            )),
            Err(e) => walker.report.notices.push(format!(
                "input {} ({}): {e}; it is not in the sandbox. Check [[inputs]] in the configuration",
                input.host,
                input.sandbox_path()
            )),
        }
    }
    Ok(())
}

struct Walker<'a, W: io::Write> {
    builder: &'a mut tar::Builder<W>,
    cap: u64,
    owner: (u64, u64),
    entries: usize,
    report: &'a mut Report,
}

impl<W: io::Write> Walker<'_, W> {
    fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(self.owner.0);
        h.set_gid(self.owner.1);
        h.set_mtime(0);
        h
    }

    fn room(&mut self, size: u64) -> bool {
        if self.entries >= MAX_ENTRIES || self.report.bytes + size > self.cap {
            self.report.over_cap += 1;
            return false;
        }
        self.entries += 1;
        true
    }

    fn dir(&mut self, rel: &str) -> io::Result<()> {
        if !self.room(0) {
            return Ok(());
        }
        let mut h = self.header(tar::EntryType::Directory, 0o755, 0);
        self.builder
            .append_data(&mut h, format!("{rel}/"), io::empty())
    }

    fn tree(&mut self, dir: &Path, rel: &str) -> io::Result<()> {
        self.dir(rel)?;
        let mut entries: Vec<_> = match std::fs::read_dir(dir) {
            Ok(r) => r.flatten().collect(),
            Err(e) => {
                self.report
                    .unreadable
                    .push(format!("{} ({e})", dir.display()));
                return Ok(());
            }
        };
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                self.report
                    .unreadable
                    .push(format!("{} (name not UTF-8)", path.display()));
                continue;
            };
            let child = format!("{rel}/{name}");
            // Never followed: what the entry is, not what it points to.
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => self.report.links += 1,
                Ok(m) if m.is_dir() => self.tree(&path, &child)?,
                Ok(m) if m.is_file() => self.file(&path, &child, &m)?,
                Ok(_) => self.report.special += 1,
                Err(e) => self
                    .report
                    .unreadable
                    .push(format!("{} ({e})", path.display())),
            }
        }
        Ok(())
    }

    fn file(&mut self, path: &Path, rel: &str, seen: &Metadata) -> io::Result<()> {
        // O_NOFOLLOW: a link swapped in since the walk looked is refused, not followed (the
        // declared path itself was resolved by `metadata`, so it is opened as resolved).
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        let file = match opened.and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((f, m)) if m.is_file() && m.ino() == seen.ino() => (f, m),
            Ok(_) => {
                self.report.changed.push(path.display().to_string());
                return Ok(());
            }
            Err(e) => {
                self.report
                    .unreadable
                    .push(format!("{} ({e})", path.display()));
                return Ok(());
            }
        };
        let (f, m) = file;
        let size = m.len();
        if !self.room(size) {
            return Ok(());
        }
        let mut h = self.header(tar::EntryType::Regular, 0o644, size);
        let mut body = Exactly::new(f, size);
        self.builder.append_data(&mut h, rel, &mut body)?;
        if body.changed {
            self.report.changed.push(path.display().to_string());
        }
        self.report.files += 1;
        self.report.bytes += size;
        Ok(())
    }
}

/// A file read as exactly `size` bytes: cut if it grew, padded with zeros if it shrank, so the
/// tar entry matches its header whatever happens to the file meanwhile.
struct Exactly {
    inner: io::Take<File>,
    left: u64,
    changed: bool,
}

impl Exactly {
    fn new(f: File, size: u64) -> Exactly {
        Exactly {
            inner: f.take(size),
            left: size,
            changed: false,
        }
    }
}

impl Read for Exactly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left as usize);
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                self.changed = true;
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unpacking script, run by the host's `python3` into a temporary directory: the tar's
    /// files arrive, and the archive's end ends it while its stdin is still open (an engine
    /// that passes on no end of input cannot keep it waiting).
    #[test]
    fn the_unpacking_ends_at_the_archives_end_with_its_input_still_open() {
        use std::io::Write;
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::fs::write(src.path().join("d/a.csv"), "x,y\n1,2\n").unwrap();
        let inputs = vec![InputEntry {
            host: src.path().join("d").display().to_string(),
            path: Some("/data/d".into()),
        }];
        let mut builder = tar::Builder::new(Vec::new());
        let mut report = Report::default();
        write_all(&mut builder, &inputs, 1 << 20, (65534, 65534), &mut report).unwrap();
        let tar = builder.into_inner().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let script = extract_script().replace(&format!("{ROOT:?}"), &format!("{:?}", dest.path()));
        let mut child = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", &script])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("python3 on the host");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&tar).unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the unpacking waited for the end of its input"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(stdin);
        assert!(status.success(), "{status}");
        assert_eq!(
            std::fs::read_to_string(dest.path().join("d/a.csv")).unwrap(),
            "x,y\n1,2\n"
        );
    }

    fn entries(inputs: &[InputEntry], cap: u64) -> (Vec<(String, u64, u32)>, Report) {
        let mut report = Report::default();
        let mut builder = tar::Builder::new(Vec::new());
        write_all(&mut builder, inputs, cap, (65534, 65534), &mut report).unwrap();
        report.finish();
        let bytes = builder.into_inner().unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let list = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                assert_eq!(h.uid().unwrap(), 65534);
                (
                    e.path().unwrap().display().to_string(),
                    h.size().unwrap(),
                    h.mode().unwrap(),
                )
            })
            .collect();
        (list, report)
    }

    #[test]
    fn a_tree_is_copied_without_its_links_or_specials() {
        let dir = tempfile::tempdir().unwrap();
        let sales = dir.path().join("sales");
        std::fs::create_dir_all(sales.join("2025")).unwrap();
        std::fs::write(sales.join("a.csv"), "x,y\n1,2\n").unwrap();
        std::fs::write(sales.join("2025/b.csv"), "x\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", sales.join("passwd")).unwrap();
        std::os::unix::fs::symlink("/", sales.join("root")).unwrap();
        nix_mkfifo(&sales.join("fifo"));
        let input = InputEntry {
            host: sales.display().to_string(),
            path: Some("/data/in/sales".into()),
        };
        let (list, report) = entries(&[input], 1 << 20);
        let names: Vec<&str> = list.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "in/",
                "in/sales/",
                "in/sales/2025/",
                "in/sales/2025/b.csv",
                "in/sales/a.csv"
            ]
        );
        assert_eq!(list[4].1, 8);
        assert_eq!(list[4].2, 0o644);
        assert!(
            report
                .notices
                .iter()
                .any(|n| n.contains("2 symbolic link(s)")),
            "{:?}",
            report.notices
        );
        assert!(
            report.notices.iter().any(|n| n.contains("fifo")),
            "{:?}",
            report.notices
        );
    }

    #[test]
    fn the_cap_and_a_missing_input_are_notices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.bin"), vec![1u8; 4096]).unwrap();
        std::fs::write(dir.path().join("small.txt"), "ok").unwrap();
        let input = |name: &str| InputEntry {
            host: dir.path().join(name).display().to_string(),
            path: None,
        };
        let (list, report) = entries(&[input("big.bin"), input("small.txt"), input("gone")], 100);
        let names: Vec<&str> = list.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["small.txt"]);
        assert!(
            report.notices.iter().any(|n| n.contains("inputs_size")),
            "{:?}",
            report.notices
        );
        assert!(
            report
                .notices
                .iter()
                .any(|n| n.contains("gone") && n.contains("[[inputs]]")),
            "{:?}",
            report.notices
        );
    }

    #[test]
    fn a_file_that_shrinks_is_padded_to_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "abc").unwrap();
        let f = File::open(&p).unwrap();
        let mut r = Exactly::new(f, 10);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc\0\0\0\0\0\0\0");
        assert!(r.changed);
    }

    fn nix_mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }
}
