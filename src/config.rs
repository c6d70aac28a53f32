//! Configuration: built-in defaults < TOML files < `MCP_BRIDGE_*` environment < command-line flags,
//! layered with figment. [`KEYS`] is the one list of keys: the env filter, `config` output and the
//! README's reference all come from it, and a unit test keeps it equal to [`Config`]'s fields.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::{Figment, Metadata};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::upstream::discovery::ServerEntry;

/// One configuration key: its name (TOML key; env is `MCP_BRIDGE_` + upper case), its default as
/// shown to people, and what it means.
pub struct Key {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// Every scalar key, in the order the docs show them. `servers` (tables) is documented apart.
pub const KEYS: &[Key] = &[
    Key {
        name: "runtime",
        default: "auto",
        doc: "Container engine: auto, podman, docker, or a socket URL (unix:///run/podman/podman.sock, tcp://host:2375).",
    },
    Key {
        name: "image",
        default: DEFAULT_IMAGE,
        doc: "Sandbox image reference. Must contain python3.",
    },
    Key {
        name: "image_archive",
        default: "",
        doc: "docker-archive (tar or tar.gz), or an executable printing one, loaded when the image is missing.",
    },
    Key {
        name: "image_sha256",
        default: "",
        doc: "Expected sha256 of the archive bytes; checked while loading.",
    },
    Key {
        name: "timeout",
        default: "30s",
        doc: "Default time limit of one run_python call.",
    },
    Key {
        name: "max_timeout",
        default: "120s",
        doc: "Upper bound for the per-call `timeout` argument.",
    },
    Key {
        name: "memory",
        default: "512m",
        doc: "Memory limit of a sandbox container (swap included).",
    },
    Key {
        name: "pids",
        default: "128",
        doc: "Process/thread limit of a sandbox container.",
    },
    Key {
        name: "cpus",
        default: "",
        doc: "CPU limit (e.g. 1.5); unset means no CPU limit.",
    },
    Key {
        name: "container_user",
        default: "65534:65534",
        doc: "UID:GID the sandbox runs as.",
    },
    Key {
        name: "max_sessions",
        default: "8",
        doc: "Most sandbox sessions alive at once; a new one beyond it closes the least recently used idle one.",
    },
    Key {
        name: "runtime_idle_timeout",
        default: "300s",
        doc: "A session's container is removed after this long without a call; so is the pool of ready ones.",
    },
    Key {
        name: "pool_size",
        default: "1",
        doc: "Sandboxes kept started and booted, ready for a new session (within max_sessions); 0 starts each on demand.",
    },
    Key {
        name: "warm_start",
        default: "true",
        doc: "After initialize, connect the engine, make the image present and fill the pool in the background; false waits for the first call.",
    },
    Key {
        name: "preload",
        default: "numpy,pandas",
        doc: "Modules imported in pooled sandboxes before a session gets one (comma-separated); one that fails is logged and skipped.",
    },
    Key {
        name: "state_dir",
        default: "$XDG_STATE_HOME/mcp-code-bridge",
        doc: "Where the bridge keeps its own podman socket and state. Never shared with the sandbox.",
    },
    Key {
        name: "output_mode",
        default: "compact",
        doc: "Response text format: compact or toon.",
    },
    Key {
        name: "output_cap",
        default: "1m",
        doc: "stdout+stderr kept per call; beyond it the head and tail are kept with a marker.",
    },
    Key {
        name: "log_level",
        default: "info",
        doc: "error, warning, info, debug or trace (any case).",
    },
    Key {
        name: "allow_self_server",
        default: "false",
        doc: "Keep server entries that would launch this bridge again.",
    },
    Key {
        name: "allow_unenforced_limits",
        default: "false",
        doc: "Run even when the host cannot enforce a resource limit (doctor says which).",
    },
    Key {
        name: "tmp_size",
        default: "64m",
        doc: "Size cap of the sandbox's /tmp tmpfs.",
    },
    Key {
        name: "workspace_size",
        default: "256m",
        doc: "Size cap of the sandbox's /workspace tmpfs.",
    },
    Key {
        name: "nofile",
        default: "1024",
        doc: "Open-files ulimit inside the sandbox (must not exceed the host's).",
    },
    Key {
        name: "servers_file",
        default: "",
        doc: "An extra mcpServers JSON file, read before the usual places.",
    },
    Key {
        name: "upstream_call_timeout",
        default: "60s",
        doc: "Time limit of one proxied tool call.",
    },
    Key {
        name: "upstream_idle_timeout",
        default: "600s",
        doc: "An upstream server is stopped after this long unused.",
    },
    Key {
        name: "upstream_start_timeout",
        default: "120s",
        doc: "Time limit for starting an upstream server and its MCP handshake (npx/uvx may download it first).",
    },
];

pub const DEFAULT_IMAGE: &str = "mcp-code-bridge-sandbox:latest";
pub const ENV_PREFIX: &str = "MCP_BRIDGE_";

/// The effective configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub runtime: String,
    pub image: String,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub image_archive: Option<PathBuf>,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub image_sha256: Option<String>,
    pub timeout: Secs,
    pub max_timeout: Secs,
    pub memory: Size,
    #[serde(deserialize_with = "flexible_u32")]
    pub pids: u32,
    #[serde(default, deserialize_with = "empty_as_none_f64")]
    pub cpus: Option<f64>,
    pub container_user: String,
    #[serde(deserialize_with = "flexible_u32")]
    pub max_sessions: u32,
    pub runtime_idle_timeout: Secs,
    #[serde(deserialize_with = "flexible_u32")]
    pub pool_size: u32,
    #[serde(deserialize_with = "flexible_bool")]
    pub warm_start: bool,
    pub preload: ModuleList,
    pub state_dir: PathBuf,
    pub output_mode: OutputMode,
    pub output_cap: Size,
    pub log_level: LogLevel,
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_self_server: bool,
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_unenforced_limits: bool,
    pub tmp_size: Size,
    pub workspace_size: Size,
    #[serde(deserialize_with = "flexible_u32")]
    pub nofile: u32,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub servers_file: Option<PathBuf>,
    pub upstream_call_timeout: Secs,
    pub upstream_idle_timeout: Secs,
    pub upstream_start_timeout: Secs,
    #[serde(default)]
    pub servers: BTreeMap<String, ServerEntry>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime: "auto".into(),
            image: DEFAULT_IMAGE.into(),
            image_archive: None,
            image_sha256: None,
            timeout: Secs(Duration::from_secs(30)),
            max_timeout: Secs(Duration::from_secs(120)),
            memory: Size(512 << 20),
            pids: 128,
            cpus: None,
            container_user: "65534:65534".into(),
            max_sessions: 8,
            runtime_idle_timeout: Secs(Duration::from_secs(300)),
            pool_size: 1,
            warm_start: true,
            preload: ModuleList(vec!["numpy".into(), "pandas".into()]),
            state_dir: default_state_dir(),
            output_mode: OutputMode::Compact,
            output_cap: Size(1 << 20),
            log_level: LogLevel::Info,
            allow_self_server: false,
            allow_unenforced_limits: false,
            tmp_size: Size(64 << 20),
            workspace_size: Size(256 << 20),
            nofile: 1024,
            servers_file: None,
            upstream_call_timeout: Secs(Duration::from_secs(60)),
            upstream_idle_timeout: Secs(Duration::from_secs(600)),
            upstream_start_timeout: Secs(Duration::from_secs(120)),
            servers: BTreeMap::new(),
        }
    }
}

