//! The runtime's compiled code, kept between sandboxes and between bridges, so that a
//! sandbox's boot does not compile the runtime's modules (docs/protocol.md, "Boot").
//!
//! Why: compiling the runtime's ~3,500 lines is ~30 ms of a boot of ~150 ms on a two-core host,
//! on the path of every cold first call. The loader compiles a module only when the boot frame
//! carries no code its interpreter can run; a sandbox that compiled sends every module's code,
//! marshalled, as its first frame. The bridge keeps it (here, in memory, and in
//! `<state_dir>/runtime-code/`), and every later boot frame, this bridge's and the next ones',
//! carries it.
//!
//! Trust: the code runs in later sandboxes before their seccomp filter is stacked, so only
//! code made before any code but the runtime's ran is taken: the `code` frame must be a fresh
//! sandbox's first line (`channel`), and the runtime sends it before the installed packages
//! are on its path and before the preload list is imported (boot.py). Kept code is used only
//! for the same runtime (a digest of the boot frame's sources and constants) and image, and by
//! an interpreter of the magic number it was made by (the loader checks it and compiles
//! otherwise). The file is the user's (0600, in a 0700 directory), read leniently: anything
//! unexpected in it is a miss, never an error. A boot that fails while carrying kept code
//! drops that code, and the start is tried once more without it (`Session::start`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use bridge_core::protocol::RuntimeCode;

/// The directory under the state dir.
const DIR: &str = "runtime-code";
/// What the code of the whole runtime may weigh in base64 (it is ~0.3 MB); larger is refused.
const MAX_CODE_BYTES: usize = 4 << 20;
/// What a kept file may weigh; a larger one is not read.
const MAX_FILE_BYTES: u64 = MAX_CODE_BYTES as u64 + (64 << 10);
/// The files kept, one per image and runtime: the oldest beyond these are removed.
const MAX_FILES: usize = 8;
/// The longest magic number taken, in hex digits (CPython's is 4 bytes).
const MAX_MAGIC_HEX: usize = 32;
const FORMAT: &str = "mcp-code-bridge runtime code";
const VERSION: u32 = 1;

/// The kept code's file.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    format: String,
    version: u32,
    image: String,
    runtime: String,
    code: RuntimeCode,
}

/// The boot frame to send, with the code held for one image (when there is any).
pub(crate) struct Compiled {
    path: PathBuf,
    image: String,
    /// The boot line carrying the code held; read from the file on first use.
    held: tokio::sync::OnceCell<Mutex<Option<Arc<Vec<u8>>>>>,
}

/// The boot line to send to one sandbox.
pub(crate) struct BootLine {
    pub(crate) line: Arc<Vec<u8>>,
    /// It carries kept code (which the sandbox's start drops if the boot fails).
    pub(crate) carries_code: bool,
}

/// The digest of the runtime the boot frame sends (its modules and the host's constants):
/// code is kept for it alone.
fn runtime_digest() -> &'static str {
    static DIGEST: LazyLock<String> =
        LazyLock::new(|| hex::encode(Sha256::digest(super::runtime::boot_line())));
    &DIGEST
}

impl Compiled {
    /// For sandboxes of `image`, with the file under `state_dir`.
    pub(crate) fn new(state_dir: &Path, image: &str) -> Compiled {
        let name = &hex::encode(Sha256::digest(image.as_bytes()))[..32];
        Compiled {
            path: state_dir.join(DIR).join(format!("{name}.json")),
            image: image.to_string(),
            held: tokio::sync::OnceCell::new(),
        }
    }

    async fn held(&self) -> &Mutex<Option<Arc<Vec<u8>>>> {
        self.held
            .get_or_init(|| async {
                let (path, image) = (self.path.clone(), self.image.clone());
                let read = tokio::task::spawn_blocking(move || read(&path, &image))
                    .await
                    .ok()
                    .flatten();
                Mutex::new(read.map(|code| line_with(&code)))
            })
            .await
    }

    /// The boot line for the next sandbox: with the code held, else the runtime's sources
    /// alone.
    pub(crate) async fn boot_line(&self) -> BootLine {
        match self.held().await.lock().unwrap().clone() {
            Some(line) => BootLine {
                line,
                carries_code: true,
            },
            None => BootLine {
                line: plain_line(),
                carries_code: false,
            },
        }
    }

