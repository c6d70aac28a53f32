//! The warm pool of rmcp clients, one per upstream server.
//!
//! A server is started when first needed (stdio: a child process in its own process group, its
//! stderr forwarded line by line to our log with the server's name; HTTP: a Streamable HTTP
//! session) and kept warm across calls and sessions. Calls on one client run concurrently, each
//! bounded by the per-call timeout. A client whose connection died is restarted by the next use;
//! a call that finds its client dead before its request was written to the server is retried
//! once on a fresh client, a call whose server died after receiving it fails with an error that
//! says the server crashed. A server unused for the idle timeout is stopped (and started again
//! when needed); [`Pool::shutdown`] stops all of them and kills what does not exit.
//!
//! Tool lists are cached per server, hydrated on demand, kept across restarts (so search does not
//! restart idle servers), refreshed after every (re)start and on `notifications/tools/list_changed`.
//! With a [`Store`], every list a server gives is also persisted, and a slot whose definition has
//! an entry there starts with that list: it is served without starting the server, which starts
//! only when one of its tools is called (and then refreshes the entry in the background).
//!
//! The pool's slots are the bridge's one list of servers: each [`Slot`] holds what is shown of a
//! server ([`ServerInfo`]), its definition, and its connection state. An exec keeps the slots of
//! the servers it loaded (`Arc<Slot>`), so a proxied call goes to its slot without a lookup.
//!
//! How one server is started lives in [`super::connection`]; its secrets are resolved there, by
//! [`super::secrets`], at each start.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, JsonObject,
    ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, ServiceError};

mod error;

pub use error::CallError;

use super::connection::stderr_suffix;
use super::connection::{CancelOnDrop, Conn, StartError, ToolCache, connect};
use super::discovery::ServerEntry;
use super::info::ServerInfo;
use super::relay::CallRelay;
use super::store::{ServerIdentity, Store, StoredEntry, definition_digest, now_secs};
use bridge_core::boxed::Boxed;
use bridge_core::config::Config;

/// The longest a search waits for servers that have no catalog entry, by default; the ones
/// still starting are named as skipped and keep starting in the background, for the next search.
pub const SEARCH_WAIT: Duration = Duration::from_secs(10);

/// A list the server gave this recently counts as fresh for [`Pool::fresh_tools`].
pub(crate) const RELIST_WITHIN: Duration = Duration::from_secs(1);

/// Limits of the pool.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// Time limit of one tool call (config `upstream_call_timeout`).
    pub call_timeout: Duration,
    /// A server unused this long is stopped; zero keeps servers until shutdown
    /// (config `upstream_idle_timeout`).
    pub idle_timeout: Duration,
    /// Time limit for starting a server and completing the MCP handshake (npx / uvx may download
    /// the package the first time).
    pub start_timeout: Duration,
    /// The longest a search waits for servers that have no catalog entry (those still starting
    /// are named as skipped and go on starting in the background); capped by `start_timeout`.
    pub search_wait: Duration,
}

impl From<&Config> for UpstreamSettings {
    fn from(config: &Config) -> Self {
        UpstreamSettings {
            call_timeout: config.upstream_call_timeout.0,
            idle_timeout: config.upstream_idle_timeout.0,
            start_timeout: config.upstream_start_timeout.0,
            search_wait: SEARCH_WAIT,
        }
    }
}

/// The configuration's defaults: they are written once, in `Config::default`.
impl Default for UpstreamSettings {
    fn default() -> Self {
        UpstreamSettings::from(&Config::default())
    }
}

/// The pool. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    slots: Vec<Arc<Slot>>,
    settings: UpstreamSettings,
    reaper_started: AtomicBool,
    shut_down: AtomicBool,
}