fn default_state_dir() -> PathBuf {
    directories::BaseDirs::new()
        .and_then(|d| d.state_dir().map(Path::to_path_buf))
        .map(|d| d.join("mcp-code-bridge"))
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("mcp-code-bridge-{}", unsafe { libc::getuid() }))
        })
}

/// Values given on the command line; `None` leaves the lower layers in force.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_archive: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_unenforced_limits: Option<bool>,
}

/// The system configuration file, the lowest file layer.
pub const SYSTEM_CONFIG: &str = "/etc/mcp-code-bridge/config.toml";

/// Moves the system configuration file elsewhere, or turns it off (`none` or empty). Not a
/// configuration key, since it decides which files are read; the test harness sets it to `none`.
pub const SYSTEM_CONFIG_ENV: &str = "MCP_BRIDGE_SYSTEM_CONFIG";

/// A line that marks a config file `scripts/setup-debian.sh --configure` wrote and may rewrite.
pub const SETUP_MARKER: &str =
    "# Written by mcp-code-bridge's scripts/setup-debian.sh --configure.";

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
    pub fn from_env() -> SystemConfig {
        match std::env::var_os(SYSTEM_CONFIG_ENV) {
            None => SystemConfig::Default(PathBuf::from(SYSTEM_CONFIG)),
            Some(v) if v.is_empty() || v.eq_ignore_ascii_case("none") => SystemConfig::Disabled,
            Some(v) => SystemConfig::FromEnv(PathBuf::from(v)),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        match self {
            SystemConfig::Default(p) | SystemConfig::FromEnv(p) => Some(p),
            SystemConfig::Disabled => None,
        }
    }
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    /// The environment variable's name.
    Env(String),
    /// The flag's name (`--image-archive`).
    CommandLine(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Env(var) => write!(f, "environment variable {var}"),
            Source::CommandLine(flag) => write!(f, "command line ({flag})"),
        }
    }
}

