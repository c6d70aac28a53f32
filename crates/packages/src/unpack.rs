//! Unpacking a wheel into a fresh directory, by construction inside it: every entry's name
//! checked as written and again as the final path it is installed at, every file created new,
//! every entry counted and bounded as it is made (bytes and entries), and the manifest of what
//! was made, against which the tree is checked before each later use.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PackageError;

/// Most entries (files and directories) one wheel may unpack to: a large package has a few
/// thousand files.
pub const MAX_ENTRIES: usize = 50_000;

/// What each entry of an unpacked tree is charged besides its bytes: an inode and a block.
/// An empty file or directory is not free to the host, so a wheel of many of them is charged
/// for them (`packages.max_size`, `packages.cache_max_size`).
pub const ENTRY_COST: u64 = 4096;

/// What an unpacked tree costs the host: its file bytes and its entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// Bytes of the tree's files.
    pub bytes: u64,
    /// Files and directories of the tree, each charged [`ENTRY_COST`] bytes more.
    pub entries: u64,
}

impl Cost {
    /// The bytes it is charged: file bytes plus [`ENTRY_COST`] per entry.
    pub fn charged(&self) -> u64 {
        self.bytes
            .saturating_add(self.entries.saturating_mul(ENTRY_COST))
    }
}

/// What a tree held when it was unpacked (`trees/<sha256>.manifest`).
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct Manifest {
    pub(super) cost: Cost,
    /// Directories, relative, `/`-separated.
    dirs: Vec<String>,
    /// Files: relative path, size, sha256 (hex).
    files: Vec<(String, u64, String)>,
}

/// Unpack the wheel file `whl` into the empty directory `into`: at most `max` bytes charged
/// ([`Cost::charged`]) and [`MAX_ENTRIES`] entries; no absolute path, no `..` anywhere in a
/// name, no link. What a wheel's `.data/purelib` and `.data/platlib` hold goes to the top, as
/// pip installs it; its scripts, headers and data are not installed (nothing here runs them).
pub(super) fn unpack(
    whl: &Path,
    into: &Path,
    name: &str,
    max: u64,
) -> Result<Manifest, PackageError> {
    let bad = |reason: String| PackageError::BadWheel {
        name: name.to_string(),
        reason,
    };
    let f = File::open(whl).map_err(|source| PackageError::Io {
        what: "could not read",
        path: whl.to_path_buf(),
        source,
    })?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| bad(format!("not a zip archive: {e}")))?;
    if zip.len() > MAX_ENTRIES {
        return Err(bad(format!(
            "{} entries, more than {MAX_ENTRIES}",
            zip.len()
        )));
    }
    let mut unpacked = Unpacked::new(into, name, max);
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| bad(format!("entry {i} cannot be read: {e}")))?;
        let raw = entry.name().to_string();
        if entry.is_symlink() {
            return Err(bad(format!("{raw:?} is a symbolic link")));
        }
        let Some(rel) = install_path(&raw).map_err(|why| bad(format!("{raw:?} {why}")))? else {
            continue;
        };
        if entry.is_dir() {
            unpacked.dir(&rel)?;
        } else {
            unpacked.file(&rel, &raw, &mut entry)?;
        }
    }
    Ok(unpacked.finish())
}

/// The path, relative to the tree, that the wheel entry named `raw` is installed at, or
/// `None` when it is not installed (a `.data` directory other than `purelib`/`platlib`).
/// Checked on the name as written and again on the final path, after the `.data` prefix is
/// mapped away: every component a plain name (no `..`, `.`, root or empty one anywhere), so no
/// entry can name a path outside the tree however its prefix is mapped.
pub(super) fn install_path(raw: &str) -> Result<Option<PathBuf>, LeavesTree> {
    const LEAVES: LeavesTree = LeavesTree;
    if raw.starts_with('/') || raw.contains('\\') || raw.contains('\0') {
        return Err(LEAVES);
    }
    let parts: Vec<&str> = raw.trim_end_matches('/').split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(LEAVES);
    }
    let parts: &[&str] = match parts.as_slice() {
        [first, kind, rest @ ..] if first.ends_with(".data") => {
            if !matches!(*kind, "purelib" | "platlib") {
                return Ok(None);
            }
            rest
        }
        [first] if first.ends_with(".data") => return Ok(None),
        all => all,
    };
    if parts.is_empty() {
        return Ok(None);
    }
    let path: PathBuf = parts.iter().collect();
    if !path
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
        || path.components().count() != parts.len()
    {
        return Err(LEAVES);
    }
    Ok(Some(path))
}

/// An archive entry's name that would leave the install directory ([`install_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("leaves the install directory")]
pub(super) struct LeavesTree;

/// A tree being unpacked into `root`: every directory and file it makes, counted and bounded
/// as it goes (bytes charged against `max`, entries against [`MAX_ENTRIES`]).
struct Unpacked<'a> {
    root: &'a Path,
    name: &'a str,
    max: u64,
    dirs: std::collections::BTreeSet<PathBuf>,
    files: Vec<(String, u64, String)>,
    bytes: u64,
}