/// One server: what is shown of it, its definition, and its connection.
pub(crate) struct Slot {
    pub(crate) info: ServerInfo,
    /// The definition, secrets included: it never leaves the host side.
    entry: ServerEntry,
    /// The live connection; the lock is held while starting, so concurrent users share one start.
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    tools: Arc<ToolCache>,
    /// Where the cached list came from and how old it is; its key in the persisted catalog.
    pub(crate) catalog: Arc<CatalogState>,
    last_used: Mutex<Instant>,
    in_flight: AtomicUsize,
    starts: AtomicU64,
    /// Held while a proxied call lists the server afresh ([`Pool::fresh_tools`]), so that
    /// concurrent calls of tools missing from the cache share one listing.
    relisting: tokio::sync::Mutex<()>,
    /// When a search last failed to start this server, and why (searches skip it for a while).
    pub(crate) search_failed: Mutex<Option<(Instant, String)>>,
    /// The renderings and checks of the cached list's schemas, made once per list.
    pub(crate) schemas: crate::schema::SchemaCache,
}

/// A slot's place in the persisted catalog.
pub(crate) struct CatalogState {
    /// [`definition_digest`] of the slot's definition.
    key: String,
    server: String,
    store: Option<Arc<Store>>,
    meta: Mutex<CatalogMeta>,
    /// When this bridge last stored a list the server gave (never for the file's).
    live_at: Mutex<Option<Instant>>,
}

/// How fresh a slot's tool list is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogMeta {
    /// When the list was taken from the server (seconds since the epoch); `None`: no list yet.
    pub updated_at: Option<u64>,
    /// The list came from the catalog file and this bridge has not listed the server since.
    pub from_file: bool,
    /// The name/version the server reported (at its last start, or when the entry was written).
    pub reported: Option<ServerIdentity>,
}

impl CatalogState {
    pub(crate) fn meta(&self) -> CatalogMeta {
        self.meta.lock().unwrap().clone()
    }

    /// Whether the cached list is the catalog file's, not yet confirmed by the server: what a
    /// policy decision may not rely on (the server may have gained or changed tools since).
    pub(crate) fn is_from_file(&self) -> bool {
        self.meta.lock().unwrap().from_file
    }

    /// A list just came from the server: note it, and persist it (soon, off the async threads).
    fn stored(self: &Arc<Self>, tools: &Arc<Vec<Tool>>) {
        *self.live_at.lock().unwrap() = Some(Instant::now());
        let entry = {
            let mut m = self.meta.lock().unwrap();
            m.updated_at = Some(now_secs());
            m.from_file = false;
            StoredEntry {
                server: self.server.clone(),
                reported: m.reported.clone(),
                updated_at: m.updated_at.unwrap_or(0),
                tools: tools.as_ref().clone(),
            }
        };
        if let Some(store) = &self.store {
            store.put_soon(&self.key, entry);
        }
    }

    /// What the server said it is at a start; a different one than the entry's is logged (the
    /// refresh that follows every start replaces the entry).
    fn reported(&self, identity: ServerIdentity) {
        let mut m = self.meta.lock().unwrap();
        if m.from_file
            && let Some(old) = &m.reported
            && old != &identity
        {
            tracing::info!(
                server = %self.server,
                "the server now reports {} {} (the catalog has {} {}); refreshing its entry",
                identity.name, identity.version, old.name, old.version
            );
        }
        m.reported = Some(identity);
    }
}

impl Slot {
    pub(crate) fn name(&self) -> &str {
        &self.info.name
    }

    /// The cached tool list, if any (never starts anything).
    pub(crate) fn cached_tools(&self) -> Option<Arc<Vec<Tool>>> {
        self.tools.get()
    }
}

/// Counts a call as in flight and marks the slot used.
struct InFlight<'a>(&'a Slot);

