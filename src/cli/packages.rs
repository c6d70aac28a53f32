//! `packages list|prune`: the host's cache of the wheels sessions installed
//! (`runtime.install`), read and pruned in the same store the bridge uses
//! (`bridge_packages::store`). Pruning never touches a session's installed files: they are
//! hard links, which outlive the cache's.

use std::process::ExitCode;

use bridge_core::config::Config;
use bridge_packages::store::Store;

fn store(config: &Config) -> Store {
    Store::new(config.state_dir.join("packages").join("cache"))
}

pub(super) fn list(config: &Config, json: bool) -> ExitCode {
    let store = store(config);
    let wheels = store.list();
    let total: u64 = wheels.iter().map(|w| w.size).sum();
    if json {
        let v = serde_json::json!({"wheels": wheels, "bytes": total, "max_bytes": config.packages.cache_max_size.0});
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    println!("{:40}  {:>10}  SHA256", "DISTRIBUTION", "BYTES");
    for w in &wheels {
        let dist = if w.dist.is_empty() {
            "(not unpacked)"
        } else {
            &w.dist
        };
        println!(
            "{:40}  {:>10}  {}",
            bridge_core::text::visible(dist),
            w.size,
            w.sha256
        );
    }
    println!(
        "{} wheel(s), {} bytes in {} (packages.cache_max_size {})",
        wheels.len(),
        total,
        store.root().display(),
        config.packages.cache_max_size
    );
    ExitCode::SUCCESS
}

pub(super) fn prune(config: &Config, all: bool) -> ExitCode {
    let store = store(config);
    let keep = if all {
        0
    } else {
        config.packages.cache_max_size.0
    };
    match store.prune(keep) {
        Ok(Some((n, freed))) => {
            println!("removed {n} wheel(s), {freed} bytes");
            ExitCode::SUCCESS
        }
        Ok(None) => super::term::fail(&bridge_packages::PackageError::CacheBusy, 1),
        Err(e) => super::term::fail(&e, 1),
    }
}
