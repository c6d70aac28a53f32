//! A sandbox's package directory: the directory mounted at `protocol::PACKAGES_DIR`, and its
//! record in the state directory.
//!
//! The kernel names the root of every bind mount in `/proc/self/mountinfo` by its path within
//! its host file system, and the sandbox can read that file under runc. So the directory a
//! sandbox mounts has a name that says nothing: `<mount root>/<32 random hex>`, where the mount
//! root is `/var/tmp/mcp-code-bridge-<uid>/<digest of the state dir>` when a hard link reaches
//! it from the state directory (the installs' links and renames need the cache's mount), else
//! `<state_dir>/packages/mounts` (then the sandbox can read where the state directory is, and
//! no more). Whose it is lives outside the mount: `<state_dir>/packages/sandboxes/<record>`, a
//! symbolic link to the directory, named as the container is (`mcp-code-bridge-<pid>-…`) or
//! `parked-<expires>-<id>` while a keeper holds it. Records are renamed when a sandbox is parked
//! or adopted; the mounted directory never moves.
//!
//! **Invariant:** everything under the mount root is the bridge's: made `0700` by this user,
//! refused when anyone else made it, and a record only ever points into it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bridge_core::config::Config;

/// The name a parked sandbox's record starts with, before the time its keeper removes it
/// (`parked-<expires>-<container>`).
pub const PARKED: &str = "parked-";

/// Where the record of container `cname`'s package directory is: the path RPC handlers and
/// the package broker are given (a link to the mounted directory).
pub fn record(config: &Config, cname: &str) -> PathBuf {
    records(config).join(cname)
}

fn records(config: &Config) -> PathBuf {
    config.state_dir.join("packages").join("sandboxes")
}

