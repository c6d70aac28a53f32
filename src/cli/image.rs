//! `image load`: load the image archive into the engine, with a progress bar on a terminal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::term::{Usage, fail, load_bar};
use bridge_core::config::Config;
use bridge_sandbox::engine::Engine;
use bridge_sandbox::image;

pub(super) async fn image_load(config: Arc<Config>, archive: Option<PathBuf>) -> ExitCode {
    let Some(archive) = archive.or(config.image_archive.clone()) else {
        return fail(
            &Usage::new("no image archive to load").hint(
                "pass --archive FILE, or set image_archive (MCP_BRIDGE_IMAGE_ARCHIVE); \
                 `scripts/setup-debian.sh --configure` builds and configures one",
            ),
            2,
        );
    };
    let engine = match Engine::connect(&config).await {
        Ok(e) => e,
        Err(e) => return fail(&e, 2),
    };
    // The configured digest is of the configured archive: another one is loaded unchecked.
    let image_sha256 = if config.image_archive.as_ref() == Some(&archive) {
        config.image_sha256.clone()
    } else {
        if config.image_sha256.is_some() {
            tracing::info!(
                "not checking {} against image_sha256: that is the digest of the configured archive",
                archive.display()
            );
        }
        None
    };
    let config = Arc::new(Config {
        image_archive: Some(archive.clone()),
        image_sha256,
        ..(*config).clone()
    });
    let bar = load_bar(&config);
    let report = |bytes: u64| {
        if let Some((_, f)) = &bar {
            f(bytes)
        }
    };
    let r = image::load(&engine.docker, &config, &archive, &report).await;
    if let Some((bar, _)) = &bar {
        bar.finish_and_clear();
    }
    engine.shutdown().await;
    match r {
        Ok(image::Provenance::Loaded { bytes, seconds, .. }) => {
            println!(
                "loaded {} ({} MiB in {seconds:.1}s)",
                config.image,
                bytes >> 20
            );
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e, 1),
    }
}
