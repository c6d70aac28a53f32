//! `Bridge`, the MCP server: a façade over the parts that own its state, and `ServerHandler`
//! for it: each MCP request rmcp hands over, answered by the part that owns it.
//!
//! - [`Calls`] (`run.rs`): what a call runs on (sandbox, servers, audit log, skills,
//!   installer) and the one path of a call; the files calls leave; the capability summary.
//! - [`Tasks`] (`tasks.rs`): calls running as tasks, and whose each is.
//! - [`Paused`] (`rounds.rs`): 2026-07-28 calls paused on a question, by handle.
//! - [`Skills`] (`published.rs`): the saved skills served as MCP skills.
//! - [`Streaming`] (`progress.rs`): what this connection's client asked to be sent while a call
//!   runs.
//!
//! MCP logging is deprecated in the newest protocol revision (SEP-2577) but still what most
//! clients show: `logging/setLevel` is answered for the legacy revisions, and the items that
//! name it allow rmcp's deprecation one by one.

use std::sync::Arc;

#[allow(deprecated)] // logging/setLevel: see the module docs
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CustomRequest, CustomResult, ErrorData,
    GetPromptRequestParams, GetPromptResponse, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::model::{
    CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::json;

use crate::capabilities::CAPABILITIES_URI;
use crate::link::{ClientApprover, PeerLink};
use crate::progress::Streaming;
use crate::published::{self, Skills};
use crate::replies::{REMOVED_IN_2026_07_28, is_2026_07_28, refused, removed_in_2026_07_28};
use crate::rounds::{self, Paused};
use crate::run::{Calls, SetupFailure};
use crate::tasks::Tasks;
use crate::tool::{RunArgs, TOOL_NAME, call_args, tool};
use bridge_core::audit::Audit;
use bridge_core::boxed::Boxed;
use bridge_core::config::Config;
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::policy::Approver;
use bridge_sandbox::{ExecOutcome, OutputSink, Sandbox, files};
use bridge_upstream::{CallRelay, ClientLink, Upstreams};

/// The MCP server of one configuration: `run` serves one over stdio, `serve` one per HTTP
/// connection ([`Bridge::for_connection`]), `exec` runs a call through one. A clone is the same
/// bridge.
#[derive(Clone)]
pub struct Bridge {
    calls: Calls,
    tasks: Tasks,
    paused: Paused,
    skills: Skills,
    streaming: Streaming,
}

impl Bridge {
    /// The bridge of `run`; it opens the audit log configured by `[audit]`.
    pub fn new(config: Arc<Config>, sandbox: Arc<Sandbox>, upstreams: Upstreams) -> Self {
        let skills = Skills::new(config.clone());
        Bridge {
            tasks: Tasks::new(&config),
            calls: Calls::new(config, sandbox, upstreams, skills.clone()),
            paused: Paused::default(),
            skills,
            streaming: Streaming::default(),
        }
    }

    /// The bridge as one HTTP client's connection sees it: shared sessions, servers, audit and
    /// tasks, and its own `logging/setLevel`.
    pub fn for_connection(&self) -> Bridge {
        Bridge {
            streaming: Streaming::default(),
            ..self.clone()
        }
    }

    /// Start the engine, the image and the pool in the background (see `Sandbox::warm_up`),
    /// and load the tokenizer the budget counts with (`budget::prepare`) on a blocking thread.
    pub fn warm_up(&self) {
        self.calls.warm_up();
    }

    /// The audit log, for whoever records proxied calls (a clone shares the one writer).
    pub fn audit(&self) -> &Audit {
        self.calls.audit()
    }

    /// The capability summary resource: the tool description, how to load servers, and the
    /// names of the servers discovered (no schemas).
    pub fn capabilities_markdown(&self) -> String {
        self.calls.capabilities_markdown()
    }

    /// Run one `run_python` call to completion in session `key`: the outcome, or why it could
    /// not be set up. The one path of a call, from MCP and from `exec`: `Calls::execute` (in
    /// `run.rs`) says what it does with each argument.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub fn execute<'a>(
        &'a self,
        key: &'a SessionKey,
        args: RunArgs,
        cancel: tokio_util::sync::CancellationToken,
        on_output: Option<OutputSink>,
        approver: Option<Arc<dyn Approver>>,
        relay: CallRelay,
        budget: Option<crate::budget::Budget>,
    ) -> Boxed<'a, Result<ExecOutcome, SetupFailure>> {
        Box::pin(
            self.calls
                .execute(key, args, cancel, on_output, approver, relay, budget),
        )
    }

    /// Remove every container and stop every server; write the audit records still queued.
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.calls.shutdown())
    }
}

/// The methods this server answers, as its "method not found" replies list them.
const METHODS: &str = "initialize, ping, tools/list, tools/call, resources/list, resources/read, skills/list, skills/get, subscriptions/listen, logging/setLevel";

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

/// How long a client may treat `tools/list` as fresh (SEP-2549): an hour, so that a `serve`
/// upgraded to another version is seen within one.
const TOOLS_TTL_MS: u64 = 3_600_000;