impl<'a> InFlight<'a> {
    fn new(slot: &'a Slot) -> Self {
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        *slot.last_used.lock().unwrap() = Instant::now();
        InFlight(slot)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        *self.0.last_used.lock().unwrap() = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// A pool over these servers, in this order; nothing starts until needed.
    #[cfg(test)]
    pub(crate) fn new(
        servers: impl IntoIterator<Item = (ServerInfo, ServerEntry)>,
        settings: UpstreamSettings,
    ) -> Self {
        Self::with_store(servers, settings, None)
    }

    /// A pool whose tool lists are seeded from, and persisted to, `store`.
    pub(crate) fn with_store(
        servers: impl IntoIterator<Item = (ServerInfo, ServerEntry)>,
        settings: UpstreamSettings,
        store: Option<Arc<Store>>,
    ) -> Self {
        let slots = servers
            .into_iter()
            .map(|(info, entry)| {
                let key = definition_digest(&entry);
                let tools = Arc::new(ToolCache::default());
                let mut meta = CatalogMeta::default();
                if let Some(stored) = store.as_ref().and_then(|s| s.get(&key)) {
                    meta = CatalogMeta {
                        updated_at: Some(stored.updated_at),
                        from_file: true,
                        reported: stored.reported,
                    };
                    tools.seed(stored.tools);
                }
                let catalog = Arc::new(CatalogState {
                    key,
                    server: info.name.clone(),
                    store: store.clone(),
                    meta: Mutex::new(meta),
                    live_at: Mutex::new(None),
                });
                let hook = catalog.clone();
                let _ = tools
                    .on_store
                    .set(Box::new(move |list: &Arc<Vec<Tool>>| hook.stored(list)));
                Arc::new(Slot {
                    info,
                    entry,
                    conn: tokio::sync::Mutex::new(None),
                    tools,
                    catalog,
                    last_used: Mutex::new(Instant::now()),
                    in_flight: AtomicUsize::new(0),
                    starts: AtomicU64::new(0),
                    relisting: tokio::sync::Mutex::new(()),
                    search_failed: Mutex::new(None),
                    schemas: Default::default(),
                })
            })
            .collect();
        Pool {
            inner: Arc::new(PoolInner {
                slots,
                settings,
                reaper_started: AtomicBool::new(false),
                shut_down: AtomicBool::new(false),
            }),
        }
    }

    /// The limits the pool was made with.
    pub fn settings(&self) -> &UpstreamSettings {
        &self.inner.settings
    }

    /// Every server, in the order given to [`Pool::new`].
    pub(crate) fn slots(&self) -> &[Arc<Slot>] {
        &self.inner.slots
    }

    /// The server of this exact name, for the diagnostics below (calls go through slots).
    fn find(&self, server: &str) -> Option<&Arc<Slot>> {
        self.inner.slots.iter().find(|s| s.name() == server)
    }

    /// The tool list, starting the server and listing its tools if not cached.
    pub(crate) async fn tools(&self, slot: &Slot) -> Result<Arc<Vec<Tool>>, CallError> {
        if let Some(t) = slot.tools.get() {
            return Ok(t);
        }
        self.list_live(slot).await
    }

    /// The tool list as the server gives it now (starting it if needed); stored and persisted.
    pub(crate) async fn list_live(&self, slot: &Slot) -> Result<Arc<Vec<Tool>>, CallError> {
        let server = slot.name();
        let _busy = InFlight::new(slot);
        let mut last_err = None;
        for _attempt in 0..2 {
            let conn = self.connection(slot).await?;
            let generation = slot.tools.generation.load(Ordering::SeqCst);
            match tokio::time::timeout(self.inner.settings.call_timeout, conn.peer.list_all_tools())
                .await
            {
                Ok(Ok(list)) => return Ok(slot.tools.store(generation, list)),
                Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                    conn.dead.store(true, Ordering::SeqCst);
                    last_err = Some(CallError::ListClosed {
                        server: server.to_string(),
                        stderr: conn.stderr_tail(),
                    });
                    continue;
                }
                Ok(Err(e)) => {
                    return Err(CallError::ListFailed {
                        server: server.to_string(),
                        reason: e.to_string(),
                    });
                }
                Err(_) => {
                    return Err(CallError::ListTimeout {
                        server: server.to_string(),
                        after: self.inner.settings.call_timeout,
                    });
                }
            }
        }
        Err(last_err.expect("the loop ends only after a closed connection"))
    }

