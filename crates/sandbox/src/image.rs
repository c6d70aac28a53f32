//! The sandbox image: present, loaded from an archive (verifying its sha256 while it streams), or
//! pulled when the reference names a registry.

use bridge_core::boxed::Boxed;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use std::time::Instant;

use bollard::Docker;
use bollard::query_parameters::{CreateImageOptionsBuilder, ImportImageOptionsBuilder};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::io::ReaderStream;

use bridge_core::config::Config;

/// Why the image could not be made present. The message says what happened; the hint, when
/// there is one, what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ImageError {
    /// What happened.
    pub message: String,
    /// What to do about it, when known.
    pub hint: Option<String>,
}

impl ImageError {
    fn new(message: impl Into<String>) -> Self {
        ImageError {
            message: message.into(),
            hint: None,
        }
    }

    fn hinted(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ImageError {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
}

impl bridge_core::error::Hinted for ImageError {
    fn hint(&self) -> Option<bridge_core::error::Hint> {
        self.hint.clone().map(bridge_core::error::Hint::sentence)
    }
}

/// How the image came to be there.
#[derive(Debug, Clone, PartialEq)]
pub enum Provenance {
    /// It was there already.
    Present,
    /// Loaded from an archive.
    Loaded {
        /// The archive's path.
        archive: String,
        /// Its size in bytes.
        bytes: u64,
        /// How long the load took.
        seconds: f64,
    },
    /// Pulled from its registry.
    Pulled,
}

/// The label naming an image's profile (`image/build-debian.sh --profile`, the Nix image's
/// `profile`): which packages beyond Python, numpy, pandas and matplotlib it has.
pub const PROFILE_LABEL: &str = "io.mcp-code-bridge.profile";

/// The profile an image says it was built with; `default` for one without the label (an older
/// build, or an image made by other means).
pub fn profile(image: &bollard::models::ImageInspect) -> String {
    image
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(PROFILE_LABEL))
        .filter(|p| !p.is_empty())
        .cloned()
        .unwrap_or_else(|| "default".into())
}

/// Whether `reference` names a registry (`host.tld/…`, `host:port/…`) so that pulling it makes
/// sense. `localhost/…` is podman's name for local images: never pulled.
pub fn names_registry(reference: &str) -> bool {
    reference
        .split_once('/')
        .is_some_and(|(first, _)| first.contains('.') || first.contains(':'))
}

/// Make sure `config.image` exists in the engine.
pub(crate) async fn ensure(
    docker: &Docker,
    config: &Config,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Provenance, ImageError> {
    if docker.inspect_image(&config.image).await.is_ok() {
        return Ok(Provenance::Present);
    }
    if let Some(archive) = &config.image_archive {
        return load(docker, config, archive, progress).await;
    }
    if names_registry(&config.image) {
        tracing::info!(image = %config.image, "image not present; pulling");
        let opts = CreateImageOptionsBuilder::default()
            .from_image(&config.image)
            .build();
        let mut s = docker.create_image(Some(opts), None, None);
        while let Some(item) = s.next().await {
            item.map_err(|e| ImageError::new(format!("pulling {} failed: {e}", config.image)))?;
        }
        return Ok(Provenance::Pulled);
    }
    Err(ImageError::hinted(
        format!(
            "the sandbox image {:?} is not in the container engine, and no archive is configured to load it from.",
            config.image
        ),
        "On Debian or Ubuntu, `scripts/setup-debian.sh --configure` (from a checkout, as root) builds one \
         and configures it; elsewhere build one with `image/build-debian.sh --output sandbox.tar` and set \
         MCP_BRIDGE_IMAGE_ARCHIVE=/path/to/sandbox.tar (or run `mcp-code-bridge image load --archive sandbox.tar`), \
         use the Nix package, which sets it, or set MCP_BRIDGE_IMAGE to an image that has python3 \
         (e.g. docker.io/library/python:3.14-slim).",
    ))
}

/// Load `archive` (docker-archive, gzipped or not, or an executable printing one) and check that
/// it provided `config.image`.
#[inline(never)]
pub fn load<'a>(
    docker: &'a Docker,
    config: &'a Config,
    archive: &'a Path,
    progress: &'a (dyn Fn(u64) + Sync),
) -> Boxed<'a, Result<Provenance, ImageError>> {
    Box::pin(load_here(docker, config, archive, progress))
}