impl ServerHandler for Bridge {
    /// The client has its answer to `initialize`: warm up in the background (engine, image,
    /// pool, the budget's tokenizer) while the model writes its first code, if the process
    /// start did not already (`run` does). Returns at once and fails nothing.
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        self.warm_up();
        // The session's skills (SEP-2640): a change to them is a resource-list change.
        self.skills
            .watch(context.peer, &Identity::of_request(&context.extensions));
    }

    #[allow(deprecated)] // enable_logging
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().enable_resources_list_changed().enable_logging().enable_tasks().enable_skills().build())
            .with_server_info(rmcp::model::Implementation::new("mcp-code-bridge", env!("CARGO_PKG_VERSION")))
            .with_instructions("Use run_python for code; discover MCP servers from inside it (see the tool description).")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let list = ListToolsResult::with_all_items(vec![tool()]);
        // SEP-2549 (2026-07-28): the list is this binary's, the same for every identity and
        // for as long as the bridge runs, so a client or an intermediary may keep it.
        Ok(if is_2026_07_28(&context) {
            list.with_ttl_ms(TOOLS_TTL_MS)
                .with_cache_scope(rmcp::model::CacheScope::Public)
        } else {
            list
        })
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL_NAME).then(tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (args, key) = call_args(request.name, request.arguments, &context.extensions)?;
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
            let task = self.tasks.spawn(&self.calls, key, args, &context, false)?;
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
                    .paused
                    .call(
                        &self.calls,
                        &self.streaming,
                        key,
                        args,
                        request.request_state,
                        request.input_responses,
                        askable,
                        &context,
                    )
                    .await;
            }
        }
        let (forwarder, on_output, progress) = match self.streaming.start(&context) {
            Some((f, out, up)) => (Some(f), Some(out), Some(up)),
            None => (None, None, None),
        };
        // The legacy revision's connection is where approvals are asked and the client's
        // requests go; the 2026-07-28 revision has none (a client that answers input requests
        // took the rounds above).
        type Links = (Option<Arc<dyn Approver>>, Option<Arc<dyn ClientLink>>);
        let (approver, client): Links = if modern {
            (None, None)
        } else {
            (
                Some(Arc::new(ClientApprover(context.peer.clone()))),
                Some(Arc::new(PeerLink::new(
                    context.peer.clone(),
                    key.owner().clone(),
                ))),
            )
        };
        let relay = CallRelay { progress, client };
        // SEP-414: the client's trace, if it sent one, is the parent of the call's span (also
        // in the task and rounds paths above).
        let parent = bridge_core::trace::parent_of(&context.meta);
        let result = self
            .calls
            .run_for(
                key,
                args,
                context.ct.clone(),
                on_output,
                approver,
                relay,
                parent,
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
        let identity = Identity::of_request(&context.extensions);
        self.tasks.get(&request.task_id, &identity)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let identity = Identity::of_request(&context.extensions);
        self.tasks
            .update(&request.task_id, &identity, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let identity = Identity::of_request(&context.extensions);
        self.tasks.cancel(&request.task_id, &identity)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let identity = Identity::of_request(&context.extensions);
        let r = Resource::new(CAPABILITIES_URI, "capabilities")
            .with_description("What run_python offers and how to load MCP servers inside it")
            .with_mime_type("text/markdown");
        let mut all = vec![r];
        all.extend(self.skills.resources(&identity).await);
        all.extend(self.calls.file_resources(&identity).await);
        let list = ListResourcesResult::with_all_items(all);
        // The files listed are this identity's and change with every call.
        Ok(if is_2026_07_28(&context) {
            list.with_ttl_ms(0)
                .with_cache_scope(rmcp::model::CacheScope::Private)
        } else {
            list
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if let Some((session, name)) = files::parse_uri(&request.uri) {
            // The URI names a session of the asker's own: another identity's file is as absent
            // as one never written.
            let key = SessionKey::new(Identity::of_request(&context.extensions), session);
            return self.calls.read_file(&request.uri, &key, &name).await;
        }
        let identity = Identity::of_request(&context.extensions);
        if let Some(skill) = self.skills.read(&request.uri, &identity).await {
            return skill;
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
        let c = ResourceContents::text(self.calls.capabilities_markdown(), CAPABILITIES_URI)
            .with_mime_type("text/markdown");
        Ok(ReadResourceResult::new(vec![c]).into())
    }

    async fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListSkillsResult, ErrorData> {
        self.skills.list(request, &context).await
    }

    async fn get_skill(
        &self,
        request: rmcp::model::GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetSkillResult, ErrorData> {
        self.skills.get(&request.uri, &context).await
    }

    /// 2026-07-28 `subscriptions/listen`: resource-list changes, which the skills make.
    fn accepted_subscription_filter(
        &self,
        _requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(published::subscription_filter())
    }

    async fn listen(
        &self,
        subscription: rmcp::service::SubscriptionContext,
    ) -> Result<(), ErrorData> {
        self.skills.listen(subscription).await
    }

    #[allow(deprecated)] // SetLevelRequestParams and its level
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
        self.streaming.set_log_level(request.level);
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
        if let Some(answer) = self
            .tasks
            .legacy_request(&self.calls, &request, &context)
            .await
        {
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
