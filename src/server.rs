//! The MCP server the agent talks to: one tool, `run_python`, and one resource, the capability
//! summary. The standing context (`tools/list`) is built from constants only, so it is the same
//! bytes however many upstream servers exist.

// MCP logging is deprecated in the newest protocol revision but still what most clients show;
// we keep sending it to clients that ask for it with `logging/setLevel`.
#![allow(deprecated)]

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult,
    ElicitRequestParams, ElicitResult, ErrorData, GetPromptRequestParams, GetPromptResponse,
    ListResourcesResult, ListToolsResult, LoggingLevel, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, SetLevelRequestParams, Tool,
};
use rmcp::model::{
    CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::TaskManager;
use rmcp::{RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::audit::{self, Audit};
use crate::config::Config;
use crate::identity;
use crate::policy::{Approval, ApprovalRequest, Approver};
use crate::progress::Forwarder;
use crate::render;
use crate::sandbox::files;
use crate::sandbox::{DEFAULT_SESSION, ExecRequest, OutputSink, Sandbox};
use crate::skills;
use crate::upstream::{CallContext, CallRelay, ClientLink, Hinted as _, ProgressSink, Upstreams};
use base64::Engine as _;

mod rounds;
mod tasks;

pub const TOOL_NAME: &str = "run_python";
/// How often a task's client is told to poll it.
const TASK_POLL_MS: u64 = 500;
/// How long a task's result is kept for its client after the longest call could have ended.
const TASK_RETENTION: std::time::Duration = std::time::Duration::from_secs(300);
pub const CAPABILITIES_URI: &str = "resource://mcp-code-bridge/capabilities";

/// The tool description: how to start, in as few tokens as possible, since it is paid for on
/// every request. `tools/list` must stay within 250 cl100k tokens (the bench's section 1, and
/// `tool_listing_is_constant_and_within_the_token_budget`), and the title, the argument
/// descriptions, the output schema and the annotations share that budget; the rest of the helper
/// summary is in the capabilities resource (`HELPERS`).
pub const TOOL_DESCRIPTION: &str = "\
Persistent Python sandbox (pandas, numpy; no network; top-level await; display(obj) returns \
images). MCP servers: `from mcp import runtime`; await runtime.search_tool_docs('query'); load \
with servers, then await mcp_<name>.<tool>(...).";

/// What the tool description leaves out for the budget, in the capabilities resource.
pub const HELPERS: &str = "\
State persists across calls of a session; the last expression is shown like a notebook's. \
`runtime.discovered_servers()` names every configured server; \
`await runtime.query_tool_docs(\"server\", detail=\"full\")` gives a server's tool schemas; \
proxied tools have real signatures (`help(mcp_<name>.<tool>)`) and return Python values. \
`runtime.export_notebook()` writes the session so far as a Jupyter notebook \
(`/workspace/out/session.ipynb`). `runtime.save_skill(func)` keeps a function for every later \
session; `runtime.list_skills()` lists them.";

/// The tool's human-readable name (`title`), which clients show instead of `run_python`.
pub const TOOL_TITLE: &str = "Python sandbox";

/// JSON schema of `run_python`'s arguments, each with a description of a few tokens (the
/// budget above) but `code`, which the tool's name and description say; `timeout` must be
/// positive, which `RunArgs::parse` checks as well.
pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "servers": {"type": "array", "items": {"type": "string"}, "description": "Servers to load"},
            "timeout": {"type": "number", "description": "Seconds", "exclusiveMinimum": 0},
            "session": {"type": "string", "description": "Interpreter name"},
            "reset": {"type": "boolean", "description": "Restart first"}
        },
        "required": ["code"],
        "additionalProperties": false
    })
}

/// Every field of `structuredContent` that `render::Payload` and `render::setup_error` emit,
/// with its JSON type, and no other (`additionalProperties: false`: a field added there and not
/// here, or of another type, fails tests/e2e/results.rs, where the Python SDK validates real
/// results against this schema). Empty fields are left out of a result, so only `status` and
/// `session` (the interpreter the call ran in) are required. `value` is the last expression's
/// repr; `error` is `{type, message?, traceback?}` and `notices` a list of strings, left at
/// their JSON type for the token budget above.
pub const OUTPUT_FIELDS: [(&str, &str); 11] = [
    ("status", "string"),
    ("session", "string"),
    ("stdout", "string"),
    ("stderr", "string"),
    ("value", "string"),
    ("error", "object"),
    ("notices", "array"),
    ("images", "integer"),
    ("truncated_bytes", "integer"),
    ("session_reset", "boolean"),
    ("duration_ms", "integer"),
];

