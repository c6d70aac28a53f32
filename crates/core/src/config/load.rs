//! Loading: built-in defaults < system file < user file < `--config` < `MCP_BRIDGE_*` environment <
//! command-line flags, layered with figment, with where each value came from.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::{Figment, Metadata};

use super::effective::{Config, Overrides};
use super::error::ConfigError;
use super::keys::{ENV_PREFIX, closest_key, env_name, key_of_env};
use super::source::source_from;
pub use super::source::{SETUP_MARKER, SYSTEM_CONFIG_ENV, Source};

/// The system configuration file, the lowest file layer.
pub const SYSTEM_CONFIG: &str = "/etc/mcp-code-bridge/config.toml";

/// Which system configuration file is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemConfig {
    /// [`SYSTEM_CONFIG`], read when it exists.
    Default(PathBuf),
    /// The file [`SYSTEM_CONFIG_ENV`] names; it must exist.
    FromEnv(PathBuf),
    /// `MCP_BRIDGE_SYSTEM_CONFIG=none` (or empty): no system file.
    Disabled,
}

impl SystemConfig {
    /// Which system file this process reads, from `MCP_BRIDGE_SYSTEM_CONFIG` (unset: the
    /// default path; empty or `none`: none).
    pub fn from_env() -> SystemConfig {
        match std::env::var_os(SYSTEM_CONFIG_ENV) {
            None => SystemConfig::Default(PathBuf::from(SYSTEM_CONFIG)),
            Some(v) if v.is_empty() || v.eq_ignore_ascii_case("none") => SystemConfig::Disabled,
            Some(v) => SystemConfig::FromEnv(PathBuf::from(v)),
        }
    }

    /// The system file to read, whether or not it exists; `None` when disabled.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SystemConfig::Default(p) | SystemConfig::FromEnv(p) => Some(p),
            SystemConfig::Disabled => None,
        }
    }
}

/// The loaded configuration with the figment it came from, for provenance.
pub struct Loaded {
    /// The configuration, checked.
    pub config: Config,
    figment: Figment,
    /// The config files read, lowest precedence first.
    pub files: Vec<PathBuf>,
    /// The system file in force (moved or turned off by `MCP_BRIDGE_SYSTEM_CONFIG`).
    pub system: SystemConfig,
    /// Things the user should know and may have got wrong (unknown `MCP_BRIDGE_*` variables).
    pub warnings: Vec<String>,
    /// Decisions taken while loading (a digest that belongs to another archive, dropped).
    pub notes: Vec<String>,
}

impl Loaded {
    /// Where the value of `key` came from, as a person would say it.
    pub fn source_of(&self, key: &str) -> String {
        self.source(key).to_string()
    }

    /// Where the value of `key` came from.
    pub fn source(&self, key: &str) -> Source {
        match self.figment.find_metadata(key) {
            Some(meta) => source_from(meta, key),
            None => Source::Default,
        }
    }
}

/// The TOML files looked at, lowest precedence first: system, user, then `--config`.
pub fn config_files(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = SystemConfig::from_env()
        .path()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    if let Some(cfg) = directories::BaseDirs::new().map(|d| d.config_dir().to_path_buf()) {
        files.push(cfg.join("mcp-code-bridge/config.toml"));
    }
    if let Some(p) = explicit {
        files.push(p.to_path_buf());
    }
    files
}

/// The `MCP_BRIDGE_*` variables with their values kept as written. figment's own `Env` parses
/// values, which is lossy for strings that look like numbers (a sha256 of digits, a uid): every
/// field here accepts text instead.
#[derive(Clone)]
struct EnvStrings(Env);

