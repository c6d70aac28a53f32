//! The one list of configuration keys: the env filter, `config` output, unknown-key hints and the
//! key table of docs/configuration.md all come from [`KEYS`]; a unit test keeps it equal to
//! [`Config`](super::Config)'s fields, and tests/e2e/docs.rs the key table to it, both ways.

/// One configuration key: its name and what it means. A name with a dot is a key of a TOML
/// section (`policy.default` is `default` in `[policy]`); its variable replaces the dot with `_`
/// (`MCP_BRIDGE_POLICY_DEFAULT`), see [`Key::env`]. Its default is not written here:
/// [`Key::default`] shows [`Config::default`](super::Config::default)'s value, so each default
/// is written once.
pub struct Key {
    /// The key as written in TOML, `section.key` for a section's (`policy.default`).
    pub name: &'static str,
    /// What the key does, and its unit or bounds where it has them, in a sentence or two.
    pub doc: &'static str,
}

impl Key {
    /// The environment variable that sets this key: `MCP_BRIDGE_` and the name in upper case,
    /// a section's dot written as `_`.
    pub fn env(&self) -> String {
        env_name(self.name)
    }
}

/// The variable of key `name` (see [`Key::env`]); also for names that are not keys.
pub fn env_name(name: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        name.replace('.', "_").to_ascii_uppercase()
    )
}

/// The key set by the variable whose name after `MCP_BRIDGE_` is `rest` (any case).
pub fn key_of_env(rest: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.name.replace('.', "_").eq_ignore_ascii_case(rest))
}