/// JSON schema of `structuredContent` (see [`OUTPUT_FIELDS`]).
pub fn output_schema() -> Value {
    let properties: serde_json::Map<String, Value> = OUTPUT_FIELDS
        .iter()
        .map(|(f, ty)| (f.to_string(), json!({ "type": ty })))
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": ["status", "session"],
        "additionalProperties": false
    })
}

/// The one tool, as `tools/list` shows it. It carries no annotations: what they would say is
/// what the specification's defaults already say of a tool without them, and every token here
/// is paid on every request. Through the servers it loads the code can do anything those
/// servers do (delete, send, pay), so it is not read-only (`readOnlyHint` defaults to false),
/// may be destructive (`destructiveHint` defaults to true), reaches the world outside the
/// bridge (`openWorldHint` defaults to true), and is not idempotent, as state persists
/// (`idempotentHint` defaults to false).
pub fn tool() -> Tool {
    let object = |v: Value| match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("schemas are objects"),
    };
    Tool::new(TOOL_NAME, TOOL_DESCRIPTION, object(input_schema()))
        .with_title(TOOL_TITLE)
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
/// Longest JSON-RPC line read from the client; a longer one is read through without being kept
/// and answered `-32600` (its id is unknown without parsing it).
pub const MAX_REQUEST_LINE_BYTES: usize = 64 << 20;

impl RunArgs {
    pub fn parse(args: Option<serde_json::Map<String, Value>>) -> Result<RunArgs, String> {
        let v = Value::Object(args.unwrap_or_default());
        let mut a: RunArgs = serde_json::from_value(v).map_err(|e| format!("invalid arguments for run_python: {e}; expected {{\"code\": string, \"servers\"?: [string], \"timeout\"?: number, \"session\"?: string, \"reset\"?: bool}}"))?;
        // JSON has no NaN or infinity, so a number that is not positive is the only bad one; a
        // zero or negative limit would otherwise be clamped silently to the floor.
        if let Some(t) = a.timeout
            && (t <= 0.0 || t.is_nan())
        {
            return Err(format!(
                "`timeout` is {t}; it must be a positive number of seconds (leave it out for the default; values above the maximum are capped)"
            ));
        }
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

/// The methods this server answers, as its "method not found" replies list them.
const METHODS: &str =
    "initialize, ping, tools/list, tools/call, resources/list, resources/read, logging/setLevel";

/// `-32601` for `method`, naming what the server implements instead.
fn not_implemented(method: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!(
            "this server does not implement {method:?}; it implements {METHODS} (its one tool is {TOOL_NAME:?})"
        ),
        None,
    )
}

/// The methods protocol revision 2026-07-28 removed (its lifecycle has no `initialize`, its
/// requests carry their log level, subscriptions are `subscriptions/listen`): a request of that
/// revision for one of them is "method not found" (`-32601`, which rmcp's HTTP transport
/// answers with `404`), as the revision says, however well or badly formed its params are.
const REMOVED_IN_2026_07_28: [&str; 5] = [
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// Whether `context` is a request of protocol revision 2026-07-28 or newer: its own `_meta`
/// says so, or (rmcp reads it from the `MCP-Protocol-Version` header for requests without
/// a session) its peer's.
fn is_2026_07_28(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str())
}

/// `-32601` for `method`, which revision 2026-07-28 does not have.
fn removed_in_2026_07_28(method: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!(
            "{method:?} does not exist in protocol revision 2026-07-28; requests stand alone (server/discover describes this server) and carry their log level in _meta"
        ),
        None,
    )
}

/// An error reply, logged as one readable line first (rmcp's own log of it is the error's Debug
/// form, left out by `logging`). At INFO: it is the client's request that was wrong, not the
/// bridge.
fn refused(method: &str, e: ErrorData) -> ErrorData {
    tracing::info!("{method}: answered with error {} ({})", e.code.0, e.message);
    e
}

