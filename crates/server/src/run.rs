//! The bridge path of one `run_python` call: load its servers, run its code in its session,
//! audit it, render its result; what it runs on (sandbox, servers, audit log, skills,
//! installer), from start to shutdown; and the files a call leaves, as resources.

use std::sync::Arc;

use rmcp::model::{
    CallToolResult, ErrorData, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
};
use serde_json::json;

use crate::budget::{self, Budget};
use crate::capabilities;
use crate::link::TracedApprover;
use crate::published::Skills;
use crate::render;
use crate::replies::refused;
use crate::tool::{RunArgs, TOOL_NAME};
use base64::Engine as _;
use bridge_core::audit::{self, Audit};
use bridge_core::config::Config;
use bridge_core::error::Hinted as _;
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::policy::Approver;
use bridge_core::trace::{self, Within as _};
use bridge_sandbox::files;
use bridge_sandbox::{ExecOutcome, ExecRequest, OutputSink, Sandbox};
use bridge_upstream::{CallContext, CallRelay, Upstreams};

/// Why a call's code could not run at all: its servers could not be loaded, or no sandbox
/// could be had.
#[derive(Debug)]
pub struct SetupFailure {
    /// The error type the result and the audit record name: the upstream error's kind when the
    /// servers could not be loaded, `SandboxUnavailable` when no sandbox could be had.
    pub kind: &'static str,
    /// What went wrong, with what to do about it.
    pub message: String,
}

/// What a `run_python` call runs on: the sessions (the sandbox), the upstream servers, the
/// audit log, the saved skills and the installer. Shared by every connection of a bridge, and
/// by its tasks and paused rounds, whose calls take this path too.
#[derive(Clone)]
pub(crate) struct Calls {
    config: Arc<Config>,
    sandbox: Arc<Sandbox>,
    upstreams: Upstreams,
    audit: Audit,
    /// The saved skills, whose RPC methods every exec's handler answers first.
    skills: Skills,
    /// The installer of `runtime.install`, whose RPC methods every exec's handler answers too.
    packages: Arc<bridge_packages::Packages>,
}

impl Calls {
    /// Open the audit log configured by `[audit]`, and give it to the sandbox and the
    /// installer; the sandbox preinstalls `[packages] preinstall` through the installer.
    pub(crate) fn new(
        config: Arc<Config>,
        sandbox: Arc<Sandbox>,
        upstreams: Upstreams,
        skills: Skills,
    ) -> Calls {
        let audit = Audit::open(&config);
        let packages = bridge_packages::Packages::new(&config, audit.clone());
        sandbox.set_audit(audit.clone());
        if !config.packages.preinstall.0.is_empty() {
            sandbox.set_provision(Arc::new(bridge_packages::Preinstall(packages.clone())));
        }
        Calls {
            config,
            sandbox,
            upstreams,
            audit,
            skills,
            packages,
        }
    }

    /// Start the engine, the image and the pool in the background (see `Sandbox::warm_up`),
    /// and load the tokenizer the budget counts with (`budget::prepare`) on a blocking thread.
    pub(crate) fn warm_up(&self) {
        self.sandbox.warm_up();
        tokio::task::spawn_blocking(budget::prepare);
    }

    /// The audit log (a clone shares the one writer).
    pub(crate) fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Remove every container and stop every server; write the audit records still queued.
    pub(crate) async fn shutdown(&self) {
        self.sandbox.shutdown().await;
        self.upstreams.shutdown().await;
        let audit = self.audit.clone();
        let _ = tokio::task::spawn_blocking(move || audit.flush(std::time::Duration::from_secs(5)))
            .await;
    }

    /// The capability summary, as it is now ([`capabilities`]).
    pub(crate) fn capabilities_markdown(&self) -> String {
        capabilities::markdown(&self.config, &self.sandbox, &self.upstreams)
    }

