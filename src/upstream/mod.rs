//! Upstream MCP servers: where their definitions come from ([`discovery`]), the warm client pool
//! ([`pool`]), and the catalog of their tools with fuzzy search ([`catalog`]).
//!
//! The sandbox side sees upstreams only through [`Upstreams::bind`], which returns the metadata to
//! send with an exec and an [`RpcHandler`] that answers the sandbox's RPCs for that exec alone:
//! docs and search cover every discovered server (started and hydrated on demand), tool calls
//! only the servers loaded for the exec. Nothing of a server's `env` or `headers` is ever part
//! of what goes to the sandbox.

pub mod catalog;
pub mod discovery;
pub mod pool;
pub mod stdio;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::protocol::{DiscoveredServer, ExecBinding, LoadedServer, RpcHandler};
use catalog::{Detail, ServerTools};
pub use discovery::{
    DiscoveredEntry, Discovery, DiscoveryContext, Origin, SOURCES, SearchedLocation, ServerEntry,
    SkippedEntry, SourceKind, SourceSpec, discover,
};
pub use pool::{Pool, UpstreamSettings};

/// The largest `limit` a search honours.
pub const MAX_SEARCH_LIMIT: usize = 50;
/// The `limit` of a search that gives none.
pub const DEFAULT_SEARCH_LIMIT: usize = 5;
/// A server that failed to start is not tried again by searches for this long.
const SEARCH_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How many servers a search starts at once.
const SEARCH_CONCURRENCY: usize = 8;
/// Longest search query considered (the rest is ignored).
const MAX_QUERY_CHARS: usize = 1000;

/// One discovered server with its provenance, for the `servers` subcommand (no secrets: the
/// program for stdio servers, scheme://host/path for HTTP ones).
#[derive(Debug, Clone, Serialize)]
pub struct ServerSource {
    pub name: String,
    pub alias: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// `stdio npx` / `http https://example.com/mcp`.
    pub target: String,
    pub origin: Origin,
}

/// Everything the `servers` subcommand shows.
#[derive(Debug, Clone, Serialize)]
pub struct SourcesReport {
    /// The places read, in precedence order.
    pub sources: &'static [SourceSpec],
    pub servers: Vec<ServerSource>,
    pub skipped: Vec<SkippedEntry>,
    pub warnings: Vec<String>,
    pub searched: Vec<SearchedLocation>,
}

/// The upstream side of the bridge. Cheap to clone; clones share the warm pool.
#[derive(Clone)]
pub struct Upstreams {
    inner: Arc<Inner>,
}

struct Inner {
    /// Sorted by name; aliases assigned in that order.
    servers: Vec<ServerInfo>,
    by_name: HashMap<String, usize>,
    by_alias: HashMap<String, usize>,
    skipped: Vec<SkippedEntry>,
    warnings: Vec<String>,
    searched: Vec<SearchedLocation>,
    pool: Pool,
    /// Servers whose start failed recently, for search: name -> when.
    failed: Mutex<HashMap<String, Instant>>,
}

struct ServerInfo {
    name: String,
    alias: String,
    description: Option<String>,
    cwd: Option<String>,
    transport: &'static str,
    target: String,
    origin: Origin,
}