    /// The tool list as the server gives it now, for a proxied call's decision: a list the
    /// server gave this bridge at `asked` or at most [`RELIST_WITHIN`] before is taken as it is,
    /// otherwise the server is listed (started if needed; bounded as a call is, by
    /// `upstream_start_timeout` and `upstream_call_timeout`). Concurrent callers wait for one
    /// listing, so code calling made-up names makes the server list at most about once a second.
    pub(crate) async fn fresh_tools(
        &self,
        slot: &Slot,
        asked: Instant,
    ) -> Result<Arc<Vec<Tool>>, CallError> {
        let _one = slot.relisting.lock().await;
        let recent = slot
            .catalog
            .live_at
            .lock()
            .unwrap()
            .is_some_and(|at| at + RELIST_WITHIN >= asked);
        if recent && let Some(t) = slot.tools.get() {
            return Ok(t);
        }
        self.list_live(slot).await
    }

    /// The cached tool list of a server, if any (never starts anything; diagnostics and tests).
    pub fn cached_tools(&self, server: &str) -> Option<Arc<Vec<Tool>>> {
        self.find(server)?.cached_tools()
    }

    /// How fresh a server's tool list is (never starts anything).
    pub fn catalog_meta(&self, server: &str) -> Option<CatalogMeta> {
        Some(self.find(server)?.catalog.meta())
    }

    /// List a server's tools for the catalog alone: a server this starts is stopped again
    /// unless a call is using it by then, so hydrating the catalog leaves nothing running.
    /// `fresh` lists it even when a list is cached.
    pub(crate) async fn hydrate(
        &self,
        slot: &Slot,
        fresh: bool,
    ) -> Result<Arc<Vec<Tool>>, CallError> {
        if !fresh && let Some(t) = slot.tools.get() {
            return Ok(t);
        }
        let starts = slot.starts.load(Ordering::SeqCst);
        let result = self.list_live(slot).await;
        if slot.starts.load(Ordering::SeqCst) != starts
            && slot.in_flight.load(Ordering::SeqCst) == 0
            && let Ok(mut guard) = slot.conn.try_lock()
            && let Some(conn) = guard.take()
        {
            tracing::debug!(server = %slot.name(), "stopping a server started only to list its tools");
            conn.stop().await;
        }
        result
    }

    /// The pid of a running stdio server (its process group), for diagnostics and tests; `None`
    /// for an unknown name, a server not running, and an HTTP server.
    #[inline(never)]
    pub fn pid<'a>(&'a self, server: &'a str) -> Boxed<'a, Option<u32>> {
        Box::pin(self.pid_here(server))
    }

    async fn pid_here(&self, server: &str) -> Option<u32> {
        let slot = self.find(server)?;
        let conn = slot.conn.lock().await;
        conn.as_ref().filter(|c| c.alive()).and_then(|c| c.pid)
    }