#[derive(Clone)]
pub struct Bridge {
    config: Arc<Config>,
    sandbox: Arc<Sandbox>,
    upstreams: Upstreams,
    log_level: Arc<std::sync::Mutex<Option<LoggingLevel>>>,
    audit: Audit,
    /// The saved skills, whose RPC methods every exec's handler answers first.
    skills: Arc<skills::Store>,
    /// `run_python` calls running as tasks, for clients that declared the tasks extension.
    tasks: TaskManager,
    /// Whose each task is (`None`: the stdio user's) and its form, so one identity cannot read or cancel
    /// another's task by its id. Pruned of the tasks the manager has let go of.
    task_owners: Arc<std::sync::Mutex<std::collections::HashMap<String, tasks::Owner>>>,
    /// `run_python` calls paused on a question under 2026-07-28 (`input_required`), by handle.
    paused: rounds::Paused,
}

impl Bridge {
    /// The bridge of `run`; it opens the audit log configured by `[audit]`.
    pub fn new(config: Arc<Config>, sandbox: Arc<Sandbox>, upstreams: Upstreams) -> Self {
        let audit = Audit::open(&config);
        let skills = Arc::new(skills::Store::from_config(&config));
        Bridge {
            skills,
            config,
            sandbox,
            upstreams,
            log_level: Default::default(),
            audit,
            tasks: TaskManager::new(),
            task_owners: Default::default(),
            paused: Default::default(),
        }
    }

    /// The bridge as one HTTP client's connection sees it: shared sessions, servers, audit and
    /// tasks, and its own `logging/setLevel`.
    pub fn for_connection(&self) -> Bridge {
        Bridge {
            log_level: Default::default(),
            ..self.clone()
        }
    }

    /// Start the engine, the image and the pool in the background (see `Sandbox::warm_up`).
    pub fn warm_up(&self) {
        self.sandbox.warm_up();
    }

    /// The audit log, for whoever records proxied calls (a clone shares the one writer).
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Run one `run_python` call to completion: the result the model sees, or a setup error.
    /// No one can be asked about its proxied calls: the policy's `ask_fallback` answers.
    pub async fn run(
        &self,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
    ) -> CallToolResult {
        self.run_for(args, cancel, on_output, None, CallRelay::default(), None)
            .await
    }

