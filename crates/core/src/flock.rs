//! An advisory exclusive lock on an open file, for the files several bridges share (the tool
//! catalog, the audit log). `File::lock` is newer than the crate's MSRV.

use std::fs::File;

/// Lock `f` exclusively (waiting for other holders); released when `f` is closed.
pub fn lock_exclusive(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor this function borrows open.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Lock `f` shared (waiting for an exclusive holder); released when `f` is closed.
pub fn lock_shared(f: &File) -> std::io::Result<()> {
    flock_retrying(f, libc::LOCK_SH)
}

/// Lock `f` exclusively if no one holds it; `Ok(false)` when someone does.
pub fn try_lock_exclusive(f: &File) -> std::io::Result<bool> {
    match flock_retrying(f, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

fn flock_retrying(f: &File, op: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor this function borrows open.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