/// Every scalar key, in the order the docs show them. `servers` and `inputs` (tables) are documented apart.
pub const KEYS: &[Key] = &[
    Key {
        name: "runtime",
        doc: "Container engine: auto, podman, docker, or a socket URL (unix:///run/podman/podman.sock, tcp://host:2375).",
    },
    Key {
        name: "isolation",
        doc: "container (the host's kernel behind namespaces, seccomp and cgroups) or gvisor (every sandbox under gVisor's user-space kernel, through the engine's runtime gvisor_runtime; never falls back).",
    },
    Key {
        name: "gvisor_runtime",
        doc: "Name of the engine's OCI runtime that runs gVisor, used with isolation = gvisor (scripts/setup-debian.sh --isolation gvisor registers runsc).",
    },
    Key {
        name: "image",
        doc: "Sandbox image reference. Must contain python3.",
    },
    Key {
        name: "image_archive",
        doc: "docker-archive (tar or tar.gz), or an executable printing one, loaded when the image is missing.",
    },
    Key {
        name: "image_sha256",
        doc: "Expected sha256 of the archive bytes; checked while loading.",
    },
    Key {
        name: "timeout",
        doc: "Default time limit of one run_python call.",
    },
    Key {
        name: "max_timeout",
        doc: "Upper bound for the per-call `timeout` argument.",
    },
    Key {
        name: "memory",
        doc: "Memory limit of a sandbox container (swap included).",
    },
    Key {
        name: "pids",
        doc: "Process/thread limit of a sandbox container.",
    },
    Key {
        name: "cpus",
        doc: "CPU limit (e.g. 1.5); unset means no CPU limit.",
    },
    Key {
        name: "container_user",
        doc: "UID:GID the sandbox runs as.",
    },
    Key {
        name: "max_sessions",
        doc: "Most sandbox sessions alive at once; a new one beyond it closes the least recently used idle one.",
    },
    Key {
        name: "memory_reserve",
        doc: "Host memory (MemAvailable) kept free: a new session is refused, and no pooled sandbox started, while less is available; 0 checks none.",
    },
    Key {
        name: "runtime_idle_timeout",
        doc: "A session's container is removed after this long without a call; so is the pool of ready ones.",
    },
    Key {
        name: "pool_size",
        doc: "Sandboxes kept started and booted, ready for a new session (within max_sessions); more while new sessions come (as many as started in the last two minutes, at most 4 per core and 16); 0 starts each on demand.",
    },
    Key {
        name: "warm_start",
        doc: "At start, connect the engine, make the image present and fill the pool in the background; false waits for the first call.",
    },
    Key {
        name: "preload",
        doc: "Modules imported in pooled sandboxes before a session gets one (comma-separated); one that fails is logged and skipped.",
    },
    Key {
        name: "state_dir",
        doc: "Where the bridge keeps its own podman socket and state (the tool catalog, catalog.json). Never shared with the sandbox.",
    },
    Key {
        name: "engine_linger",
        doc: "How long the bridge's own podman service outlives its last user (run, serve, exec, doctor, image load), idle, for the next one to find; 0 stops it with the bridge.",
    },
    Key {
        name: "session_linger",
        doc: "How long a session that ran code stays running, parked, after its bridge exits, for the next bridge on the same state_dir to resume on the first call naming it (at most engine_linger; runc only, no inputs); 0 closes sessions with their bridge.",
    },
    Key {
        name: "snapshot_max_size",
        doc: "Largest snapshot of one session's state, written when the session is closed without a caller (idle timeout, max_sessions, the bridge's exit) and restored by the next call naming it; a larger state is not kept (a notice names its largest values); 0 keeps no snapshots.",
    },
    Key {
        name: "snapshot_ttl",
        doc: "How long a session's snapshot is kept after it was written.",
    },
    Key {
        name: "snapshot_store_size",
        doc: "Every snapshot of the state dir together; past it the oldest are removed first.",
    },
    Key {
        name: "output_mode",
        doc: "Response text format: compact or toon.",
    },
    Key {
        name: "output_cap",
        doc: "stdout+stderr kept per call; beyond it the head and tail are kept with a marker.",
    },
    Key {
        name: "output_budget",
        doc: "cl100k tokens of output one result may carry; over it, a head-and-tail preview and the whole output as a file in /workspace/out/.outputs/.",
    },
    Key {
        name: "log_level",
        doc: "error, warning, info, debug or trace (any case).",
    },
    Key {
        name: "otel_endpoint",
        doc: "Send traces (OTLP over HTTP/protobuf) to this collector, its base URL (http://127.0.0.1:4318; /v1/traces is added): a span per run_python call, its proxied calls, sandbox, installs and approvals. Unset: the standard OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT decide; without any, none are sent.",
    },
    Key {
        name: "otel_content",
        doc: "Put a call's code and output on its span (each cut at 64 KiB); off, a span never carries code, output or a tool's arguments.",
    },
    Key {
        name: "allow_self_server",
        doc: "Keep server entries that would launch this bridge again.",
    },
    Key {
        name: "allow_unenforced_limits",
        doc: "Run even when the host cannot enforce a resource limit (doctor says which).",
    },
    Key {
        name: "tmp_size",
        doc: "Size cap of the sandbox's /tmp tmpfs.",
    },
    Key {
        name: "workspace_size",
        doc: "Size cap of the sandbox's /workspace tmpfs.",
    },
    Key {
        name: "inputs_size",
        doc: "Size cap of the sandbox's /data tmpfs, where the [[inputs]] are copied at each session's start (mounted only when inputs are declared).",
    },
    Key {
        name: "file_cap",
        doc: "Largest file copied out of /workspace/out (a resource link; larger ones are skipped with a notice).",
    },
    Key {
        name: "files_per_call",
        doc: "Most files of /workspace/out copied out per call (new or changed ones).",
    },
    Key {
        name: "files_total",
        doc: "Bytes of /workspace/out files kept on the host per session, until it is reset or closed.",
    },
    Key {
        name: "nofile",
        doc: "Open-files ulimit inside the sandbox (must not exceed the host's).",
    },
    Key {
        name: "servers_file",
        doc: "An extra mcpServers JSON file, read before the usual places.",
    },
    Key {
        name: "upstream_call_timeout",
        doc: "Time limit of one proxied tool call.",
    },
    Key {
        name: "upstream_idle_timeout",
        doc: "An upstream server is stopped after this long unused.",
    },
    Key {
        name: "upstream_start_timeout",
        doc: "Time limit for starting an upstream server and its MCP handshake (npx/uvx may download it first).",
    },
    Key {
        name: "policy.default",
        doc: "allow, ask or deny: what a proxied tool call no rule matches gets.",
    },
    Key {
        name: "policy.allow",
        doc: "\"server.tool\" globs (on real names) of calls that run; a list, or comma-separated in the environment.",
    },
    Key {
        name: "policy.ask",
        doc: "\"server.tool\" globs of calls the user approves first (elicitation in the client).",
    },
    Key {
        name: "policy.deny",
        doc: "\"server.tool\" globs of calls refused (ToolDenied in Python). Of all matching rules the most restrictive wins: deny > ask > allow.",
    },
    Key {
        name: "policy.destructive",
        doc: "allow, ask, deny or unset: for tools no rule matches whose annotations say destructiveHint (not readOnlyHint); unset follows default.",
    },
    Key {
        name: "policy.ask_fallback",
        doc: "allow or deny: what ask means when the client cannot be asked (no elicitation).",
    },
    Key {
        name: "policy.flows.enabled",
        doc: "Check where the guarded arguments of acting and open tools come from (docs/policy.md, Flows); off by default.",
    },
    Key {
        name: "policy.flows.untrusted",
        doc: "\"server.tool\" globs of tools whose results carry someone else's words (mail, web pages, reviews); a list, or comma-separated in the environment.",
    },
    Key {
        name: "policy.flows.private",
        doc: "\"server.tool\" globs of tools whose results are private: an open tool's argument may not carry a run of their text unasked.",
    },
    Key {
        name: "policy.flows.acting",
        doc: "\"server.tool\" globs of tools that act on the world: their guarded arguments must be the user's intent, not text of an untrusted result.",
    },
    Key {
        name: "policy.flows.open",
        doc: "\"server.tool\" globs of tools that send their arguments to others: checked as acting tools are, and for private text.",
    },
    Key {
        name: "policy.flows.guard",
        doc: "The arguments that must be the user's intent, per \"server.tool\" glob (a table of lists; in the environment glob=arg+arg entries split at ;); a tool no glob names has every argument guarded.",
    },
    Key {
        name: "policy.flows.on_suspect",
        doc: "ask or deny: what a call gets whose guarded argument came from untrusted content or carries private text.",
    },
    Key {
        name: "policy.flows.annotations",
        doc: "Label tools by their MCP annotations too, where a server sets them: openWorldHint untrusted, readOnlyHint false or destructiveHint acting, both open.",
    },
    Key {
        name: "audit.path",
        doc: "The audit log (JSON lines, mode 0600): one record per run_python call and per proxied tool call. An absolute path, or off.",
    },
    Key {
        name: "audit.code",
        doc: "What of the executed code a record keeps: sha256 (its digest) or full (the code too, up to 64 KiB).",
    },
    Key {
        name: "audit.max_size",
        doc: "Size at which the audit log is rotated (audit.jsonl becomes audit.jsonl.1).",
    },
    Key {
        name: "audit.keep",
        doc: "Rotated audit files kept (.1 newest to .N oldest); older ones are deleted. At most 100.",
    },
    Key {
        name: "skills.max_size",
        doc: "Most bytes of one saved skill (runtime.save_skill): its source and description together. 256 to 1m.",
    },
    Key {
        name: "skills.max_count",
        doc: "Most skills kept in <state_dir>/skills; saving one more is refused until one is removed. 1 to 1000.",
    },
    Key {
        name: "skills.save",
        doc: "allow, ask or deny: whether runtime.save_skill stores a skill (every later session runs it); ask shows the user its name, description and source first, and without a client to ask follows policy.ask_fallback.",
    },
    Key {
        name: "packages.allow",
        doc: "Distribution-name globs (normalized: scikit-*) the code may install with runtime.install without asking; a list, or comma-separated in the environment.",
    },
    Key {
        name: "packages.deny",
        doc: "Distribution-name globs refused (PackageDenied in Python). deny > allow; a name neither matches is asked, naming every dependency that comes with it.",
    },
    Key {
        name: "packages.ask_fallback",
        doc: "allow or deny: what ask means when the client cannot be asked; unset follows policy.ask_fallback.",
    },
    Key {
        name: "packages.index_url",
        doc: "The simple index (PEP 503/691) the host resolves and downloads from; the sandbox never reaches it.",
    },
    Key {
        name: "packages.find_links",
        doc: "An absolute path of a directory of wheels searched besides the index (alone with packages.offline).",
    },
    Key {
        name: "packages.offline",
        doc: "Reach no index: install only from packages.find_links and the host's cache.",
    },
    Key {
        name: "packages.preinstall",
        doc: "Requirements installed into every new session (pooled ones too) before its first call; a list, or comma-separated in the environment.",
    },
    Key {
        name: "packages.max_size",
        doc: "Most bytes (unpacked) one session may have installed; each file and directory counts 4096 bytes besides its bytes.",
    },
    Key {
        name: "packages.cache_max_size",
        doc: "Most bytes the host's package cache (<state_dir>/packages) keeps, each unpacked file and directory counting 4096 bytes besides its bytes; the least recently used wheels are pruned first.",
    },
    Key {
        name: "packages.uv",
        doc: "The resolver, uv: a path, or a name found on PATH.",
    },
    Key {
        name: "packages.timeout",
        doc: "Time limit of one install: resolving, downloading and unpacking.",
    },
    Key {
        name: "listen",
        doc: "Address and port `serve` listens on; an address other than loopback needs token_file or oauth.",
    },
    Key {
        name: "token_file",
        doc: "`serve`'s bearer tokens: lines of `name:token` (the name is the identity); read at start.",
    },
    Key {
        name: "http.allowed_hosts",
        doc: "`Host` values `serve` accepts besides loopback names and the listen address (DNS-rebinding protection); `*` for any.",
    },
    Key {
        name: "http.allowed_origins",
        doc: "Browser `Origin`s accepted besides loopback ones (`https://app.example`, `:*` for any port); others get 403.",
    },
    Key {
        name: "http.tls_cert",
        doc: "PEM certificate chain; with http.tls_key, `serve` speaks HTTPS.",
    },
    Key {
        name: "http.tls_key",
        doc: "PEM private key of http.tls_cert.",
    },
    Key {
        name: "http.public_url",
        doc: "URL clients reach /mcp at (behind a proxy, the proxy's), named by the Protected Resource Metadata; else from each request's Host.",
    },
    Key {
        name: "http.max_sessions_per_identity",
        doc: "Most sandbox sessions one identity keeps alive under `serve` (max_sessions bounds them all).",
    },
    Key {
        name: "http.max_requests_per_identity",
        doc: "Most requests of one identity in flight at once; more are answered 429.",
    },
    Key {
        name: "http.max_request_size",
        doc: "Largest request body `serve` reads; more is answered 413.",
    },
    Key {
        name: "http.max_mcp_sessions_per_identity",
        doc: "Most MCP sessions (Mcp-Session-Id) one identity keeps open; its next initialize is answered 429.",
    },
    Key {
        name: "http.max_connections",
        doc: "Most connections `serve` holds open at once; the next is answered 503 and closed. At least 16; lowered to what the open-files limit allows.",
    },
    Key {
        name: "http.header_timeout",
        doc: "How long a client has to send a request's headers, and an idle connection is kept; then it is closed. 100ms to 5m.",
    },
    Key {
        name: "oauth.issuer",
        doc: "serve: accept OAuth access tokens (JWT) of this authorization server, checked against its published keys; https, or http on a loopback host.",
    },
    Key {
        name: "oauth.audience",
        doc: "serve: the aud a token must carry (this server's resource URL as the issuer knows it); required with oauth.issuer.",
    },
    Key {
        name: "oauth.other_issuers",
        doc: "serve: further authorization servers whose tokens are accepted, each with its own metadata and keys; their identities are sub@issuer.",
    },
];

/// What every configuration variable's name starts with.
pub const ENV_PREFIX: &str = "MCP_BRIDGE_";

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

/// Levenshtein distance, for suggesting the closest known name.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn keys_table_matches_config_fields() {
        let v = serde_json::to_value(Config::default()).unwrap();
        // A section (an object) contributes its keys as `section.key`.
        let mut fields: Vec<String> = Vec::new();
        // A section within a section (`[policy.flows]`) contributes `policy.flows.key`; a
        // table value (`policy.flows.guard`) is one key.
        fn walk(prefix: &str, v: &serde_json::Value, fields: &mut Vec<String>) {
            for (k, v) in v.as_object().unwrap() {
                let name = format!("{prefix}{k}");
                match v.as_object() {
                    _ if name == "servers" || name == "inputs" => {}
                    Some(_) if name == "policy.flows.guard" => fields.push(name),
                    Some(_) => walk(&format!("{name}."), v, fields),
                    None => fields.push(name),
                }
            }
        }
        walk("", &v, &mut fields);
        fields.sort();
        let mut keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        keys.sort();
        assert_eq!(fields, keys);
    }
}
