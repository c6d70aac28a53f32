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
//!
//! Secrets (`env`, `headers`, `{file:...}` / `${VAR}` references) are resolved here, at start, and
//! go nowhere but to the child process or the HTTP requests.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

#[allow(deprecated)] // Logging is deprecated by SEP-2577; servers still send it.
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientJsonRpcMessage, ClientRequest, Implementation,
    JsonObject, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam,
    ProtocolVersion, RequestId, ServerResult, Tool,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService, RxJsonRpcMessage,
    ServiceError, TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ServiceExt};
use tokio::io::AsyncBufReadExt;

use super::discovery::ServerEntry;

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
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        UpstreamSettings {
            call_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(600),
            start_timeout: Duration::from_secs(120),
        }
    }
}

/// How many stderr lines of a server are kept for error messages.
const STDERR_TAIL_LINES: usize = 12;
/// Longest stderr line kept (longer ones are cut).
const STDERR_LINE_MAX: usize = 400;
/// How long a graceful stop may take before the process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The pool. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    slots: BTreeMap<String, Arc<Slot>>,
    settings: UpstreamSettings,
    reaper_started: AtomicBool,
    shut_down: AtomicBool,
}

struct Slot {
    name: String,
    entry: ServerEntry,
    /// The live connection; the lock is held while starting, so concurrent users share one start.
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    tools: Arc<ToolCache>,
    last_used: Mutex<Instant>,
    in_flight: AtomicUsize,
    starts: AtomicU64,
}

/// The cached tool list of one server.
#[derive(Default)]
struct ToolCache {
    tools: Mutex<Option<Arc<Vec<Tool>>>>,
    /// Bumped by every invalidation, so a slow refresh does not overwrite a newer one.
    generation: AtomicU64,
}

impl ToolCache {
    fn get(&self) -> Option<Arc<Vec<Tool>>> {
        self.tools.lock().unwrap().clone()
    }
    fn invalidate(&self) -> u64 {
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *self.tools.lock().unwrap() = None;
        g
    }
    fn store(&self, generation: u64, tools: Vec<Tool>) -> Arc<Vec<Tool>> {
        let tools = Arc::new(tools);
        let mut guard = self.tools.lock().unwrap();
        if self.generation.load(Ordering::SeqCst) == generation || guard.is_none() {
            *guard = Some(tools.clone());
        }
        tools
    }
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
fn process_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
    !(state.starts_with('Z') || state.starts_with('X'))
}

/// One running client.
struct Conn {
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Handler>>>,
    /// Ids of requests whose bytes reached the server's stdin / the HTTP layer.
    sent: Arc<Mutex<HashSet<RequestId>>>,
    /// Set when a call saw the connection fail.
    dead: AtomicBool,
    /// The child's pid (= its process group id), for stdio servers.
    pid: Option<u32>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Changes when the server sent a message too long to read (stdio; see `stdio.rs`).
    oversize: tokio::sync::watch::Receiver<u64>,
}

impl Conn {
    fn alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
            && !self.peer.is_transport_closed()
            // A killed child is noticed here at once, before its closed pipe reaches the
            // transport: a call sent meanwhile would count as crashed mid-call, not retried.
            && self.pid.is_none_or(process_running)
    }

    fn stderr_hint(&self) -> String {
        stderr_hint(&self.stderr_tail)
    }

    /// Close the client, then make sure the process group is gone.
    async fn stop(&self) {
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            // Closing the transport closes the child's stdin, then SIGTERM, then SIGKILL.
            let _ = service.close_with_timeout(STOP_GRACE * 3).await;
        }
        if let Some(pid) = self.pid {
            kill_group(pid);
        }
    }
}

fn stderr_hint(tail: &Mutex<VecDeque<String>>) -> String {
    let tail = tail.lock().unwrap();
    if tail.is_empty() {
        String::new()
    } else {
        format!(
            "; its stderr ended with:\n{}",
            tail.iter().cloned().collect::<Vec<_>>().join("\n")
        )
    }
}

/// SIGKILL a process group (ignoring "no such process").
fn kill_group(pgid: u32) {
    if pgid > 1 {
        // SAFETY: plain syscall with a negative pid = the group we created for the child.
        unsafe {
            libc::kill(-(pgid as libc::pid_t), libc::SIGKILL);
        }
    }
}