    /// How many times a server's cached tool list was invalidated by
    /// `notifications/tools/list_changed` (diagnostics and tests).
    pub fn tool_list_changes(&self, server: &str) -> u64 {
        self.find(server)
            .map(|s| s.tools.generation.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// How many times a server was started (diagnostics and tests).
    pub fn starts(&self, server: &str) -> u64 {
        self.find(server)
            .map(|s| s.starts.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// Whether a server has a live client (`false` for an unknown name).
    #[inline(never)]
    pub fn is_running<'a>(&'a self, server: &'a str) -> Boxed<'a, bool> {
        Box::pin(self.is_running_here(server))
    }

    async fn is_running_here(&self, server: &str) -> bool {
        let Some(slot) = self.find(server) else {
            return false;
        };
        slot.conn.lock().await.as_ref().is_some_and(|c| c.alive())
    }

    /// Call a tool. A tool's own failure is `Ok` with `is_error: true`.
    /// While it runs, the server's progress notifications for it and its questions go to
    /// `relay` (see `relay.rs`).
    pub(crate) async fn call_tool(
        &self,
        slot: &Slot,
        tool: &str,
        arguments: Option<JsonObject>,
        relay: &CallRelay,
    ) -> Result<CallToolResult, CallError> {
        let server = slot.name();
        let _busy = InFlight::new(slot);
        let timeout = self.inner.settings.call_timeout;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        // SEP-414: the server's own spans join the call's trace.
        let traced = bridge_core::trace::meta_of(&bridge_core::trace::Context::current());
        if !traced.is_empty() {
            params.meta = Some(rmcp::model::RequestMetaObject(rmcp::model::MetaObject(
                traced,
            )));
        }
        // The names an error carries, made only when there is one.
        let (server_, tool_) = (|| server.to_string(), || tool.to_string());

        for attempt in 0..2 {
            let conn = self.connection(slot).await?;
            // Watched from before the request goes out, so no dropped answer can slip past.
            let mut oversize = conn.oversize.clone();
            oversize.mark_unchanged();
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
            let handle = match conn
                .peer
                .send_request_with_option(request, PeerRequestOptions::with_timeout(timeout))
                .await
            {
                Ok(h) => h,
                Err(ServiceError::TransportClosed) if attempt == 0 => {
                    conn.dead.store(true, Ordering::SeqCst);
                    tracing::info!(server, "upstream connection was closed; restarting it");
                    continue;
                }
                Err(e) => {
                    conn.dead.store(true, Ordering::SeqCst);
                    return Err(CallError::Unreachable {
                        server: server_(),
                        reason: e.to_string(),
                        stderr: conn.stderr_tail(),
                    });
                }
            };
            let id = handle.id.clone();
            // rmcp gives every request a progress token of its own; what the server says of
            // this call goes to its relay from here on (a notification sent before this line,
            // in the moment since the request was queued, is only logged).
            let _route = conn
                .routes
                .route(handle.progress_token.clone(), tool, relay);
            let mut guard = CancelOnDrop {
                peer: conn.peer.clone(),
                id: Some(id.clone()),
                sent: conn.sent.clone(),
            };
            let result = tokio::select! {
                r = handle.await_response() => r,
                Ok(()) = oversize.changed() => {
                    return Err(CallError::TooLarge {
                        server: server_(),
                        tool: tool_(),
                        limit: super::stdio::MAX_MESSAGE_BYTES,
                    });
                }
            };
            guard.id = None;
            let reached = conn.sent.lock().unwrap().remove(&id);
            return match result {
                Ok(ServerResult::CallToolResult(r)) => Ok(r),
                Ok(ServerResult::InputRequiredResult(_)) => Err(CallError::InputRequired {
                    server: server_(),
                    tool: tool_(),
                }),
                Ok(ServerResult::CreateTaskResult(_)) => Err(CallError::TaskHandle {
                    server: server_(),
                    tool: tool_(),
                }),
                Ok(other) => Err(CallError::UnexpectedResult {
                    server: server_(),
                    tool: tool_(),
                    result: format!("{other:?}"),
                }),
                Err(ServiceError::Timeout { .. }) => Err(CallError::Timeout {
                    server: server_(),
                    tool: tool_(),
                    after: timeout,
                }),
                Err(ServiceError::McpError(e)) => Err(CallError::Refused {
                    server: server_(),
                    tool: tool_(),
                    reason: e.message.to_string(),
                }),
                Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                    conn.dead.store(true, Ordering::SeqCst);
                    if !reached && attempt == 0 {
                        tracing::info!(
                            server,
                            "upstream connection failed before the call reached it ({e}); restarting it"
                        );
                        continue;
                    }
                    Err(CallError::Crashed {
                        server: server_(),
                        tool: tool_(),
                        stderr: conn.stderr_tail(),
                    })
                }
                Err(ServiceError::Cancelled { reason }) => Err(CallError::Cancelled {
                    server: server_(),
                    tool: tool_(),
                    reason,
                }),
                Err(e) => Err(CallError::Failed {
                    server: server_(),
                    tool: tool_(),
                    reason: e.to_string(),
                }),
            };
        }
        Err(CallError::NotRestarted { server: server_() })
    }

    /// The live connection of a slot, starting (or restarting) the server if needed.
    async fn connection(&self, slot: &Slot) -> Result<Arc<Conn>, CallError> {
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(CallError::ShuttingDown);
        }
        let mut guard = slot.conn.lock().await;
        if let Some(conn) = guard.as_ref() {
            if conn.alive() {
                return Ok(conn.clone());
            }
            // Dead: let it go in the background (kills what is left of the process group).
            let old = guard.take().expect("checked");
            tracing::warn!(server = %slot.name(), "upstream server exited or its connection broke; restarting it{}", stderr_suffix(&old.stderr_tail()));
            tokio::spawn(async move { old.stop().await });
        }
        let start_timeout = self.inner.settings.start_timeout;
        let conn = tokio::time::timeout(
            start_timeout,
            connect(slot.name(), &slot.entry, slot.tools.clone()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(StartError::Timeout {
                server: slot.name().to_string(),
                after: start_timeout,
            })
        })?;
        let conn = Arc::new(conn);
        slot.starts.fetch_add(1, Ordering::SeqCst);
        if let Some(info) = conn.peer.peer_info()
            && let Some(server) = &info.server_info
        {
            slot.catalog.reported(ServerIdentity {
                name: server.name.clone(),
                version: server.version.clone(),
            });
        }
        *guard = Some(conn.clone());
        drop(guard);
        self.ensure_reaper();
        // Refresh the cached tool list in the background when one is cached (it may have changed
        // while the server was down); otherwise the caller hydrates it.
        if slot.tools.get().is_some() {
            let generation = slot.tools.generation.load(Ordering::SeqCst);
            let tools = slot.tools.clone();
            let peer = conn.peer.clone();
            let timeout = self.inner.settings.call_timeout;
            tokio::spawn(async move {
                if let Ok(Ok(list)) = tokio::time::timeout(timeout, peer.list_all_tools()).await {
                    tools.store(generation, list);
                }
            });
        }
        Ok(conn)
    }

    /// Stops idle servers from time to time.
    fn ensure_reaper(&self) {
        let idle = self.inner.settings.idle_timeout;
        if idle.is_zero() || self.inner.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak: Weak<PoolInner> = Arc::downgrade(&self.inner);
        let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.shut_down.load(Ordering::SeqCst) {
                    return;
                }
                for slot in inner.slots.iter() {
                    if slot.in_flight.load(Ordering::SeqCst) > 0
                        || slot.last_used.lock().unwrap().elapsed() < idle
                    {
                        continue;
                    }
                    let Ok(mut guard) = slot.conn.try_lock() else {
                        continue;
                    };
                    if let Some(conn) = guard.take() {
                        tracing::info!(server = %slot.name(), "stopping upstream server after {}s unused", idle.as_secs());
                        tokio::spawn(async move { conn.stop().await });
                    }
                }
            }
        });
    }

    /// Stop every server (also the ones starting); later calls fail.
    pub(crate) async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let mut stops = Vec::new();
        for slot in self.inner.slots.iter() {
            let conn = slot.conn.lock().await.take();
            if let Some(conn) = conn {
                stops.push(async move { conn.stop().await });
            }
        }
        futures::future::join_all(stops).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_core::error::Hinted as _;

    /// A pool of one server, and its slot.
    fn one(name: &str, entry: ServerEntry, settings: UpstreamSettings) -> (Pool, Arc<Slot>) {
        let pool = Pool::new([(ServerInfo::named(name, &entry), entry)], settings);
        let slot = pool.slots()[0].clone();
        (pool, slot)
    }

    fn stdio(command: &str, args: &[&str]) -> ServerEntry {
        ServerEntry {
            command: Some(command.into()),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_missing_command_is_a_clear_start_error() {
        let (pool, ghost) = one(
            "ghost",
            stdio("mcb-no-such-command-xyz", &[]),
            UpstreamSettings::default(),
        );
        let e = pool.tools(&ghost).await.unwrap_err();
        assert!(
            matches!(
                &e,
                CallError::Start(StartError::CommandNotFound { server, command })
                    if server == "ghost" && command == "mcb-no-such-command-xyz"
            ),
            "{e}"
        );
        assert_eq!(
            e.message(),
            "Server 'ghost' failed to start: command 'mcb-no-such-command-xyz' not found (is it installed and on PATH?)"
        );
        assert_eq!(e.hint().unwrap().text(), "is it installed and on PATH?");
        // Calls start it the same way, and fail the same way.
        let e = pool
            .call_tool(&ghost, "x", None, &CallRelay::default())
            .await
            .unwrap_err();
        assert!(
            matches!(e, CallError::Start(StartError::CommandNotFound { .. })),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_server_that_exits_reports_its_stderr() {
        let (pool, dies) = one(
            "dies",
            stdio("sh", &["-c", "echo 'fatal: missing API key' >&2; exit 3"]),
            UpstreamSettings::default(),
        );
        let e = pool.tools(&dies).await.unwrap_err();
        let CallError::Start(StartError::Handshake { stderr, .. }) = &e else {
            panic!("{e}")
        };
        assert_eq!(stderr, &["fatal: missing API key"]);
        assert!(
            e.to_string().contains("failed to start")
                && e.to_string().contains("fatal: missing API key"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn http_connect_errors_say_why_without_the_query() {
        for (url, why) in [
            ("http://127.0.0.1:9/mcp?token=abc123", "Connection refused"),
            ("https://127.0.0.1:9/mcp?token=abc123", "Connection refused"),
        ] {
            let entry = ServerEntry {
                url: Some(url.into()),
                ..Default::default()
            };
            let (pool, h) = one("h", entry, UpstreamSettings::default());
            let e = pool.tools(&h).await.unwrap_err();
            let CallError::Start(StartError::Connect { server, reason, .. }) = &e else {
                panic!("{e}")
            };
            assert_eq!(server, "h");
            assert!(reason.contains(why), "{e}");
            let e = e.message();
            assert!(e.contains("Server 'h' failed to start"), "{e}");
            assert!(!e.contains("abc123"), "the query leaked: {e}");
        }
    }

    #[tokio::test]
    async fn a_silent_server_hits_the_start_timeout() {
        let (pool, mute) = one(
            "mute",
            stdio("sleep", &["30"]),
            UpstreamSettings {
                start_timeout: Duration::from_millis(300),
                ..Default::default()
            },
        );
        let t = Instant::now();
        let e = pool.tools(&mute).await.unwrap_err();
        assert!(
            matches!(&e, CallError::Start(StartError::Timeout { after, .. }) if *after == Duration::from_millis(300)),
            "{e}"
        );
        let text = e.message();
        assert!(text.contains("handshake within 0.3s"), "{text}");
        assert!(
            e.hint()
                .unwrap()
                .text()
                .contains("MCP_BRIDGE_UPSTREAM_START_TIMEOUT"),
            "{text}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn after_shutdown_nothing_starts() {
        let (pool, s) = one("s", stdio("true", &[]), UpstreamSettings::default());
        pool.shutdown().await;
        let e = pool
            .call_tool(&s, "x", None, &CallRelay::default())
            .await
            .unwrap_err();
        assert!(matches!(e, CallError::ShuttingDown), "{e}");
    }
}