    /// [`Bridge::run`], asking `approver` (the client of the request) about the proxied calls
    /// the policy says to ask about; `relay` gets what those calls pass on to the client (their
    /// progress, their servers' questions). Every call, set up or not, leaves one `exec` record
    /// in the audit log, and each of its proxied calls a `tool_call` record.
    pub async fn run_for(
        &self,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
        approver: Option<Arc<dyn Approver>>,
        relay: CallRelay,
        identity: Option<&str>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let session = args
            .session
            .as_deref()
            .unwrap_or(DEFAULT_SESSION)
            .to_string();
        // The sandbox session, approvals and files are found by the key: under `serve` it is
        // the identity's own, whatever session name another identity uses.
        let key = identity::session_key(identity, &session);
        if args.reset {
            self.upstreams.forget_session(&key);
        }
        // The code goes to the sandbox; the log needs it after (its digest, or all of it).
        let code = self.audit.is_on().then(|| args.code.clone());
        let record = |status: &str, error_type: Option<&str>| {
            if let Some(code) = &code {
                self.audit.exec(audit::Exec {
                    session: &session,
                    identity,
                    code,
                    servers: &args.servers,
                    status,
                    error_type,
                    duration: started.elapsed(),
                });
            }
        };
        let call = CallContext {
            session: key.clone(),
            approver,
            relay,
            audit: self.audit.clone(),
        };
        let binding = match self.upstreams.load_for(&args.servers, call).await {
            Ok(b) => match identity {
                Some(id) => skills::rpc::SkillRpc::bind(
                    &Arc::new(skills::Store::for_identity(&self.config, id)),
                    b,
                ),
                None => skills::rpc::SkillRpc::bind(&self.skills, b),
            },
            Err(e) => {
                record("setup_error", Some(e.kind()));
                return render::setup_error(e.kind(), &e.message(), &session);
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
        match self.sandbox.run(&key, args.reset, req).await {
            Ok(outcome) => {
                let status = serde_json::to_value(outcome.outcome).unwrap_or_default();
                let error_type = outcome.error.as_ref().map(|e| e.kind.as_str());
                record(status.as_str().unwrap_or("unknown"), error_type);
                render::tool_result(outcome, self.config.output_mode, &session)
            }
            Err(e) => {
                record("setup_error", Some("SandboxUnavailable"));
                render::setup_error("SandboxUnavailable", &e.with_hint(), &session)
            }
        }
    }

    /// `resources/read` of a file copied out of `/workspace/out`: text when its type is textual
    /// and its bytes UTF-8, else base64. Bounded by `file_cap`, which every kept file is within.
    async fn read_file(
        &self,
        uri: &str,
        session: &str,
        name: &str,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let found = match self.sandbox.read_file(session, name).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(uri, "could not read a kept file: {e}");
                return Err(refused(
                    "resources/read",
                    ErrorData::internal_error(format!("{uri} could not be read: {e}"), None),
                ));
            }
        };
        let Some((f, bytes)) = found else {
            return Err(refused(
                "resources/read",
                ErrorData::resource_not_found(
                    format!(
                        "no file {name:?} in session {session:?}: it was never written to {}, or the session was reset or closed since (resources/list shows the files there are)",
                        files::OUT_DIR
                    ),
                    Some(json!({"uri": uri})),
                ),
            ));
        };
        let textual = f.mime.starts_with("text/")
            || matches!(
                f.mime.as_str(),
                "application/json"
                    | "application/xml"
                    | "application/javascript"
                    | "application/toml"
            );
        let c = match String::from_utf8(bytes) {
            Ok(text) if textual => ResourceContents::text(text, uri),
            Ok(text) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
                uri,
            ),
            Err(e) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                uri,
            ),
        }
        .with_mime_type(f.mime);
        Ok(ReadResourceResult::new(vec![c]).into())
    }

    /// A 2026-07-28 `tools/call` whose client can be asked (or that answers a question): a new
    /// call runs in the background until it asks or ends; a retry with `request_state` resumes
    /// the paused call it names with the answers. Each round streams the output to its own
    /// request's progress token while it lasts.
    async fn call_in_rounds(
        &self,
        args: RunArgs,
        request_state: Option<String>,
        responses: Option<rmcp::model::InputResponses>,
        askable: rounds::Askable,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let identity = identity::of_request(&context.extensions);
        let session = args.session.as_deref().unwrap_or(DEFAULT_SESSION);
        let binding = rounds::Binding::new(identity.clone(), session, &args.code);
        let running = match request_state {
            Some(state) => self
                .paused
                .take(&state, &binding, responses)
                .map_err(|e| refused("tools/call", e.into_error()))?,
            None => {
                let (links, questions) = rounds::Running::links(askable, identity.as_deref());
                let rounds::Links {
                    approver,
                    client,
                    cancel,
                    sinks,
                } = links;
                let relay = CallRelay {
                    progress: Some(sinks.progress()),
                    client: Some(Arc::new(client)),
                };
                let bridge = self.clone();
                let out = sinks.output();
                let run_cancel = cancel.clone();
                rounds::Running::spawn(binding, cancel, sinks, questions, async move {
                    bridge
                        .run_for(
                            args,
                            run_cancel,
                            Some(out),
                            Some(Arc::new(approver)),
                            relay,
                            identity.as_deref(),
                        )
                        .await
                })
            }
        };
        let forwarder = self.progress(context).map(|(f, out, up)| {
            running.sinks.set(Some((out, up)));
            f
        });
        let sinks = running.sinks.clone();
        let response = running.drive(&context.ct, &self.paused).await;
        sinks.set(None);
        if let Some(f) = forwarder {
            f.finish().await;
        }
        Ok(response)
    }

    /// The capability summary resource: the tool description, how to load servers, and the
    /// names of the servers discovered (no schemas).
    pub fn capabilities_markdown(&self) -> String {
        let mut s = String::from("# mcp-code-bridge\n\n");
        s.push_str(TOOL_DESCRIPTION);
        s.push_str("\n\n");
        s.push_str(HELPERS);
        s.push_str("\n\n## Files out\n\nFiles the code writes under `/workspace/out/` (make it first: `os.makedirs(\"/workspace/out\", exist_ok=True)`) come back after the call as resource links (new or changed ones only) that the client reads with `resources/read`; images among them are also shown. Only regular files; they last as long as the session.");
        if !self.config.inputs.is_empty() {
            s.push_str("\n\n## Files in\n\nThe user's files, copied into every new session (read-only on the host's side: changes stay in the sandbox, a reset brings the originals back):\n");
            for i in &self.config.inputs {
                s.push_str(&format!("- `{}`\n", i.sandbox_path()));
            }
        }
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
        s.push_str("\n## Tool policy\n\nThe user decides which tool calls run (`server.tool` globs on real names):\n");
        s.push_str(&self.upstreams.policy().markdown());
        s
    }

    /// Stream output as progress (and logging, when enabled) notifications, when the client
    /// asked for either.
    fn progress(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<(Forwarder, OutputSink, ProgressSink)> {
        let token = context.meta.get_progress_token();
        let logging = self.log_level.lock().unwrap().is_some();
        if token.is_none() && !logging {
            return None;
        }
        Some(Forwarder::start(context.peer.clone(), token, logging))
    }
}