async fn load_here(
    docker: &Docker,
    config: &Config,
    archive: &Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Provenance, ImageError> {
    let started = Instant::now();
    let kind = sniff(archive).map_err(|e| {
        ImageError::new(format!(
            "cannot read image archive {}: {e}",
            archive.display()
        ))
    })?;
    tracing::info!(archive = %archive.display(), ?kind, "loading sandbox image");
    let mut child = None;
    let raw: Pin<Box<dyn tokio::io::AsyncRead + Send>> = match kind {
        ArchiveKind::Tar | ArchiveKind::Gzip => Box::pin(
            tokio::fs::File::open(archive)
                .await
                .map_err(|e| ImageError::new(format!("cannot open {}: {e}", archive.display())))?,
        ),
        ArchiveKind::Executable => {
            let mut c = tokio::process::Command::new(archive)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    ImageError::new(format!(
                        "cannot run image stream script {}: {e}",
                        archive.display()
                    ))
                })?;
            let out = c.stdout.take().expect("piped stdout");
            child = Some(c);
            Box::pin(out)
        }
    };
    // A file is checked before anything is sent: the engine may commit an image before it sees
    // the end of the upload, so a late failure could leave a bad image behind. A stream script's
    // output cannot be read twice: it is checked while it streams, and what it loaded is removed
    // on a mismatch.
    let stream_check = match (&config.image_sha256, kind) {
        (Some(want), ArchiveKind::Tar | ArchiveKind::Gzip) => {
            check_file_digest(archive, want).await?;
            None
        }
        (want, _) => want.clone(),
    };
    // Engines load only plain tars (podman refuses a gzipped one), so gzip is undone here.
    let verifier = Verify::new(raw, stream_check);
    let counted = verifier.counter.clone();
    let mismatched = verifier.mismatch.clone();
    let reader: Pin<Box<dyn tokio::io::AsyncRead + Send>> = match kind {
        ArchiveKind::Gzip => Box::pin(async_compression::tokio::bufread::GzipDecoder::new(
            tokio::io::BufReader::with_capacity(1 << 20, verifier),
        )),
        _ => Box::pin(verifier),
    };
    let opts = ImportImageOptionsBuilder::default().quiet(true).build();
    let body = ReaderStream::with_capacity(reader, 1 << 20);
    let mut s = docker.import_image_stream(opts, body, None);
    // Progress while the upload runs (the engine answers only at its end), each value once.
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut reported = 0;
    let mut report = |n: u64| {
        if n != reported {
            reported = n;
            progress(n);
        }
    };
    let mut messages = Vec::new();
    let mut failure = None;
    loop {
        let item = tokio::select! {
            item = s.next() => item,
            _ = ticks.tick() => {
                report(counted.load(std::sync::atomic::Ordering::Relaxed));
                continue;
            }
        };
        match item {
            None => break,
            Some(Ok(info)) => {
                if let Some(m) = info.stream.or(info.status) {
                    messages.push(m.trim().to_string());
                }
                if let Some(e) = info.error_detail.and_then(|d| d.message) {
                    failure = Some(format!(
                        "the engine refused image archive {}: {e}",
                        archive.display()
                    ));
                    break;
                }
            }
            Some(Err(e)) => {
                let n = counted.load(std::sync::atomic::Ordering::Relaxed);
                failure = Some(format!(
                    "loading image archive {} failed after {n} bytes: {e}",
                    archive.display()
                ));
                break;
            }
        }
    }
    drop(s);
    // The digest check ends the upload with an error, which the engine and the HTTP client
    // report in their own words (a broken request): the mismatch is what happened.
    let failure = match (mismatched.get(), failure) {
        (Some((got, want)), _) => Some(mismatch(archive, got, want)),
        (None, why) => why.map(ImageError::new),
    };
    if let Some(e) = failure {
        for loaded in messages.iter().filter_map(|m| loaded_reference(m)) {
            let _ = docker
                .remove_image(
                    loaded,
                    None::<bollard::query_parameters::RemoveImageOptions>,
                    None,
                )
                .await;
        }
        return Err(e);
    }
    if let Some(mut c) = child {
        let status = c.wait().await.map_err(|e| ImageError::new(e.to_string()))?;
        if !status.success() {
            return Err(ImageError::new(format!(
                "image stream script {} failed with {status}",
                archive.display()
            )));
        }
    }
    let bytes = counted.load(std::sync::atomic::Ordering::Relaxed);
    report(bytes);
    if docker.inspect_image(&config.image).await.is_err() {
        // The archive may carry another tag (or none): tag its one image as configured.
        let loaded: Vec<&str> = messages
            .iter()
            .filter_map(|m| loaded_reference(m))
            .collect();
        if let [one] = loaded.as_slice() {
            let (repo, tag) = split_reference(&config.image);
            let opts = bollard::query_parameters::TagImageOptionsBuilder::default()
                .repo(repo)
                .tag(tag)
                .build();
            if let Err(e) = docker.tag_image(one, Some(opts)).await {
                tracing::warn!("could not tag loaded image {one} as {}: {e}", config.image);
            } else {
                tracing::info!("tagged loaded image {one} as {}", config.image);
            }
        }
    }
    if docker.inspect_image(&config.image).await.is_err() {
        return Err(ImageError::hinted(
            format!(
                "archive {} loaded ({}), but it does not contain image {:?}.",
                archive.display(),
                messages.join("; "),
                config.image
            ),
            "Set MCP_BRIDGE_IMAGE to the name it has.",
        ));
    }
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(image = %config.image, bytes, seconds, "sandbox image loaded");
    Ok(Provenance::Loaded {
        archive: archive.display().to_string(),
        bytes,
        seconds,
    })
}

