//! Opening the files the bridge keeps in its state directory (the tool catalog, the skills,
//! the audit log and their locks). The state directory is shared by every bridge of the user
//! and is where the bridge's own records live, so what is found there is checked before it is
//! used: a FIFO would block the `open` itself (a read waits for a writer, a write for a
//! reader, before `initialize` is ever answered), a device could be read without end, and a
//! symbolic link would redirect a read or a write to any file the user can reach.
//!
//! [`open`] opens with `O_NOFOLLOW` (a link is refused, not followed), `O_NONBLOCK` (a FIFO or
//! device cannot make the `open` wait) and `O_CLOEXEC`, then checks with `fstat` on the open
//! handle (no race with a rename) that it is a regular file; anything else is an error that
//! names what was found, which the caller turns into its warning or refusal. `O_NONBLOCK` is
//! cleared again, though it does nothing on a regular file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// `path` opened with `options` (whose custom flags are replaced), only if it is a regular
/// file. A missing file is `NotFound` as usual; a symbolic link, FIFO, socket, device or
/// directory is an `InvalidInput` error saying which it is.
pub fn open(path: &Path, options: &OpenOptions) -> io::Result<File> {
    let mut options = options.clone();
    options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_regular("a symbolic link"));
        }
        // A FIFO opened for writing with no reader: refused at once instead of waiting.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Err(not_regular("a FIFO")),
        Err(e) => return Err(e),
    };
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a file"
        }));
    }
    // SAFETY: F_GETFL/F_SETFL on a descriptor this function owns; no memory is passed.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// A lock file of the state dir: [`open`] for writing, made with mode 0600 when missing, never
/// truncated (its content is nothing; `flock` on it is the lock).
pub fn open_lock(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    open(
        path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600),
    )
}

/// A file to read: [`open`] for reading.
pub fn open_read(path: &Path) -> io::Result<File> {
    open(path, OpenOptions::new().read(true))
}

/// Write `bytes` to `path` whole: a file of mode 0600 made in `tmp` (on the same filesystem)
/// and renamed over it, so a reader sees the old file or the new one, never a part, and a link
/// at `path` is replaced, not followed.
pub fn write_atomic(tmp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new_in(tmp)?;
    f.write_all(bytes)?;
    f.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The text of `path` when it is a regular file of this user's of at most `max` bytes, in
/// UTF-8; `None` for anything else (missing, a link, another user's, larger): for the caches
/// the bridge keeps in the state dir, where anything unexpected is a miss, never an error.
pub fn read_own(path: &Path, max: u64) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = open_read(path).ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if file.metadata().ok()?.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    let mut text = String::new();
    (&mut file).take(max + 1).read_to_string(&mut text).ok()?;
    (text.len() as u64 <= max).then_some(text)
}

/// [`write_atomic`] to `path`, its directory made (mode 0700) if missing.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    write_atomic(dir, path, bytes)
}

fn not_regular(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}, not a regular file"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn only_regular_files_are_opened_and_nothing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("catalog.json");
        mkfifo(&fifo);
        let start = Instant::now();
        let e = open_read(&fifo).unwrap_err();
        assert!(e.to_string().contains("it is a FIFO"), "{e}");
        let e = open(&fifo, OpenOptions::new().write(true).create(true)).unwrap_err();
        assert!(e.to_string().contains("it is a FIFO"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));

        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_read(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let e = open_read(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
        assert_eq!(
            open_read(&dir.path().join("none")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(open_read(&target).is_ok());
    }
}