impl figment::Provider for EnvStrings {
    fn metadata(&self) -> Metadata {
        self.0.metadata()
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        // A section's key (`policy.default`) becomes a nested dict, as TOML's `[policy]` does.
        let mut dict = figment::value::Dict::new();
        for (k, v) in self.0.iter() {
            let mut at = &mut dict;
            let mut parts = k.as_str().split('.').peekable();
            while let Some(part) = parts.next() {
                if parts.peek().is_none() {
                    at.insert(part.to_string(), figment::value::Value::from(v.clone()));
                    break;
                }
                let entry = at
                    .entry(part.to_string())
                    .or_insert_with(|| figment::value::Dict::new().into());
                match entry {
                    figment::value::Value::Dict(_, d) => at = d,
                    _ => break,
                }
            }
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

/// Load the layered configuration. Errors name the key, the bad value and its source.
pub fn load(explicit: Option<&Path>, overrides: &Overrides) -> Result<Loaded, ConfigError> {
    if let Some(p) = explicit
        && !p.is_file()
    {
        return Err(ConfigError::MissingFile(p.to_path_buf()));
    }
    let system = SystemConfig::from_env();
    if let SystemConfig::FromEnv(p) = &system
        && !p.is_file()
    {
        return Err(ConfigError::MissingSystemFile(p.clone()));
    }
    let files = config_files(explicit);
    let env = EnvStrings(
        Env::prefixed(ENV_PREFIX).filter_map(|k| key_of_env(k.as_str()).map(|k| k.name.into())),
    );
    // Every layer above the defaults, lowest first, also kept apart: which layer set what.
    let mut layers: Vec<Figment> = Vec::new();
    let mut read = Vec::new();
    for f in &files {
        if f.is_file() {
            layers.push(Figment::from(Toml::file_exact(f)));
            read.push(f.clone());
        }
    }
    layers.push(Figment::from(env));
    layers.push(Figment::from(Serialized::defaults(overrides)));
    let figment = layers.iter().fold(
        Figment::from(Serialized::defaults(Config::default())),
        |acc, layer| acc.merge(layer.clone()),
    );
    let mut config: Config = figment.extract().map_err(ConfigError::from_figment)?;
    let mut loaded = Loaded {
        config: Config::default(),
        figment,
        files: read,
        system,
        warnings: unknown_variables(std::env::vars_os().map(|(k, _)| k)),
        notes: Vec::new(),
    };
    if let Some(note) = digest_of_another_archive(&config, &layers, &loaded) {
        config.image_sha256 = None;
        loaded.notes.push(note);
    }
    if let Err((key, why)) = config.validate() {
        return Err(ConfigError::Invalid {
            key,
            origin: loaded.source(key),
            why,
        });
    }
    loaded.config = config;
    Ok(loaded)
}

/// `image_archive` and `image_sha256` are one fact. When the layer that gave the digest also
/// names an archive, and that is not the archive in force (a higher layer set another one without
/// a digest), the digest is of that other archive: it is dropped, and this says why.
fn digest_of_another_archive(
    config: &Config,
    layers: &[Figment],
    loaded: &Loaded,
) -> Option<String> {
    let archive = config.image_archive.as_ref()?;
    config.image_sha256.as_ref()?;
    let text = |layer: &Figment, key: &str| -> Option<String> {
        layer
            .find_value(key)
            .ok()
            .and_then(|v| v.into_string())
            .map(|s| s.trim().to_string())
    };
    // The layer the digest came from: the highest one that sets it.
    let digest_layer = layers
        .iter()
        .rev()
        .find(|l| l.find_value("image_sha256").is_ok())?;
    let its_archive = text(digest_layer, "image_archive").filter(|s| !s.is_empty())?;
    if Path::new(&its_archive) == archive.as_path() {
        return None;
    }
    Some(format!(
        "ignoring image_sha256 from {}: it is the digest of the image_archive that layer names ({its_archive}), \
         not of {} (image_archive from {})",
        loaded.source("image_sha256"),
        archive.display(),
        loaded.source("image_archive"),
    ))
}

/// Variables that start with `MCP_BRIDGE_` but are not settings, with the closest key. The
/// project's own test and benchmark variables (`MCP_BRIDGE_TEST_*`, `MCP_BRIDGE_BENCH_*`) and
/// `MCP_BRIDGE_SYSTEM_CONFIG` are not settings either, and are meant.
pub(super) fn unknown_variables(names: impl Iterator<Item = std::ffi::OsString>) -> Vec<String> {
    let mut out: Vec<String> = names
        .filter_map(|n| n.into_string().ok())
        .filter(|n| {
            n.strip_prefix(ENV_PREFIX).is_some_and(|rest| {
                !rest.is_empty()
                    && n != SYSTEM_CONFIG_ENV
                    && !rest.starts_with("TEST_")
                    && !rest.starts_with("BENCH_")
                    && key_of_env(rest).is_none()
            })
        })
        .map(|n| {
            let rest = n[ENV_PREFIX.len()..].to_ascii_lowercase();
            let closest = closest_key(&rest);
            format!(
                "{n} is not a setting and is ignored; did you mean {}?",
                env_name(closest)
            )
        })
        .collect();
    out.sort();
    out
}

// figment::Jail fixes the closure's error type (a large figment::Error).
#[cfg(test)]
#[allow(clippy::result_large_err)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::LogLevel;
    use crate::error::Hinted as _;

    /// No test here reads the machine's system config file.
    fn isolate(jail: &mut figment::Jail) {
        jail.set_env(SYSTEM_CONFIG_ENV, "none");
    }

    /// `load` of `c.toml` in the jail with no command-line overrides.
    fn load_c() -> Result<Loaded, String> {
        load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.report())
    }

    /// `load_c` must fail, and its message contain every one of `parts`.
    fn assert_load_c_names(parts: &[&str]) {
        let err = load_c().err().expect("the config was accepted");
        let missing: Vec<&&str> = parts.iter().filter(|p| !err.contains(**p)).collect();
        assert!(missing.is_empty(), "{missing:?} not in: {err}");
    }

    #[test]
    fn figment_layers_env_over_toml_and_names_bad_values() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "timeout = \"10s\"\nmemory = \"256m\"\n[servers.time]\ncommand = \"uvx\"\nargs = [\"mcp-server-time\"]\n")?;
            jail.set_env("MCP_BRIDGE_MEMORY", "1g");
            jail.set_env("MCP_BRIDGE_LOG_LEVEL", "WARNING");
            jail.set_env("MCP_BRIDGE_ALLOW_SELF_SERVER", "1");
            jail.set_env("MCP_BRIDGE_TEST_SOMETHING_ELSE", "x");
            let l = load_c()?;
            assert_eq!(l.config.timeout.0, Duration::from_secs(10));
            assert_eq!(l.config.memory.0, 1 << 30);
            assert_eq!(l.config.log_level, LogLevel::Warn);
            assert!(l.config.allow_self_server);
            assert_eq!(l.config.servers["time"].command.as_deref(), Some("uvx"));
            assert_eq!(
                l.source_of("memory"),
                "environment variable MCP_BRIDGE_MEMORY"
            );
            assert!(l.warnings.is_empty(), "{:?}", l.warnings);
            assert!(l.source_of("timeout").ends_with("c.toml"));
            assert_eq!(l.source_of("pids"), "default");

