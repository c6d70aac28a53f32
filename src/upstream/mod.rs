//! Upstream MCP servers: where their definitions come from ([`discovery`]), the warm client pool
//! ([`pool`]; one server's connection in [`connection`], its secrets in [`secrets`]), and the
//! catalog of their tools with fuzzy search ([`catalog`]). Errors say what happened and, apart,
//! what to do ([`error`]).
//!
//! The sandbox side sees upstreams only through [`Upstreams::bind`], which returns the metadata to
//! send with an exec and an [`RpcHandler`] that answers the sandbox's RPCs for that exec alone:
//! docs and search cover every discovered server (started and hydrated on demand), tool calls
//! only the servers loaded for the exec. The handler keeps the pool slots of those servers, so a
//! proxied call goes straight to its server. Nothing of a server's `env` or `headers` is ever part
//! of what goes to the sandbox.
//!
//! This side knows the wire types ([`crate::protocol`]) and the configuration, and nothing of the
//! sandbox.

pub mod catalog;
pub mod connection;
pub mod discovery;
pub mod error;
pub mod pool;
pub mod rpc;
pub mod secrets;
pub mod stdio;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::protocol::{DiscoveredServer, ExecBinding, LoadedServer};
use catalog::ServerTools;
pub use discovery::{
    DiscoveredEntry, Discovery, DiscoveryContext, Origin, SOURCES, SearchedLocation, ServerEntry,
    SkippedEntry, SourceKind, SourceSpec, discover,
};
pub use error::{Hint, Hinted};
use pool::Slot;
pub use pool::{CallError, Pool, UpstreamSettings};
pub use rpc::RpcError;

/// A server that failed to start is not tried again by searches for this long.
const SEARCH_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How many servers a search starts at once.
const SEARCH_CONCURRENCY: usize = 8;
/// Why [`Upstreams::load`] could not prepare an exec.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "Unknown MCP server{} {}",
        if names.len() > 1 { "s" } else { "" },
        names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
    )]
    UnknownServers {
        names: Vec<String>,
        /// Every discovered server, by name.
        known: Vec<String>,
    },
    /// Servers that could not be started or listed, each with its own advice, one per line.
    #[error("{}", .0.iter().map(Hinted::message).collect::<Vec<_>>().join("\n"))]
    Unavailable(Vec<CallError>),
}

impl Hinted for BindError {
    fn hint(&self) -> Option<Hint> {
        match self {
            BindError::UnknownServers { known, .. } => Some(known_servers(known)),
            BindError::Unavailable(_) => None,
        }
    }
}

/// Which names would have worked.
fn known_servers(known: &[String]) -> Hint {
    if known.is_empty() {
        Hint::clause(
            "no MCP servers are configured (see `mcp-code-bridge servers` for where they are read from)",
        )
    } else {
        Hint::clause(format!("known servers: {}", known.join(", ")))
    }
}

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

/// What the bridge shows of one server: no secrets, nothing that needs it running.
pub(crate) struct ServerInfo {
    pub(crate) name: String,
    alias: String,
    description: Option<String>,
    cwd: Option<String>,
    transport: &'static str,
    target: String,
    origin: Origin,
}

impl ServerInfo {
    fn new(d: &DiscoveredEntry, alias: String) -> ServerInfo {
        ServerInfo {
            name: d.name.clone(),
            alias,
            description: d.entry.description.clone(),
            cwd: d
                .entry
                .cwd
                .as_ref()
                .map(|c| c.to_string_lossy().to_string()),
            transport: d.entry.transport(),
            target: d.entry.target_summary(),
            origin: d.origin.clone(),
        }
    }

    /// A server whose alias is its name, from the TOML (for tests of the pool).
    #[cfg(test)]
    pub(crate) fn named(name: &str, entry: &ServerEntry) -> ServerInfo {
        let d = Discovery::from_entries([(name.to_string(), entry.clone())]);
        ServerInfo::new(&d.servers[0], name.to_string())
    }
}

/// The upstream side of the bridge. Cheap to clone; clones share the warm pool.
#[derive(Clone)]
pub struct Upstreams {
    inner: Arc<Inner>,
}

