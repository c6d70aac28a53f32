//! Upstream MCP servers: where their definitions come from ([`discovery`]), the warm client pool
//! ([`pool`]; one server's connection in [`connection`], its secrets in [`secrets`]), and the
//! catalog of their tools with fuzzy search ([`catalog`]). What it reports to its callers (why
//! an exec could not be bound, what a search skipped, the `servers` view) is in [`report`].
//!
//! The sandbox side sees upstreams only through [`Upstreams::bind`], which returns the metadata to
//! send with an exec and an [`RpcHandler`] that answers the sandbox's RPCs for that exec alone:
//! docs and search cover every discovered server (served from the persisted catalog,
//! [`store`], and started only for a server that has no entry there), tool calls only the
//! servers loaded for the exec. The handler keeps the pool slots of those servers, so a
//! proxied call goes straight to its server. Nothing of a server's `env` or `headers` is ever part
//! of what goes to the sandbox.
//!
//! This side knows the wire types ([`bridge_core::protocol`]) and the configuration, and nothing of the
//! sandbox.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.
use bridge_core::boxed::Boxed;

pub mod catalog;
pub mod connection;
pub mod discovery;
pub mod pool;
mod record;
mod relay;
pub mod report;
pub mod rpc;
pub mod schema;
pub mod secrets;
pub mod stdio;
pub mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge_core::error::Hinted;
use bridge_core::identity::SessionKey;
use bridge_core::policy::{Approver, Grants, Policy};
use bridge_core::protocol::{CatalogInfo, DiscoveredServer, ExecBinding, LoadedServer};
use catalog::ServerTools;
pub use discovery::{
    DiscoveredEntry, Discovery, DiscoveryContext, Origin, SOURCES, SearchedLocation, ServerEntry,
    SkippedEntry, SourceKind, SourceSpec, discover,
};
use pool::Slot;
pub use pool::{CallError, CatalogMeta, Pool, UpstreamSettings};
pub use relay::{CallRelay, ClientLink, ProgressSink, UpstreamProgress};
pub use report::{BindError, Refreshed, ServerSource, SkippedServer, SourcesReport};
pub use rpc::RpcError;
use store::Store;

/// A server that failed to start is not tried again by searches for this long.
const SEARCH_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How many servers are started at once to list their tools (search, refresh): twice the CPUs,
/// between 4 and 8. Starting a server is mostly CPU (an interpreter, its imports); more at once
/// than the machine runs only makes every one of them late for a search's wait, while a few at
/// a time lets the first ones answer in time.
pub fn hydrate_concurrency() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(4)
        .clamp(4, 8)
}

/// The longest a search waits for servers that have no catalog entry, by default; the ones
/// still starting are named as skipped and keep starting in the background, for the next search.
pub const SEARCH_WAIT: Duration = Duration::from_secs(10);

/// A hydration in progress, shared by every search that waits for it.
type Hydration = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), String>>>;
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
    /// The persisted catalog, when there is one.
    store: Option<Arc<Store>>,
    /// Bounds how many servers are being started to list their tools.
    hydrate_permits: Arc<tokio::sync::Semaphore>,
    /// Hydrations under way, by server name.
    hydrating: std::sync::Mutex<std::collections::HashMap<String, Hydration>>,
    skipped: Vec<SkippedEntry>,
    warnings: Vec<String>,
    searched: Vec<SearchedLocation>,
    /// The `[policy]` every proxied call goes through (`rpc::ExecRpc::call_tool`).
    policy: Arc<Policy>,
    /// "Allow for this session" answers, by session and interpreter.
    grants: Grants,
}

/// Who a `run_python` call is for, as its proxied calls' policy needs it: the session (what
/// "allow for this session" is remembered under) and the client to ask, when it can be asked;
/// and what its proxied calls pass back to that client (their progress, their servers' questions).
#[derive(Clone, Default)]
pub struct CallContext {
    /// The session's key: under `serve`, the identity's own session, so approvals "for this
    /// session" and audit records are the identity's.
    pub session: SessionKey,
    pub approver: Option<Arc<dyn Approver>>,
    pub relay: CallRelay,
    /// Where each proxied call's `tool_call` record goes (off by default).
    pub audit: bridge_core::audit::Audit,
}