impl Source {
    /// Whether this is a file `scripts/setup-debian.sh --configure` wrote (it has the marker).
    pub fn written_by_setup(&self) -> bool {
        match self {
            Source::File(p) => std::fs::read_to_string(p)
                .is_ok_and(|text| text.lines().any(|l| l.trim_end() == SETUP_MARKER)),
            _ => false,
        }
    }
}

/// The loaded configuration with the figment it came from, for provenance.
pub struct Loaded {
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

fn source_from(meta: &Metadata, key: &str) -> Source {
    let top = key.split('.').next().unwrap_or(key);
    match &meta.source {
        Some(figment::Source::File(path)) => Source::File(path.clone()),
        _ if meta.name.contains("environment") => {
            Source::Env(format!("{ENV_PREFIX}{}", top.to_ascii_uppercase()))
        }
        // `Serialized` providers are named after their type.
        _ if meta.name.ends_with("::Overrides") => {
            Source::CommandLine(format!("--{}", top.replace('_', "-")))
        }
        _ => Source::Default,
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
        let mut dict = figment::value::Dict::new();
        for (k, v) in self.0.iter() {
            dict.insert(k.as_str().to_string(), figment::value::Value::from(v));
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

/// Load the layered configuration. Errors name the key, the bad value and its source.
pub fn load(explicit: Option<&Path>, overrides: &Overrides) -> Result<Loaded, ConfigError> {
    if let Some(p) = explicit
        && !p.is_file()
    {
        return Err(ConfigError(format!(
            "config file {} (from --config) does not exist or is not a file",
            p.display()
        )));
    }
    let system = SystemConfig::from_env();
    if let SystemConfig::FromEnv(p) = &system
        && !p.is_file()
    {
        return Err(ConfigError(format!(
            "system config file {} (from {SYSTEM_CONFIG_ENV}) does not exist or is not a file\n\
             hint: point {SYSTEM_CONFIG_ENV} at an existing file, or set it to `none` to read no system file",
            p.display()
        )));
    }
    let files = config_files(explicit);
    let keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    let env = EnvStrings(
        Env::prefixed(ENV_PREFIX)
            .only(&keys)
            .map(|k| k.as_str().to_ascii_lowercase().into()),
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
        return Err(ConfigError(format!(
            "invalid value for `{key}` from {}: {why}",
            loaded.source(key)
        )));
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
fn unknown_variables(names: impl Iterator<Item = std::ffi::OsString>) -> Vec<String> {
    let mut out: Vec<String> = names
        .filter_map(|n| n.into_string().ok())
        .filter(|n| {
            n.strip_prefix(ENV_PREFIX).is_some_and(|rest| {
                !rest.is_empty()
                    && n != SYSTEM_CONFIG_ENV
                    && !rest.starts_with("TEST_")
                    && !rest.starts_with("BENCH_")
                    && !KEYS.iter().any(|k| k.name.eq_ignore_ascii_case(rest))
            })
        })
        .map(|n| {
            let rest = n[ENV_PREFIX.len()..].to_ascii_lowercase();
            let closest = closest_key(&rest);
            format!(
                "{n} is not a setting and is ignored; did you mean {ENV_PREFIX}{}?",
                closest.to_ascii_uppercase()
            )
        })
        .collect();
    out.sort();
    out
}

/// The key nearest to `name`: one that contains it (or is contained in it) first, then the
/// smallest edit distance; ties go to the key listed first.
pub fn closest_key(name: &str) -> &'static str {
    let name = name.to_ascii_lowercase();
    KEYS.iter()
        .map(|k| k.name)
        .min_by_key(|k| {
            let contains = !name.is_empty() && (k.contains(name.as_str()) || name.contains(k));
            (!contains, edit_distance(&name, k))
        })
        .unwrap_or("timeout")
}

/// Levenshtein distance (insertions, deletions, substitutions), on bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl Config {
    /// Checks serde cannot make: ranges and relations between keys. The error is the key at
    /// fault and why; `load` adds where the value came from.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, why: String| Err((key, why));
        if self.timeout.0 > self.max_timeout.0 {
            return bad(
                "timeout",
                format!(
                    "{} is above max_timeout ({}); raise max_timeout or lower timeout",
                    self.timeout, self.max_timeout
                ),
            );
        }
        if self.timeout.0.is_zero() {
            return bad("timeout", "must be more than 0s".into());
        }
        if self.memory.0 < 16 << 20 {
            return bad(
                "memory",
                format!("{} is too small for Python; use at least 16m", self.memory),
            );
        }
        if self.pids < 8 {
            return bad(
                "pids",
                format!("{} is too small for Python; use at least 8", self.pids),
            );
        }
        if self.max_sessions == 0 {
            return bad(
                "max_sessions",
                "0 would refuse every call; use at least 1".into(),
            );
        }
        if let Some(bad_name) = self.preload.0.iter().find(|m| !ModuleList::valid(m)) {
            return bad(
                "preload",
                format!(
                    "{bad_name:?} is not a module name; write dotted Python names separated by commas, e.g. numpy,pandas"
                ),
            );
        }
        if self.upstream_start_timeout.0.is_zero() {
            return bad(
                "upstream_start_timeout",
                "must be more than 0s; servers started by npx or uvx may need a minute the first time".into(),
            );
        }
        if let Some(c) = self.cpus
            && !(c > 0.0 && c.is_finite())
        {
            return bad(
                "cpus",
                format!("{c} must be a positive number such as 1 or 0.5"),
            );
        }
        let user_ok = self
            .container_user
            .split(':')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !user_ok || self.container_user.split(':').count() > 2 {
            return bad(
                "container_user",
                format!(
                    "{:?} must be UID or UID:GID in digits, e.g. 65534:65534",
                    self.container_user
                ),
            );
        }
        if self.container_user.split(':').next() == Some("0") {
            return bad(
                "container_user",
                "the sandbox never runs as root (uid 0); use e.g. 65534:65534".into(),
            );
        }
        if let Some(h) = &self.image_sha256
            && (h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return bad("image_sha256", format!("{h:?} is not 64 hex digits"));
        }
        if self.image.trim().is_empty() {
            return bad("image", "must not be empty".into());
        }
        Ok(())
    }

    /// A per-call timeout, clamped to `[100ms, max_timeout]`.
    pub fn clamp_timeout(&self, requested: Option<f64>) -> Duration {
        match requested {
            // `try_from` refuses values too large for a Duration; they clamp to the maximum too.
            Some(s) if s.is_finite() && s > 0.0 => Duration::try_from_secs_f64(s)
                .unwrap_or(self.max_timeout.0)
                .min(self.max_timeout.0)
                .max(Duration::from_millis(100)),
            _ => self.timeout.0,
        }
    }
}

/// A configuration error: a sentence for the user.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl ConfigError {
    fn from_figment(e: figment::Error) -> Self {
        let mut out = Vec::new();
        for err in e {
            let key = err.path.join(".");
            let source = err
                .metadata
                .as_ref()
                .map(|m| source_from(m, &key))
                .unwrap_or(Source::Default);
            let what = match &err.kind {
                figment::error::Kind::UnknownField(f, expected) => {
                    let known: Vec<&str> = if err.path.len() <= 1 {
                        KEYS.iter().map(|k| k.name).chain(["servers"]).collect()
                    } else {
                        expected.to_vec()
                    };
                    let closest = known
                        .iter()
                        .min_by_key(|k| edit_distance(f, k))
                        .map(|k| format!("did you mean `{k}`? "))
                        .unwrap_or_default();
                    out.push(format!(
                        "unknown key `{f}` in {source}\nhint: {closest}Known keys: {}",
                        known.join(", ")
                    ));
                    continue;
                }
                // figment's own wording doubles the backticks (``a` or `b``).
                figment::error::Kind::UnknownVariant(v, expected) => {
                    format!("`{v}` is not one of: {}", expected.join(", "))
                }
                other => other.to_string(),
            };
            if key.is_empty() {
                out.push(format!("invalid configuration in {source}: {what}"));
            } else {
                out.push(format!("invalid value for `{key}` from {source}: {what}"));
            }
        }
        ConfigError(out.join("\n"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// A duration written as `30`, `30s`, `1.5s`, `500ms`, `2m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Secs(pub Duration);

impl Secs {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a duration; write e.g. 30, 30s, 500ms, 2m"))?;
        let factor = match unit.trim() {
            "" | "s" | "sec" | "secs" => 1.0,
            "ms" => 0.001,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            u => {
                return Err(format!(
                    "{s:?} has an unknown unit {u:?}; use ms, s, m or h"
                ));
            }
        };
        let secs = n * factor;
        if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
            return Err(format!("{s:?} is out of range"));
        }
        Ok(Secs(Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Secs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(n) if n >= 0 => {
                Secs::parse(&n.to_string()).map_err(serde::de::Error::custom)
            }
            NumOrStr::Float(x) => Secs::parse(&x.to_string()).map_err(serde::de::Error::custom),
            NumOrStr::Str(s) => Secs::parse(&s).map_err(serde::de::Error::custom),
            NumOrStr::Int(n) => Err(serde::de::Error::custom(format!(
                "{n} is negative; a duration is 0 or more"
            ))),
        }
    }
}

/// A byte size written as `536870912`, `512k`, `512m`, `1g` (binary units; `mb`, `MiB` also accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size; write e.g. 512m, 1g, 65536"))?;
        let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            u => return Err(format!("{s:?} has an unknown unit {u:?}; use k, m or g")),
        };
        let v = n * factor as f64;
        if !v.is_finite() || !(0.0..=1e15).contains(&v) {
            return Err(format!("{s:?} is out of range"));
        }
        Ok(Size(v as u64))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        match b {
            0 => write!(f, "0"),
            _ if b.is_multiple_of(1 << 30) => write!(f, "{}g", b >> 30),
            _ if b.is_multiple_of(1 << 20) => write!(f, "{}m", b >> 20),
            _ if b.is_multiple_of(1 << 10) => write!(f, "{}k", b >> 10),
            _ => write!(f, "{b}"),
        }
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(n) if n >= 0 => Ok(Size(n as u64)),
            NumOrStr::Float(x) => Size::parse(&x.to_string()).map_err(serde::de::Error::custom),
            NumOrStr::Str(s) => Size::parse(&s).map_err(serde::de::Error::custom),
            NumOrStr::Int(n) => Err(serde::de::Error::custom(format!(
                "{n} is negative; a size is 0 or more"
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Int(i64),
    Float(f64),
    Str(String),
}

/// How `run_python` renders its text content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    Compact,
    Toon,
}

/// Log verbosity. Accepts the seed's spellings (`INFO`, `warning`, `critical`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_filter())
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "error" | "critical" | "fatal" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => {
                return Err(serde::de::Error::custom(format!(
                    "{s:?} is not a log level; use error, warning, info, debug or trace"
                )));
            }
        })
    }
}

fn flexible_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum B {
        Bool(bool),
        Int(i64),
        Str(String),
    }
    match B::deserialize(d)? {
        B::Bool(b) => Ok(b),
        B::Int(0) => Ok(false),
        B::Int(1) => Ok(true),
        B::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err(serde::de::Error::custom(format!(
                "{s:?} is not a boolean; use true/false or 1/0"
            ))),
        },
        B::Int(n) => Err(serde::de::Error::custom(format!(
            "{n} is not a boolean; use true/false or 1/0"
        ))),
    }
}