            // Values that look like numbers stay text where text is meant.
            jail.set_env("MCP_BRIDGE_IMAGE_SHA256", "0".repeat(64));
            jail.set_env("MCP_BRIDGE_PIDS", "64");
            let l = load_c()?;
            assert_eq!(
                l.config.image_sha256.as_deref(),
                Some("0".repeat(64).as_str())
            );
            assert_eq!(l.config.pids, 64);

            let o = Overrides {
                memory: Some("128m".into()),
                ..Default::default()
            };
            let l = load(Some(Path::new("c.toml")), &o).map_err(|e| e.report())?;
            assert_eq!(l.config.memory.0, 128 << 20);

            jail.set_env("MCP_BRIDGE_TIMEOUT", "soon");
            assert_load_c_names(&["`timeout`", "soon", "MCP_BRIDGE_TIMEOUT"]);
            Ok(())
        });
    }

    #[test]
    fn out_of_range_values_name_the_key_and_their_source() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "max_sessions = 0\n")?;
            assert_load_c_names(&["`max_sessions`", "c.toml", "at least 1"]);
            jail.create_file("c.toml", "")?;
            jail.set_env("MCP_BRIDGE_UPSTREAM_START_TIMEOUT", "0");
            assert_load_c_names(&["`upstream_start_timeout`", "environment"]);
            jail.set_env("MCP_BRIDGE_UPSTREAM_START_TIMEOUT", "5m");
            jail.set_env("MCP_BRIDGE_MAX_SESSIONS", "3");
            let l = load_c()?;
            assert_eq!(l.config.upstream_start_timeout.0, Duration::from_secs(300));
            assert_eq!(l.config.max_sessions, 3);
            Ok(())
        });
    }

    #[test]
    fn unknown_toml_key_is_named_with_its_file() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "timout = 5\n")?;
            assert_load_c_names(&[
                "unknown key `timout` in ",
                "c.toml\nhint: did you mean `timeout`?",
            ]);
            jail.create_file("c.toml", "[servers.x]\ncomand = \"x\"\n")?;
            assert_load_c_names(&["comand", "did you mean `command`?"]);
            Ok(())
        });
    }

    #[test]
    fn a_misspelt_runtime_is_refused_at_load_naming_key_value_and_closest_engine() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "runtime = \"podmn\"\n")?;
            assert_load_c_names(&[
                "invalid value for `runtime` from ",
                "c.toml",
                "`podmn` is not one of: auto, podman, docker",
                "did you mean `podman`?",
            ]);
            jail.create_file("c.toml", "")?;
            jail.set_env("MCP_BRIDGE_RUNTIME", "unix:///run/x.sock");
            let l = load_c()?;
            assert_eq!(
                l.config.runtime,
                crate::config::Runtime::Socket("unix:///run/x.sock".into())
            );
            Ok(())
        });
    }

    #[test]
    fn errors_say_each_thing_once() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "")?;
            jail.set_env("MCP_BRIDGE_OUTPUT_MODE", "fancy");
            let err = load_c().err().expect("fancy is not an output mode");
            assert_eq!(
                err,
                "invalid value for `output_mode` from environment variable \
                 MCP_BRIDGE_OUTPUT_MODE: `fancy` is not one of: compact, toon"
            );
            jail.set_env("MCP_BRIDGE_OUTPUT_MODE", "toon");
            jail.set_env("MCP_BRIDGE_CONTAINER_USER", "0");
            let err = load_c().err().expect("uid 0 is refused");
            assert!(
                err.starts_with(
                    "invalid value for `container_user` from environment variable \
                     MCP_BRIDGE_CONTAINER_USER: the sandbox never runs as root"
                ),
                "{err}"
            );
            jail.set_env("MCP_BRIDGE_CONTAINER_USER", "1000");
            jail.create_file("c.toml", "timeout = \"soon\"\n")?;
            let err = load_c().err().expect("soon is not a duration");
            assert!(
                err.starts_with("invalid value for `timeout` from ")
                    && err.contains("c.toml: \"soon\" is not a duration"),
                "{err}"
            );
            assert!(
                !err.contains("``") && !err.contains("environment (environment"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn the_system_config_file_can_be_moved_or_turned_off() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("system.toml", "memory = \"1g\"\n")?;
            jail.set_env(SYSTEM_CONFIG_ENV, "system.toml");
            let l = load(None, &Overrides::default()).map_err(|e| e.report())?;
            assert_eq!(l.config.memory.0, 1 << 30);
            assert!(
                matches!(l.source("memory"), Source::File(p) if p.ends_with("system.toml")),
                "{:?}",
                l.source("memory")
            );
            assert_eq!(l.system, SystemConfig::FromEnv("system.toml".into()));
            assert_eq!(config_files(None)[0], Path::new("system.toml"));

            for off in ["none", "NONE", ""] {
                jail.set_env(SYSTEM_CONFIG_ENV, off);
                let l = load(None, &Overrides::default()).map_err(|e| e.report())?;
                assert_eq!(l.config.memory.0, 512 << 20, "{off:?}");
                assert_eq!(l.system, SystemConfig::Disabled);
                assert!(
                    !config_files(None)
                        .iter()
                        .any(|f| f.ends_with("system.toml"))
                );
                assert!(
                    !config_files(None)
                        .iter()
                        .any(|f| f == Path::new(SYSTEM_CONFIG))
                );
            }

            jail.set_env(SYSTEM_CONFIG_ENV, "missing.toml");
            let err = load(None, &Overrides::default()).err().unwrap().report();
            assert!(
                err.contains("missing.toml")
                    && err.contains(SYSTEM_CONFIG_ENV)
                    && err.contains("\nhint: ")
                    && err.contains("`none`"),
                "{err}"
            );
            Ok(())
        });
        // Unset, it is the usual file (read only when it exists).
        assert_eq!(
            SystemConfig::Default(SYSTEM_CONFIG.into()).path(),
            Some(Path::new("/etc/mcp-code-bridge/config.toml"))
        );
    }

    #[test]
    fn a_digest_does_not_follow_its_archive_into_another_layer() {
        let a = "0".repeat(64);
        let b = "1".repeat(64);
        figment::Jail::expect_with(|jail| {
            jail.set_env(SYSTEM_CONFIG_ENV, "system.toml");
            jail.create_file(
                "system.toml",
                &format!("image_archive = \"/cache/a.tar\"\nimage_sha256 = \"{a}\"\n"),
            )?;
            jail.create_file("c.toml", "")?;
            // The system file alone: its archive with its digest.
            let l = load_c()?;
            assert_eq!(l.config.image_sha256.as_deref(), Some(a.as_str()));
            assert!(l.notes.is_empty());

            // Another archive from the environment, without a digest: the system file's digest
            // is of its own archive, not of this one.
            jail.set_env("MCP_BRIDGE_IMAGE_ARCHIVE", "/tmp/b.tar");
            let l = load_c()?;
            assert_eq!(
                l.config.image_archive.as_deref(),
                Some(Path::new("/tmp/b.tar"))
            );
            assert_eq!(l.config.image_sha256, None);
            let note = l.notes.join("\n");
            assert!(
                note.contains("ignoring image_sha256 from ")
                    && note.contains("system.toml: it is the digest of")
                    && note.contains("/cache/a.tar")
                    && note.contains("/tmp/b.tar")
                    && note.contains("environment variable MCP_BRIDGE_IMAGE_ARCHIVE"),
                "{note}"
            );

            // The same archive named again keeps its digest.
            jail.set_env("MCP_BRIDGE_IMAGE_ARCHIVE", "/cache/a.tar");
            let l = load_c()?;
            assert_eq!(l.config.image_sha256.as_deref(), Some(a.as_str()));

            // Both from the environment: that pair wins together.
            jail.set_env("MCP_BRIDGE_IMAGE_ARCHIVE", "/tmp/b.tar");
            jail.set_env("MCP_BRIDGE_IMAGE_SHA256", &b);
            let l = load_c()?;
            assert_eq!(l.config.image_sha256.as_deref(), Some(b.as_str()));
            assert!(l.notes.is_empty());

            // A digest alone (a layer naming no archive) is for whatever archive is in force.
            jail.clear_env();
            jail.set_env(SYSTEM_CONFIG_ENV, "system.toml");
            jail.create_file("system.toml", &format!("image_sha256 = \"{a}\"\n"))?;
            jail.create_file("c.toml", "image_archive = \"/tmp/c.tar\"\n")?;
            let l = load_c()?;
            assert_eq!(l.config.image_sha256.as_deref(), Some(a.as_str()));

            // A --config file or a flag that names another archive drops it too.
            jail.create_file(
                "system.toml",
                &format!("image_archive = \"/cache/a.tar\"\nimage_sha256 = \"{a}\"\n"),
            )?;
            let l = load_c()?;
            assert_eq!(l.config.image_sha256, None);
            assert!(l.notes[0].contains("c.toml"), "{:?}", l.notes);
            jail.create_file("c.toml", "")?;
            let o = Overrides {
                image_archive: Some("/tmp/d.tar".into()),
                ..Default::default()
            };
            let l = load(Some(Path::new("c.toml")), &o).map_err(|e| e.report())?;
            assert_eq!(l.config.image_sha256, None);
            assert!(
                l.notes[0].contains("command line (--image-archive)"),
                "{:?}",
                l.notes
            );
            Ok(())
        });
    }

    #[test]
    fn unknown_variables_are_named_with_the_closest_key() {
        let warn = |names: &[&str]| unknown_variables(names.iter().map(|n| n.into()));
        let w = warn(&["MCP_BRIDGE_TIMOUT"]);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("MCP_BRIDGE_TIMOUT is not a setting and is ignored; did you mean MCP_BRIDGE_TIMEOUT?"),
            "{w:?}"
        );
        assert!(warn(&["MCP_BRIDGE_MEM"])[0].contains("MCP_BRIDGE_MEMORY?"));
        assert!(warn(&["MCP_BRIDGE_ARCHIVE"])[0].contains("MCP_BRIDGE_IMAGE_ARCHIVE?"));
        assert!(warn(&["MCP_BRIDGE_IMAGE_SHA"])[0].contains("MCP_BRIDGE_IMAGE_SHA256?"));
        assert!(warn(&["MCP_BRIDGE_SERVER_FILE"])[0].contains("MCP_BRIDGE_SERVERS_FILE?"));
        let typo = warn(&["MCP_BRIDGE_TYPO"]);
        assert!(
            typo[0].contains(&format!(
                "did you mean MCP_BRIDGE_{}?",
                closest_key("typo").to_ascii_uppercase()
            )),
            "{typo:?}"
        );
        // Settings, the system-file variable and the project's test and bench variables.
        assert!(
            warn(&[
                "MCP_BRIDGE_TIMEOUT",
                "MCP_BRIDGE_SYSTEM_CONFIG",
                "MCP_BRIDGE_TEST_IMAGE_ARCHIVE",
                "MCP_BRIDGE_BENCH_BIN",
                "MCP_BRIDGE_",
                "OTHER_TIMEOUT",
            ])
            .is_empty()
        );
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file("c.toml", "")?;
            jail.set_env("MCP_BRIDGE_TYPO", "1");
            let l = load_c()?;
            assert!(
                l.warnings.iter().any(|w| w.starts_with("MCP_BRIDGE_TYPO ")),
                "{:?}",
                l.warnings
            );
            Ok(())
        });
    }

    #[test]
    fn preload_is_a_list_in_toml_and_comma_separated_in_the_environment() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file(
                "c.toml",
                "preload = [\"numpy\", \"scipy.linalg\"]\npool_size = 2\n",
            )?;
            let l = load_c()?;
            assert_eq!(l.config.preload.0, ["numpy", "scipy.linalg"]);
            assert_eq!(l.config.pool_size, 2);
            assert!(l.config.warm_start);
            jail.set_env("MCP_BRIDGE_PRELOAD", "pandas, json");
            jail.set_env("MCP_BRIDGE_WARM_START", "false");
            let l = load_c()?;
            assert_eq!(l.config.preload.0, ["pandas", "json"]);
            assert!(!l.config.warm_start);
            jail.set_env("MCP_BRIDGE_PRELOAD", "");
            assert!(load_c()?.config.preload.0.is_empty());
            jail.set_env("MCP_BRIDGE_PRELOAD", "numpy,os; import x");
            assert_load_c_names(&["`preload`", "environment", "os; import x"]);
            Ok(())
        });
    }

    #[test]
    fn flows_are_a_section_in_policy_and_variables_and_their_errors_name_key_and_origin() {
        figment::Jail::expect_with(|jail| {
            isolate(jail);
            jail.create_file(
                "c.toml",
                "[policy.flows]\nenabled = true\nacting = [\"bank.*\"]\nguard = { \"bank.send_money\" = [\"recipient\", \"amount\"] }\n",
            )?;
            let l = load_c()?;
            let f = &l.config.policy.flows;
            assert!(f.enabled && f.annotations);
            assert_eq!(f.acting.0, ["bank.*"]);
            assert_eq!(f.guard.0["bank.send_money"], ["recipient", "amount"]);
            assert!(l.source_of("policy.flows.acting").ends_with("c.toml"));
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_UNTRUSTED", "mail.read_*, web.*");
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_GUARD", "mail.send=to+cc");
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_ON_SUSPECT", "deny");
            let l = load_c()?;
            let f = &l.config.policy.flows;
            assert_eq!(f.untrusted.0, ["mail.read_*", "web.*"]);
            assert_eq!(f.guard.0["mail.send"], ["to", "cc"]);
            assert_eq!(f.on_suspect, crate::config::flows::OnSuspect::Deny);
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_OPEN", "web");
            assert_load_c_names(&[
                "`policy.flows.open`",
                "environment variable MCP_BRIDGE_POLICY_FLOWS_OPEN",
                "has no '.'",
            ]);
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_OPEN", "");
            jail.set_env("MCP_BRIDGE_POLICY_FLOWS_ON_SUSPECT", "maybe");
            assert_load_c_names(&["policy.flows.on_suspect", "maybe"]);
            Ok(())
        });
    }
}
