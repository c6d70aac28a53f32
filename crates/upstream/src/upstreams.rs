//! The upstream side of the bridge ([`Upstreams`]): the discovered servers in their warm pool,
//! the persisted catalog, and what the side offers its callers: the `servers` report, searches
//! over every server's tools (started a few at a time when they have no catalog entry),
//! the catalog refresh, and shutdown. Binding an exec to its servers is in `bind.rs`; the RPCs
//! of a bound exec in `rpc.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge_core::boxed::Boxed;
use bridge_core::error::Hinted as _;
use bridge_core::flows::{FlowRules, Flows};
use bridge_core::identity::SessionKey;
use bridge_core::policy::{Approver, Grants, Policy};
use bridge_core::protocol::DiscoveredServer;

use super::catalog::{self, ServerTools};
use super::discovery::{
    Discovery, DiscoveryContext, SOURCES, SearchedLocation, SkippedEntry, discover,
};
use super::info::ServerInfo;
use super::pool::{CallError, Pool, Slot, UpstreamSettings};
use super::relay::CallRelay;
use super::report::{Refreshed, ServerSource, SkippedServer, SourcesReport};
use super::schema;
use super::store::{self, Store};

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

/// A hydration in progress, shared by every search that waits for it.
type Hydration = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), Unlisted>>>;

/// Why a search's hydration of one server listed no tools (shared by every search waiting for
/// it, so cloned).
#[derive(Debug, Clone, thiserror::Error)]
enum Unlisted {
    /// Starting or listing the server failed.
    #[error("{}", .0.message())]
    Failed(Arc<CallError>),
    /// The task listing it ended without an answer (it panicked or was cancelled).
    #[error("listing its tools failed: {0}")]
    Aborted(Arc<tokio::task::JoinError>),
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
    /// `[policy.flows]` and what each identity's calls saw (`rpc::ExecRpc::call_tool` checks
    /// and records; `server` records each call's code and what its reply showed).
    flows: Arc<Flows>,
}

/// Who a `run_python` call is for, as its proxied calls' policy needs it: the session (what
/// "allow for this session" is remembered under) and the client to ask, when it can be asked;
/// and what its proxied calls pass back to that client (their progress, their servers' questions).
#[derive(Clone, Default)]
pub struct CallContext {
    /// The session's key: under `serve`, the identity's own session, so approvals "for this
    /// session" and audit records are the identity's.
    pub session: SessionKey,
    /// Who asks the user about a call the policy says to ask about; `None` (or one that
    /// cannot ask) leaves such a call to `ask_fallback`.
    pub approver: Option<Arc<dyn Approver>>,
    /// Where the servers' progress and questions during the proxied calls go.
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
                flows: Arc::new(Flows::default()),
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

    /// The same upstream side with `flows` checked. Call before the first clone.
    pub fn with_flows(mut self, flows: Flows) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.flows = Arc::new(flows);
        }
        self
    }

    /// The flow rules and records (`[policy.flows]`).
    pub fn flows(&self) -> &Flows {
        &self.inner.flows
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
            .with_flows(Flows::new(FlowRules::from_loaded(loaded)))
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
    pub(crate) fn known(&self) -> Vec<String> {
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

    /// The "allow for this session" answers given so far.
    pub(crate) fn grants(&self) -> &Grants {
        &self.inner.grants
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
    pub(crate) fn lookup(&self, name: &str) -> Option<&Arc<Slot>> {
        find_server(self.inner.pool.slots(), name)
    }

    /// The hydrated catalog of one server (starts it if its tools are not cached).
    pub(crate) async fn server_tools(&self, slot: &Slot) -> Result<ServerTools, CallError> {
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
    pub(crate) async fn all_tools(&self) -> (Vec<ServerTools>, Vec<SkippedServer>) {
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
                Ok(Err(why)) => why.to_string(),
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
                    *slot.search_failed.lock().unwrap() = Some((Instant::now(), why));
                    Err(Unlisted::Failed(Arc::new(e)))
                }
            }
        });
        let h: Hydration = task
            .map(|r| r.unwrap_or_else(|e| Err(Unlisted::Aborted(Arc::new(e)))))
            .boxed()
            .shared();
        map.insert(name, h.clone());
        h
    }

    /// List every server's tools now, entry or not, and persist them (`servers --refresh`):
    /// [`hydrate_concurrency`] at a time, each within the start timeout; servers started for
    /// this are stopped again. `progress` is told of each server as it finishes.
    #[inline(never)]
    pub fn refresh_catalog<'a>(
        &'a self,
        progress: impl Fn(&Refreshed) + Send + 'a,
    ) -> Boxed<'a, Vec<Refreshed>> {
        Box::pin(self.refresh_catalog_here(Box::new(progress)))
    }

    async fn refresh_catalog_here(
        &self,
        progress: Box<dyn Fn(&Refreshed) + Send + '_>,
    ) -> Vec<Refreshed> {
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
                    .map(|tools| tools.len());
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
    /// written in the background; call this before a short-lived process exits). Fails with
    /// [`store::StoreError::Write`] when the state directory, its lock or the file cannot be
    /// written; without a persisted catalog there is nothing to write.
    #[inline(never)]
    pub fn flush_catalog(&self) -> Boxed<'_, Result<(), store::StoreError>> {
        Box::pin(self.flush_catalog_here())
    }

    async fn flush_catalog_here(&self) -> Result<(), store::StoreError> {
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
pub(crate) mod tests {
    use super::*;
    use crate::discovery::ServerEntry;

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

    /// The upstream side of servers named `names`, whose command does not exist.
    pub(crate) fn ups(names: &[&str]) -> Upstreams {
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
}
