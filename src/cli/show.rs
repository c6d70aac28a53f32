//! `config`: every key with its value and where it came from, then the files read and any notes.

use std::path::PathBuf;

use bridge_core::config::{self, KEYS};

pub(super) fn print_config(loaded: &config::Loaded) {
    let v = serde_json::to_value(&loaded.config).unwrap_or_default();
    let width = KEYS.iter().map(|k| k.name.len()).max().unwrap_or(10);
    for k in KEYS {
        let val = match k.name.split('.').fold(&v, |v, part| &v[part]) {
            serde_json::Value::Null => "(unset)".to_string(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut source = loaded.source_of(k.name);
        if k.name == "image_sha256" && loaded.config.image_sha256.is_none() && source != "default" {
            source.push_str(", ignored (see the note below)");
        }
        println!("{:width$} = {:24} # {source}", k.name, val);
    }
    for (name, entry) in &loaded.config.servers {
        let what = entry
            .command
            .clone()
            .or(entry.url.clone())
            .unwrap_or_default();
        println!(
            "servers.{name} = {what} # {}",
            loaded.source_of(&format!("servers.{name}"))
        );
    }
    let list = |files: &[PathBuf]| {
        files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if loaded.files.is_empty() {
        println!(
            "# no config file found; looked at: {}",
            list(&config::config_files(None))
        );
    } else {
        println!("# config files read: {}", list(&loaded.files));
    }
    match &loaded.system {
        config::SystemConfig::Default(_) => {}
        config::SystemConfig::FromEnv(p) => println!(
            "# system config file {} (from {})",
            p.display(),
            config::SYSTEM_CONFIG_ENV
        ),
        config::SystemConfig::Disabled => println!(
            "# no system config file ({}=none)",
            config::SYSTEM_CONFIG_ENV
        ),
    }
    for n in &loaded.notes {
        println!("# note: {n}");
    }
    for w in &loaded.warnings {
        println!("# warning: {w}");
    }
}
