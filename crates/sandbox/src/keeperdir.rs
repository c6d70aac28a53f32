//! The keeper directory: where keepers' sockets are (`park`), and the bridge's own engine
//! service's when the state dir is too long for them ([`socket_in`]); a short directory of this
//! user's alone, `$XDG_RUNTIME_DIR/mcp-code-bridge` (or `/run/user/<uid>/mcp-code-bridge`), else
//! `/tmp/mcp-code-bridge-<uid>`, used only when it is a directory (not a link), owned by this
//! user and of mode 0700; otherwise hand-over is off ([`HandOverOff`]).

use std::path::{Path, PathBuf};

/// The longest path a Unix socket may have (`sizeof(sun_path)` less its NUL).
pub(crate) const SUN_PATH_MAX: usize = 107;
/// The longest socket name in the keeper directory: a lingering engine service's, `engine-`, 32
/// hex digits and `.sock` (a keeper's is 32 hex digits and `.sock`; a bridge's own service's
/// `podman-<pid>.sock`).
const SOCKET_NAME_LEN: usize = 44;

/// Where keepers' sockets would be, whether or not it is there or fit for use: in
/// `$XDG_RUNTIME_DIR` (when set, absolute and short enough), else in `/run/user/<uid>` when that
/// is there, else `/tmp/mcp-code-bridge-<uid>`. The second element is the per-user directory
/// the first lies in, when it is not made here (its owner and mode are checked too).
fn keeper_place() -> (PathBuf, Option<PathBuf>) {
    // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
    let uid = unsafe { libc::getuid() };
    let fits = |dir: &Path| fits_beside(dir, SOCKET_NAME_LEN);
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            let run = PathBuf::from(format!("/run/user/{uid}"));
            run.symlink_metadata().is_ok().then_some(run)
        });
    if let Some(rt) = runtime {
        let dir = rt.join("mcp-code-bridge");
        if fits(&dir) {
            return (dir, Some(rt));
        }
    }
    (PathBuf::from(format!("/tmp/mcp-code-bridge-{uid}")), None)
}

/// The keeper directory's path (nothing made or checked).
pub(crate) fn keeper_base() -> PathBuf {
    keeper_place().0
}

/// The keeper directory, made if it is not there (mode 0700), and checked: a directory, not a
/// link, this user's, of mode 0700 (and so the per-user directory it lies in). Another local
/// user may have made it first, or left a link in its place: then the error says so and what
/// to do, and no sandbox is handed over through it.
pub fn keeper_dir() -> Result<PathBuf, HandOverOff> {
    use std::os::unix::fs::DirBuilderExt;
    let (dir, parent) = keeper_place();
    if let Some(parent) = &parent {
        check_private_dir(parent, "the runtime directory")?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(HandOverOff {
                problem: format!("the keeper directory {} cannot be made: {e}", dir.display()),
                fix: "set XDG_RUNTIME_DIR to a directory of yours of mode 0700".into(),
            });
        }
    }
    check_private_dir(&dir, "the keeper directory")?;
    Ok(dir)
}

/// The keeper directory when it is there and fit for use (nothing made).
pub(crate) fn keeper_dir_if_there() -> Result<PathBuf, HandOverOff> {
    let (dir, parent) = keeper_place();
    if let Some(parent) = &parent {
        check_private_dir(parent, "the runtime directory")?;
    }
    check_private_dir(&dir, "the keeper directory")?;
    Ok(dir)
}

/// `dir` is a directory (the link itself is looked at, never followed), owned by this user,
/// with no access for group or others.
fn check_private_dir(dir: &Path, what: &str) -> Result<(), HandOverOff> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
    let me = unsafe { libc::getuid() };
    let m = dir.symlink_metadata().map_err(|e| HandOverOff {
        problem: format!("{what} {} cannot be read: {e}", dir.display()),
        fix: "set XDG_RUNTIME_DIR to a directory of yours of mode 0700".into(),
    })?;
    let problem = if m.file_type().is_symlink() {
        "is a symbolic link".to_string()
    } else if !m.is_dir() {
        "is not a directory".to_string()
    } else if m.uid() != me {
        format!("belongs to uid {}, not to this user (uid {me})", m.uid())
    } else if m.mode() & 0o077 != 0 {
        format!("has mode {:04o}, not 0700", m.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(HandOverOff {
        problem: format!(
            "{what} {} {problem}: another local user may have prepared it, so no sandbox is \
             handed to the next bridge through it",
            dir.display()
        ),
        fix: format!(
            "remove it (`rm -r {}`, as its owner or root), or set XDG_RUNTIME_DIR to a directory \
             of yours of mode 0700",
            dir.display()
        ),
    })
}

/// Where a socket of the state dir `state_dir` goes: `state_dir/<beside>` when that path fits in
/// a socket address (with `longest` bytes for its name, the longest the name may grow to),
/// else `<keeper directory>/<short>`, the keeper directory made and checked first. `Err` only
/// when the state dir is too long and the keeper directory cannot be used.
pub(crate) fn socket_in(
    state_dir: &Path,
    beside: &str,
    longest: usize,
    short: &str,
) -> Result<PathBuf, HandOverOff> {
    if fits_beside(state_dir, longest) {
        Ok(state_dir.join(beside))
    } else {
        keeper_dir().map(|dir| dir.join(short))
    }
}

/// Where [`socket_in`] puts sockets of `state_dir`, nothing made or checked: `state_dir` itself,
/// or the keeper directory.
pub(crate) fn socket_dir(state_dir: &Path, longest: usize) -> PathBuf {
    if fits_beside(state_dir, longest) {
        state_dir.to_path_buf()
    } else {
        keeper_base()
    }
}

/// 32 hex digits of the SHA-256 of `state_dir` as the file system resolves it (so that two
/// spellings of one directory meet), a NUL and `parts`: a socket's name in the keeper directory,
/// 32 bytes whatever the state dir's length.
pub(crate) fn state_digest(state_dir: &Path, parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::ffi::OsStrExt;
    let real = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut h = Sha256::new();
    h.update(real.as_os_str().as_bytes());
    h.update([0]);
    for p in parts {
        h.update(p);
    }
    hex::encode(h.finalize())[..32].to_string()
}

/// Whether a name of `longest` bytes in `dir` makes a socket path that fits.
fn fits_beside(dir: &Path, longest: usize) -> bool {
    dir.as_os_str().len() + 1 + longest <= SUN_PATH_MAX
}

/// Why sandboxes cannot be handed from one bridge to the next (the keeper directory is not
/// fit for use), and what repairs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOverOff {
    /// What is wrong with the keeper directory.
    pub problem: String,
    /// What repairs it.
    pub fix: String,
}

impl std::fmt::Display for HandOverOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hand-over to the next bridge is off: {} (each bridge starts its own sandboxes); fix: {}",
            self.problem, self.fix
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keeper_directory_not_this_users_alone_is_refused_with_its_fix() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_private_dir(&open, "the keeper directory")
            .unwrap_err()
            .to_string();
        assert!(e.contains("has mode 0755, not 0700"), "{e}");
        assert!(e.contains("rm -r"), "{e}");
        let link = tmp.path().join("link");
        let private = tmp.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let e = check_private_dir(&link, "the keeper directory").unwrap_err();
        assert!(e.problem.contains("is a symbolic link"), "{e}");
        assert!(check_private_dir(&private, "x").is_ok());
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = check_private_dir(&file, "x").unwrap_err();
        assert!(e.problem.contains("is not a directory"), "{e}");
    }
}