/// Our side of one upstream connection: logs what the server says and keeps its tool list fresh.
struct Handler {
    server: String,
    tools: Arc<ToolCache>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("mcp-code-bridge", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        tracing::info!(server = %self.server, "upstream tool list changed; refreshing");
        let generation = self.tools.invalidate();
        let tools = self.tools.clone();
        let peer = context.peer.clone();
        let server = self.server.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(60), peer.list_all_tools()).await {
                Ok(Ok(list)) => {
                    tools.store(generation, list);
                }
                Ok(Err(e)) => {
                    tracing::info!(server = %server, "refreshing the tool list failed: {e}")
                }
                Err(_) => tracing::warn!(server = %server, "refreshing the tool list timed out"),
            }
        });
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let data = match &params.data {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let logger = params.logger.as_deref().unwrap_or("");
        match params.level {
            LoggingLevel::Debug => tracing::debug!(server = %self.server, logger, "{data}"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server = %self.server, logger, "{data}")
            }
            LoggingLevel::Warning => tracing::warn!(server = %self.server, logger, "{data}"),
            _ => tracing::error!(server = %self.server, logger, "{data}"),
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::debug!(
            server = %self.server,
            progress = params.progress,
            total = params.total,
            message = params.message.as_deref().unwrap_or(""),
            "upstream progress"
        );
    }
}