fn flexible_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match NumOrStr::deserialize(d)? {
        NumOrStr::Int(n) => u32::try_from(n).map_err(|_| {
            serde::de::Error::custom(format!("{n} is out of range (0 to {})", u32::MAX))
        }),
        NumOrStr::Str(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number"))),
        NumOrStr::Float(x) => Err(serde::de::Error::custom(format!(
            "{x} is not a whole number"
        ))),
    }
}

/// Python modules to import ahead of need: a list in TOML, comma-separated in the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleList(pub Vec<String>);

impl ModuleList {
    /// A dotted Python name: only such names are ever imported, and none holds a comma.
    pub fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.split('.').all(|p| {
                p.chars()
                    .next()
                    .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                    && p.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
            })
    }
}

impl fmt::Display for ModuleList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl Serialize for ModuleList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ModuleList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum L {
            List(Vec<String>),
            Str(String),
        }
        let names = match L::deserialize(d)? {
            L::List(v) => v,
            L::Str(s) => s.split(',').map(str::to_string).collect(),
        };
        Ok(ModuleList(
            names
                .into_iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
        ))
    }
}

fn empty_as_none<'de, D: Deserializer<'de>, T: From<String>>(d: D) -> Result<Option<T>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    Ok(s.filter(|s| !s.trim().is_empty()).map(T::from))
}