/// Make the package directory of a new container: empty, the bridge's, readable and searchable
/// by everyone (the sandbox's user reads it through the mount), writable by the bridge only,
/// with its record at `record`. Returns the directory to mount.
pub fn make(config: &Config, record: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = record.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if std::fs::symlink_metadata(record).is_ok() {
        remove(record);
    }
    let mut dir = mount_root(config)?.join(random_name());
    if let Err(e) = std::fs::create_dir(&dir) {
        // Another bridge on this state dir removed the mount root as it ended ([`leave`]).
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
        forget(config);
        dir = mount_root(config)?.join(random_name());
        std::fs::create_dir(&dir)?;
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    if let Err(e) = std::os::unix::fs::symlink(&dir, record) {
        let _ = std::fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(dir)
}

/// Remove a package directory whose container is gone, and its record. The bridge made its
/// directories read-only for the sandbox, not for itself, so a plain recursive removal does it.
/// A record that is a directory (as bridges before the mount root made them) is removed whole.
pub fn remove(record: &Path) {
    let gone = |r: std::io::Result<()>, what: &Path| {
        if let Err(e) = r
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(dir = %what.display(), "could not remove a package directory: {e}");
        }
    };
    match std::fs::symlink_metadata(record) {
        Ok(m) if m.file_type().is_symlink() => {
            if let Ok(dir) = std::fs::read_link(record)
                && is_mount_dir(&dir)
            {
                gone(std::fs::remove_dir_all(&dir), &dir);
            }
            gone(std::fs::remove_file(record), record);
        }
        Ok(_) => gone(std::fs::remove_dir_all(record), record),
        Err(_) => {}
    }
}

/// [`remove`], by a keeper whose parked sandbox's time is over: with no bridge left on the
/// state dir, nothing else would remove the mount root it leaves empty.
pub fn remove_last(record: &Path) {
    let dir = std::fs::read_link(record).ok().filter(|d| is_mount_dir(d));
    remove(record);
    if let Some(root) = dir.as_deref().and_then(Path::parent) {
        remove_root_if_empty(root);
    }
}

/// Remove a mount root, and `/var/tmp/mcp-code-bridge-<uid>` above it, when nothing is left in
/// them (another bridge that had it cached makes it again: [`make`]).
fn remove_root_if_empty(root: &Path) {
    if std::fs::remove_dir(root).is_ok()
        && let Some(top) = root.parent()
        && top.starts_with("/var/tmp")
    {
        let _ = std::fs::remove_dir(top);
    }
}

/// Remove the package directories of containers whose bridge is gone (records named
/// `mcp-code-bridge-<pid>…`), of parked sandboxes past their time (what a killed bridge or
/// keeper left), and directories under the mount root no record names, a minute old (a bridge
/// killed between making one and its record). Best effort; nothing else is touched.
pub fn sweep(config: &Config) {
    let me = std::process::id();
    let now = bridge_core::clock::now_secs();
    let mut named = std::collections::HashSet::new();
    for e in std::fs::read_dir(records(config))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let gone = if let Some(rest) = name.strip_prefix(PARKED) {
            // Named with the time its keeper removes it: past that (and a minute for the
            // removal), nothing mounts it any more.
            let expires = rest.split('-').next().and_then(|t| t.parse::<u64>().ok());
            expires.is_some_and(|t| now > t + 60)
        } else {
            match bridge_of(&name) {
                Some(p) => p != me && bridge_core::procfs::running_since(p).is_none(),
                None => false,
            }
        };
        if gone {
            remove(&e.path());
        } else if let Ok(target) = std::fs::read_link(e.path()) {
            named.insert(target);
        }
    }
    let Ok(root) = mount_root(config) else {
        return;
    };
    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let path = e.path();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 60);
        if old && !named.contains(&path) && is_mount_dir(&path) {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The bridge whose record `name` is: `mcp-code-bridge-<pid>-...` (a session's) or
/// `mcp-code-bridge-<pid>.pool-...` (a pooled or adopted one's) is its leading digits.
fn bridge_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("mcp-code-bridge-")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether `dir` is one this module makes: 32 hex digits, under a mount root.
fn is_mount_dir(dir: &Path) -> bool {
    let name_ok = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() == 32 && n.bytes().all(|b| b.is_ascii_hexdigit()));
    name_ok && dir.is_absolute()
}

/// At the bridge's end, after its sessions are closed or parked: remove what is left of its own
/// (a pooled sandbox started as it ended), then the mount root (and
/// `/var/tmp/mcp-code-bridge-<uid>`) when nothing is left in them, so that a state directory
/// used once keeps no inode there.
pub fn leave(config: &Config) {
    let me = std::process::id();
    for e in std::fs::read_dir(records(config))
        .into_iter()
        .flatten()
        .flatten()
    {
        if bridge_of(&e.file_name().to_string_lossy()) == Some(me) {
            remove(&e.path());
        }
    }
    if let Ok(root) = mount_root(config) {
        remove_root_if_empty(&root);
    }
    forget(config);
}

static FOUND: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

fn forget(config: &Config) {
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    found.retain(|(s, _)| *s != config.state_dir);
}

fn random_name() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source");
    hex::encode(b)
}

/// Where this state directory's package directories are made (see the module's text), found
/// once per bridge and state directory.
pub fn mount_root(config: &Config) -> std::io::Result<PathBuf> {
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, root)) = found.iter().find(|(s, _)| *s == config.state_dir) {
        return Ok(root.clone());
    }
    let packages = config.state_dir.join("packages");
    make_private(&packages, false)?;
    let root = match neutral_root(&config.state_dir, &packages) {
        Ok(root) => root,
        Err(why) => {
            tracing::debug!(
                "package directories are made in the state directory, whose path a sandbox can read in /proc/self/mountinfo: {why}"
            );
            let root = packages.join("mounts");
            make_private(&root, false)?;
            root
        }
    };
    found.push((config.state_dir.clone(), root.clone()));
    Ok(root)
}