    /// Take the code a sandbox sent as its first frame: held for the next boots and written
    /// to the file (off the async threads). Code not of this runtime's shape is refused
    /// (logged).
    pub(crate) async fn offer(&self, code: RuntimeCode) {
        if let Err(why) = check(&code) {
            tracing::warn!("ignoring the runtime code a sandbox sent: {why}");
            return;
        }
        let line = line_with(&code);
        *self.held().await.lock().unwrap() = Some(line);
        let path = self.path.clone();
        let record = Record {
            format: FORMAT.into(),
            version: VERSION,
            image: self.image.clone(),
            runtime: runtime_digest().into(),
            code,
        };
        let written = tokio::task::spawn_blocking(move || write(&path, &record)).await;
        match written {
            Ok(Ok(())) => tracing::debug!(image = %self.image, "kept the runtime's compiled code"),
            Ok(Err(e)) => tracing::debug!(
                "could not keep the runtime's compiled code in {}: {e}",
                self.path.display()
            ),
            Err(_) => {}
        }
    }

    /// Drop the code held (a sandbox booted with it did not start): the next boots compile,
    /// and the first of them sends fresh code.
    pub(crate) async fn forget(&self) {
        *self.held().await.lock().unwrap() = None;
        let path = self.path.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
    }
}

fn line_with(code: &RuntimeCode) -> Arc<Vec<u8>> {
    Arc::new(super::runtime::boot_line_with(Some(code)))
}

fn plain_line() -> Arc<Vec<u8>> {
    static LINE: LazyLock<Arc<Vec<u8>>> =
        LazyLock::new(|| Arc::new(super::runtime::boot_line().to_vec()));
    LINE.clone()
}

/// Whether `code` is the code of this runtime's modules: one entry for each, in base64, of a
/// bounded size, with a magic number in hex.
fn check(code: &RuntimeCode) -> Result<(), String> {
    let magic = &code.magic;
    if magic.is_empty()
        || magic.len() > MAX_MAGIC_HEX
        || !magic.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err("its magic number is not a short hex string".into());
    }
    let names: Vec<&str> = super::runtime::MODULES.iter().map(|(n, _)| *n).collect();
    if code.modules.len() != names.len() || !names.iter().all(|n| code.modules.contains_key(*n)) {
        return Err("it does not name exactly the runtime's modules".into());
    }
    let mut total = 0usize;
    for (name, data) in &code.modules {
        total += data.len();
        if data.is_empty()
            || !data
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        {
            return Err(format!("the code of {name} is not base64"));
        }
    }
    if total > MAX_CODE_BYTES {
        return Err(format!("it is over {MAX_CODE_BYTES} bytes"));
    }
    Ok(())
}

/// The code kept in `path` for `image` and this runtime; `None` for anything else.
fn read(path: &Path, image: &str) -> Option<RuntimeCode> {
    let text = bridge_core::statefile::read_own(path, MAX_FILE_BYTES)?;
    let r: Record = serde_json::from_str(&text).ok()?;
    (r.format == FORMAT
        && r.version == VERSION
        && r.image == image
        && r.runtime == runtime_digest()
        && check(&r.code).is_ok())
    .then_some(r.code)
}

/// `record` written whole to `path`, its directory made 0700 if missing; the oldest files
/// beyond [`MAX_FILES`] removed.
fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    bridge_core::statefile::write_private(path, &bytes)?;
    prune(path.parent().unwrap_or(Path::new(".")), path);
    Ok(())
}

/// Remove the oldest kept files beyond [`MAX_FILES`] (never `keep`, just written).
fn prune(dir: &Path, keep: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= MAX_FILES {
        return;
    }
    files.sort();
    let excess = files.len() - MAX_FILES;
    for (_, p) in files.into_iter().filter(|(_, p)| p != keep).take(excess) {
        let _ = std::fs::remove_file(p);
    }
}

