//! The MCP server the agent talks to: one tool, `run_python`, and one resource, the capability
//! summary. The standing context (`tools/list`) is built from constants only, so it is the same
//! bytes however many upstream servers exist.

// MCP logging is deprecated in the newest protocol revision but still what most clients show;
// we keep sending it to clients that ask for it with `logging/setLevel`.
#![allow(deprecated)]

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult,
    ErrorData, ListResourcesResult, ListToolsResult, LoggingLevel, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, SetLevelRequestParams, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::audit::{self, Audit};
use crate::config::Config;
use crate::progress::Forwarder;
use crate::render;
use crate::sandbox::{DEFAULT_SESSION, ExecRequest, OutputSink, Sandbox};
use crate::upstream::{Hinted as _, Upstreams};

pub const TOOL_NAME: &str = "run_python";
pub const CAPABILITIES_URI: &str = "resource://mcp-code-bridge/capabilities";

/// The tool description: the helper summary, and all the model needs to start. Keep it short:
/// it is paid for on every request.
pub const TOOL_DESCRIPTION: &str = "\
Run Python in a persistent sandbox (no network; pandas, numpy). State persists across calls; \
top-level await works; the last expression is shown; display(obj) returns images.
Use the user's MCP servers from code: `from mcp import runtime`; runtime.discovered_servers(); \
await runtime.search_tool_docs(\"query\"); await runtime.query_tool_docs(\"server\", detail=\"full\"). \
Load with \"servers\": [\"name\"], then await mcp_<name>.<tool>(...) (see help()); results are \
Python values.
timeout: seconds; session: interpreter name; reset: start fresh.";

/// JSON schema of `run_python`'s arguments.
pub fn input_schema() -> Value {
    // Property meanings are in the description: repeating them here would cost tokens on every
    // request.
    json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "servers": {"type": "array", "items": {"type": "string"}},
            "timeout": {"type": "number"},
            "session": {"type": "string"},
            "reset": {"type": "boolean"}
        },
        "required": ["code"],
        "additionalProperties": false
    })
}

/// JSON schema of `structuredContent` (see `render::Payload`): the same fields in both output
/// modes, empty ones left out. Only the core fields are declared: every property costs tokens
/// on every request (the bench holds `tools/list` to 250 cl100k tokens), and the others
/// (`status` values, `notices`, `images`, `truncated_bytes`, `session_reset`, `duration_ms`) are
/// allowed by it and still sent when non-empty (`render::Payload` is their definition).
pub fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "status": {"type": "string"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "value": {"type": "string"},
            "error": {"type": "object"}
        },
        "required": ["status"]
    })
}

/// The one tool, as `tools/list` shows it.
pub fn tool() -> Tool {
    let object = |v: Value| match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("schemas are objects"),
    };
    Tool::new(TOOL_NAME, TOOL_DESCRIPTION, object(input_schema()))
        .with_raw_output_schema(object(output_schema()))
}

/// `run_python`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    pub code: String,
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub reset: bool,
}

/// Largest `code` accepted, so a runaway client cannot make us buffer gigabytes.
pub const MAX_CODE_BYTES: usize = 4 << 20;
/// Longest JSON-RPC line read from the client; longer ones are dropped unanswered (their id is
/// unknown without parsing them).
pub const MAX_REQUEST_LINE_BYTES: usize = 64 << 20;

impl RunArgs {
    pub fn parse(args: Option<serde_json::Map<String, Value>>) -> Result<RunArgs, String> {
        let v = Value::Object(args.unwrap_or_default());
        let mut a: RunArgs = serde_json::from_value(v).map_err(|e| format!("invalid arguments for run_python: {e}; expected {{\"code\": string, \"servers\"?: [string], \"timeout\"?: number, \"session\"?: string, \"reset\"?: bool}}"))?;
        // `Duration` cannot hold 1e300 seconds (converting it panicked, and the call got no
        // reply); the configured maximum applies anyway.
        a.timeout = a.timeout.map(|t| t.min(1e9));
        if a.code.len() > MAX_CODE_BYTES {
            return Err(format!(
                "`code` is {} bytes; the limit is {MAX_CODE_BYTES}. Send smaller pieces across calls (state persists).",
                a.code.len()
            ));
        }
        if let Some(s) = &a.session
            && (s.is_empty()
                || s.len() > 64
                || !s
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            return Err(format!(
                "`session` {s:?} must be 1-64 characters of letters, digits, '-', '_' or '.'"
            ));
        }
        Ok(a)
    }
}