/// Hash a file and compare with `want` (hex).
async fn check_file_digest(path: &Path, want: &str) -> Result<(), ImageError> {
    let got = file_sha256(path).await?;
    if got.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(mismatch(path, &got, want))
    }
}

/// The sha256 of a file, in hex (hashed on a blocking thread).
#[inline(never)]
pub fn file_sha256(path: &Path) -> Boxed<'_, Result<String, ImageError>> {
    Box::pin(file_sha256_here(path))
}

async fn file_sha256_here(path: &Path) -> Result<String, ImageError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || -> io::Result<String> {
        use std::io::Read;
        let mut f = std::fs::File::open(&p)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(hex::encode(h.finalize()));
            }
            h.update(&buf[..n]);
        }
    })
    .await
    .map_err(|e| ImageError::new(e.to_string()))?
    .map_err(|e| ImageError::new(format!("cannot read {}: {e}", path.display())))
}

fn mismatch(archive: &Path, got: &str, want: &str) -> ImageError {
    ImageError::hinted(
        format!(
            "sha256 mismatch: image archive {} has {got}, but image_sha256 expects {want}; nothing was loaded.",
            archive.display()
        ),
        "The archive is damaged or is not the one configured: `mcp-code-bridge doctor` says where each \
         value comes from and which command rebuilds the archive.",
    )
}

/// The image a load message names: `Loaded image: X`, `Loaded image(s): X`, `Loaded image ID: X`.
fn loaded_reference(message: &str) -> Option<&str> {
    let rest = message.trim().strip_prefix("Loaded image")?;
    let (_, r) = rest.split_once(": ")?;
    let r = r.trim();
    (!r.is_empty() && !r.contains(',') && !r.contains(char::is_whitespace)).then_some(r)
}