/// A transport that records which requests were written, to tell "never reached the server"
/// (safe to retry) from "the server died with it" (not safe).
struct Tracked<T> {
    inner: T,
    sent: Arc<Mutex<HashSet<RequestId>>>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tracked<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Only tool calls are tracked (their ids are removed when the call ends).
        let id = match &item {
            ClientJsonRpcMessage::Request(r)
                if matches!(r.request, ClientRequest::CallToolRequest(_)) =>
            {
                Some(r.id.clone())
            }
            _ => None,
        };
        let sent = self.sent.clone();
        let fut = self.inner.send(item);
        async move {
            let r = fut.await;
            if r.is_ok()
                && let Some(id) = id
            {
                sent.lock().unwrap().insert(id);
            }
            r
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Sends `notifications/cancelled` if a call's future is dropped before its answer (the sandbox
/// call was interrupted).
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    sent: Arc<Mutex<HashSet<RequestId>>>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        self.sent.lock().unwrap().remove(&id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let peer = self.peer.clone();
            rt.spawn(async move {
                let _ = peer
                    .notify_cancelled(CancelledNotificationParam::new(
                        Some(id),
                        Some("the caller went away".into()),
                    ))
                    .await;
            });
        }
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
    /// A pool over these servers; nothing starts until needed.
    pub fn new(
        servers: impl IntoIterator<Item = (String, ServerEntry)>,
        settings: UpstreamSettings,
    ) -> Self {
        let slots = servers
            .into_iter()
            .map(|(name, entry)| {
                let slot = Slot {
                    name: name.clone(),
                    entry,
                    conn: tokio::sync::Mutex::new(None),
                    tools: Arc::new(ToolCache::default()),
                    last_used: Mutex::new(Instant::now()),
                    in_flight: AtomicUsize::new(0),
                    starts: AtomicU64::new(0),
                };
                (name, Arc::new(slot))
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

    pub fn settings(&self) -> &UpstreamSettings {
        &self.inner.settings
    }

    fn slot(&self, server: &str) -> Result<&Arc<Slot>, String> {
        self.inner.slots.get(server).ok_or_else(|| {
            format!(
                "Unknown server '{server}'; known servers: {}",
                self.inner
                    .slots
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// The cached tool list, if any (never starts anything).
    pub fn cached_tools(&self, server: &str) -> Option<Arc<Vec<Tool>>> {
        self.inner.slots.get(server)?.tools.get()
    }

    /// The tool list, starting the server and listing its tools if not cached.
    pub async fn tools(&self, server: &str) -> Result<Arc<Vec<Tool>>, String> {
        let slot = self.slot(server)?;
        if let Some(t) = slot.tools.get() {
            return Ok(t);
        }
        let _busy = InFlight::new(slot);
        let mut last_err = String::new();
        for _attempt in 0..2 {
            let conn = self.connection(slot).await?;
            let generation = slot.tools.generation.load(Ordering::SeqCst);
            match tokio::time::timeout(self.inner.settings.call_timeout, conn.peer.list_all_tools())
                .await
            {
                Ok(Ok(list)) => return Ok(slot.tools.store(generation, list)),
                Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                    conn.dead.store(true, Ordering::SeqCst);
                    last_err = format!(
                        "Server '{server}' closed its connection while listing its tools{}",
                        conn.stderr_hint()
                    );
                    continue;
                }
                Ok(Err(e)) => {
                    return Err(format!("Server '{server}' failed to list its tools: {e}"));
                }
                Err(_) => {
                    return Err(format!(
                        "Server '{server}' did not list its tools within {}s",
                        self.inner.settings.call_timeout.as_secs()
                    ));
                }
            }
        }
        Err(last_err)
    }

    /// The pid of a running stdio server (its process group), for diagnostics and tests.
    pub async fn pid(&self, server: &str) -> Option<u32> {
        let slot = self.inner.slots.get(server)?;
        let conn = slot.conn.lock().await;
        conn.as_ref().filter(|c| c.alive()).and_then(|c| c.pid)
    }

    /// How many times a server's cached tool list was invalidated by
    /// `notifications/tools/list_changed` (diagnostics and tests).
    pub fn tool_list_changes(&self, server: &str) -> u64 {
        self.inner
            .slots
            .get(server)
            .map(|s| s.tools.generation.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// How many times a server was started (diagnostics and tests).
    pub fn starts(&self, server: &str) -> u64 {
        self.inner
            .slots
            .get(server)
            .map(|s| s.starts.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// Whether a server has a live client.
    pub async fn is_running(&self, server: &str) -> bool {
        let Some(slot) = self.inner.slots.get(server) else {
            return false;
        };
        slot.conn.lock().await.as_ref().is_some_and(|c| c.alive())
    }

    /// Call a tool. `Err` is a message for the model; a tool's own failure is `Ok` with
    /// `is_error: true`.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let slot = self.slot(server)?;
        let _busy = InFlight::new(slot);
        let timeout = self.inner.settings.call_timeout;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;

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
                    return Err(format!(
                        "Server '{server}' is not reachable: {e}{}",
                        conn.stderr_hint()
                    ));
                }
            };
            let id = handle.id.clone();
            let mut guard = CancelOnDrop {
                peer: conn.peer.clone(),
                id: Some(id.clone()),
                sent: conn.sent.clone(),
            };
            let result = tokio::select! {
                r = handle.await_response() => r,
                Ok(()) = oversize.changed() => {
                    return Err(format!(
                        "Server '{server}' answered with a message larger than {} MiB, the most one MCP message over stdio may carry; it was dropped, so the call of '{tool}' has no result. Ask the tool for less at a time (a page, a range, a filter).",
                        super::stdio::MAX_MESSAGE_BYTES >> 20
                    ));
                }
            };
            guard.id = None;
            let reached = conn.sent.lock().unwrap().remove(&id);
            return match result {
                Ok(ServerResult::CallToolResult(r)) => Ok(r),
                Ok(ServerResult::InputRequiredResult(_)) => Err(format!(
                    "Tool '{tool}' on server '{server}' asked for user input (elicitation), which the bridge cannot provide"
                )),
                Ok(ServerResult::CreateTaskResult(_)) => Err(format!(
                    "Tool '{tool}' on server '{server}' answered with a task handle, which the bridge does not support"
                )),
                Ok(other) => Err(format!(
                    "Server '{server}' answered the call of '{tool}' with an unexpected result: {other:?}"
                )),
                Err(ServiceError::Timeout { .. }) => Err(format!(
                    "Tool '{tool}' on server '{server}' did not answer within {}s (upstream_call_timeout); the call was cancelled",
                    timeout.as_secs()
                )),
                Err(ServiceError::McpError(e)) => Err(format!(
                    "Server '{server}' refused the call of '{tool}': {}",
                    e.message
                )),
                Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                    conn.dead.store(true, Ordering::SeqCst);
                    if !reached && attempt == 0 {
                        tracing::info!(
                            server,
                            "upstream connection failed before the call reached it ({e}); restarting it"
                        );
                        continue;
                    }
                    Err(format!(
                        "Server '{server}' crashed during the call of '{tool}' (it will be restarted on the next call){}",
                        conn.stderr_hint()
                    ))
                }
                Err(ServiceError::Cancelled { reason }) => Err(format!(
                    "The call of '{tool}' on server '{server}' was cancelled{}",
                    reason.map(|r| format!(": {r}")).unwrap_or_default()
                )),
                Err(e) => Err(format!(
                    "The call of '{tool}' on server '{server}' failed: {e}"
                )),
            };
        }
        Err(format!("Server '{server}' could not be restarted"))
    }

    /// The live connection of a slot, starting (or restarting) the server if needed.
    async fn connection(&self, slot: &Arc<Slot>) -> Result<Arc<Conn>, String> {
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err("The bridge is shutting down; upstream servers are stopped".into());
        }
        let mut guard = slot.conn.lock().await;
        if let Some(conn) = guard.as_ref() {
            if conn.alive() {
                return Ok(conn.clone());
            }
            // Dead: let it go in the background (kills what is left of the process group).
            let old = guard.take().expect("checked");
            tracing::warn!(server = %slot.name, "upstream server exited or its connection broke; restarting it{}", old.stderr_hint());
            tokio::spawn(async move { old.stop().await });
        }
        let conn = tokio::time::timeout(self.inner.settings.start_timeout, start(slot))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "Server '{}' did not complete the MCP handshake within {:.1}s. If it downloads itself on first start (npx, uvx), raise upstream_start_timeout (MCP_BRIDGE_UPSTREAM_START_TIMEOUT); the bridge log shows its stderr.",
                    slot.name,
                    self.inner.settings.start_timeout.as_secs_f64()
                ))
            })?;
        let conn = Arc::new(conn);
        slot.starts.fetch_add(1, Ordering::SeqCst);
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
                for slot in inner.slots.values() {
                    if slot.in_flight.load(Ordering::SeqCst) > 0
                        || slot.last_used.lock().unwrap().elapsed() < idle
                    {
                        continue;
                    }
                    let Ok(mut guard) = slot.conn.try_lock() else {
                        continue;
                    };
                    if let Some(conn) = guard.take() {
                        tracing::info!(server = %slot.name, "stopping upstream server after {}s unused", idle.as_secs());
                        tokio::spawn(async move { conn.stop().await });
                    }
                }
            }
        });
    }

    /// Stop every server (also the ones starting); later calls fail.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let mut stops = Vec::new();
        for slot in self.inner.slots.values() {
            let conn = slot.conn.lock().await.take();
            if let Some(conn) = conn {
                stops.push(async move { conn.stop().await });
            }
        }
        futures::future::join_all(stops).await;
    }

    /// Stop one server now (it starts again when next needed). For tests and diagnostics.
    pub async fn stop(&self, server: &str) {
        if let Some(slot) = self.inner.slots.get(server) {
            let conn = slot.conn.lock().await.take();
            if let Some(conn) = conn {
                conn.stop().await;
            }
        }
    }
}