/// `/var/tmp/mcp-code-bridge-<uid>/<digest of the state dir>`, when it is (or can be made) this
/// user's alone and a hard link from `packages` reaches it.
fn neutral_root(state_dir: &Path, packages: &Path) -> Result<PathBuf, String> {
    use sha2::Digest;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let top = Path::new("/var/tmp").join(format!("mcp-code-bridge-{uid}"));
    make_private(&top, true).map_err(|e| format!("{}: {e}", top.display()))?;
    let full = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = sha2::Sha256::digest(full.as_os_str().as_encoded_bytes());
    let root = top.join(hex::encode(&digest[..8]));
    make_private(&root, true).map_err(|e| format!("{}: {e}", root.display()))?;
    // Installs hard-link the cache's files and rename into the directory: both need the same
    // mount, which a link tells (a bind-mounted /var/tmp shares the device, not the mount).
    let probe = packages.join(format!(".link-probe-{}", std::process::id()));
    let there = root.join(format!(".link-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| format!("{}: {e}", probe.display()))?;
    let linked = std::fs::hard_link(&probe, &there);
    let _ = std::fs::remove_file(&probe);
    let _ = std::fs::remove_file(&there);
    linked.map_err(|e| {
        format!(
            "a hard link from {} does not reach it: {e}",
            packages.display()
        )
    })?;
    Ok(root)
}

/// Make `dir` (its parents too) this user's alone, or check that it is: a directory, not a
/// link, owned by this user, `0700`. With `strict`, one that exists otherwise is refused (a
/// shared place such as /var/tmp, where someone else may have made it first); without, its
/// mode is set.
fn make_private(dir: &Path, strict: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let made = std::fs::DirBuilder::new().mode(0o700).create(dir);
    match made {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if !strict && e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me {
        return Err(std::io::Error::other(
            "it is not a directory of this user's (a link, or someone else made it)",
        ));
    }
    if m.mode() & 0o077 != 0 {
        if strict {
            return Err(std::io::Error::other(format!(
                "others may use it (mode {:o}; it must be 0700)",
                m.mode() & 0o777
            )));
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> Config {
        Config {
            state_dir: dir.join("state"),
            ..Config::default()
        }
    }

    #[test]
    fn a_package_directory_is_named_by_nothing_of_the_state_dir_and_goes_with_its_record() {
        let tmp = tempfile::tempdir().unwrap();
        let c = config(tmp.path());
        let rec = record(&c, "mcp-code-bridge-1-x");
        let dir = make(&c, &rec).unwrap();
        assert_eq!(std::fs::read_link(&rec).unwrap(), dir);
        let shown = dir.to_string_lossy().into_owned();
        assert!(!shown.contains("mcp-code-bridge-1-x"), "{shown}");
        assert!(is_mount_dir(&dir), "{shown}");
        std::fs::write(dir.join("f.py"), "x").unwrap();
        // Through the record, as the package broker writes.
        assert!(rec.join("f.py").exists());
        remove(&rec);
        assert!(!dir.exists() && std::fs::symlink_metadata(&rec).is_err());
        let root = mount_root(&c).unwrap();
        leave(&c);
        assert!(
            !root.exists(),
            "an empty mount root is removed as the bridge ends"
        );
        // And made again when a sandbox starts after that.
        let dir = make(&c, &rec).unwrap();
        remove(&rec);
        assert!(!dir.exists());
        leave(&c);
    }

    #[test]
    fn a_shared_place_someone_else_prepared_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = make_private(&open, true).unwrap_err();
        assert!(e.to_string().contains("0700"), "{e}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        let e = make_private(&link, true).unwrap_err();
        assert!(e.to_string().contains("link"), "{e}");
    }

    #[test]
    fn the_sweep_takes_directories_no_record_names_and_the_records_of_gone_bridges() {
        let tmp = tempfile::tempdir().unwrap();
        let c = config(tmp.path());
        let live = record(&c, &format!("mcp-code-bridge-{}-live", std::process::id()));
        let live_dir = make(&c, &live).unwrap();
        // A pid no process has (above the kernel's maximum).
        let dead = record(&c, "mcp-code-bridge-4194999-dead");
        let dead_dir = make(&c, &dead).unwrap();
        let orphan = mount_root(&c).unwrap().join(random_name());
        std::fs::create_dir(&orphan).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        std::fs::File::open(&orphan)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let young = mount_root(&c).unwrap().join(random_name());
        std::fs::create_dir(&young).unwrap();
        sweep(&c);
        assert!(live_dir.exists() && live.exists());
        assert!(!dead_dir.exists() && std::fs::symlink_metadata(&dead).is_err());
        assert!(!orphan.exists(), "an old directory no record names");
        assert!(young.exists(), "one being made now is left");
        remove(&live);
        let _ = std::fs::remove_dir(&young);
        leave(&c);
    }
}
