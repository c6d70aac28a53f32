//! What a reply may carry as images: the types clients show, and the bounds of one reply
//! (count, raw size, base64 total), for `display()`ed figures (checked frame by frame) and for
//! the image files of `/workspace/out` shown inline beside their links.

use super::files::{OUT_DIR, OutStore};
use super::output::ExecOutcome;

/// Images returned per call.
pub(crate) const MAX_IMAGES: usize = 16;
/// Base64 bytes of all images of one reply together: with the output cap's text (which appears
/// twice, as content and as structured content) a reply stays within the 16 MiB of one message
/// that stdio clients such as rmcp's accept; a larger one would never be read.
pub(crate) const MAX_IMAGES_TOTAL: usize = 12 << 20;
/// Largest image `display()` may return, raw; the runtime refuses larger ones with the same
/// number (sent in the boot frame, `sandbox::runtime`).
pub(crate) const MAX_IMAGE_BYTES: usize = 6 << 20;

/// Whether a `display` frame holds an image a client can show: an allowed type whose bytes are
/// valid base64, no larger than [`MAX_IMAGE_BYTES`], and start as that type's files do.
pub(super) fn check_image(mime: &str, data: &str) -> Result<(), BadImage> {
    use base64::Engine as _;
    let magic: &[&[u8]] = match mime {
        "image/png" => &[b"\x89PNG\r\n\x1a\n"],
        "image/jpeg" => &[b"\xff\xd8\xff"],
        "image/gif" => &[b"GIF87a", b"GIF89a"],
        "image/webp" => &[b"RIFF"],
        _ => return Err(BadImage::Type(mime.chars().take(60).collect())),
    };
    if data.len() > MAX_IMAGE_BYTES.div_ceil(3) * 4 {
        return Err(BadImage::TooLarge);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| BadImage::NotBase64)?;
    if !magic.iter().any(|m| bytes.starts_with(m)) {
        return Err(BadImage::NotThatType(mime.to_string()));
    }
    Ok(())
}

/// Why a `display` frame's image is not returned ([`check_image`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadImage {
    /// Its type (cut to 60 characters) is none a client accepts.
    #[error("type {0:?} is not an image type clients accept (PNG, JPEG, GIF, WebP)")]
    Type(String),
    /// Its data is over [`MAX_IMAGE_BYTES`].
    #[error("larger than {} MiB", MAX_IMAGE_BYTES >> 20)]
    TooLarge,
    /// Its data is not base64.
    #[error("the data is not valid base64")]
    NotBase64,
    /// Its bytes do not start as its type's files do.
    #[error("the bytes are not a {0} file")]
    NotThatType(String),
}

/// Images among the call's new files are also shown inline, as `display()`ed ones are, within
/// the same bounds (count, size, base64 total of one reply); an image whose bytes the code also
/// displayed is not shown twice. One that does not fit stays a link, and a notice says why.
pub(crate) fn inline_images(outcome: &mut ExecOutcome, store: &OutStore) {
    use base64::Engine as _;
    const SHOWN: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
    for f in outcome
        .files
        .iter()
        .filter(|f| SHOWN.contains(&f.mime.as_str()))
    {
        let b64_len = (f.size as usize).div_ceil(3) * 4;
        let total: usize = outcome.images.iter().map(|(_, d)| d.len()).sum();
        let why = if f.size as usize > MAX_IMAGE_BYTES {
            Some(format!("larger than {} MiB", MAX_IMAGE_BYTES >> 20))
        } else if outcome.images.len() >= MAX_IMAGES {
            Some(format!("at most {MAX_IMAGES} images are shown per call"))
        } else if total + b64_len > MAX_IMAGES_TOTAL {
            Some(format!(
                "the images of one call may total {} MiB of base64",
                MAX_IMAGES_TOTAL >> 20
            ))
        } else {
            None
        };
        if let Some(why) = why {
            outcome.notices.push(format!(
                "{OUT_DIR}/{} is returned as a link only, not shown: {why}",
                f.name
            ));
            continue;
        }
        let Ok(Some((_, bytes))) = store.read(&f.name) else {
            continue;
        };
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        if outcome.images.iter().any(|(_, d)| *d == data) {
            continue;
        }
        outcome.images.push((f.mime.clone(), data));
    }
}