    /// Run one `run_python` call to completion in session `key`: the outcome, or why it could
    /// not be set up. This is the one path of a call, from MCP and from `exec`: it loads the
    /// call's servers under the policy (asking `approver`, the client of the request, about the
    /// proxied calls the policy says to ask about; with none, `ask_fallback` answers), binds the
    /// key's skills, runs the code, and leaves one `exec` record in the audit log (each proxied
    /// call leaves a `tool_call` record). `relay` gets what those calls pass on to the client
    /// (their progress, their servers' questions). With `budget`, the parts of the output over
    /// it are kept whole as files (`server::budget`) for a result to preview; without, as for
    /// `exec`, which prints everything, none is.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn execute(
        &self,
        key: &SessionKey,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
        approver: Option<Arc<dyn Approver>>,
        relay: CallRelay,
        budget: Option<Budget>,
    ) -> Result<ExecOutcome, SetupFailure> {
        let started = std::time::Instant::now();
        if args.reset {
            self.upstreams.forget_session(key);
        }
        // The code's literals are the user's intent while its model has seen no untrusted text.
        self.upstreams.flows().begin_exec(key.owner(), &args.code);
        // The code goes to the sandbox; the log needs it after (its digest, or all of it).
        let code = self.audit.is_on().then(|| args.code.clone());
        let record = |status: &str, error_type: Option<&str>| {
            if let Some(code) = &code {
                self.audit.exec(audit::Exec {
                    session: key.name(),
                    identity: key.owner().name(),
                    code,
                    servers: &args.servers,
                    status,
                    error_type,
                    duration: started.elapsed(),
                });
            }
        };
        let asker = approver.clone();
        let can_ask = approver.as_ref().is_some_and(|a| a.can_ask());
        let call = CallContext {
            session: key.clone(),
            approver,
            relay,
            audit: self.audit.clone(),
        };
        let gate = bridge_skills::rpc::SaveGate {
            rule: self.config.skills.save,
            fallback: self.config.policy.ask_fallback,
            approver: asker.clone(),
            audit: self.audit.clone(),
            key: key.clone(),
        };
        let binding = match self.upstreams.load_for(&args.servers, call).await {
            Ok(b) => {
                bridge_skills::rpc::SkillRpc::bind(&self.skills.store_of(key.owner()), b, gate)
            }
            Err(e) => {
                record("setup_error", Some(e.kind()));
                return Err(SetupFailure {
                    kind: e.kind(),
                    message: e.message(),
                });
            }
        };
        let binding = bridge_core::protocol::ExecBinding {
            rpc: bridge_packages::rpc::PackagesRpc::wrap(
                self.packages.clone(),
                key.clone(),
                asker,
                binding.rpc,
            ),
            ..binding
        };
        let req = ExecRequest {
            code: args.code,
            timeout: self.config.clamp_timeout(args.timeout),
            max_timeout: self.config.max_timeout.0,
            output_cap: self.config.output_cap.0 as usize,
            binding,
            cancel,
            on_output,
            spill: budget.map(|b| bridge_sandbox::Spill {
                fit: Arc::new(b),
                key: key.clone(),
            }),
        };
        match self.sandbox.run(key, args.reset, req).await {
            Ok(mut outcome) => {
                if let Some(e) = outcome
                    .error
                    .as_ref()
                    .filter(|e| e.kind == "ModuleNotFoundError")
                    && let Some(hint) = self.packages.missing_module_hint(&e.message, can_ask)
                {
                    outcome.notices.push(hint);
                }
                let status = serde_json::to_value(outcome.outcome).unwrap_or_default();
                let error_type = outcome.error.as_ref().map(|e| e.kind.as_str());
                record(status.as_str().unwrap_or("unknown"), error_type);
                Ok(outcome)
            }
            Err(e) => {
                record("setup_error", Some("SandboxUnavailable"));
                Err(SetupFailure {
                    kind: "SandboxUnavailable",
                    message: e.message(),
                })
            }
        }
    }

    /// [`Calls::execute`], its outcome rendered as the result the model sees, under a span of
    /// its own, child of `parent` (the request's `traceparent`, [`trace::parent_of`]); its
    /// trace id in the result's `_meta` when it has one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_for(
        &self,
        key: SessionKey,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
        approver: Option<Arc<dyn Approver>>,
        relay: CallRelay,
        parent: trace::Context,
    ) -> CallToolResult {
        let budget = Budget::new(self.config.output_budget);
        let span = self.call_span(&parent, &key, &args);
        let approver = approver.map(|a| Arc::new(TracedApprover(a)) as Arc<dyn Approver>);
        let outcome = self
            .execute(&key, args, cancel, on_output, approver, relay, Some(budget))
            .within(span.clone())
            .await;
        self.end_call_span(&span, &outcome);
        let trace_id = trace::trace_id(&span);
        let mut result = match outcome {
            Ok(outcome) => {
                self.reply_shown(&key, &outcome);
                render::tool_result(outcome, self.config.output_mode, key.name(), &budget)
            }
            Err(e) => render::setup_error(e.kind, &e.message, key.name()),
        };
        if let Some(id) = trace_id {
            render::add_trace_id(&mut result, &id);
        }
        result
    }

    /// With flows on, whether what this reply shows the client (its whole output, value and
    /// error, streamed or kept as files too) carries untrusted text: then the identity's model
    /// is steered from now on (`bridge_core::flows`).
    fn reply_shown(&self, key: &SessionKey, o: &ExecOutcome) {
        if !self.upstreams.flows().is_on() {
            return;
        }
        let mut texts = vec![o.stdout.as_str(), o.stderr.as_str()];
        texts.extend(o.value.as_deref());
        if let Some(e) = &o.error {
            texts.extend([e.message.as_str(), e.traceback.as_str()]);
        }
        self.shown(key, "a reply showed the client", &texts);
    }

    /// `texts` reached `key`'s client (`what` says how, as the log line begins): the identity's model is steered when they
    /// carry untrusted text (`bridge_core::flows`), and the log says so once.
    fn shown(&self, key: &SessionKey, what: &str, texts: &[&str]) {
        if let Some(tool) = self.upstreams.flows().reply_shown(key.owner(), texts) {
            tracing::info!(
                session = key.name(),
                "{what} text of {tool}'s result: literals of later code no longer count as the user's intent"
            );
        }
    }

    /// The span of one `run_python` call (OpenTelemetry's MCP conventions, and the bridge's
    /// own `mcp_code_bridge.*`): never the code, unless `otel_content`.
    fn call_span(
        &self,
        parent: &trace::Context,
        key: &SessionKey,
        args: &RunArgs,
    ) -> trace::Context {
        let mut attrs = vec![
            trace::Attr::new("mcp.method.name", "tools/call"),
            trace::Attr::new("gen_ai.operation.name", "execute_tool"),
            trace::Attr::new("gen_ai.tool.name", TOOL_NAME),
            trace::Attr::new("mcp_code_bridge.session", key.name().to_string()),
            trace::Attr::new("mcp_code_bridge.reset", args.reset),
        ];
        if let Some(id) = key.owner().name() {
            attrs.push(trace::Attr::new("enduser.id", id.to_string()));
        }
        if !args.servers.is_empty() {
            attrs.push(trace::Attr::new(
                "mcp_code_bridge.servers",
                args.servers.join(","),
            ));
        }
        if self.config.otel_content {
            attrs.push(trace::Attr::new(
                "mcp_code_bridge.code",
                trace::content(&args.code),
            ));
        }
        let name = format!("tools/call {}", TOOL_NAME);
        trace::start(parent, name, trace::SpanKind::Server, attrs)
    }

    /// The call's span ended with how it went: status, output size, the error's type.
    fn end_call_span(&self, span: &trace::Context, outcome: &Result<ExecOutcome, SetupFailure>) {
        match outcome {
            Ok(o) => {
                let status = serde_json::to_value(o.outcome).unwrap_or_default();
                let mut attrs = vec![
                    trace::Attr::new(
                        "mcp_code_bridge.status",
                        status.as_str().unwrap_or("unknown").to_string(),
                    ),
                    trace::Attr::new(
                        "mcp_code_bridge.output_bytes",
                        (o.stdout.len() + o.stderr.len()) as i64,
                    ),
                    trace::Attr::new("mcp_code_bridge.images", o.images.len() as i64),
                    trace::Attr::new("mcp_code_bridge.files", o.files.len() as i64),
                ];
                if let Some(how) = o.resumed {
                    attrs.push(trace::Attr::new("mcp_code_bridge.resumed", how));
                }
                if self.config.otel_content {
                    let mut text = o.stdout.clone();
                    text.push_str(&o.stderr);
                    attrs.push(trace::Attr::new(
                        "mcp_code_bridge.output",
                        trace::content(&text),
                    ));
                }
                trace::set(span, attrs);
                let error =
                    match o.outcome {
                        bridge_sandbox::Outcome::Ok => None,
                        _ => Some(o.error.as_ref().map_or_else(
                            || status.as_str().unwrap_or("unknown"),
                            |e| e.kind.as_str(),
                        )),
                    };
                trace::end(span, error);
            }
            Err(e) => {
                trace::set(
                    span,
                    vec![trace::Attr::new("mcp_code_bridge.status", "setup_error")],
                );
                trace::end(span, Some(e.kind));
            }
        }
    }

    /// The files copied out of `/workspace/out` of `identity`'s live sessions, as
    /// `resources/list` lists them, until their session is reset or closed.
    pub(crate) async fn file_resources(&self, identity: &Identity) -> Vec<Resource> {
        let mut all = Vec::new();
        for (key, f) in self.sandbox.files().await {
            if key.owner() != identity {
                continue;
            }
            let session = key.name();
            all.push(
                Resource::new(f.uri, f.name.clone())
                    .with_title(format!("{}/{} (session {session})", files::OUT_DIR, f.name))
                    .with_mime_type(f.mime)
                    .with_size(f.size),
            );
        }
        all
    }

    /// `resources/read` of a file copied out of `/workspace/out`: text when its type is textual
    /// and its bytes UTF-8, else base64. Bounded by `file_cap`, which every kept file is within.
    pub(crate) async fn read_file(
        &self,
        uri: &str,
        session: &SessionKey,
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
                        "no file {name:?} in session {:?}: it was never written to {}, or the session was reset or closed since (resources/list shows the files there are)",
                        session.name(),
                        files::OUT_DIR
                    ),
                    Some(json!({"uri": uri})),
                ),
            ));
        };
        if self.upstreams.flows().is_on() {
            self.shown(
                session,
                "a file read by the client showed",
                &[&String::from_utf8_lossy(&bytes)],
            );
        }
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
}