#[derive(Clone)]
pub struct Bridge {
    config: Arc<Config>,
    sandbox: Arc<Sandbox>,
    upstreams: Upstreams,
    log_level: Arc<std::sync::Mutex<Option<LoggingLevel>>>,
    audit: Audit,
}

impl Bridge {
    /// The bridge of `run`; it opens the audit log configured by `[audit]`.
    pub fn new(config: Arc<Config>, sandbox: Arc<Sandbox>, upstreams: Upstreams) -> Self {
        let audit = Audit::open(&config);
        Bridge {
            config,
            sandbox,
            upstreams,
            log_level: Default::default(),
            audit,
        }
    }

    /// The audit log, for whoever records proxied calls (a clone shares the one writer).
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Run one `run_python` call to completion: the result the model sees, or a setup error.
    /// Every call, set up or not, leaves one `exec` record in the audit log.
    pub async fn run(
        &self,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let session = args
            .session
            .as_deref()
            .unwrap_or(DEFAULT_SESSION)
            .to_string();
        // The code goes to the sandbox; the log needs it after (its digest, or all of it).
        let code = self.audit.is_on().then(|| args.code.clone());
        let record = |status: &str, error_type: Option<&str>| {
            if let Some(code) = &code {
                self.audit.exec(audit::Exec {
                    session: &session,
                    identity: None,
                    code,
                    servers: &args.servers,
                    status,
                    error_type,
                    duration: started.elapsed(),
                });
            }
        };
        let binding = match self.upstreams.load(&args.servers).await {
            Ok(b) => b,
            Err(e) => {
                record("setup_error", Some(e.kind()));
                return render::setup_error(e.kind(), &e.message());
            }
        };
        let req = ExecRequest {
            code: args.code,
            timeout: self.config.clamp_timeout(args.timeout),
            max_timeout: self.config.max_timeout.0,
            output_cap: self.config.output_cap.0 as usize,
            binding,
            cancel,
            on_output,
        };
        match self.sandbox.run(&session, args.reset, req).await {
            Ok(outcome) => {
                let status = serde_json::to_value(outcome.outcome).unwrap_or_default();
                let error_type = outcome.error.as_ref().map(|e| e.kind.as_str());
                record(status.as_str().unwrap_or("unknown"), error_type);
                render::tool_result(outcome, self.config.output_mode)
            }
            Err(e) => {
                record("setup_error", Some("SandboxUnavailable"));
                render::setup_error("SandboxUnavailable", &e.with_hint())
            }
        }
    }

    /// The capability summary resource: the tool description, how to load servers, and the
    /// names of the servers discovered (no schemas).
    pub fn capabilities_markdown(&self) -> String {
        let mut s = String::from("# mcp-code-bridge\n\n");
        s.push_str(TOOL_DESCRIPTION);
        s.push_str("\n\n## Loading servers\n\nPass `\"servers\": [\"name\", ...]` to `run_python`. Only loaded servers get `mcp_<alias>` proxies and accept calls; discovery helpers (`runtime.discovered_servers()`, `runtime.search_tool_docs()`) see every server. `runtime.describe_server(name)` shows a loaded server's tools and `cwd`.\n\n## Discovered servers\n\n");
        let servers = self.upstreams.discovered();
        if servers.is_empty() {
            s.push_str("(none configured: see `mcp-code-bridge servers`)\n");
        }
        for d in servers {
            s.push_str(&format!(
                "- `{}` (alias `mcp_{}`){}\n",
                d.name,
                d.alias,
                d.description.map(|x| format!(": {x}")).unwrap_or_default()
            ));
        }
        s
    }

    /// Stream output as progress (and logging, when enabled) notifications, when the client
    /// asked for either.
    fn progress(&self, context: &RequestContext<RoleServer>) -> Option<(Forwarder, OutputSink)> {
        let token = context.meta.get_progress_token();
        let logging = self.log_level.lock().unwrap().is_some();
        if token.is_none() && !logging {
            return None;
        }
        Some(Forwarder::start(context.peer.clone(), token, logging))
    }
}