impl Upstreams {
    /// The upstream side without a persisted catalog (tool lists live in memory only).
    pub fn new(discovery: Discovery, settings: UpstreamSettings) -> Self {
        Self::with_store(discovery, settings, None)
    }

    /// The upstream side with the persisted catalog of `store`.
    pub fn with_store(
        discovery: Discovery,
        settings: UpstreamSettings,
        store: Option<Arc<Store>>,
    ) -> Self {
        let Discovery {
            mut servers,
            skipped,
            warnings,
            searched,
        } = discovery;
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        servers.dedup_by(|a, b| a.name == b.name);
        let aliases = catalog::assign_aliases(servers.iter().map(|s| s.name.as_str()), "server");
        let pool = Pool::with_store(
            servers
                .into_iter()
                .zip(aliases)
                .map(|(s, alias)| (ServerInfo::new(&s, alias), s.entry)),
            settings,
            store.clone(),
        );
        Upstreams {
            inner: Arc::new(Inner {
                pool,
                store,
                hydrate_permits: Arc::new(tokio::sync::Semaphore::new(hydrate_concurrency())),
                hydrating: Default::default(),
                skipped,
                warnings,
                searched,
                policy: Arc::new(Policy::default()),
                grants: Grants::default(),
            }),
        }
    }

    /// The same upstream side with `policy` in force. Call before the first clone.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.policy = Arc::new(policy);
        }
        self
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Forget what session `name` was allowed "for this session" (its interpreter is reset).
    pub fn forget_session(&self, name: &SessionKey) {
        self.inner.grants.forget(name);
    }

    /// Discover servers as the loaded configuration says (TOML `[servers]`, `servers_file`,
    /// `allow_self_server`, this process's `HOME` / `XDG_CONFIG_HOME` / current directory), and
    /// build the upstream side with its timeouts. The config is layered from several files, so
    /// each `[servers.<name>]` table keeps the file that defined it, which `servers` and the log
    /// name.
    pub fn from_loaded(loaded: &bridge_core::config::Loaded) -> Self {
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
        let store = Arc::new(Store::open(&config.state_dir));
        Upstreams::with_store(discover(&ctx), UpstreamSettings::from(config), Some(store))
            .with_policy(Policy::from_loaded(loaded))
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
        let known = self.known();
        if known.is_empty() {
            tracing::info!("no upstream MCP servers configured");
        } else {
            tracing::info!(
                "{} upstream server(s) discovered: {}",
                known.len(),
                known.join(", ")
            );
        }
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

    /// [`Upstreams::load_for`] with no session and no client to ask (`exec`): a call the
    /// policy says to ask about gets `ask_fallback`.
    pub async fn load(&self, loaded: &[String]) -> Result<ExecBinding, BindError> {
        self.load_for(loaded, CallContext::default()).await
    }

    /// Prepare an exec that loads `loaded`: resolve the names (server names or aliases) once,
    /// start those servers and hydrate their tool lists (concurrently). The exec's RPC handler
    /// keeps their slots, and applies the policy to every proxied call for `call`'s session.
    /// Each tool's metadata says whether the policy asks before calling it or refuses it.
    #[inline(never)]
    pub fn load_for<'a>(
        &'a self,
        loaded: &'a [String],
        call: CallContext,
    ) -> Boxed<'a, Result<ExecBinding, BindError>> {
        Box::pin(self.load_for_here(loaded, call))
    }

    async fn load_for_here(
        &self,
        loaded: &[String],
        call: CallContext,
    ) -> Result<ExecBinding, BindError> {
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
                    tools: self.mark_policy(slot, tools.into_tool_meta()),
                    catalog: catalog_info(&slot.catalog.meta()),
                }),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(BindError::Unavailable(errors));
        }
        let rpc = rpc::ExecRpc::new(self.clone(), slots, call);
        Ok(ExecBinding {
            servers,
            discovered: self.discovered(),
            rpc: Arc::new(rpc),
            skills: false,
        })
    }

    /// Set each tool's `policy` to `ask` or `deny` when the policy says so (before any grant:
    /// what the model plans with is the rule, not a session's answers).
    fn mark_policy(
        &self,
        slot: &Slot,
        mut tools: Vec<bridge_core::protocol::ToolMeta>,
    ) -> Vec<bridge_core::protocol::ToolMeta> {
        let policy = &self.inner.policy;
        if policy.allows_everything() {
            return tools;
        }
        let listed = slot.cached_tools();
        for t in &mut tools {
            let destructive = listed
                .as_ref()
                .and_then(|l| l.iter().find(|x| x.name == t.name))
                .is_some_and(bridge_core::policy::is_destructive);
            let action = policy.rule_for(slot.name(), &t.name, destructive).action;
            t.policy = (action != bridge_core::config::policy::Action::Allow)
                .then(|| action.as_str().to_string());
        }
        tools
    }

    /// Stop every upstream server (call on exit).
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.shutdown_here())
    }

    async fn shutdown_here(&self) {
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
        let schemas = schema::Schemas::of(&slot.schemas, &info.name, &tools);
        Ok(ServerTools::from_tools(
            &info.name,
            &info.alias,
            info.description.as_deref(),
            &tools,
            Some(&schemas),
        ))
    }

    /// The catalogs of every server for a search, and the servers left out with why. Servers
    /// with a catalog entry are served from it; the others are started (a few at a time, each
    /// within the start timeout) and waited for at most `search_wait`: one slow or broken
    /// server does not hold back the others' results. A server that failed is not retried by
    /// searches for [`SEARCH_RETRY_AFTER`].
    async fn all_tools(&self) -> (Vec<ServerTools>, Vec<SkippedServer>) {
        let now = Instant::now();
        let slots = self.inner.pool.slots();
        let mut skipped = Vec::new();
        let mut waits = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            if slot.cached_tools().is_some() {
                continue;
            }
            {
                let mut failed = slot.search_failed.lock().unwrap();
                if let Some((at, why)) = failed.as_ref() {
                    let ago = now.duration_since(*at);
                    if ago < SEARCH_RETRY_AFTER {
                        skipped.push((
                            i,
                            SkippedServer {
                                server: slot.name().to_string(),
                                reason: format!(
                                    "{why} (failed {}s ago; searches try it again after {}s)",
                                    ago.as_secs(),
                                    SEARCH_RETRY_AFTER.as_secs()
                                ),
                            },
                        ));
                        continue;
                    }
                    *failed = None;
                }
            }
            waits.push((i, self.hydration(slot.clone())));
        }
        let settings = self.inner.pool.settings();
        let wait = settings
            .search_wait
            .min(settings.start_timeout + Duration::from_secs(2));
        let deadline = tokio::time::Instant::now() + wait;
        let outcomes = futures::future::join_all(
            waits
                .into_iter()
                .map(|(i, h)| async move { (i, tokio::time::timeout_at(deadline, h).await) }),
        )
        .await;
        for (i, outcome) in outcomes {
            let slot = &slots[i];
            let reason = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(why)) => why,
                // Listed between the deadline and here: it is searched.
                Err(_) if slot.cached_tools().is_some() => continue,
                Err(_) => format!(
                    "still starting after {:.0}s; its tools will be searched once it answers",
                    wait.as_secs_f64()
                ),
            };
            skipped.push((
                i,
                SkippedServer {
                    server: slot.name().to_string(),
                    reason,
                },
            ));
        }
        skipped.sort_by_key(|(i, _)| *i);
        let catalogs = slots
            .iter()
            .filter_map(|slot| {
                let tools = slot.cached_tools()?;
                let info = &slot.info;
                let schemas = schema::Schemas::of(&slot.schemas, &info.name, &tools);
                Some(ServerTools::from_tools(
                    &info.name,
                    &info.alias,
                    info.description.as_deref(),
                    &tools,
                    Some(&schemas),
                ))
            })
            .collect();
        (catalogs, skipped.into_iter().map(|(_, s)| s).collect())
    }

    /// The hydration of one server's catalog entry for searches: started once (in a task of
    /// its own, so it goes on when a search stops waiting) and shared by whoever waits for it.
    fn hydration(&self, slot: Arc<Slot>) -> Hydration {
        use futures::FutureExt;
        let mut map = self.inner.hydrating.lock().unwrap();
        if let Some(h) = map.get(slot.name()) {
            return h.clone();
        }
        let up = self.clone();
        let name = slot.name().to_string();
        let task = tokio::spawn(async move {
            let _permit = up.inner.hydrate_permits.clone().acquire_owned().await;
            let r = up.inner.pool.hydrate(&slot, false).await;
            up.inner.hydrating.lock().unwrap().remove(slot.name());
            match r {
                Ok(_) => Ok(()),
                Err(e) => {
                    let why = e.message();
                    tracing::warn!(server = %slot.name(), "skipped in search_tool_docs: {why}");
                    *slot.search_failed.lock().unwrap() = Some((Instant::now(), why.clone()));
                    Err(why)
                }
            }
        });
        let h: Hydration = task
            .map(|r| r.unwrap_or_else(|e| Err(format!("listing its tools failed: {e}"))))
            .boxed()
            .shared();
        map.insert(name, h.clone());
        h
    }

    /// List every server's tools now, entry or not, and persist them (`servers --refresh`):
    /// [`hydrate_concurrency`] at a time, each within the start timeout; servers started for
    /// this are stopped again. `progress` is told of each server as it finishes.
    pub async fn refresh_catalog(&self, progress: impl Fn(&Refreshed)) -> Vec<Refreshed> {
        use futures::StreamExt;
        let slots: Vec<Arc<Slot>> = self.inner.pool.slots().to_vec();
        let mut done = Vec::with_capacity(slots.len());
        let mut stream = futures::stream::iter(slots)
            .map(|slot| async move {
                let t = Instant::now();
                let result = self
                    .inner
                    .pool
                    .hydrate(&slot, true)
                    .await
                    .map(|tools| tools.len())
                    .map_err(|e| e.message());
                Refreshed {
                    server: slot.name().to_string(),
                    result,
                    took: t.elapsed(),
                }
            })
            .buffer_unordered(hydrate_concurrency());
        while let Some(r) = stream.next().await {
            progress(&r);
            done.push(r);
        }
        done
    }
}

impl Upstreams {
    /// Write the catalog file now, merged with what other bridges wrote (list results are
    /// written in the background; call this before a short-lived process exits).
    pub async fn flush_catalog(&self) -> Result<(), store::StoreError> {
        let Some(store) = self.inner.store.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || store.flush())
            .await
            .unwrap_or(Ok(()))
    }

    /// The catalog file, when there is one.
    pub fn catalog_path(&self) -> Option<std::path::PathBuf> {
        self.inner.store.as_ref().map(|s| s.path())
    }
}

/// What `describe_server()` shows of a list's age.
fn catalog_info(meta: &CatalogMeta) -> Option<CatalogInfo> {
    Some(CatalogInfo {
        updated_at: meta.updated_at?,
        source: if meta.from_file { "catalog" } else { "live" }.to_string(),
    })
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
            jail.set_env(bridge_core::config::SYSTEM_CONFIG_ENV, "none");
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
            let loaded = bridge_core::config::load(
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
        let text = u.load(&["alpha".into()]).await.err().unwrap().message();
        assert!(
            text.contains("'alpha'") && text.contains("not found (is it installed"),
            "{text}"
        );
    }
}
