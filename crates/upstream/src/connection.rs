//! One connection to one upstream server: starting it (a stdio child in its own process group,
//! or a Streamable HTTP session) and the MCP handshake, our side of the session ([`Handler`]:
//! the server's log lines, progress and tool-list changes), the transport wrapper that tells a
//! request that never reached the server (safe to retry) from one the server died with, and the
//! tail of the server's stderr that error messages quote.
//!
//! The pool decides when to connect, reconnect and stop; this file knows how.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[allow(deprecated)] // Logging is deprecated by SEP-2577; servers still send it.
use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ClientRequest, ElicitRequestParams, ElicitResult, ErrorData, Implementation, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam, ProtocolVersion, RequestId, Tool,
};
use rmcp::service::{
    NotificationContext, Peer, RequestContext, RoleClient, RunningService, RxJsonRpcMessage,
    TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ServiceExt};
use tokio::io::AsyncRead;

use super::discovery::{ServerEntry, redact_url};
use super::relay::{Routes, UpstreamProgress};
use super::secrets::{ResolveError, Resolved, resolve};
use bridge_core::error::{Hint, Hinted};

/// How many stderr lines of a server are kept for error messages.
const STDERR_TAIL_LINES: usize = 12;
/// Longest stderr line kept (longer ones are cut).
const STDERR_LINE_MAX: usize = 400;
/// How long a graceful stop may take before the process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A secret its definition references (`${VAR}`, `{file:/path}`, `env_file`) could not be
    /// resolved; nothing was started.
    #[error("Server '{server}' cannot be started: {source}")]
    Unresolved {
        /// The server's name.
        server: String,
        /// Which reference failed, and why.
        source: ResolveError,
    },
    /// The stdio server's command is not on `PATH` (nor at the path given).
    #[error("Server '{server}' failed to start: command '{command}' not found")]
    CommandNotFound {
        /// The server's name.
        server: String,
        /// The command as its definition gives it.
        command: String,
    },
    /// The stdio server's command exists but could not be run (permissions, not executable,
    /// too many processes).
    #[error("Server '{server}' failed to start: cannot run '{command}': {source}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The command as its definition gives it.
        command: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The child ran but the MCP handshake failed (it exited, or answered something that is
    /// not MCP); its process group is killed.
    #[error("Server '{server}' failed to start: {reason}{}", stderr_suffix(stderr))]
    Handshake {
        /// The server's name.
        server: String,
        /// What the MCP client reported.
        reason: String,
        /// The last lines the child wrote to stderr (at most `STDERR_TAIL_LINES`, each cut at
        /// `STDERR_LINE_MAX` characters).
        stderr: Vec<String>,
    },
    /// The HTTP server could not be reached or did not complete the MCP handshake.
    #[error("Server '{server}' failed to start: cannot connect to {url}: {reason}")]
    Connect {
        /// The server's name.
        server: String,
        /// Its URL, redacted (no query, no user info).
        url: String,
        /// What the MCP client reported, with the URL in it redacted the same way.
        reason: String,
    },
    /// A name in the HTTP server's `headers` is not a valid HTTP header name.
    #[error("Server '{server}': header name {header:?} is not valid")]
    HeaderName {
        /// The server's name.
        server: String,
        /// The header's name as the definition gives it.
        header: String,
    },
    /// A value in the HTTP server's `headers` (after its secrets are resolved) is not a valid
    /// HTTP header value (a control character, a newline). The value itself is never shown.
    #[error("Server '{server}': the value of header {header:?} is not valid")]
    HeaderValue {
        /// The server's name.
        server: String,
        /// The name of the header whose value is wrong.
        header: String,
    },
    /// Starting and the handshake together took longer than the start timeout
    /// (`upstream_start_timeout`).
    #[error(
        "Server '{server}' did not complete the MCP handshake within {:.1}s",
        after.as_secs_f64()
    )]
    Timeout {
        /// The server's name.
        server: String,
        /// The start timeout that ran out.
        after: Duration,
    },
}

impl Hinted for StartError {
    fn hint(&self) -> Option<Hint> {
        match self {
            StartError::Unresolved { source, .. } => source.hint(),
            StartError::CommandNotFound { .. } => Some(Hint::aside("is it installed and on PATH?")),
            StartError::Timeout { .. } => Some(Hint::sentence(
                "If it downloads itself on first start (npx, uvx), raise upstream_start_timeout (MCP_BRIDGE_UPSTREAM_START_TIMEOUT); the bridge log shows its stderr.",
            )),
            _ => None,
        }
    }
}

/// Told of every tool list a server gave (the pool persists it in the catalog).
pub(super) type OnStore = Box<dyn Fn(&Arc<Vec<Tool>>) + Send + Sync>;

/// The cached tool list of one server.
#[derive(Default)]
pub(super) struct ToolCache {
    tools: Mutex<Option<Arc<Vec<Tool>>>>,
    /// Bumped by every invalidation, so a slow refresh does not overwrite a newer one.
    pub(super) generation: AtomicU64,
    /// Called after a list from the server was stored, wherever it was fetched.
    pub(super) on_store: std::sync::OnceLock<OnStore>,
}