/// Start one server: resolve its secrets, spawn or connect, handshake.
async fn start(slot: &Slot) -> Result<Conn, String> {
    let name = &slot.name;
    let resolved =
        resolve(&slot.entry).map_err(|e| format!("Server '{name}' cannot be started: {e}"))?;
    let handler = Handler {
        server: name.clone(),
        tools: slot.tools.clone(),
    };
    let sent = Arc::new(Mutex::new(HashSet::new()));
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));

    match resolved {
        Resolved::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(&command);
            cmd.args(&args).envs(&env).kill_on_drop(true);
            if let Some(cwd) = &cwd {
                cmd.current_dir(cwd);
            }
            let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
            wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
            let spawned = super::stdio::spawn(wrapped).map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::NotFound {
                    format!("command '{command}' not found (is it installed and on PATH?)")
                } else {
                    format!("cannot run '{command}': {e}")
                };
                format!("Server '{name}' failed to start: {hint}")
            })?;
            let super::stdio::Spawned {
                transport: proc,
                stderr,
                pid,
                oversize,
            } = spawned;
            let stderr_done = stderr.map(|stderr| {
                let tail = stderr_tail.clone();
                let server = name.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let mut line = line;
                        if line.len() > STDERR_LINE_MAX {
                            let mut cut = STDERR_LINE_MAX;
                            while !line.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            line.truncate(cut);
                            line.push('…');
                        }
                        tracing::info!(target: "mcp_code_bridge::upstream::stderr", server = %server, "{line}");
                        let mut t = tail.lock().unwrap();
                        if t.len() == STDERR_TAIL_LINES {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                })
            });
            let transport = Tracked {
                inner: proc,
                sent: sent.clone(),
            };
            match handler.serve(transport).await {
                Ok(service) => Ok(Conn {
                    peer: service.peer().clone(),
                    service: tokio::sync::Mutex::new(Some(service)),
                    sent,
                    dead: AtomicBool::new(false),
                    pid,
                    stderr_tail,
                    oversize,
                }),
                Err(e) => {
                    if let Some(pid) = pid {
                        kill_group(pid);
                    }
                    // Let the last stderr lines arrive: they usually say what went wrong.
                    if let Some(done) = stderr_done {
                        let _ = tokio::time::timeout(Duration::from_millis(500), done).await;
                    }
                    Err(format!(
                        "Server '{name}' failed to start: {}{}",
                        init_error_text(&e),
                        stderr_hint(&stderr_tail)
                    ))
                }
            }
        }
        Resolved::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut map = std::collections::HashMap::new();
            for (k, v) in headers {
                let name_ = http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| format!("Server '{name}': header name {k:?} is not valid"))?;
                let value = http::HeaderValue::from_str(&v).map_err(|_| {
                    format!("Server '{name}': the value of header {k:?} is not valid")
                })?;
                map.insert(name_, value);
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.clone()).custom_headers(map);
            let transport = StreamableHttpClientTransport::from_config(config);
            let transport = Tracked {
                inner: transport,
                sent: sent.clone(),
            };
            let service = handler.serve(transport).await.map_err(|e| {
                // The error text may quote the URL with its query (tokens): show it redacted.
                let text = init_error_text(&e).replace(&url, &redact(&url));
                format!(
                    "Server '{name}' failed to start: cannot connect to {}: {text}",
                    redact(&url)
                )
            })?;
            Ok(Conn {
                peer: service.peer().clone(),
                service: tokio::sync::Mutex::new(Some(service)),
                sent,
                dead: AtomicBool::new(false),
                pid: None,
                stderr_tail,
                // rmcp's HTTP client reports an oversized response as an error of the call.
                oversize: tokio::sync::watch::channel(0).1,
            })
        }
    }
}