fn empty_as_none_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrStr::Int(n)) => Ok(Some(n as f64)),
        Some(NumOrStr::Float(x)) => Ok(Some(x)),
        Some(NumOrStr::Str(s)) if s.trim().is_empty() => Ok(None),
        Some(NumOrStr::Str(s)) => s.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!("{s:?} is not a number; write e.g. 1 or 0.5"))
        }),
    }
}

#[cfg(test)]
// figment::Jail fixes the closure's error type (a large figment::Error).
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn keys_table_matches_config_fields() {
        let v = serde_json::to_value(Config::default()).unwrap();
        let mut fields: Vec<&str> = v
            .as_object()
            .unwrap()
            .keys()
            .map(|s| s.as_str())
            .filter(|k| *k != "servers")
            .collect();
        fields.sort();
        let mut keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        keys.sort();
        assert_eq!(fields, keys);
    }

    #[test]
    fn readme_documents_every_key_with_its_default() {
        let readme = include_str!("../README.md");
        for k in KEYS {
            let default = if k.default.is_empty() {
                "—".to_string()
            } else {
                format!("`{}`", k.default)
            };
            let row = format!(
                "| `{}` | `{ENV_PREFIX}{}` | {default} |",
                k.name,
                k.name.to_ascii_uppercase()
            );
            assert!(
                readme.contains(&row),
                "README.md lacks the row starting {row:?}"
            );
        }
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(Secs::parse("30").unwrap().0, Duration::from_secs(30));
        assert_eq!(Secs::parse("30s").unwrap().0, Duration::from_secs(30));
        assert_eq!(Secs::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert_eq!(Secs::parse("2m").unwrap().0, Duration::from_secs(120));
        assert!(Secs::parse("abc").is_err());
        assert!(Secs::parse("3 parsecs").is_err());
        assert_eq!(Size::parse("512m").unwrap().0, 512 << 20);
        assert_eq!(Size::parse("1G").unwrap().0, 1 << 30);
        assert_eq!(Size::parse("65536").unwrap().0, 65536);
        assert!(Size::parse("lots").is_err());
        assert_eq!(Size(512 << 20).to_string(), "512m");
        assert_eq!(Secs(Duration::from_secs(30)).to_string(), "30s");
    }

    /// No test here reads the machine's system config file.
    fn isolate(jail: &mut figment::Jail) {
        jail.set_env(SYSTEM_CONFIG_ENV, "none");
    }

    /// `load` of `c.toml` in the jail with no command-line overrides.
    fn load_c() -> Result<Loaded, String> {
        load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.0)
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
            let l = load(Some(Path::new("c.toml")), &o).map_err(|e| e.0)?;
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
            let l = load(None, &Overrides::default()).map_err(|e| e.0)?;
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
                let l = load(None, &Overrides::default()).map_err(|e| e.0)?;
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
            let err = load(None, &Overrides::default()).err().unwrap().0;
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
            let l = load(Some(Path::new("c.toml")), &o).map_err(|e| e.0)?;
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
    fn timeouts_clamp() {
        let c = Config::default();
        assert_eq!(c.clamp_timeout(None), Duration::from_secs(30));
        assert_eq!(c.clamp_timeout(Some(1e6)), Duration::from_secs(120));
        assert_eq!(c.clamp_timeout(Some(5.0)), Duration::from_secs(5));
        assert_eq!(c.clamp_timeout(Some(-1.0)), Duration::from_secs(30));
        assert_eq!(c.clamp_timeout(Some(f64::MAX)), Duration::from_secs(120));
    }
}