impl<'a> Unpacked<'a> {
    fn new(root: &'a Path, name: &'a str, max: u64) -> Unpacked<'a> {
        Unpacked {
            root,
            name,
            max,
            dirs: Default::default(),
            files: Vec::new(),
            bytes: 0,
        }
    }

    fn cost(&self) -> Cost {
        Cost {
            bytes: self.bytes,
            entries: (self.dirs.len() + self.files.len()) as u64,
        }
    }

    fn bad(&self, reason: String) -> PackageError {
        PackageError::BadWheel {
            name: self.name.to_string(),
            reason,
        }
    }

    /// Charge one more entry of `bytes`, refusing past the bounds.
    fn charge(&self, entries: u64, bytes: u64) -> Result<(), PackageError> {
        let mut c = self.cost();
        c.entries += entries;
        c.bytes = c.bytes.saturating_add(bytes);
        if c.entries > MAX_ENTRIES as u64 {
            return Err(self.bad(format!(
                "it unpacks to more than {MAX_ENTRIES} entries, more than a wheel may have"
            )));
        }
        if c.charged() > self.max {
            return Err(PackageError::TooLarge {
                what: format!(
                    "{} unpacked ({} bytes in {} files and directories, each entry counted as {ENTRY_COST} bytes more)",
                    self.name, c.bytes, c.entries
                ),
                size: c.charged(),
                max: self.max,
            });
        }
        Ok(())
    }

    /// `rel` and every directory above it, made where missing.
    fn dir(&mut self, rel: &Path) -> Result<(), PackageError> {
        let mut at = PathBuf::new();
        for c in rel.components() {
            at.push(c);
            if self.dirs.contains(&at) {
                continue;
            }
            self.charge(1, 0)?;
            let full = self.root.join(&at);
            match std::fs::create_dir(&full) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(self.bad(format!(
                        "{:?} is both a file and a directory",
                        at.display().to_string()
                    )));
                }
                Err(source) => {
                    return Err(PackageError::Io {
                        what: "could not make",
                        path: full,
                        source,
                    });
                }
            }
            self.dirs.insert(at.clone());
        }
        Ok(())
    }

    /// The file `rel` with the entry's bytes: made new (never over another), no more than it
    /// declared, 0444.
    fn file(
        &mut self,
        rel: &Path,
        raw: &str,
        entry: &mut zip::read::ZipFile<'_, File>,
    ) -> Result<(), PackageError> {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.dir(parent)?;
        }
        let declared = entry.size();
        self.charge(1, declared)?;
        let dest = self.root.join(rel);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&dest)
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::AlreadyExists {
                    self.bad(format!("{raw:?} names a path the wheel has already"))
                } else {
                    PackageError::Io {
                        what: "could not write",
                        path: dest.clone(),
                        source,
                    }
                }
            })?;
        // The declared size is the compressed stream's claim: no more is read.
        let mut hashing = HashingWriter {
            inner: &mut out,
            hasher: Sha256::new(),
        };
        let n = std::io::copy(&mut (&mut *entry).take(declared + 1), &mut hashing)
            .map_err(|e| self.bad(format!("{raw:?} cannot be unpacked: {e}")))?;
        if n > declared {
            return Err(self.bad(format!(
                "{raw:?} holds more than its declared {declared} bytes"
            )));
        }
        let digest = hex::encode(hashing.hasher.finalize());
        drop(out);
        set_mode(&dest, 0o444);
        self.bytes += n;
        self.files.push((slash_path(rel), n, digest));
        Ok(())
    }

    fn finish(self) -> Manifest {
        let cost = self.cost();
        let mut files = self.files;
        files.sort();
        Manifest {
            cost,
            dirs: self.dirs.iter().map(|d| slash_path(d)).collect(),
            files,
        }
    }
}

struct HashingWriter<'a> {
    inner: &'a mut File,
    hasher: Sha256,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn slash_path(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether the tree at `root` is exactly `m`: the same directories, the same files with the
/// same sizes and sha256, read-only, nothing else and no link.
pub(super) fn verify_tree(root: &Path, m: &Manifest) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if !std::fs::symlink_metadata(root).is_ok_and(|t| t.is_dir()) {
        return false;
    }
    let files: HashMap<&str, (u64, &str)> = m
        .files
        .iter()
        .map(|(p, n, h)| (p.as_str(), (*n, h.as_str())))
        .collect();
    let dirs: std::collections::HashSet<&str> = m.dirs.iter().map(String::as_str).collect();
    let (mut seen_files, mut seen_dirs) = (0usize, 0usize);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            return false;
        };
        for e in entries {
            let Ok(e) = e else { return false };
            let r = rel.join(e.file_name());
            let key = slash_path(&r);
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                return false;
            };
            if meta.is_dir() {
                if !dirs.contains(key.as_str()) {
                    return false;
                }
                seen_dirs += 1;
                stack.push(r);
            } else if meta.is_file() {
                let Some((size, digest)) = files.get(key.as_str()) else {
                    return false;
                };
                if meta.len() != *size || meta.permissions().mode() & 0o7777 != 0o444 {
                    return false;
                }
                if file_sha256(&e.path()).ok().as_deref() != Some(*digest) {
                    return false;
                }
                seen_files += 1;
            } else {
                return false;
            }
        }
    }
    seen_files == files.len() && seen_dirs == dirs.len()
}

pub(super) fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// What the files and directories under `dir` cost (links not followed, not counted).
pub(crate) fn tree_cost(dir: &Path) -> Cost {
    let mut cost = Cost::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                cost.entries += 1;
                stack.push(e.path());
            } else if t.is_file() {
                cost.entries += 1;
                cost.bytes += e.metadata().map_or(0, |m| m.len());
            }
        }
    }
    cost
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}