/// Asks the human through the MCP client of a `run_python` request: an `elicitation/create`
/// request in form mode, one field with the three choices.
struct ClientApprover(rmcp::Peer<RoleServer>);

/// The choices of an approval form, as sent (`const`) and shown (`title`).
pub const APPROVE_ONCE: &str = "allow_once";
pub const APPROVE_SESSION: &str = "allow_session";
pub const APPROVE_DENY: &str = "deny";

/// The approval form: one required field, `decision`, a titled single choice.
pub fn approval_schema() -> rmcp::model::ElicitationSchema {
    serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Allow this tool call?",
                "oneOf": [
                    {"const": APPROVE_ONCE, "title": "Allow once"},
                    {"const": APPROVE_SESSION, "title": "Allow for this session"},
                    {"const": APPROVE_DENY, "title": "Deny"}
                ]
            }
        },
        "required": ["decision"]
    }))
    .expect("the approval form is a valid elicitation schema")
}

#[async_trait::async_trait]
impl Approver for ClientApprover {
    fn can_ask(&self) -> bool {
        self.0
            .supported_elicitation_modes()
            .contains(&rmcp::service::ElicitationMode::Form)
    }

    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: request.message(),
            requested_schema: approval_schema(),
        };
        rounds::approval_of(
            self.0
                .create_elicitation(params)
                .await
                .map_err(|e| e.to_string()),
        )
    }
}

/// The arguments of a `tools/call` of `run_python`, or the refusal that says what is wrong.
/// A call that names no session gets its connection's default: the MCP session's own under
/// Streamable HTTP's `Mcp-Session-Id` (`identity::mcp_session`), else `default` (stdio's one
/// client; a 2026-07-28 request, which has no connection, shares it with every other request
/// of its identity that names none).
fn call_args(
    name: std::borrow::Cow<'static, str>,
    arguments: Option<serde_json::Map<String, Value>>,
    extensions: &rmcp::model::Extensions,
) -> Result<RunArgs, ErrorData> {
    if name != TOOL_NAME {
        return Err(refused(
            "tools/call",
            ErrorData::invalid_params(
                format!("unknown tool {name:?}; this server has one tool, {TOOL_NAME:?}"),
                None,
            ),
        ));
    }
    let mut args = RunArgs::parse(arguments)
        .map_err(|e| refused("tools/call", ErrorData::invalid_params(e, None)))?;
    if args.session.is_none() {
        args.session = identity::mcp_session(extensions);
    }
    Ok(args)
}