impl ToolCache {
    pub(super) fn get(&self) -> Option<Arc<Vec<Tool>>> {
        self.tools.lock().unwrap().clone()
    }
    pub(super) fn invalidate(&self) -> u64 {
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *self.tools.lock().unwrap() = None;
        g
    }
    pub(super) fn store(&self, generation: u64, tools: Vec<Tool>) -> Arc<Vec<Tool>> {
        let tools = Arc::new(tools);
        let mut guard = self.tools.lock().unwrap();
        if self.generation.load(Ordering::SeqCst) == generation || guard.is_none() {
            *guard = Some(tools.clone());
            drop(guard);
            if let Some(hook) = self.on_store.get() {
                hook(&tools);
            }
        }
        tools
    }
    /// Seed the cache with a list that did not come from the server (the persisted catalog).
    pub(super) fn seed(&self, tools: Vec<Tool>) {
        *self.tools.lock().unwrap() = Some(Arc::new(tools));
    }
}

/// One running client.
pub(super) struct Conn {
    pub(super) peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Handler>>>,
    /// Ids of requests whose bytes reached the server's stdin / the HTTP layer.
    pub(super) sent: Arc<Mutex<HashSet<RequestId>>>,
    /// Set when a call saw the connection fail.
    pub(super) dead: AtomicBool,
    /// The child's pid (= its process group id), for stdio servers.
    pub(super) pid: Option<u32>,
    stderr: StderrTail,
    /// Changes when the server sent a message too long to read (stdio; see `stdio.rs`).
    pub(super) oversize: tokio::sync::watch::Receiver<u64>,
    /// The calls in flight, by the progress token each one sent: where their progress and
    /// their server's questions go.
    pub(super) routes: Routes,
}

