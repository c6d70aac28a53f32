//! Every advisory lock of the project on a file several bridges share (the tool catalog, the
//! audit log, the package and skill stores, a parking slot, the engine's own service): std's
//! `File::lock` family (`flock(2)` on Linux: held by the open file description, released when
//! it is closed), with `EINTR` retried.

use std::fs::{File, TryLockError};
use std::io::{ErrorKind, Result};

/// Lock `f` exclusively (waiting for other holders); released when `f` is closed.
pub fn lock_exclusive(f: &File) -> Result<()> {
    retrying(|| f.lock())
}

/// Lock `f` shared (waiting for an exclusive holder); released when `f` is closed.
pub fn lock_shared(f: &File) -> Result<()> {
    retrying(|| f.lock_shared())
}

/// Lock `f` exclusively if no one holds it; `Ok(false)` when someone does.
pub fn try_lock_exclusive(f: &File) -> Result<bool> {
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => return Ok(false),
            Err(TryLockError::Error(e)) if e.kind() == ErrorKind::Interrupted => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

fn retrying(mut op: impl FnMut() -> Result<()>) -> Result<()> {
    loop {
        match op() {
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_file_cannot_take_a_held_lock_until_it_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let a = File::create(&path).unwrap();
        let b = File::open(&path).unwrap();
        lock_exclusive(&a).unwrap();
        assert!(
            !try_lock_exclusive(&b).unwrap(),
            "a held lock was taken twice"
        );
        drop(a);
        assert!(
            try_lock_exclusive(&b).unwrap(),
            "a closed file kept its lock"
        );
        let c = File::open(&path).unwrap();
        assert!(!try_lock_exclusive(&c).unwrap());
        drop(b);
        lock_shared(&c).unwrap();
        let d = File::open(&path).unwrap();
        lock_shared(&d).unwrap();
        assert!(!try_lock_exclusive(&File::open(&path).unwrap()).unwrap());
    }
}