/// A handshake error without transport type names, with the chain of causes.
fn init_error_text(e: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    match e {
        E::TransportError { error, context } => {
            let mut text = error.error.to_string();
            let mut source = error.error.source();
            while let Some(s) = source {
                let s_text = s.to_string();
                if !text.contains(&s_text) {
                    text.push_str(": ");
                    text.push_str(&s_text);
                }
                source = s.source();
            }
            // Some HTTP client errors keep their cause only in their Debug form.
            if let Some(detail) = connect_detail(&format!("{:?}", error.error))
                && !text.contains(&detail)
            {
                text.push_str(": ");
                text.push_str(&detail);
            }
            format!("{text} (during {context})")
        }
        E::ConnectionClosed(what) => {
            format!("the server closed the connection before answering ({what})")
        }
        other => other.to_string(),
    }
}

/// `ConnectError("tcp connect error", ..., Os { ..., message: "Connection refused" })` ->
/// `tcp connect error: Connection refused`.
fn connect_detail(debug: &str) -> Option<String> {
    let quoted_after = |key: &str| -> Option<String> {
        let start = debug.find(key)? + key.len();
        let end = debug[start..].find('"')?;
        Some(debug[start..start + end].to_string())
    };
    let what = quoted_after("ConnectError(\"")?;
    Some(match quoted_after("message: \"") {
        Some(m) => format!("{what}: {m}"),
        None => what,
    })
}

fn redact(url: &str) -> String {
    super::discovery::ServerEntry {
        url: Some(url.to_string()),
        ..Default::default()
    }
    .target_summary()
    .trim_start_matches("http ")
    .to_string()
}