impl ServerHandler for Bridge {
    /// The client has its answer to `initialize`: warm up in the background (engine, image,
    /// pool) while the model writes its first code. Returns at once and fails nothing.
    async fn on_initialized(&self, _context: rmcp::service::NotificationContext<RoleServer>) {
        self.sandbox.warm_up();
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().enable_logging().enable_tasks().build())
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
        let args = call_args(request.name, request.arguments, &context.extensions)?;
        // A request whose own capabilities (`_meta`, as every 2026-07-28 request carries them
        // and SEP-2663 asks) declare the tasks extension gets a task: the call runs on, polled
        // with `tasks/get` and cancelled with `tasks/cancel`, however long the client's own
        // request timeout is. Its output is in the result (no progress: the request has been
        // answered). A declaration at `initialize` alone does not do: the Inspector makes one
        // and cannot read a task.
        if context
            .meta
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            let task = self.spawn_task(args, &context, false)?;
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        // 2026-07-28 has no server-to-client requests: a client that declared elicitation in
        // this request is asked by `input_required` rounds (`rounds`), and its retry resumes the
        // call; one that did not cannot be asked (the policy's `ask_fallback`).
        let modern = is_2026_07_28(&context);
        if modern {
            let askable = rounds::Askable::of(context.client_capabilities().as_ref());
            if request.request_state.is_some() || askable.any() {
                return self
                    .call_in_rounds(
                        args,
                        request.request_state,
                        request.input_responses,
                        askable,
                        &context,
                    )
                    .await;
            }
        }
        let (forwarder, on_output, progress) = match self.progress(&context) {
            Some((f, out, up)) => (Some(f), Some(out), Some(up)),
            None => (None, None, None),
        };
        let identity = identity::of_request(&context.extensions);
        let (approver, client): (Option<Arc<dyn Approver>>, Option<Arc<dyn ClientLink>>) = if modern
        {
            (None, None)
        } else {
            (
                Some(Arc::new(ClientApprover(context.peer.clone()))),
                Some(Arc::new(PeerLink::new(
                    context.peer.clone(),
                    identity.as_deref(),
                ))),
            )
        };
        let relay = CallRelay { progress, client };
        let result = self
            .run_for(
                args,
                context.ct.clone(),
                on_output,
                approver,
                relay,
                identity.as_deref(),
            )
            .await;
        if let Some(f) = forwarder {
            f.finish().await;
        }
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.task_visible(&request.task_id, &identity::of_request(&context.extensions))?;
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_visible(&request.task_id, &identity::of_request(&context.extensions))?;
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_visible(&request.task_id, &identity::of_request(&context.extensions))?;
        self.tasks.cancel_task(&request.task_id)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let identity = identity::of_request(&context.extensions);
        let r = Resource::new(CAPABILITIES_URI, "capabilities")
            .with_description("What run_python offers and how to load MCP servers inside it")
            .with_mime_type("text/markdown");
        let mut all = vec![r];
        // The live sessions' files of /workspace/out, until their session is reset or closed.
        for (key, f) in self.sandbox.files().await {
            if !identity::owns(identity.as_deref(), &key) {
                continue;
            }
            let session = identity::split_key(&key).1;
            all.push(
                Resource::new(f.uri, f.name.clone())
                    .with_title(format!("{}/{} (session {session})", files::OUT_DIR, f.name))
                    .with_mime_type(f.mime)
                    .with_size(f.size),
            );
        }
        Ok(ListResourcesResult::with_all_items(all))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if let Some((key, name)) = files::parse_uri(&request.uri) {
            // Another identity's file is as absent as one never written.
            let key = if identity::owns(identity::of_request(&context.extensions).as_deref(), &key)
            {
                key
            } else {
                String::new()
            };
            return self.read_file(&request.uri, &key, &name).await;
        }
        if request.uri != CAPABILITIES_URI {
            return Err(refused(
                "resources/read",
                ErrorData::resource_not_found(
                    format!(
                        "no resource {:?}; there are {CAPABILITIES_URI} and the files of /workspace/out (resources/list)",
                        request.uri
                    ),
                    Some(json!({"uri": request.uri})),
                ),
            ));
        }
        let c = ResourceContents::text(self.capabilities_markdown(), CAPABILITIES_URI)
            .with_mime_type("text/markdown");
        Ok(ReadResourceResult::new(vec![c]).into())
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if is_2026_07_28(&context) {
            return Err(refused(
                "logging/setLevel",
                removed_in_2026_07_28("logging/setLevel"),
            ));
        }
        *self.log_level.lock().unwrap() = Some(request.level);
        Ok(())
    }

    /// rmcp's default answers an empty list; but this server declares no `prompts` capability
    /// (in `initialize` and `server/discover`), and a method of a capability it does not
    /// declare is one it does not implement.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Err(refused("prompts/list", not_implemented("prompts/list")))
    }

    /// rmcp answers a method it knows but we do not implement with its bare name; this server
    /// has no prompts, so `prompts/get` says what it does implement, as unknown methods do.
    async fn get_prompt(
        &self,
        _request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Err(refused("prompts/get", not_implemented("prompts/get")))
    }

    /// rmcp lands here for unknown methods and for known ones whose params did not parse
    /// (`tools/call` with `"arguments": "x"`); its default answer is just the method name.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if let Some(answer) = self.legacy_task_request(&request, &context).await {
            return answer;
        }
        let m = request.method;
        if REMOVED_IN_2026_07_28.contains(&m.as_str()) && is_2026_07_28(&context) {
            return Err(refused(&m, removed_in_2026_07_28(&m)));
        }
        if METHODS.split(", ").any(|k| k == m) {
            let shape = if m == "tools/call" {
                "; expected {\"name\": \"run_python\", \"arguments\": {\"code\": string, ...}}"
            } else {
                ""
            };
            return Err(refused(
                &m,
                ErrorData::invalid_params(format!("malformed params for {m:?}{shape}"), None),
            ));
        }
        Err(refused(&m, not_implemented(&m)))
    }
}