/// The modules of a `code` frame by name, for tests.
#[cfg(test)]
fn fake_code(magic: &str) -> RuntimeCode {
    RuntimeCode {
        magic: magic.into(),
        modules: super::runtime::MODULES
            .iter()
            .map(|(n, _)| (n.to_string(), "YWJj".to_string()))
            .collect::<std::collections::BTreeMap<_, _>>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn frame(line: &[u8]) -> serde_json::Value {
        serde_json::from_slice(line).unwrap()
    }

    #[test]
    fn code_offered_is_sent_in_later_boot_frames_and_kept_for_the_next_bridge() {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let c = Compiled::new(dir.path(), "img:1");
            let first = c.boot_line().await;
            assert!(!first.carries_code);
            assert!(frame(&first.line).get("code").is_none());
            c.offer(fake_code("a70d0d0a")).await;
            let next = c.boot_line().await;
            assert!(next.carries_code);
            let f = frame(&next.line);
            assert_eq!(f["code"]["magic"], "a70d0d0a");
            assert_eq!(f["code"]["modules"]["boot"], "YWJj");
            assert_eq!(
                f["modules"],
                frame(super::super::runtime::boot_line())["modules"]
            );

            // The next bridge of this state dir and image reads it; another image does not.
            let again = Compiled::new(dir.path(), "img:1");
            assert!(again.boot_line().await.carries_code);
            let other = Compiled::new(dir.path(), "img:2");
            assert!(!other.boot_line().await.carries_code);
            let files: Vec<_> = std::fs::read_dir(dir.path().join(DIR)).unwrap().collect();
            assert_eq!(files.len(), 1);
            let path = files[0].as_ref().unwrap().path();
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(&path).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600);

            // Dropped: not sent, and not read by the next bridge.
            again.forget().await;
            assert!(!again.boot_line().await.carries_code);
            assert!(
                !Compiled::new(dir.path(), "img:1")
                    .boot_line()
                    .await
                    .carries_code
            );
        });
    }

    #[test]
    fn code_not_of_the_runtimes_shape_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = Compiled::new(dir.path(), "img");
        rt().block_on(async {
            let mut missing = fake_code("a70d0d0a");
            missing.modules.remove("boot");
            let mut extra = fake_code("a70d0d0a");
            extra.modules.insert("evil".into(), "YWJj".into());
            let mut not_b64 = fake_code("a70d0d0a");
            not_b64.modules.insert("boot".into(), "{\"x\": 1}".into());
            let mut huge = fake_code("a70d0d0a");
            huge.modules
                .insert("boot".into(), "A".repeat(MAX_CODE_BYTES + 1));
            for bad in [
                fake_code(""),
                fake_code("not hex"),
                fake_code(&"0".repeat(MAX_MAGIC_HEX + 1)),
                missing,
                extra,
                not_b64,
                huge,
            ] {
                assert!(check(&bad).is_err(), "{:?}", bad.magic);
                c.offer(bad).await;
                assert!(!c.boot_line().await.carries_code);
            }
        });
    }

    #[test]
    fn a_kept_file_for_another_runtime_corrupt_oversized_or_a_link_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let c = Compiled::new(dir.path(), "img");
            c.offer(fake_code("a70d0d0a")).await;
        });
        let path = std::fs::read_dir(dir.path().join(DIR))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        assert!(read(&path, "img").is_some());
        assert!(read(&path, "other").is_none());
        let good = std::fs::read_to_string(&path).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["runtime"] = "0".repeat(64).into();
        std::fs::write(&path, v.to_string()).unwrap();
        assert!(read(&path, "img").is_none(), "another runtime's code");
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(read(&path, "img").is_none(), "a cut file");
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["code"]["modules"]["boot"] = "A".repeat(MAX_FILE_BYTES as usize).into();
        std::fs::write(&path, v.to_string()).unwrap();
        assert!(read(&path, "img").is_none(), "an oversized file");
        let target = dir.path().join("elsewhere.json");
        std::fs::write(&target, &good).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(read(&path, "img").is_none(), "a link");
    }

    #[test]
    fn at_most_max_files_are_kept_the_oldest_removed() {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(async {
            for i in 0..MAX_FILES + 3 {
                Compiled::new(dir.path(), &format!("img:{i}"))
                    .offer(fake_code("a70d0d0a"))
                    .await;
                // Distinct modification times, oldest first.
                std::thread::sleep(std::time::Duration::from_millis(15));
            }
            let left = std::fs::read_dir(dir.path().join(DIR)).unwrap().count();
            assert_eq!(left, MAX_FILES);
            let last = Compiled::new(dir.path(), &format!("img:{}", MAX_FILES + 2));
            assert!(last.boot_line().await.carries_code);
            assert!(
                !Compiled::new(dir.path(), "img:0")
                    .boot_line()
                    .await
                    .carries_code
            );
        });
    }
}