impl Conn {
    pub(super) fn alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
            && !self.peer.is_transport_closed()
            // A killed child is noticed here at once, before its closed pipe reaches the
            // transport: a call sent meanwhile would count as crashed mid-call, not retried.
            && self.pid.is_none_or(bridge_core::procfs::is_running)
    }

    /// The server's last stderr lines (stdio servers), for error messages.
    pub(super) fn stderr_tail(&self) -> Vec<String> {
        self.stderr.lines()
    }

    /// Close the client, then make sure the process group is gone.
    pub(super) async fn stop(&self) {
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

/// The last lines a server wrote to its stderr. Every line also goes to the log, tagged with the
/// server's name; the tail is what an error message quotes, since it usually says what went
/// wrong (a missing key, a bad flag).
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().cloned().collect()
    }

    /// Log and keep each line of `stderr` until it closes; long lines are cut.
    fn forward(
        &self,
        stderr: impl AsyncRead + Unpin + Send + 'static,
        server: String,
    ) -> tokio::task::JoinHandle<()> {
        let tail = self.clone();
        tokio::spawn(async move {
            use bridge_core::logging::{LogBudget, MAX_LINE, PROCESS_LINES_PER_MINUTE, next_line};
            let mut reader = tokio::io::BufReader::new(stderr);
            let mut budget =
                LogBudget::new("stderr lines of this server", PROCESS_LINES_PER_MINUTE);
            while let Some(mut line) = next_line(&mut reader, MAX_LINE).await {
                bridge_core::text::truncate_with(&mut line, STDERR_LINE_MAX, "…");
                if budget.allow(&server) {
                    tracing::info!(target: "mcp_code_bridge::upstream::stderr", server = %server, "{}", bridge_core::text::visible(&line));
                }
                let mut t = tail.0.lock().unwrap();
                if t.len() == STDERR_TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        })
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
pub(super) struct Handler {
    server: String,
    tools: Arc<ToolCache>,
    routes: Routes,
    /// The server's log notifications reach the bridge's log within this budget.
    log: std::sync::Mutex<bridge_core::logging::LogBudget>,
}

impl ClientHandler for Handler {
    /// Elicitation is declared: a server's question goes to the client of the `run_python`
    /// call that made the server busy (see `relay.rs`), which may still decline it.
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_elicitation().build(),
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
        if !self.log.lock().unwrap().allow(&self.server) {
            return;
        }
        let mut data = match &params.data {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        bridge_core::text::truncate_with(&mut data, bridge_core::logging::MAX_LINE, "…");
        let logger = params.logger.as_deref().unwrap_or("");
        match params.level {
            LoggingLevel::Debug => {
                tracing::debug!(server = %self.server, logger = %bridge_core::text::visible(logger), "{}", bridge_core::text::visible(&data))
            }
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server = %self.server, logger = %bridge_core::text::visible(logger), "{}", bridge_core::text::visible(&data))
            }
            LoggingLevel::Warning => {
                tracing::warn!(server = %self.server, logger = %bridge_core::text::visible(logger), "{}", bridge_core::text::visible(&data))
            }
            _ => {
                tracing::error!(server = %self.server, logger = %bridge_core::text::visible(logger), "{}", bridge_core::text::visible(&data))
            }
        }
    }

    /// A server's question goes to the client of the call in flight that it belongs to; see
    /// [`Routes::elicit`].
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(self.routes.elicit(&self.server, request).await)
    }

    /// Progress of a call in flight goes to that call's `run_python` progress; any other (a late
    /// one, or a token we never sent) is only logged.
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some((tool, sink)) = self.routes.progress_of(&params.progress_token) {
            sink(UpstreamProgress {
                server: self.server.clone(),
                tool,
                progress: params.progress,
                total: params.total,
                message: params.message.clone(),
            });
        }
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
pub(super) struct CancelOnDrop {
    pub(super) peer: Peer<RoleClient>,
    pub(super) id: Option<RequestId>,
    pub(super) sent: Arc<Mutex<HashSet<RequestId>>>,
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

/// Start one server: resolve its secrets, spawn or connect, handshake. `tools` is the server's
/// cache, which the session keeps fresh on `notifications/tools/list_changed`.
pub(super) async fn connect(
    name: &str,
    entry: &ServerEntry,
    tools: Arc<ToolCache>,
) -> Result<Conn, StartError> {
    let resolved = resolve(entry).map_err(|source| StartError::Unresolved {
        server: name.to_string(),
        source,
    })?;
    let routes = Routes::default();
    let handler = Handler {
        server: name.to_string(),
        tools,
        routes: routes.clone(),
        log: std::sync::Mutex::new(bridge_core::logging::LogBudget::new(
            "log messages of this server",
            bridge_core::logging::PROCESS_LINES_PER_MINUTE,
        )),
    };
    let sent = Arc::new(Mutex::new(HashSet::new()));
    let stderr_tail = StderrTail::default();

    match resolved {
        Resolved::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = super::stdio::command(&command, &args, &env, entry.inherit_env);
            cmd.kill_on_drop(true);
            if let Some(cwd) = &cwd {
                cmd.current_dir(cwd);
            }
            let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
            wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
            let spawned = super::stdio::spawn(wrapped).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    StartError::CommandNotFound {
                        server: name.to_string(),
                        command: command.clone(),
                    }
                } else {
                    StartError::Spawn {
                        server: name.to_string(),
                        command: command.clone(),
                        source: e,
                    }
                }
            })?;
            let super::stdio::Spawned {
                transport: proc,
                stderr,
                pid,
                oversize,
            } = spawned;
            let stderr_done = stderr.map(|stderr| stderr_tail.forward(stderr, name.to_string()));
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
                    stderr: stderr_tail,
                    oversize,
                    routes,
                }),
                Err(e) => {
                    if let Some(pid) = pid {
                        kill_group(pid);
                    }
                    // Let the last stderr lines arrive: they usually say what went wrong.
                    if let Some(done) = stderr_done {
                        let _ = tokio::time::timeout(Duration::from_millis(500), done).await;
                    }
                    Err(StartError::Handshake {
                        server: name.to_string(),
                        reason: init_error_text(&e),
                        stderr: stderr_tail.lines(),
                    })
                }
            }
        }
        Resolved::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut map = std::collections::HashMap::new();
            for (k, v) in headers {
                let header_name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                    StartError::HeaderName {
                        server: name.to_string(),
                        header: k.clone(),
                    }
                })?;
                let value =
                    http::HeaderValue::from_str(&v).map_err(|_| StartError::HeaderValue {
                        server: name.to_string(),
                        header: k.clone(),
                    })?;
                map.insert(header_name, value);
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
                let redacted = redact_url(&url);
                StartError::Connect {
                    server: name.to_string(),
                    reason: init_error_text(&e).replace(&url, &redacted),
                    url: redacted,
                }
            })?;
            Ok(Conn {
                peer: service.peer().clone(),
                service: tokio::sync::Mutex::new(Some(service)),
                sent,
                dead: AtomicBool::new(false),
                pid: None,
                stderr: stderr_tail,
                // rmcp's HTTP client reports an oversized response as an error of the call.
                oversize: tokio::sync::watch::channel(0).1,
                routes,
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

/// The last stderr lines of a server, as they follow an error: nothing when there are none.
pub(crate) fn stderr_suffix(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{}", lines.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_keep_their_cause_from_the_debug_form() {
        let debug = r#"reqwest::Error { kind: Request, source: hyper_util::client::legacy::Error(Connect, ConnectError("tcp connect error", 127.0.0.1:9, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })) }"#;
        assert_eq!(
            connect_detail(debug).as_deref(),
            Some("tcp connect error: Connection refused")
        );
        assert_eq!(
            connect_detail(r#"ConnectError("dns error", x)"#).as_deref(),
            Some("dns error")
        );
        assert_eq!(connect_detail("Timeout"), None);
    }
}