/// The client of a `run_python` request, as its proxied calls reach it: a server's question
/// goes to the user through this peer, and only while every running call is the same
/// identity's (stdio has one client, so one identity).
struct PeerLink(rmcp::service::Peer<RoleServer>, String);

impl PeerLink {
    fn new(peer: rmcp::service::Peer<RoleServer>, identity: Option<&str>) -> PeerLink {
        PeerLink(peer, identity.unwrap_or("stdio").to_string())
    }
}

#[async_trait::async_trait]
impl ClientLink for PeerLink {
    fn identity(&self) -> &str {
        &self.1
    }

    fn can_elicit(&self, request: &ElicitRequestParams) -> bool {
        use rmcp::service::ElicitationMode;
        let modes = self.0.supported_elicitation_modes();
        match request {
            ElicitRequestParams::FormElicitationParams { .. } => {
                modes.contains(&ElicitationMode::Form)
            }
            ElicitRequestParams::UrlElicitationParams { .. } => {
                modes.contains(&ElicitationMode::Url)
            }
            _ => false,
        }
    }

    async fn elicit(&self, request: ElicitRequestParams) -> Result<ElicitResult, String> {
        self.0
            .create_elicitation(request)
            .await
            .map_err(|e| e.to_string())
    }
}

/// The first SIGTERM or SIGINT, by name: both servers shut down cleanly on either.
pub async fn quit_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    let mut int = signal(SignalKind::interrupt()).expect("signal handler");
    tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" }
}

/// Serve MCP over stdio until the client closes it, then remove every container.
pub async fn serve_stdio(bridge: Bridge) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let this = bridge.clone();
    let transport = crate::stdio::StdioTransport::process(MAX_REQUEST_LINE_BYTES);
    let service = bridge.serve(transport).await?;
    tokio::select! {
        r = service.waiting() => { if let Err(e) = r { tracing::warn!("MCP service ended: {e}"); } }
        sig = quit_signal() => tracing::info!("{sig}: shutting down"),
    }
    this.shutdown().await;
    Ok(())
}

impl Bridge {
    /// Remove every container and stop every server; write the audit records still queued.
    pub async fn shutdown(&self) {
        self.sandbox.shutdown().await;
        self.upstreams.shutdown().await;
        let audit = self.audit.clone();
        let _ = tokio::task::spawn_blocking(move || audit.flush(std::time::Duration::from_secs(5)))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_listing_is_constant_and_within_the_token_budget() {
        let a = serde_json::to_string(&tool()).unwrap();
        let b = serde_json::to_string(&tool()).unwrap();
        assert_eq!(a, b);
        // The budget the bench's section 1 reports against: the whole tools/list result.
        let list = serde_json::to_string(&ListToolsResult::with_all_items(vec![tool()])).unwrap();
        let bpe = tiktoken_rs::cl100k_base().expect("cl100k vocabulary");
        let n = bpe.encode_ordinary(&list).len();
        assert!(n <= 250, "{n} cl100k tokens: {list}");
    }

    #[test]
    fn the_approval_form_offers_three_choices() {
        let v = serde_json::to_value(approval_schema()).unwrap();
        let choices: Vec<&str> = v["properties"]["decision"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["const"].as_str().unwrap())
            .collect();
        assert_eq!(choices, [APPROVE_ONCE, APPROVE_SESSION, APPROVE_DENY]);
        assert_eq!(v["required"], json!(["decision"]));
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
        // the call unanswered (tests/e2e/faults.rs::client_wrong_argument_types_are_refused_with_the_expected_shape).
        for bad in [json!(-1), json!(0), json!(-0.0), json!("5"), json!(true)] {
            let e = ok(json!({"code": "1", "timeout": bad})).unwrap_err();
            assert!(e.contains("timeout"), "{bad}: {e}");
        }
        assert!(
            ok(json!({"code": "1", "timeout": -1}))
                .unwrap_err()
                .contains("positive number of seconds")
        );
        let a = ok(json!({"code": "1", "timeout": 1e300})).unwrap();
        assert_eq!(
            Config::default().clamp_timeout(a.timeout),
            Config::default().max_timeout.0
        );
    }
}