/// A server definition with every reference resolved.
#[derive(Debug, PartialEq)]
pub(crate) enum Resolved {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Resolve references (`${VAR}`, `${VAR:-default}`, `${env:VAR}`, `{env:VAR}`, `{file:/path}`)
/// in every field, and merge `env_file` under `env` (`env` wins).
pub(crate) fn resolve(entry: &ServerEntry) -> Result<Resolved, String> {
    if let Some(url) = &entry.url {
        let url = expand(url, "url")?;
        let mut headers = BTreeMap::new();
        for (k, v) in &entry.headers {
            headers.insert(k.clone(), expand(v, &format!("headers.{k}"))?);
        }
        return Ok(Resolved::Http { url, headers });
    }
    let command = entry.command.as_deref().ok_or("it has no command")?;
    let command = expand(command, "command")?;
    let args = entry
        .args
        .iter()
        .enumerate()
        .map(|(i, a)| expand(a, &format!("args[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = BTreeMap::new();
    if let Some(file) = &entry.env_file {
        let file = PathBuf::from(expand(&file.to_string_lossy(), "env_file")?);
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read env_file {}: {e}", file.display()))?;
        env.extend(parse_env_file(&text));
    }
    for (k, v) in &entry.env {
        env.insert(k.clone(), expand(v, &format!("env.{k}"))?);
    }
    let cwd = match &entry.cwd {
        Some(c) => {
            let c = PathBuf::from(expand(&c.to_string_lossy(), "cwd")?);
            if !c.is_dir() {
                return Err(format!("its cwd {} is not a directory", c.display()));
            }
            Some(c)
        }
        None => None,
    };
    Ok(Resolved::Stdio {
        command,
        args,
        env,
        cwd,
    })
}

/// Expand references in one value. `what` names the field in errors (never the value).
pub(crate) fn expand(value: &str, what: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("${")
            && let Some(end) = after.find('}')
        {
            let inner = &after[..end];
            rest = &after[end + 1..];
            if let Some(input) = inner.strip_prefix("input:") {
                return Err(format!(
                    "{what} uses the VS Code input variable ${{input:{input}}}, which the bridge cannot prompt for; put the value in env or env_file"
                ));
            }
            let inner = inner.strip_prefix("env:").unwrap_or(inner);
            let (var, default) = match inner.split_once(":-") {
                Some((v, d)) => (v, Some(d)),
                None => (inner, None),
            };
            match (std::env::var(var), default) {
                (Ok(v), _) if !(v.is_empty() && default.is_some()) => out.push_str(&v),
                (_, Some(d)) => out.push_str(d),
                (_, None) => {
                    return Err(format!(
                        "{what} references the environment variable {var}, which is not set"
                    ));
                }
            }
            continue;
        }
        if let Some(after) = rest.strip_prefix("{env:")
            && let Some(end) = after.find('}')
        {
            let var = &after[..end];
            rest = &after[end + 1..];
            match std::env::var(var) {
                Ok(v) => out.push_str(&v),
                Err(_) => {
                    return Err(format!(
                        "{what} references the environment variable {var}, which is not set"
                    ));
                }
            }
            continue;
        }
        if let Some(after) = rest.strip_prefix("{file:")
            && let Some(end) = after.find('}')
        {
            let path = &after[..end];
            rest = &after[end + 1..];
            let text = std::fs::read_to_string(Path::new(path)).map_err(|e| {
                format!("{what} references the file {path}, which cannot be read: {e}")
            })?;
            out.push_str(text.trim_end_matches(['\n', '\r']));
            continue;
        }
        let c = rest.chars().next().expect("non-empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    Ok(out)
}

/// A dotenv file: `KEY=value`, `export KEY=value`, `#` comments, single / double quotes.
pub(crate) fn parse_env_file(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let v = v.trim();
        let value = if let Some(q) = v.strip_prefix('"') {
            let body = q.rfind('"').map(|i| &q[..i]).unwrap_or(q);
            let mut s = String::new();
            let mut chars = body.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some(o) => s.push(o),
                        None => s.push('\\'),
                    }
                } else {
                    s.push(c);
                }
            }
            s
        } else if let Some(q) = v.strip_prefix('\'') {
            q.rfind('\'').map(|i| &q[..i]).unwrap_or(q).to_string()
        } else {
            match v.find(" #") {
                Some(i) => v[..i].trim_end().to_string(),
                None => v.to_string(),
            }
        };
        out.push((k.to_string(), value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_and_missing_ones_are_errors_without_values() {
        // SAFETY: test-only env mutation of a unique name.
        unsafe { std::env::set_var("MCB_POOL_TEST_TOKEN", "s3cret") };
        assert_eq!(
            expand("Bearer ${MCB_POOL_TEST_TOKEN}", "h").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand("${env:MCB_POOL_TEST_TOKEN}", "h").unwrap(), "s3cret");
        assert_eq!(
            expand("{env:MCB_POOL_TEST_TOKEN}!", "h").unwrap(),
            "s3cret!"
        );
        assert_eq!(expand("${MCB_POOL_TEST_UNSET:-dflt}", "h").unwrap(), "dflt");
        assert_eq!(
            expand("plain $HOME {x} ${", "h").unwrap(),
            "plain $HOME {x} ${"
        );
        let e = expand("${MCB_POOL_TEST_UNSET}", "env.X").unwrap_err();
        assert!(e.contains("env.X") && e.contains("MCB_POOL_TEST_UNSET"));
        assert!(
            expand("${input:token}", "env.X")
                .unwrap_err()
                .contains("input")
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tok");
        std::fs::write(&f, "from-file\n").unwrap();
        assert_eq!(
            expand(&format!("{{file:{}}}", f.display()), "e").unwrap(),
            "from-file"
        );
        let e = expand("{file:/nonexistent/x}", "env.T").unwrap_err();
        assert!(e.contains("env.T"));
    }

    #[test]
    fn env_file_merges_under_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join(".env");
        std::fs::write(
            &f,
            "# comment\nA=1\nexport B=\"two words\\n\"\nC='lit $x'\nD=v # trailing\nbad line\nA_OVERRIDDEN=file\n",
        )
        .unwrap();
        let entry = ServerEntry {
            command: Some("srv".into()),
            env_file: Some(f),
            env: [("A_OVERRIDDEN".to_string(), "env".to_string())].into(),
            cwd: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let Resolved::Stdio { env, cwd, .. } = resolve(&entry).unwrap() else {
            panic!()
        };
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words\n");
        assert_eq!(env["C"], "lit $x");
        assert_eq!(env["D"], "v");
        assert_eq!(env["A_OVERRIDDEN"], "env");
        assert_eq!(cwd.as_deref(), Some(dir.path()));
        let bad = ServerEntry {
            command: Some("srv".into()),
            cwd: Some("/nonexistent/dir".into()),
            ..Default::default()
        };
        assert!(resolve(&bad).unwrap_err().contains("not a directory"));
    }

    #[tokio::test]
    async fn a_missing_command_is_a_clear_start_error() {
        let pool = Pool::new(
            [(
                "ghost".to_string(),
                ServerEntry {
                    command: Some("mcb-no-such-command-xyz".into()),
                    ..Default::default()
                },
            )],
            UpstreamSettings::default(),
        );
        let e = pool.tools("ghost").await.unwrap_err();
        assert!(e.contains("ghost") && e.contains("not found"), "{e}");
        let e = pool.call_tool("nope", "x", None).await.unwrap_err();
        assert!(
            e.contains("Unknown server 'nope'") && e.contains("ghost"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_server_that_exits_reports_its_stderr() {
        let pool = Pool::new(
            [(
                "dies".to_string(),
                ServerEntry {
                    command: Some("sh".into()),
                    args: vec![
                        "-c".into(),
                        "echo 'fatal: missing API key' >&2; exit 3".into(),
                    ],
                    ..Default::default()
                },
            )],
            UpstreamSettings::default(),
        );
        let e = pool.tools("dies").await.unwrap_err();
        assert!(
            e.contains("failed to start") && e.contains("fatal: missing API key"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn http_connect_errors_say_why_without_the_query() {
        for (url, why) in [
            ("http://127.0.0.1:9/mcp?token=abc123", "Connection refused"),
            ("https://127.0.0.1:9/mcp?token=abc123", "Connection refused"),
        ] {
            let pool = Pool::new(
                [(
                    "h".to_string(),
                    ServerEntry {
                        url: Some(url.into()),
                        ..Default::default()
                    },
                )],
                UpstreamSettings::default(),
            );
            let e = pool.tools("h").await.unwrap_err();
            assert!(e.contains("Server 'h' failed to start"), "{e}");
            assert!(e.contains(why), "{e}");
            assert!(!e.contains("abc123"), "the query leaked: {e}");
        }
    }

    #[tokio::test]
    async fn a_silent_server_hits_the_start_timeout() {
        let pool = Pool::new(
            [(
                "mute".to_string(),
                ServerEntry {
                    command: Some("sleep".into()),
                    args: vec!["30".into()],
                    ..Default::default()
                },
            )],
            UpstreamSettings {
                start_timeout: Duration::from_millis(300),
                ..Default::default()
            },
        );
        let t = Instant::now();
        let e = pool.tools("mute").await.unwrap_err();
        assert!(e.contains("handshake within 0.3s"), "{e}");
        assert!(e.contains("MCP_BRIDGE_UPSTREAM_START_TIMEOUT"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