/// `repo[:tag]` -> (repo, tag), minding registry ports (`host:5000/x`).
fn split_reference(reference: &str) -> (&str, &str) {
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (reference, "latest"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArchiveKind {
    Tar,
    Gzip,
    Executable,
}

fn sniff(path: &Path) -> io::Result<ArchiveKind> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::File::open(path)?;
    let mut head = [0u8; 262];
    let n = f.read(&mut head)?;
    if n >= 2 && head[..2] == [0x1f, 0x8b] {
        return Ok(ArchiveKind::Gzip);
    }
    if n >= 262 && &head[257..262] == b"ustar" {
        return Ok(ArchiveKind::Tar);
    }
    if f.metadata()?.permissions().mode() & 0o111 != 0 {
        return Ok(ArchiveKind::Executable);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "neither a tar, a tar.gz, nor an executable",
    ))
}

/// A reader that hashes what passes and, when the digest does not match at the end, fails
/// instead of reaching a clean end, so the engine sees a broken upload and loads nothing. The
/// digests of a mismatch are also left in `mismatch`, for the caller to report.
struct Verify<R> {
    inner: R,
    hasher: Option<Sha256>,
    expected: Option<String>,
    counter: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// (got, expected) when the digest did not match.
    mismatch: std::sync::Arc<std::sync::OnceLock<(String, String)>>,
}

impl<R> Verify<R> {
    fn new(inner: R, expected: Option<String>) -> Self {
        Verify {
            inner,
            hasher: Some(Sha256::new()),
            expected: expected.map(|e| e.to_ascii_lowercase()),
            counter: Default::default(),
            mismatch: Default::default(),
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Verify<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if !new.is_empty() {
                    let n = new.len() as u64;
                    if let Some(h) = self.hasher.as_mut() {
                        h.update(new);
                    }
                    self.counter
                        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                // End of input: check the digest, once.
                let Some(h) = self.hasher.take() else {
                    return Poll::Ready(Ok(()));
                };
                let got = hex::encode(h.finalize());
                match self.expected.clone() {
                    Some(want) if want != got => {
                        let msg = format!(
                            "sha256 mismatch: the archive has {got}, but image_sha256 expects {want}"
                        );
                        let _ = self.mismatch.set((got, want));
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, msg)))
                    }
                    _ => Poll::Ready(Ok(())),
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_detection() {
        assert!(names_registry("docker.io/library/python:3.14-slim"));
        assert!(names_registry("registry:5000/x"));
        assert!(!names_registry("mcp-code-bridge-sandbox:latest"));
        assert!(!names_registry("localhost/mcp-code-bridge-sandbox:latest"));
        assert!(!names_registry("library/python"));
    }

    #[test]
    fn load_messages_and_references() {
        assert_eq!(
            loaded_reference("Loaded image: localhost/x:latest"),
            Some("localhost/x:latest")
        );
        assert_eq!(
            loaded_reference("Loaded image(s): sha256:abc"),
            Some("sha256:abc")
        );
        assert_eq!(
            loaded_reference("Loaded image ID: sha256:abc\n"),
            Some("sha256:abc")
        );
        assert_eq!(loaded_reference("Loaded image(s): a:1,b:2"), None);
        assert_eq!(loaded_reference("Getting image source signatures"), None);
        assert_eq!(split_reference("x:1"), ("x", "1"));
        assert_eq!(split_reference("host:5000/x"), ("host:5000/x", "latest"));
        assert_eq!(split_reference("host:5000/x:2"), ("host:5000/x", "2"));
    }

    #[tokio::test]
    async fn verify_passes_matching_and_fails_mismatching_digests() {
        use tokio::io::AsyncReadExt;
        let good = hex::encode(Sha256::digest(b"hello"));
        let mut out = Vec::new();
        Verify::new(&b"hello"[..], Some(good))
            .read_to_end(&mut out)
            .await
            .unwrap();
        assert_eq!(out, b"hello");
        let mut v = Verify::new(&b"hello"[..], Some("00".repeat(32)));
        let err = v.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        let (got, want) = v
            .mismatch
            .get()
            .expect("the mismatch is kept for the caller");
        assert_eq!(got, &hex::encode(Sha256::digest(b"hello")));
        assert_eq!(want, &"00".repeat(32));
    }
}