struct Inner {
    /// The servers, sorted by name (aliases assigned in that order), with their connections.
    pool: Pool,
    skipped: Vec<SkippedEntry>,
    warnings: Vec<String>,
    searched: Vec<SearchedLocation>,
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
        let pool = Pool::new(
            servers
                .into_iter()
                .zip(aliases)
                .map(|(s, alias)| (ServerInfo::new(&s, alias), s.entry)),
            settings,
        );
        Upstreams {
            inner: Arc::new(Inner {
                pool,
                skipped,
                warnings,
                searched,
            }),
        }
    }

    /// Discover servers as the loaded configuration says (TOML `[servers]`, `servers_file`,
    /// `allow_self_server`, this process's `HOME` / `XDG_CONFIG_HOME` / current directory), and
    /// build the upstream side with its timeouts. The config is layered from several files, so
    /// each `[servers.<name>]` table keeps the file that defined it, which `servers` and the log
    /// name.
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
        Upstreams::new(discover(&ctx), UpstreamSettings::from(config))
    }

    /// Every server, sorted by name.
    fn servers(&self) -> impl Iterator<Item = &ServerInfo> {
        self.inner.pool.slots().iter().map(|s| &s.info)
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
            self.inner.pool.slots().len(),
            self.known().join(", ")
        );
    }

    /// Every discovered server's name.
    fn known(&self) -> Vec<String> {
        self.servers().map(|s| s.name.clone()).collect()
    }

    /// Every discovered server: name, alias, description (no schemas, no secrets).
    pub fn discovered(&self) -> Vec<DiscoveredServer> {
        self.servers()
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
                .servers()
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

    /// [`Upstreams::load`], its error as the one text the model or the person at the CLI reads.
    pub async fn bind(&self, loaded: &[String]) -> Result<ExecBinding, String> {
        self.load(loaded).await.map_err(|e| e.message())
    }

    /// Prepare an exec that loads `loaded`: resolve the names (server names or aliases) once,
    /// start those servers and hydrate their tool lists (concurrently). The exec's RPC handler
    /// keeps their slots.
    pub async fn load(&self, loaded: &[String]) -> Result<ExecBinding, BindError> {
        let mut slots: Vec<Arc<Slot>> = Vec::new();
        let mut unknown = Vec::new();
        for name in loaded {
            match self.lookup(name) {
                Some(slot) => {
                    if !slots.iter().any(|s| Arc::ptr_eq(s, slot)) {
                        slots.push(slot.clone());
                    }
                }
                None => unknown.push(name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(BindError::UnknownServers {
                names: unknown,
                known: self.known(),
            });
        }
        let results = futures::future::join_all(slots.iter().map(|s| self.server_tools(s))).await;
        let mut servers = Vec::with_capacity(slots.len());
        let mut errors = Vec::new();
        for (slot, r) in slots.iter().zip(results) {
            let info = &slot.info;
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
            return Err(BindError::Unavailable(errors));
        }
        let rpc = rpc::ExecRpc::new(self.clone(), slots);
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

    /// The server a name means, among every discovered one.
    fn lookup(&self, name: &str) -> Option<&Arc<Slot>> {
        find_server(self.inner.pool.slots(), name)
    }

    /// The hydrated catalog of one server (starts it if its tools are not cached).
    async fn server_tools(&self, slot: &Slot) -> Result<ServerTools, CallError> {
        let tools = self.inner.pool.tools(slot).await?;
        let info = &slot.info;
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
        let candidates: Vec<Arc<Slot>> = self
            .inner
            .pool
            .slots()
            .iter()
            .filter(|s| {
                let mut failed = s.search_failed.lock().unwrap();
                if failed.is_some_and(|at| now.duration_since(at) >= SEARCH_RETRY_AFTER) {
                    *failed = None;
                }
                failed.is_none()
            })
            .cloned()
            .collect();
        use futures::StreamExt;
        let mut results: Vec<(usize, Arc<Slot>, Result<ServerTools, CallError>)> =
            futures::stream::iter(candidates.into_iter().enumerate())
                .map(|(i, slot)| async move {
                    let r = self.server_tools(&slot).await;
                    (i, slot, r)
                })
                .buffer_unordered(SEARCH_CONCURRENCY)
                .collect()
                .await;
        results.sort_by_key(|(i, _, _)| *i);
        let mut out = Vec::new();
        for (_, slot, r) in results {
            match r {
                Ok(t) => out.push(t),
                Err(e) => {
                    tracing::warn!(server = %slot.name(), "skipped in search_tool_docs: {}", e.message());
                    *slot.search_failed.lock().unwrap() = Some(Instant::now());
                }
            }
        }
        out
    }
}

/// The server a name means: the one of that name, else of that alias, else the one whose alias
/// the name becomes as an identifier (`My-Server` finds `my_server`).
fn find_server<'a>(slots: &'a [Arc<Slot>], name: &str) -> Option<&'a Arc<Slot>> {
    slots
        .iter()
        .find(|s| s.info.name == name)
        .or_else(|| slots.iter().find(|s| s.info.alias == name))
        .or_else(|| {
            let alias = catalog::sanitize_identifier(&name.to_lowercase(), "server");
            slots.iter().find(|s| s.info.alias == alias)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure returns figment::Error.
    fn toml_servers_keep_the_file_that_defined_them() {
        figment::Jail::expect_with(|jail| {
            // Nothing of the machine's /etc/mcp-code-bridge/config.toml.
            jail.set_env(crate::config::SYSTEM_CONFIG_ENV, "none");
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

    pub(super) fn ups(names: &[&str]) -> Upstreams {
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
        let e = u.load(&["gamma".into()]).await.err().unwrap();
        assert!(
            matches!(&e, BindError::UnknownServers { names, known } if names == &["gamma"] && known == &["alpha", "beta"]),
            "{e}"
        );
        assert_eq!(
            e.message(),
            "Unknown MCP server 'gamma'; known servers: alpha, beta"
        );
        let e = u
            .load(&["gamma".into(), "delta".into()])
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("Unknown MCP servers 'gamma', 'delta'"),
            "{e}"
        );
        let e = ups(&[]).load(&["x".into()]).await.err().unwrap();
        assert!(
            e.hint()
                .unwrap()
                .text()
                .contains("no MCP servers are configured"),
            "{e}"
        );
        // A server that cannot start is named with the reason.
        let e = u.load(&["alpha".into()]).await.err().unwrap();
        let BindError::Unavailable(errors) = &e else {
            panic!("{e}")
        };
        assert!(
            matches!(
                errors.as_slice(),
                [CallError::Start(connection::StartError::CommandNotFound { server, .. })] if server == "alpha"
            ),
            "{e}"
        );
        // The text the model gets joins each error with its advice.
        let text = u.bind(&["alpha".into()]).await.err().unwrap();
        assert!(
            text.contains("'alpha'") && text.contains("not found (is it installed"),
            "{text}"
        );
    }
}
