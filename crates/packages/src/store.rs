//! The host's package cache, `<state_dir>/packages/` (mode 0700), shared by every bridge of
//! the user:
//! - `wheels/<sha256>.whl`: wheels as downloaded, named by the digest they were checked against;
//! - `trees/<sha256>/`: each unpacked once (files 0444), what sessions' directories hard-link,
//!   with `trees/<sha256>.manifest`: every directory, and every file with its size and sha256,
//!   as unpacked. A tree is checked against it each time it is used and unpacked again from
//!   its wheel when anything differs, so a tree is only ever what its wheel's digest says;
//! - `plans/<key>.json`: resolutions already made, so the same install in another session
//!   reaches no index;
//! - `uv/`: uv's own cache; `tmp/`: work in progress, renamed into place whole.
//!
//! Everything enters by an atomic rename, so bridges installing at once never see a half
//! file, and take a shared lock on `.lock` while they use the cache; pruning takes it
//! exclusively (and is skipped while anyone installs).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PackageError;
use super::resolve::Wheel;
use super::unpack::{self, Manifest, file_sha256, tree_cost, verify_tree};

pub use super::link::{link_tree, unlink_created};
pub use super::unpack::{Cost, ENTRY_COST, MAX_ENTRIES};

/// Largest manifest read back (50,000 entries of a long path and a digest fit).
const MAX_MANIFEST: u64 = 32 << 20;

/// The host's package cache, `<state_dir>/packages/cache` (see the module's documentation):
/// cheap to clone, one directory whatever the clone.
#[derive(Clone)]
pub struct Store {
    root: PathBuf,
}