impl Upstreams {
    pub fn new(discovery: Discovery, settings: UpstreamSettings) -> Self {
        let Discovery {
            mut servers,
            skipped,
            warnings,
            searched,
        } = discovery;
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        servers.dedup_by(|a, b| a.name == b.name);
        let aliases = catalog::assign_aliases(servers.iter().map(|s| s.name.as_str()), "server");
        let infos: Vec<ServerInfo> = servers
            .iter()
            .zip(aliases)
            .map(|(s, alias)| ServerInfo {
                name: s.name.clone(),
                alias,
                description: s.entry.description.clone(),
                cwd: s
                    .entry
                    .cwd
                    .as_ref()
                    .map(|c| c.to_string_lossy().to_string()),
                transport: s.entry.transport(),
                target: s.entry.target_summary(),
                origin: s.origin.clone(),
            })
            .collect();
        let by_name = infos
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let by_alias = infos
            .iter()
            .enumerate()
            .map(|(i, s)| (s.alias.clone(), i))
            .collect();
        let pool = Pool::new(servers.into_iter().map(|s| (s.name, s.entry)), settings);
        Upstreams {
            inner: Arc::new(Inner {
                servers: infos,
                by_name,
                by_alias,
                skipped,
                warnings,
                searched,
                pool,
                failed: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Discover servers as the configuration says (TOML `[servers]`, `servers_file`,
    /// `allow_self_server`, this process's `HOME` / `XDG_CONFIG_HOME` / current directory) and
    /// build the upstream side with `upstream_call_timeout` and `upstream_idle_timeout`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        let ctx = DiscoveryContext::from_env(
            config.servers.clone(),
            config.servers_file.clone(),
            config.allow_self_server,
        );
        Upstreams::new(discover(&ctx), Self::settings_of(config))
    }

    /// [`Upstreams::from_config`] that also knows which TOML file defined each
    /// `[servers.<name>]` table (the config is layered from several files), so `servers` and
    /// the log name that file.
    pub fn from_loaded(loaded: &crate::config::Loaded) -> Self {
        let config = &loaded.config;
        let mut ctx = DiscoveryContext::from_env(
            config.servers.clone(),
            config.servers_file.clone(),
            config.allow_self_server,
        );
        ctx.config_files = config
            .servers
            .keys()
            .filter_map(|name| {
                // `source_of` names the file for values from a file ("environment", "default"
                // or "command line" otherwise; servers come from files only).
                let source = std::path::PathBuf::from(loaded.source_of(&format!("servers.{name}")));
                source.is_file().then(|| (name.clone(), source))
            })
            .collect();
        Upstreams::new(discover(&ctx), Self::settings_of(config))
    }

    fn settings_of(config: &crate::config::Config) -> UpstreamSettings {
        UpstreamSettings {
            call_timeout: config.upstream_call_timeout.0,
            idle_timeout: config.upstream_idle_timeout.0,
            start_timeout: config.upstream_start_timeout.0,
        }
    }

    /// Discovery's warnings (unreadable or broken files).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }

    /// The `servers` subcommand's text: every server with where it came from, the skipped
    /// entries with reasons, the warnings, and the places read in precedence order.
    pub fn report(&self) -> String {
        use std::fmt::Write;
        let r = self.sources();
        let mut out = String::new();
        if r.servers.is_empty() {
            out.push_str("No MCP servers discovered.\n");
        } else {
            let _ = writeln!(out, "{} MCP server(s):", r.servers.len());
            for s in &r.servers {
                let alias = if s.alias != s.name {
                    format!(" (mcp_{})", s.alias)
                } else {
                    String::new()
                };
                let _ = writeln!(out, "  {}{alias}  {}", s.name, s.target);
                let _ = writeln!(out, "      from {}", s.origin);
                if let Some(d) = &s.description {
                    let _ = writeln!(out, "      {d}");
                }
            }
        }
        if !r.skipped.is_empty() {
            let _ = writeln!(out, "\nSkipped:");
            for s in &r.skipped {
                let _ = writeln!(out, "  {}  ({})\n      {}", s.name, s.origin, s.reason);
            }
        }
        if !r.warnings.is_empty() {
            let _ = writeln!(out, "\nWarnings:");
            for w in &r.warnings {
                let _ = writeln!(out, "  {w}");
            }
        }
        let _ = writeln!(
            out,
            "\nSources, in precedence order (the first definition of a name wins):"
        );
        for (i, spec) in r.sources.iter().enumerate() {
            let _ = writeln!(out, "  {:>2}. {}  {}", i + 1, spec.location, spec.format);
            for place in r.searched.iter().filter(|p| p.kind == spec.kind) {
                let mark = if place.found { "read" } else { "absent" };
                let _ = writeln!(out, "        {mark}: {}", place.path.display());
            }
        }
        out
    }

    /// Log discovery's warnings (warn) and skipped entries (info); call once when serving.
    pub fn log_discovery(&self) {
        for w in &self.inner.warnings {
            tracing::warn!("server discovery: {w}");
        }
        for s in &self.inner.skipped {
            tracing::info!(server = %s.name, origin = %s.origin, "server entry skipped: {}", s.reason);
        }
        tracing::info!(
            "{} upstream server(s) discovered: {}",
            self.inner.servers.len(),
            self.inner
                .servers
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    /// Every discovered server: name, alias, description (no schemas, no secrets).
    pub fn discovered(&self) -> Vec<DiscoveredServer> {
        self.inner
            .servers
            .iter()
            .map(|s| DiscoveredServer {
                name: s.name.clone(),
                alias: s.alias.clone(),
                description: s.description.clone(),
            })
            .collect()
    }

    /// Provenance of everything discovery saw, for `mcp-code-bridge servers` and `doctor`.
    pub fn sources(&self) -> SourcesReport {
        SourcesReport {
            sources: SOURCES,
            servers: self
                .inner
                .servers
                .iter()
                .map(|s| ServerSource {
                    name: s.name.clone(),
                    alias: s.alias.clone(),
                    description: s.description.clone(),
                    transport: s.transport,
                    target: s.target.clone(),
                    origin: s.origin.clone(),
                })
                .collect(),
            skipped: self.inner.skipped.clone(),
            warnings: self.inner.warnings.clone(),
            searched: self.inner.searched.clone(),
        }
    }

    /// The warm pool (diagnostics, tests).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Prepare an exec that loads `loaded`: start those servers and hydrate their tool lists
    /// (concurrently). Names may be given as server names or aliases.
    pub async fn bind(&self, loaded: &[String]) -> Result<ExecBinding, String> {
        let mut idx: Vec<usize> = Vec::new();
        let mut unknown = Vec::new();
        for name in loaded {
            match self.lookup(name) {
                Some(i) => {
                    if !idx.contains(&i) {
                        idx.push(i);
                    }
                }
                None => unknown.push(name.as_str()),
            }
        }
        if !unknown.is_empty() {
            let list = unknown
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(format!(
                "Unknown MCP server{} {list}; {}",
                if unknown.len() > 1 { "s" } else { "" },
                self.known_hint()
            ));
        }
        let results = futures::future::join_all(idx.iter().map(|&i| self.server_tools(i))).await;
        let mut servers = Vec::with_capacity(idx.len());
        let mut errors = Vec::new();
        for (&i, r) in idx.iter().zip(results) {
            let info = &self.inner.servers[i];
            match r {
                Ok(tools) => servers.push(LoadedServer {
                    name: info.name.clone(),
                    alias: info.alias.clone(),
                    description: info.description.clone(),
                    cwd: info.cwd.clone(),
                    tools: tools.into_tool_meta(),
                }),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("\n"));
        }
        let rpc = ExecRpc {
            up: self.clone(),
            loaded: idx,
        };
        Ok(ExecBinding {
            servers,
            discovered: self.discovered(),
            rpc: Arc::new(rpc),
        })
    }

    /// Stop every upstream server (call on exit).
    pub async fn shutdown(&self) {
        self.inner.pool.shutdown().await;
    }

    fn lookup(&self, name: &str) -> Option<usize> {
        self.inner
            .by_name
            .get(name)
            .or_else(|| self.inner.by_alias.get(name))
            .copied()
            .or_else(|| {
                let lower = name.to_lowercase();
                self.inner
                    .by_alias
                    .get(&catalog::sanitize_identifier(&lower, "server"))
                    .copied()
            })
    }

    fn known_hint(&self) -> String {
        if self.inner.servers.is_empty() {
            "no MCP servers are configured (see `mcp-code-bridge servers` for where they are read from)"
                .into()
        } else {
            format!(
                "known servers: {}",
                self.inner
                    .servers
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }

    /// The hydrated catalog of one server (starts it if its tools are not cached).
    async fn server_tools(&self, i: usize) -> Result<ServerTools, String> {
        let info = &self.inner.servers[i];
        let tools = self.inner.pool.tools(&info.name).await?;
        Ok(ServerTools::from_tools(
            &info.name,
            &info.alias,
            info.description.as_deref(),
            &tools,
        ))
    }

    /// The catalogs of every server for a search; servers that fail are skipped (and not
    /// retried for a while).
    async fn all_tools(&self) -> Vec<ServerTools> {
        let now = Instant::now();
        let candidates: Vec<usize> = {
            let mut failed = self.inner.failed.lock().unwrap();
            failed.retain(|_, at| now.duration_since(*at) < SEARCH_RETRY_AFTER);
            (0..self.inner.servers.len())
                .filter(|i| !failed.contains_key(&self.inner.servers[*i].name))
                .collect()
        };
        use futures::StreamExt;
        let mut results: Vec<(usize, Result<ServerTools, String>)> =
            futures::stream::iter(candidates)
                .map(|i| async move { (i, self.server_tools(i).await) })
                .buffer_unordered(SEARCH_CONCURRENCY)
                .collect()
                .await;
        results.sort_by_key(|(i, _)| *i);
        let mut out = Vec::new();
        for (i, r) in results {
            match r {
                Ok(t) => out.push(t),
                Err(e) => {
                    let name = &self.inner.servers[i].name;
                    tracing::warn!(server = %name, "skipped in search_tool_docs: {e}");
                    self.inner
                        .failed
                        .lock()
                        .unwrap()
                        .insert(name.clone(), Instant::now());
                }
            }
        }
        out
    }
}

/// The RPC handler of one exec.
struct ExecRpc {
    up: Upstreams,
    /// Indices of the servers loaded for this exec.
    loaded: Vec<usize>,
}

fn param_str<'a>(params: &'a Value, key: &str, method: &str) -> Result<&'a str, String> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{method} needs a string parameter '{key}'"))
}

impl ExecRpc {
    fn server(&self, name: &str) -> Result<usize, String> {
        self.up
            .lookup(name)
            .ok_or_else(|| format!("Unknown MCP server '{name}'; {}", self.up.known_hint()))
    }

    async fn handle_inner(&self, method: &str, params: &Value) -> Result<Value, String> {
        let inner = &self.up.inner;
        match method {
            "list_servers" => Ok(json!(
                self.loaded
                    .iter()
                    .map(|&i| inner.servers[i].name.clone())
                    .collect::<Vec<_>>()
            )),
            "list_tools" => {
                let i = self.server(param_str(params, "server", method)?)?;
                Ok(json!(self.up.server_tools(i).await?.list()))
            }
            "query_tool_docs" => {
                let i = self.server(param_str(params, "server", method)?)?;
                let tool = match params.get("tool") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.as_str()),
                    Some(_) => return Err("query_tool_docs: 'tool' must be a string".into()),
                };
                let detail = Detail::parse(params.get("detail").and_then(Value::as_str));
                Ok(json!(self.up.server_tools(i).await?.docs(tool, detail)?))
            }
            "search_tool_docs" => {
                let query = param_str(params, "query", method)?;
                let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
                let limit = match params.get("limit") {
                    None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
                    Some(v) => v
                        .as_f64()
                        .map(|n| n.clamp(1.0, MAX_SEARCH_LIMIT as f64) as usize)
                        .ok_or("search_tool_docs: 'limit' must be a number")?,
                };
                let catalogs = self.up.all_tools().await;
                let refs: Vec<&ServerTools> = catalogs.iter().collect();
                Ok(json!(catalog::search(&refs, &query, limit)))
            }
            "call_tool" => {
                let name = param_str(params, "server", method)?;
                let i = self.server(name)?;
                let server = &inner.servers[i].name;
                if !self.loaded.contains(&i) {
                    return Err(format!(
                        "Server '{server}' is not loaded for this call; pass \"servers\": [\"{server}\"] to run_python to load it"
                    ));
                }
                let tool = param_str(params, "tool", method)?;
                let arguments = match params.get("arguments") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(o)) => Some(o.clone()),
                    Some(_) => {
                        return Err(
                            "call_tool: 'arguments' must be an object (keyword arguments)".into(),
                        );
                    }
                };
                // Accept the alias the proxies use; pass unknown names through for the server to judge.
                let tool_name = match inner.pool.cached_tools(server) {
                    // The runtime sends real names: skip building the catalog (it deep-copies
                    // every tool's schemas, ~10 % of the bridge's CPU per proxied call).
                    Some(tools) if tools.iter().any(|t| t.name == tool) => tool.to_string(),
                    Some(tools) => {
                        let st =
                            ServerTools::from_tools(server, &inner.servers[i].alias, None, &tools);
                        st.find(tool)
                            .map(|t| t.name.clone())
                            .unwrap_or_else(|| tool.to_string())
                    }
                    None => tool.to_string(),
                };
                let result = inner.pool.call_tool(server, &tool_name, arguments).await?;
                Ok(call_result_json(&result))
            }
            other => Err(format!(
                "Unknown RPC method '{other}'; the host answers list_servers, list_tools, query_tool_docs, search_tool_docs, call_tool"
            )),
        }
    }
}

/// A `CallToolResult` as the sandbox gets it: `content`, `structuredContent` (when present),
/// `isError` (always present), `_meta` (when present).
pub fn call_result_json(result: &rmcp::model::CallToolResult) -> Value {
    let mut v = serde_json::to_value(result)
        .unwrap_or_else(|e| json!({"content": [], "isError": true, "error": e.to_string()}));
    if let Some(o) = v.as_object_mut() {
        o.remove("resultType");
        o.entry("isError").or_insert(Value::Bool(false));
        o.entry("content").or_insert(json!([]));
    }
    v
}

#[async_trait::async_trait]
impl RpcHandler for ExecRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, String> {
        self.handle_inner(method, &params).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure returns figment::Error.
    fn toml_servers_keep_the_file_that_defined_them() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HOME", jail.directory().display().to_string());
            jail.set_env(
                "XDG_CONFIG_HOME",
                jail.directory().join("xdg").display().to_string(),
            );
            jail.create_dir("xdg/mcp-code-bridge")?;
            jail.create_file(
                "xdg/mcp-code-bridge/config.toml",
                "[servers.from_user]\ncommand = \"u\"\n",
            )?;
            jail.create_file("extra.toml", "[servers.from_flag]\ncommand = \"f\"\n")?;
            let loaded = crate::config::load(
                Some(std::path::Path::new("extra.toml")),
                &Default::default(),
            )
            .unwrap();
            let report = Upstreams::from_loaded(&loaded).report();
            assert!(
                report.contains("from extra.toml [servers.from_flag]"),
                "{report}"
            );
            assert!(
                report.contains("xdg/mcp-code-bridge/config.toml [servers.from_user]"),
                "{report}"
            );
            Ok(())
        });
    }

    fn ups(names: &[&str]) -> Upstreams {
        let entries = names.iter().map(|n| {
            (
                n.to_string(),
                ServerEntry {
                    command: Some("mcb-no-such-command-xyz".into()),
                    ..Default::default()
                },
            )
        });
        Upstreams::new(
            Discovery::from_entries(entries),
            UpstreamSettings::default(),
        )
    }

    #[test]
    fn discovered_servers_get_unique_aliases_in_name_order() {
        let u = ups(&["my-server", "My Server", "class", "9lives"]);
        let d = u.discovered();
        let pairs: Vec<(&str, &str)> = d
            .iter()
            .map(|s| (s.name.as_str(), s.alias.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("9lives", "_9lives"),
                ("My Server", "my_server"),
                ("class", "class_"),
                ("my-server", "my_server_2")
            ]
        );
        let r = u.sources();
        assert_eq!(r.servers.len(), 4);
        let text = u.report();
        assert!(
            text.contains("4 MCP server(s)") && text.contains("my-server (mcp_my_server_2)"),
            "{text}"
        );
        assert!(
            text.contains("precedence order") && text.contains("~/MCPs/*.json"),
            "{text}"
        );
        assert_eq!(r.servers[0].target, "stdio mcb-no-such-command-xyz");
        assert_eq!(r.sources.len(), SOURCES.len());
    }

    #[tokio::test]
    async fn bind_rejects_unknown_names_listing_the_known_ones() {
        let u = ups(&["alpha", "beta"]);
        let e = u.bind(&["gamma".into()]).await.err().unwrap();
        assert!(e.contains("'gamma'") && e.contains("alpha, beta"), "{e}");
        let e = ups(&[]).bind(&["x".into()]).await.err().unwrap();
        assert!(e.contains("no MCP servers are configured"), "{e}");
        // A server that cannot start is named with the reason.
        let e = u.bind(&["alpha".into()]).await.err().unwrap();
        assert!(e.contains("'alpha'") && e.contains("not found"), "{e}");
    }

    #[tokio::test]
    async fn rpc_enforces_loaded_servers_and_validates_params() {
        let u = ups(&["alpha", "beta"]);
        let b = u.bind(&[]).await.unwrap();
        assert!(b.servers.is_empty());
        assert_eq!(b.discovered.len(), 2);
        let rpc = b.rpc;
        assert_eq!(
            rpc.handle("list_servers", json!({})).await.unwrap(),
            json!([])
        );
        let e = rpc
            .handle(
                "call_tool",
                json!({"server": "beta", "tool": "x", "arguments": {}}),
            )
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "Server 'beta' is not loaded for this call; pass \"servers\": [\"beta\"] to run_python to load it"
        );
        let e = rpc
            .handle("call_tool", json!({"server": "zeta", "tool": "x"}))
            .await
            .unwrap_err();
        assert!(e.contains("Unknown MCP server 'zeta'"));
        assert!(
            rpc.handle("list_tools", json!({}))
                .await
                .unwrap_err()
                .contains("'server'")
        );
        assert!(
            rpc.handle("frobnicate", json!({}))
                .await
                .unwrap_err()
                .contains("Unknown RPC method")
        );
        // Search skips servers that cannot start, and answers.
        assert_eq!(
            rpc.handle("search_tool_docs", json!({"query": "x"}))
                .await
                .unwrap(),
            json!([])
        );
        assert!(
            rpc.handle("search_tool_docs", json!({"query": "x", "limit": "a"}))
                .await
                .is_err()
        );
    }

    #[test]
    fn call_results_keep_the_protocol_fields() {
        let r = rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text("hi")]);
        let v = call_result_json(&r);
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["isError"], false);
        assert!(v.get("resultType").is_none());
    }
}
