//! A session's package directory made of the cache's trees: hard links (a copy across file
//! systems), never over an existing file, and taken back whole when an install fails.

use std::path::{Path, PathBuf};

use super::PackageError;

/// Hard-link every file of `tree` into `dest` (its directories made), listing in `created`
/// what it made so that a failed install can take it back. A file already at a path is a
/// conflict between two distributions: refused, never overwritten.
pub fn link_tree(tree: &Path, dest: &Path, created: &mut Vec<PathBuf>) -> Result<(), PackageError> {
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| PackageError::Io { what, path, source }
    };
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let src_dir = tree.join(&rel);
        for e in std::fs::read_dir(&src_dir).map_err(io("could not read", &src_dir))? {
            let e = e.map_err(io("could not read", &src_dir))?;
            let r = rel.join(e.file_name());
            let to = dest.join(&r);
            let t = e.file_type().map_err(io("could not read", &e.path()))?;
            if t.is_dir() {
                match std::fs::create_dir(&to) {
                    Ok(()) => {
                        set_mode(&to, 0o755);
                        created.push(to);
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && to.is_dir() => {}
                    Err(source) => return Err(io("could not make", &to)(source)),
                }
                stack.push(r);
            } else if t.is_file() {
                if std::fs::symlink_metadata(&to).is_ok() {
                    return Err(PackageError::FileConflict(r.display().to_string()));
                }
                match std::fs::hard_link(e.path(), &to) {
                    Ok(()) => {}
                    // Another file system: a copy, read-only as the tree's.
                    Err(_) => {
                        std::fs::copy(e.path(), &to).map_err(io("could not copy to", &to))?;
                        set_mode(&to, 0o444);
                    }
                }
                created.push(to);
            }
        }
    }
    Ok(())
}

/// Take back what [`link_tree`] made: files, then directories, deepest first.
pub fn unlink_created(created: &[PathBuf]) {
    for p in created.iter().rev() {
        if p.is_dir() {
            let _ = std::fs::remove_dir(p);
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}