/// A held lock on the cache (shared or exclusive), released when dropped.
pub struct CacheLock(#[allow(dead_code)] File);

impl Store {
    /// The cache in `root`; nothing is created until it is used.
    pub fn new(root: PathBuf) -> Store {
        Store { root }
    }

    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// uv's own cache, inside this one (`uv/`).
    pub fn uv_cache(&self) -> PathBuf {
        self.root.join("uv")
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Make the directories (the root 0700) and take the shared lock.
    pub fn open_shared(&self) -> Result<CacheLock, PackageError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PackageError::Io {
                what: "could not prepare the package cache",
                path,
                source,
            }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(io(&self.root))?;
        let _ = std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700));
        for d in ["wheels", "trees", "plans", "tmp", "uv"] {
            std::fs::create_dir_all(self.dir(d)).map_err(io(&self.dir(d)))?;
        }
        let lock = self.lock_file()?;
        bridge_core::flock::lock_shared(&lock).map_err(io(&self.root))?;
        Ok(CacheLock(lock))
    }

    fn lock_file(&self) -> Result<File, PackageError> {
        let path = self.root.join(".lock");
        bridge_core::statefile::open_lock(&path).map_err(|source| PackageError::Io {
            what: "could not open",
            path,
            source,
        })
    }

    /// A fresh directory under `tmp/`, removed with its guard.
    pub fn work_dir(&self) -> Result<tempfile::TempDir, PackageError> {
        tempfile::Builder::new()
            .prefix("work-")
            .tempdir_in(self.dir("tmp"))
            .map_err(|source| PackageError::Io {
                what: "could not make a work directory in",
                path: self.dir("tmp"),
                source,
            })
    }

    /// A resolution made before under `key`, if every wheel of it is still cached.
    pub fn plan(&self, key: &str) -> Option<Vec<Wheel>> {
        let path = self.dir("plans").join(format!("{key}.json"));
        let mut text = String::new();
        bridge_core::statefile::open_read(&path)
            .ok()?
            .take(4 << 20)
            .read_to_string(&mut text)
            .ok()?;
        let wheels: Vec<Wheel> = serde_json::from_str(&text).ok()?;
        wheels
            .iter()
            .all(|w| {
                w.sha256
                    .as_ref()
                    .is_some_and(|h| self.wheel_path(h).is_file())
            })
            .then_some(wheels)
    }

    /// Keep `wheels` as the resolution of `key` (the requirement set and interpreter), for
    /// [`Store::plan`]. Best effort: a plan that cannot be written is only not reused.
    pub fn save_plan(&self, key: &str, wheels: &[Wheel]) {
        let Ok(text) = serde_json::to_string(wheels) else {
            return;
        };
        let path = self.dir("plans").join(format!("{key}.json"));
        let _ = write_atomic(&self.dir("tmp"), &path, text.as_bytes());
    }

    fn wheel_path(&self, sha256: &str) -> PathBuf {
        self.dir("wheels").join(format!("{sha256}.whl"))
    }

    fn tree_path(&self, sha256: &str) -> PathBuf {
        self.dir("trees").join(sha256)
    }

    /// Where what a tree held when it was unpacked is kept ([`Manifest`]): the check of a
    /// tree before each use, and its cost for an install from the cache and the listing.
    fn manifest_path(&self, sha256: &str) -> PathBuf {
        self.dir("trees").join(format!("{sha256}.manifest"))
    }

    fn manifest(&self, sha256: &str) -> Option<Manifest> {
        let text = bridge_core::statefile::read_own(&self.manifest_path(sha256), MAX_MANIFEST)?;
        serde_json::from_str(&text).ok()
    }

    /// The cost of the unpacked tree `sha256`: its manifest's, or a walk when there is none.
    fn tree_cost(&self, sha256: &str) -> Cost {
        self.manifest(sha256)
            .map(|m| m.cost)
            .unwrap_or_else(|| tree_cost(&self.tree_path(sha256)))
    }

    /// The wheel `w` in the cache, downloaded (or copied from `find_links`) and checked if it
    /// is not there yet: its sha256 set (computed for a `find_links` file). `true` when it was
    /// cached already. At most `max` bytes are read.
    pub(crate) async fn fetch(
        &self,
        client: &reqwest::Client,
        w: &mut Wheel,
        max: u64,
        deadline: tokio::time::Instant,
    ) -> Result<bool, PackageError> {
        if let Some(h) = &w.sha256
            && self.wheel_path(h).is_file()
        {
            touch(&self.wheel_path(h));
            return Ok(true);
        }
        if let Some(size) = w.size
            && size > max
        {
            return Err(PackageError::TooLarge {
                what: format!("the wheel of {} {}", w.name, w.version),
                size,
                max,
            });
        }
        let mut tmp = tempfile::NamedTempFile::new_in(self.dir("tmp")).map_err(|source| {
            PackageError::Io {
                what: "could not make a file in",
                path: self.dir("tmp"),
                source,
            }
        })?;
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        let too_large = |w: &Wheel, size: u64| PackageError::TooLarge {
            what: format!("the wheel of {} {}", w.name, w.version),
            size,
            max,
        };
        if let Some(url) = w.url.clone() {
            let fetch = async {
                let mut resp = client
                    .get(&url)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .map_err(|e| PackageError::Download {
                        name: w.name.clone(),
                        reason: e.to_string(),
                    })?;
                while let Some(chunk) = resp.chunk().await.map_err(|e| PackageError::Download {
                    name: w.name.clone(),
                    reason: e.to_string(),
                })? {
                    got += chunk.len() as u64;
                    if got > max || w.size.is_some_and(|s| got > s) {
                        return Err(too_large(w, got));
                    }
                    hasher.update(&chunk);
                    tmp.write_all(&chunk).map_err(|source| PackageError::Io {
                        what: "could not write",
                        path: tmp.path().to_path_buf(),
                        source,
                    })?;
                }
                Ok(())
            };
            match tokio::time::timeout_at(deadline, fetch).await {
                Ok(r) => r?,
                Err(_) => return Err(PackageError::Timeout(0)),
            }
        } else if let Some(path) = w.path.clone() {
            // A file of `find_links`: read on the blocking pool, not on a runtime thread.
            let name = (w.name.clone(), w.version.clone());
            let copied = tokio::task::spawn_blocking(move || {
                copy_hashing(&path, tmp, hasher, max).map_err(|e| match e {
                    Copy::Io(what, path, source) => PackageError::Io { what, path, source },
                    Copy::TooLarge(size) => PackageError::TooLarge {
                        what: format!("the wheel of {} {}", name.0, name.1),
                        size,
                        max,
                    },
                })
            })
            .await
            .map_err(|e| PackageError::Unavailable(e.to_string()))??;
            (tmp, hasher, got) = copied;
        }
        let digest = hex::encode(hasher.finalize());
        match &w.sha256 {
            Some(expected) if *expected != digest => {
                return Err(PackageError::HashMismatch {
                    name: w.name.clone(),
                    expected: expected.clone(),
                    got: digest,
                });
            }
            Some(_) => {}
            None => w.sha256 = Some(digest.clone()),
        }
        if w.size.is_some_and(|s| s != got) {
            return Err(PackageError::Download {
                name: w.name.clone(),
                reason: format!("{got} bytes came, the index said {}", w.size.unwrap_or(0)),
            });
        }
        let dest = self.wheel_path(&digest);
        tmp.persist(&dest).map_err(|e| PackageError::Io {
            what: "could not keep",
            path: dest.clone(),
            source: e.error,
        })?;
        Ok(false)
    }

    /// The unpacked tree of the cached wheel `sha256` and what it costs, unpacking it the
    /// first time (at most `max` bytes charged, [`Cost::charged`], and [`MAX_ENTRIES`]
    /// entries; no absolute path, no `..` anywhere in a name, no link). What a wheel's
    /// `.data/purelib` and `.data/platlib` hold goes to the top, as pip installs it; its
    /// scripts, headers and data are not installed (nothing here runs them).
    ///
    /// A tree unpacked before is used only when it is still exactly what its manifest says
    /// (every directory, every file's size and sha256, nothing else, no link); otherwise it is
    /// set aside and unpacked again from the wheel, whose own digest is checked first.
    pub fn tree(
        &self,
        name: &str,
        sha256: &str,
        max: u64,
    ) -> Result<(PathBuf, Cost), PackageError> {
        let tree = self.tree_path(sha256);
        if std::fs::symlink_metadata(&tree).is_ok() {
            match self.manifest(sha256) {
                Some(m) if verify_tree(&tree, &m) => return Ok((tree, m.cost)),
                _ => {
                    tracing::warn!(
                        tree = %tree.display(),
                        "a cached package tree differs from what was unpacked: it is unpacked again from its wheel"
                    );
                    self.set_aside(&tree);
                    let _ = std::fs::remove_file(self.manifest_path(sha256));
                }
            }
        }
        let whl = self.wheel_path(sha256);
        let got = file_sha256(&whl).map_err(|source| PackageError::Io {
            what: "could not read",
            path: whl.clone(),
            source,
        })?;
        if got != sha256 {
            let _ = std::fs::remove_file(&whl);
            return Err(PackageError::HashMismatch {
                name: name.to_string(),
                expected: sha256.to_string(),
                got,
            });
        }
        let work = tempfile::Builder::new()
            .prefix("tree-")
            .tempdir_in(self.dir("tmp"))
            .map_err(|source| PackageError::Io {
                what: "could not make a directory in",
                path: self.dir("tmp"),
                source,
            })?;
        let manifest = unpack::unpack(&whl, work.path(), name, max)?;
        let tmp = work.keep();
        match std::fs::rename(&tmp, &tree) {
            Ok(()) => {
                let text = serde_json::to_vec(&manifest).expect("a manifest serializes");
                write_atomic(&self.dir("tmp"), &self.manifest_path(sha256), &text).map_err(
                    |source| PackageError::Io {
                        what: "could not write",
                        path: self.manifest_path(sha256),
                        source,
                    },
                )?;
            }
            // Another bridge unpacked it first: theirs is checked at its next use.
            Err(_) if tree.is_dir() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Err(source) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(PackageError::Io {
                    what: "could not keep",
                    path: tree,
                    source,
                });
            }
        }
        Ok((tree, manifest.cost))
    }

    /// Move `path` out of the cache's names (into `tmp/`) and remove it: a session linking from
    /// it at that moment fails whole rather than half.
    fn set_aside(&self, path: &Path) {
        let aside = self
            .dir("tmp")
            .join(format!("stale-{}", hex::encode(rand_bytes())));
        let target = if std::fs::rename(path, &aside).is_ok() {
            aside
        } else {
            path.to_path_buf()
        };
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            make_writable(&target);
            let _ = std::fs::remove_dir_all(&target);
        } else {
            let _ = std::fs::remove_file(&target);
        }
    }

    /// Every cached wheel: file name (from its tree's `.dist-info`), size, last use.
    pub fn list(&self) -> Vec<Cached> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.dir("wheels")) else {
            return out;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(sha) = name.strip_suffix(".whl") else {
                continue;
            };
            let Ok(meta) = e.metadata() else { continue };
            let tree = self.tree_path(sha);
            let cost = if tree.is_dir() {
                self.tree_cost(sha)
            } else {
                Cost::default()
            };
            out.push(Cached {
                sha256: sha.to_string(),
                dist: dist_info(&tree).unwrap_or_default(),
                size: meta.len() + cost.charged(),
                entries: cost.entries,
                used: meta.modified().ok(),
            });
        }
        out.sort_by(|a, b| a.dist.cmp(&b.dist));
        out
    }

    /// Remove the least recently used wheels (and their trees) until the cache holds at most
    /// `keep` bytes (0: everything), and every saved resolution. Under the exclusive lock;
    /// `None` when another bridge is installing now.
    pub fn prune(&self, keep: u64) -> Result<Option<(usize, u64)>, PackageError> {
        if !self.root.is_dir() {
            return Ok(Some((0, 0)));
        }
        let lock = self.lock_file()?;
        let locked =
            bridge_core::flock::try_lock_exclusive(&lock).map_err(|source| PackageError::Io {
                what: "could not lock",
                path: self.root.join(".lock"),
                source,
            })?;
        if !locked {
            return Ok(None);
        }
        let mut all = self.list();
        let mut total: u64 = all.iter().map(|c| c.size).sum();
        all.sort_by_key(|c| c.used);
        let (mut removed, mut freed) = (0, 0);
        for c in all {
            if total <= keep && keep > 0 {
                break;
            }
            let _ = std::fs::remove_file(self.wheel_path(&c.sha256));
            self.set_aside(&self.tree_path(&c.sha256));
            let _ = std::fs::remove_file(self.manifest_path(&c.sha256));
            total -= c.size;
            freed += c.size;
            removed += 1;
        }
        if removed > 0
            && let Ok(plans) = std::fs::read_dir(self.dir("plans"))
        {
            for p in plans.flatten() {
                let _ = std::fs::remove_file(p.path());
            }
        }
        if keep == 0 {
            let _ = std::fs::remove_dir_all(self.uv_cache());
        }
        drop(lock);
        Ok(Some((removed, freed)))
    }
}