impl ServerHandler for Bridge {
    /// The client has its answer to `initialize`: warm up in the background (engine, image,
    /// pool) while the model writes its first code. Returns at once and fails nothing.
    async fn on_initialized(&self, _context: rmcp::service::NotificationContext<RoleServer>) {
        self.sandbox.warm_up();
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().enable_logging().build())
            .with_server_info(rmcp::model::Implementation::new("mcp-code-bridge", env!("CARGO_PKG_VERSION")))
            .with_instructions("Use run_python for code; discover MCP servers from inside it (see the tool description).")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![tool()]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL_NAME).then(tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != TOOL_NAME {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool {:?}; this server has one tool, {TOOL_NAME:?}",
                    request.name
                ),
                None,
            ));
        }
        let args =
            RunArgs::parse(request.arguments).map_err(|e| ErrorData::invalid_params(e, None))?;
        let (forwarder, sink) = self.progress(&context).unzip();
        let result = self.run(args, context.ct.clone(), sink).await;
        if let Some(f) = forwarder {
            f.finish().await;
        }
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let r = Resource::new(CAPABILITIES_URI, "capabilities")
            .with_description("What run_python offers and how to load MCP servers inside it")
            .with_mime_type("text/markdown");
        Ok(ListResourcesResult::with_all_items(vec![r]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri != CAPABILITIES_URI {
            return Err(ErrorData::resource_not_found(
                format!(
                    "no resource {:?}; the only one is {CAPABILITIES_URI}",
                    request.uri
                ),
                None,
            ));
        }
        let c = ResourceContents::text(self.capabilities_markdown(), CAPABILITIES_URI)
            .with_mime_type("text/markdown");
        Ok(ReadResourceResult::new(vec![c]).into())
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.log_level.lock().unwrap() = Some(request.level);
        Ok(())
    }

    /// rmcp lands here for unknown methods and for known ones whose params did not parse
    /// (`tools/call` with `"arguments": "x"`); its default answer is just the method name.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        const METHODS: &str = "initialize, ping, tools/list, tools/call, resources/list, resources/read, logging/setLevel";
        let m = request.method;
        if METHODS.split(", ").any(|k| k == m) {
            let shape = if m == "tools/call" {
                "; expected {\"name\": \"run_python\", \"arguments\": {\"code\": string, ...}}"
            } else {
                ""
            };
            return Err(ErrorData::invalid_params(
                format!("malformed params for {m:?}{shape}"),
                None,
            ));
        }
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("unknown method {m:?}; this server implements {METHODS}"),
            None,
        ))
    }
}

/// Serve MCP over stdio until the client closes it, then remove every container.
pub async fn serve_stdio(bridge: Bridge) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let sandbox = bridge.sandbox.clone();
    let upstreams = bridge.upstreams.clone();
    let audit = bridge.audit.clone();
    // rmcp drops lines over 16 MiB without a word, so a `code` between that and our own limit
    // would never be answered; up to this length it gets the clear refusal of `RunArgs::parse`.
    let (stdin, stdout) = rmcp::transport::stdio();
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(stdin, stdout)
        .with_max_line_length(MAX_REQUEST_LINE_BYTES);
    let service = bridge.serve(transport).await?;
    let quit = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .expect("signal handler");
        tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" }
    };
    tokio::select! {
        r = service.waiting() => { if let Err(e) = r { tracing::warn!("MCP service ended: {e}"); } }
        sig = quit => tracing::info!("{sig}: shutting down"),
    }
    sandbox.shutdown().await;
    upstreams.shutdown().await;
    // Records of the last calls may still be queued: written before the process ends.
    let _ =
        tokio::task::spawn_blocking(move || audit.flush(std::time::Duration::from_secs(5))).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_listing_is_constant_and_small() {
        let a = serde_json::to_string(&tool()).unwrap();
        let b = serde_json::to_string(&tool()).unwrap();
        assert_eq!(a, b);
        // About 200 tokens: at ~4 bytes a token, well under 1.5 KB.
        assert!(a.len() < 1500, "{} bytes", a.len());
    }

    #[test]
    fn args_are_checked() {
        let ok = |v: Value| RunArgs::parse(v.as_object().cloned());
        assert!(ok(json!({"code": "1"})).is_ok());
        assert!(
            ok(json!({"code": 1}))
                .unwrap_err()
                .contains("invalid arguments")
        );
        assert!(
            ok(json!({"code": "1", "bogus": 1}))
                .unwrap_err()
                .contains("bogus")
        );
        assert!(ok(json!({})).unwrap_err().contains("code"));
        assert!(
            ok(json!({"code": "1", "session": "../x"}))
                .unwrap_err()
                .contains("session")
        );
        // Regression: 1e300 seconds overflowed `Duration` in clamp_timeout, a panic that left
        // the call unanswered (tests/faults.rs::client_wrong_argument_types_are_refused_with_the_expected_shape).
        let a = ok(json!({"code": "1", "timeout": 1e300})).unwrap();
        assert_eq!(
            Config::default().clamp_timeout(a.timeout),
            Config::default().max_timeout.0
        );
    }
}
