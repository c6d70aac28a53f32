//! The effective configuration: [`Config`] with its defaults (the only place a default is
//! written, shown for each key by [`Key::default`]) and the checks serde cannot make, and the
//! command-line [`Overrides`] that the flags are derived from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::audit::AuditConfig;
use super::http::{self, HttpConfig};
use super::inputs::{self, InputEntry};
use super::keys::Key;
use super::oauth::OAuthConfig;
use super::packages::PackagesConfig;
use super::policy::PolicyConfig;
use super::servers::ServerEntry;
use super::skills::SkillsConfig;
use super::values::{
    Isolation, LogLevel, ModuleList, OutputMode, Runtime, Secs, Size, empty_as_none,
    empty_as_none_f64, flexible_bool, flexible_u32,
};

/// The effective configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The container engine: `auto`, `podman`, `docker`, or a socket URL ([`Runtime`]).
    pub runtime: Runtime,
    /// How sandboxes are isolated from the host's kernel: `container` (namespaces, seccomp,
    /// cgroups) or `gvisor` (gVisor's user-space kernel, through [`Config::gvisor_runtime`]; never
    /// falls back).
    pub isolation: Isolation,
    /// The name the engine registers gVisor's OCI runtime under (`runsc`), used with
    /// `isolation = "gvisor"`.
    pub gvisor_runtime: String,
    /// The sandbox image's reference; it must contain `python3`.
    pub image: String,
    /// A docker-archive (tar or tar.gz), or an executable that prints one, loaded when the
    /// image is missing; `None`: a missing image is an error.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub image_archive: Option<PathBuf>,
    /// The sha256 (64 hex digits) `image_archive`'s bytes must have, checked while loading.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub image_sha256: Option<String>,
    /// The time limit of a `run_python` call that gives none.
    pub timeout: Secs,
    /// The most a call's own `timeout` may ask for; larger ones are clamped to it.
    pub max_timeout: Secs,
    /// The memory limit of a sandbox container, swap included.
    pub memory: Size,
    /// Processes and threads a sandbox's code may have at once (under gVisor the host's cgroup
    /// gets more: [`Config::host_pids_limit`]).
    #[serde(deserialize_with = "flexible_u32")]
    pub pids: u32,
    /// The CPU limit of a sandbox container, in CPUs (`1.5`); `None`: no limit.
    #[serde(default, deserialize_with = "empty_as_none_f64")]
    pub cpus: Option<f64>,
    /// The `UID` or `UID:GID` the sandbox's processes run as; never uid 0.
    pub container_user: String,
    /// Most sessions alive at once; a new one beyond it closes the least recently used idle one.
    #[serde(deserialize_with = "flexible_u32")]
    pub max_sessions: u32,
    /// Host memory (`MemAvailable`) kept free: no new sandbox starts below it; 0 checks none.
    pub memory_reserve: Size,
    /// A session's container is removed after this long without a call, and so is the pool
    /// of ready ones.
    pub runtime_idle_timeout: Secs,
    /// Sandboxes kept started and booted, ready for a new session (within `max_sessions`); 0
    /// starts each on demand.
    #[serde(deserialize_with = "flexible_u32")]
    pub pool_size: u32,
    /// At start, connect to the engine, make the image present and fill the pool in the
    /// background; false waits for the first call.
    #[serde(deserialize_with = "flexible_bool")]
    pub warm_start: bool,
    /// Modules imported in pooled sandboxes before a session gets one.
    pub preload: ModuleList,
    /// Where the bridge keeps its state (its podman service's socket, the tool catalog, skills,
    /// snapshots, the package cache, the audit log); never shared with a sandbox.
    pub state_dir: PathBuf,
    /// How long the bridge's own podman service outlives its last user, idle, for the next
    /// one to find; 0 stops it with the bridge.
    pub engine_linger: Secs,
    /// How long a session that ran code stays parked, running, after its bridge exits, for the
    /// next bridge on the same `state_dir` to resume (`sandbox::park`, `sandbox::parking`).
    pub session_linger: Secs,
    /// Largest snapshot of one session's state (`sandbox::snapshots`); 0: no snapshots.
    pub snapshot_max_size: Size,
    /// How long a snapshot is kept after it was written.
    pub snapshot_ttl: Secs,
    /// Every snapshot of the state dir together; the oldest go first.
    pub snapshot_store_size: Size,
    /// The format of a result's text: `compact` or `toon`.
    pub output_mode: OutputMode,
    /// Bytes of stdout and stderr together kept per call; beyond them the head and tail are
    /// kept with a marker.
    pub output_cap: Size,
    /// cl100k tokens one result may put into the model's context; past them it carries a
    /// preview and the whole output is kept as a file (`server::budget`).
    #[serde(deserialize_with = "flexible_u32")]
    pub output_budget: u32,
    /// The level of this project's log lines (`RUST_LOG` overrides it).
    pub log_level: LogLevel,
    /// Where traces go (OTLP over HTTP/protobuf), as a collector's base URL; `/v1/traces` is
    /// added. None: the standard `OTEL_EXPORTER_OTLP_*` variables decide, and without them no
    /// traces are sent.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub otel_endpoint: Option<String>,
    /// Put a call's code and output on its span (bounded by `trace::MAX_CONTENT`).
    #[serde(deserialize_with = "flexible_bool")]
    pub otel_content: bool,
    /// Keep server entries that would launch this bridge again (dropped by default).
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_self_server: bool,
    /// Run even when the host cannot enforce a resource limit (`doctor` says which).
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_unenforced_limits: bool,
    /// The size of the sandbox's `/tmp` tmpfs.
    pub tmp_size: Size,
    /// The size of the sandbox's `/workspace` tmpfs.
    pub workspace_size: Size,
    /// The largest file copied out of `/workspace/out`; larger ones are skipped with a notice.
    pub file_cap: Size,
    /// Most files of `/workspace/out` (new or changed) copied out per call.
    #[serde(deserialize_with = "flexible_u32")]
    pub files_per_call: u32,
    /// Bytes of `/workspace/out` files kept on the host per session, until it is reset or
    /// closed.
    pub files_total: Size,
    /// The size of the sandbox's `/data` tmpfs, where the `[[inputs]]` are copied (mounted only
    /// when inputs are declared).
    pub inputs_size: Size,
    /// The open-files ulimit inside the sandbox; it must not exceed the host's.
    #[serde(deserialize_with = "flexible_u32")]
    pub nofile: u32,
    /// An extra `mcpServers` JSON file, read before the usual places.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub servers_file: Option<PathBuf>,
    /// The time limit of one proxied tool call.
    pub upstream_call_timeout: Secs,
    /// An upstream server is stopped after this long unused.
    pub upstream_idle_timeout: Secs,
    /// The time limit for starting an upstream server and its MCP handshake (`npx` or `uvx`
    /// may download it first).
    pub upstream_start_timeout: Secs,
    /// `[policy]`: which proxied tool calls run, ask the user, or are refused.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// `[audit]`: the audit log.
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[skills]`: the bounds of the saved skills.
    #[serde(default)]
    pub skills: SkillsConfig,
    /// `[packages]`: what the code may install into its session, and from where.
    #[serde(default)]
    pub packages: PackagesConfig,
    /// Where `serve` listens (`address:port`).
    pub listen: String,
    /// `serve`'s bearer tokens: lines of `name:token`, the name being the identity.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub token_file: Option<PathBuf>,
    /// `[http]`: what `serve` accepts besides authentication.
    #[serde(default)]
    pub http: HttpConfig,
    /// `[oauth]`: the authorization server whose tokens `serve` accepts.
    #[serde(default)]
    pub oauth: OAuthConfig,
    /// `[[inputs]]`: host files and directories copied into each sandbox under `/data`.
    #[serde(default)]
    pub inputs: Vec<InputEntry>,
    /// `[servers.<name>]`: the upstream servers the configuration declares, by name (upstream
    /// discovery adds those of `mcpServers` files).
    #[serde(default)]
    pub servers: BTreeMap<String, ServerEntry>,
}

// Here rather than in `keys.rs`, so that the list of keys names nothing of the configuration
// whose defaults it shows.
impl Key {
    /// The default as shown to people (`config`, docs/configuration.md): [`Config::default`]'s value,
    /// except `state_dir`, whose default depends on the machine and is shown as its rule.
    pub fn default(&self) -> String {
        if self.name == "state_dir" {
            return "$XDG_STATE_HOME/mcp-code-bridge".to_string();
        }
        if self.name == "audit.path" {
            return "<state_dir>/audit.jsonl".to_string();
        }
        let defaults = serde_json::to_value(Config::default()).unwrap_or_default();
        match self
            .name
            .split('.')
            .try_fold(&defaults, |v, part| v.get(part))
            .cloned()
        {
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Null) | None => String::new(),
            Some(serde_json::Value::Object(o)) if o.is_empty() => String::new(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
            Some(other) => other.to_string(),
        }
    }
}

/// The sandbox image used when `image` is not set.
pub const DEFAULT_IMAGE: &str = "mcp-code-bridge-sandbox:latest";

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime: Runtime::Auto,
            isolation: Isolation::Container,
            gvisor_runtime: "runsc".into(),
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
            memory_reserve: Size(512 << 20),
            runtime_idle_timeout: Secs(Duration::from_secs(300)),
            pool_size: 1,
            warm_start: true,
            preload: ModuleList(vec!["numpy".into(), "pandas".into()]),
            state_dir: default_state_dir(),
            engine_linger: Secs(Duration::from_secs(300)),
            session_linger: Secs(Duration::from_secs(600)),
            snapshot_max_size: Size(256 << 20),
            snapshot_ttl: Secs(Duration::from_secs(7 * 86_400)),
            snapshot_store_size: Size(2 << 30),
            output_mode: OutputMode::Compact,
            output_cap: Size(4 << 20),
            output_budget: 8000,
            log_level: LogLevel::Info,
            otel_endpoint: None,
            otel_content: false,
            allow_self_server: false,
            allow_unenforced_limits: false,
            tmp_size: Size(64 << 20),
            workspace_size: Size(256 << 20),
            file_cap: Size(16 << 20),
            files_per_call: 64,
            files_total: Size(256 << 20),
            inputs_size: Size(256 << 20),
            nofile: 1024,
            servers_file: None,
            upstream_call_timeout: Secs(Duration::from_secs(60)),
            upstream_idle_timeout: Secs(Duration::from_secs(600)),
            upstream_start_timeout: Secs(Duration::from_secs(120)),
            policy: PolicyConfig::default(),
            audit: AuditConfig::default(),
            skills: SkillsConfig::default(),
            packages: PackagesConfig::default(),
            listen: http::DEFAULT_LISTEN.into(),
            token_file: None,
            http: HttpConfig::default(),
            oauth: OAuthConfig::default(),
            inputs: Vec::new(),
            servers: BTreeMap::new(),
        }
    }
}

fn default_state_dir() -> PathBuf {
    directories::BaseDirs::new()
        .and_then(|d| d.state_dir().map(Path::to_path_buf))
        .map(|d| d.join("mcp-code-bridge"))
        .unwrap_or_else(|| {
            // SAFETY: getuid has no preconditions, cannot fail and touches no memory of ours.
            let uid = unsafe { libc::getuid() };
            std::env::temp_dir().join(format!("mcp-code-bridge-{uid}"))
        })
}

/// Values given on the command line, the last layer; `None` leaves the lower layers in force.
/// The flags are derived from this struct, so a flag and the key it sets cannot drift apart;
/// figment names their source `--flag` (see `load::source_from`).
#[derive(Debug, Default, Clone, Serialize, clap::Args)]
pub struct Overrides {
    /// Container engine: auto, podman, docker, or a socket URL.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Kernel isolation of the sandbox: container or gvisor.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Sandbox image reference.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image archive to load when the image is missing.
    #[arg(long, global = true, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_archive: Option<PathBuf>,
    /// Default time limit of a call (30, 30s, 2m).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Memory limit of the sandbox (512m, 1g).
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Response format: compact or toon.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<String>,
    /// Tokens of output one result may carry before it becomes a preview and a file.
    #[arg(long, global = true, value_name = "TOKENS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_budget: Option<u32>,
    /// Log level: error, warning, info, debug, trace.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// Address and port `serve` listens on (127.0.0.1:8931).
    #[arg(long, global = true, value_name = "ADDR:PORT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// State directory of the bridge.
    #[arg(long, global = true, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Run even where the host cannot enforce a resource limit.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_unenforced_limits: bool,
}

/// The smallest `output_budget`: room for a preview's head, tail and the line saying where the
/// rest is.
pub const MIN_OUTPUT_BUDGET: u32 = 500;

impl Config {
    /// Checks serde cannot make: ranges and relations between keys. The error is the key at
    /// fault and why; `load` adds where the value came from.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
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
        if self.output_budget < MIN_OUTPUT_BUDGET {
            return bad(
                "output_budget",
                format!(
                    "{} tokens leave no room for a preview; use at least {MIN_OUTPUT_BUDGET}",
                    self.output_budget
                ),
            );
        }
        if self.engine_linger.0 > Duration::from_secs(86_400) {
            return bad(
                "engine_linger",
                format!(
                    "{} is more than a day: the service outlives its last bridge by this much; use a day or less (0 stops it with the bridge)",
                    self.engine_linger
                ),
            );
        }
        if self.session_linger.0 > Duration::from_secs(86_400) {
            return bad(
                "session_linger",
                format!(
                    "{} is more than a day: a session left running holds its memory that long; use a day or less (0 closes sessions with their bridge)",
                    self.session_linger
                ),
            );
        }
        if self.snapshot_max_size.0 > self.snapshot_store_size.0 {
            return bad(
                "snapshot_max_size",
                format!(
                    "{} is more than snapshot_store_size ({}): no snapshot that large could be kept; raise snapshot_store_size or lower snapshot_max_size",
                    self.snapshot_max_size, self.snapshot_store_size
                ),
            );
        }
        if let Some(endpoint) = &self.otel_endpoint {
            match url::Url::parse(endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(_) => {
                    return bad(
                        "otel_endpoint",
                        format!(
                            "{endpoint:?} is not an http(s) URL with a host; give the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318"
                        ),
                    );
                }
                Err(e) => {
                    return bad(
                        "otel_endpoint",
                        format!(
                            "{endpoint:?} is not a URL ({e}); give the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318"
                        ),
                    );
                }
            }
        }
        if self.snapshot_ttl.0 > Duration::from_secs(366 * 86_400) {
            return bad(
                "snapshot_ttl",
                format!(
                    "{} is more than a year; use a year or less (snapshot_max_size = 0 keeps none)",
                    self.snapshot_ttl
                ),
            );
        }
        if self.max_sessions == 0 {
            return bad(
                "max_sessions",
                "0 would refuse every call; use at least 1".into(),
            );
        }
        if self.file_cap.0 > self.files_total.0 {
            return bad(
                "file_cap",
                format!(
                    "{} is more than files_total ({}): no file that large could be kept; raise files_total or lower file_cap",
                    self.file_cap, self.files_total
                ),
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
        if self.gvisor_runtime.is_empty()
            || !self
                .gvisor_runtime
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return bad(
                "gvisor_runtime",
                format!(
                    "{:?} is not a runtime name; write the name the engine registers gVisor under, e.g. runsc",
                    self.gvisor_runtime
                ),
            );
        }
        if self.image.trim().is_empty() {
            return bad("image", "must not be empty".into());
        }
        self.policy.validate()?;
        self.audit.check()?;
        self.skills.check()?;
        self.packages.check()?;
        self.oauth.check()?;
        self.http.check(&self.listen)?;
        inputs::check(&self.inputs)
    }

    /// The OCI runtime every sandbox container is created with: `None` is the engine's
    /// default (runc, crun), which `isolation = "container"` means.
    pub fn oci_runtime(&self) -> Option<&str> {
        match self.isolation {
            Isolation::Container => None,
            Isolation::Gvisor => Some(&self.gvisor_runtime),
        }
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

/// Under `isolation = "gvisor"` the container's pids cgroup holds the whole gVisor sandbox: its
/// kernel's own host threads (some 40 at rest, Debian's runsc 2022, ptrace) and, for each task of
/// the code, the host threads and processes that run it (5 to 6 per process under ptrace: a
/// fork bomb of 64 processes needed between 300 and 400). The code's own tasks are held to
/// `pids` by gVisor's kernel (nproc, which it counts per user inside the sandbox); the host's
/// cgroup gets `pids × GVISOR_HOST_PIDS_PER_TASK + GVISOR_HOST_PIDS_BASE`, room for gVisor's
/// share, still a bound the host's kernel enforces. With `pids` alone on the cgroup a fork bomb
/// ended the whole sandbox (gVisor's kernel could not make a thread) instead of failing a fork.
pub const GVISOR_HOST_PIDS_PER_TASK: u32 = 8;
/// See [`GVISOR_HOST_PIDS_PER_TASK`].
pub const GVISOR_HOST_PIDS_BASE: u32 = 64;

impl Config {
    /// The pids cgroup limit of a sandbox container, as the host's kernel enforces it.
    pub fn host_pids_limit(&self) -> i64 {
        match self.isolation {
            Isolation::Gvisor => {
                self.pids as i64 * GVISOR_HOST_PIDS_PER_TASK as i64 + GVISOR_HOST_PIDS_BASE as i64
            }
            _ => self.pids as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_gvisor_the_code_gets_pids_and_the_host_cgroup_room_for_gvisor() {
        let mut c = Config {
            pids: 32,
            ..Config::default()
        };
        assert_eq!(c.host_pids_limit(), 32);
        c.isolation = Isolation::Gvisor;
        assert!(c.validate().is_ok());
        assert_eq!(c.host_pids_limit(), 32 * 8 + 64);
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