/// Why [`copy_hashing`] stopped.
enum Copy {
    Io(&'static str, PathBuf, std::io::Error),
    TooLarge(u64),
}

/// `path` appended to `tmp` and `hasher`, at most `max` bytes: the file, the hasher and the
/// bytes read.
fn copy_hashing(
    path: &Path,
    mut tmp: tempfile::NamedTempFile,
    mut hasher: Sha256,
    max: u64,
) -> Result<(tempfile::NamedTempFile, Sha256, u64), Copy> {
    let mut f = File::open(path).map_err(|e| Copy::Io("could not read", path.to_path_buf(), e))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Copy::Io("could not read", path.to_path_buf(), e))?;
        if n == 0 {
            return Ok((tmp, hasher, got));
        }
        got += n as u64;
        if got > max {
            return Err(Copy::TooLarge(got));
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .map_err(|e| Copy::Io("could not write", tmp.path().to_path_buf(), e))?;
    }
}

/// One wheel of the cache.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cached {
    /// The wheel's SHA-256 (hex): its name in the cache.
    pub sha256: String,
    /// `name-version`, from the unpacked tree's `.dist-info` (empty when not unpacked).
    pub dist: String,
    /// What it costs the host: the wheel's bytes and its tree's charge ([`Cost::charged`]).
    pub size: u64,
    /// Files and directories of its tree.
    pub entries: u64,
    /// When an install last took it, downloaded or found cached (its file's modification
    /// time): pruning removes the least recently used first. `None` when it cannot be read.
    #[serde(skip)]
    pub used: Option<std::time::SystemTime>,
}

fn rand_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b
}

/// Give the owner write on every directory under `dir`, so that it can be removed.
fn make_writable(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        set_mode(&d, 0o755);
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
}

fn dist_info(tree: &Path) -> Option<String> {
    std::fs::read_dir(tree).ok()?.flatten().find_map(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".dist-info"))
            .map(str::to_string)
    })
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

/// Mark a cached wheel used now (pruning goes by it).
fn touch(path: &Path) {
    if let Ok(f) = File::options().write(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

pub use bridge_core::statefile::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel(entries: &[(&str, &[u8])], symlink: Option<&str>) -> Vec<u8> {
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            for (name, data) in entries {
                z.start_file(*name, opts).unwrap();
                z.write_all(data).unwrap();
            }
            if let Some(l) = symlink {
                z.add_symlink(l, "/etc/passwd", opts).unwrap();
            }
            z.finish().unwrap();
        }
        buf.into_inner()
    }

    fn cached(store: &Store, bytes: &[u8]) -> String {
        let sha = hex::encode(Sha256::digest(bytes));
        std::fs::write(store.wheel_path(&sha), bytes).unwrap();
        sha
    }

    #[test]
    fn a_wheel_unpacks_to_its_install_layout_read_only() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path().join("packages"));
        let _l = store.open_shared().unwrap();
        let sha = cached(
            &store,
            &wheel(
                &[
                    ("pkg/__init__.py", b"X = 1\n"),
                    ("pkg-1.0.dist-info/METADATA", b"Name: pkg\n"),
                    ("pkg-1.0.data/platlib/fast.so", b"\x7fELF"),
                    ("pkg-1.0.data/scripts/run", b"#!/bin/sh\n"),
                ],
                None,
            ),
        );
        let (tree, cost) = store.tree("pkg", &sha, 1 << 20).unwrap();
        assert!(tree.join("pkg/__init__.py").is_file());
        assert!(tree.join("fast.so").is_file());
        assert!(!tree.join("run").exists() && !tree.join("pkg-1.0.data").exists());
        // Three files and two directories.
        assert_eq!(
            cost,
            Cost {
                bytes: 6 + 10 + 4,
                entries: 5
            }
        );
        // Used again: checked, the same.
        assert_eq!(
            store.tree("pkg", &sha, 1 << 20).unwrap(),
            (tree.clone(), cost)
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tree.join("pkg/__init__.py"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o444);
        let dest = d.path().join("session");
        std::fs::create_dir(&dest).unwrap();
        let mut created = Vec::new();
        link_tree(&tree, &dest, &mut created).unwrap();
        assert!(dest.join("pkg/__init__.py").is_file());
        // The same files again conflict, and nothing is overwritten.
        let mut again = Vec::new();
        assert!(matches!(
            link_tree(&tree, &dest, &mut again),
            Err(PackageError::FileConflict(_))
        ));
        unlink_created(&again);
        unlink_created(&created);
        assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
        assert_eq!(store.list().len(), 1);
        assert_eq!(store.list()[0].dist, "pkg-1.0");
        // Not while a bridge holds the cache (this test's own shared lock)...
        assert_eq!(store.prune(0).unwrap(), None);
        drop(_l);
        assert_eq!(store.prune(0).unwrap().map(|(n, _)| n), Some(1));
        assert!(store.list().is_empty());
    }

    #[test]
    fn hostile_wheels_are_refused_and_leave_nothing() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path().join("packages"));
        let _l = store.open_shared().unwrap();
        for (bytes, why) in [
            (wheel(&[("../../escape.py", b"x")], None), "leaves"),
            (wheel(&[("/etc/evil.py", b"x")], None), "leaves"),
            // A `..` that stays inside the archive but climbs out once the prefix is mapped.
            (
                wheel(&[("p-1.0.data/purelib/../../trees/x.py", b"x")], None),
                "leaves",
            ),
            (
                wheel(&[("p-1.0.data/platlib/../x.py", b"x")], None),
                "leaves",
            ),
            (wheel(&[("a/./b.py", b"x")], None), "leaves"),
            (wheel(&[("a//b.py", b"x")], None), "leaves"),
            (wheel(&[("a\\..\\b.py", b"x")], None), "leaves"),
            (wheel(&[("ok.py", b"x")], Some("link")), "symbolic link"),
            (wheel(&[("big.bin", &vec![0u8; 4096])], None), "above"),
        ] {
            let sha = cached(&store, &bytes);
            let err = store.tree("evil", &sha, 1024).unwrap_err();
            let msg = bridge_core::error::Hinted::message(&err);
            assert!(
                msg.contains(why) || matches!(err, PackageError::TooLarge { .. }),
                "{msg}"
            );
            assert!(!store.tree_path(&sha).exists());
        }
        let left: Vec<_> = std::fs::read_dir(store.dir("tmp")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(
            std::fs::read_dir(store.dir("trees"))
                .unwrap()
                .next()
                .is_none(),
            "nothing reached the trees"
        );
    }

    /// Empty directories and files are charged an entry each: a wheel of thousands of them
    /// passes no size limit by having no bytes.
    #[test]
    fn entries_are_charged_and_bounded() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path().join("packages"));
        let _l = store.open_shared().unwrap();
        let names: Vec<String> = (0..300).map(|i| format!("p/d{i}/")).collect();
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            let opts = zip::write::SimpleFileOptions::default();
            for n in &names {
                z.add_directory(n.as_str(), opts).unwrap();
            }
            z.finish().unwrap();
        }
        let sha = cached(&store, buf.get_ref());
        // 301 directories: 1,232,896 bytes charged, over 1 MiB.
        let err = store.tree("dirs", &sha, 1 << 20).unwrap_err();
        assert!(matches!(err, PackageError::TooLarge { .. }), "{err}");
        assert!(bridge_core::error::Hinted::message(&err).contains("files and directories"));
        let (_, cost) = store.tree("dirs", &sha, 2 << 20).unwrap();
        assert_eq!(
            cost,
            Cost {
                bytes: 0,
                entries: 301
            }
        );
        assert_eq!(store.list()[0].entries, 301);
        assert!(store.list()[0].size >= 301 * ENTRY_COST);
    }

    /// A cached tree that differs from what was unpacked (a file changed, one added, a mode
    /// made writable) is unpacked again from its wheel before it is used; a wheel that no
    /// longer matches its digest is refused and dropped.
    #[test]
    fn a_changed_tree_is_unpacked_again_and_a_changed_wheel_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path().join("packages"));
        let _l = store.open_shared().unwrap();
        let sha = cached(&store, &wheel(&[("pkg/__init__.py", b"X = 1\n")], None));
        let (tree, _) = store.tree("pkg", &sha, 1 << 20).unwrap();
        let file = tree.join("pkg/__init__.py");
        for tamper in 0..3 {
            match tamper {
                0 => {
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
                        .unwrap();
                    std::fs::write(&file, b"X = 2\n").unwrap();
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444))
                        .unwrap();
                }
                1 => std::fs::write(tree.join("pkg/planted.py"), b"").unwrap(),
                _ => {
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap()
                }
            }
            let (again, _) = store.tree("pkg", &sha, 1 << 20).unwrap();
            assert_eq!(
                std::fs::read(again.join("pkg/__init__.py")).unwrap(),
                b"X = 1\n"
            );
            assert!(!again.join("pkg/planted.py").exists());
        }
        std::fs::write(store.wheel_path(&sha), b"not the wheel").unwrap();
        std::fs::remove_file(store.manifest_path(&sha)).unwrap();
        let err = store.tree("pkg", &sha, 1 << 20).unwrap_err();
        assert!(matches!(err, PackageError::HashMismatch { .. }), "{err}");
        assert!(!store.wheel_path(&sha).exists());
    }
}
