//! `ServerHandler` for [`Bridge`]: each MCP request rmcp hands over, answered.
//!
//! MCP logging is deprecated in the newest protocol revision (SEP-2577) but still what most
//! clients show: `logging/setLevel` is answered for the legacy revisions, and the items that
//! name it allow rmcp's deprecation one by one.

use std::sync::Arc;

#[allow(deprecated)]
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

use super::link::{ClientApprover, PeerLink};
use super::replies::{
    METHODS, REMOVED_IN_2026_07_28, is_2026_07_28, not_implemented, refused, removed_in_2026_07_28,
};
use super::tool::{call_args, tool};
use super::{Bridge, CAPABILITIES_URI, TOOL_NAME, rounds};
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::policy::Approver;
use bridge_sandbox::files;
use bridge_upstream::{CallRelay, ClientLink};

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
        self.watch_skills(context.peer, &Identity::of_request(&context.extensions));
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
            let task = self.spawn_task(key, args, &context, false)?;
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
        let (forwarder, on_output, progress) = match self.progress(&context) {
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
        self.task_visible(&request.task_id, &Identity::of_request(&context.extensions))?;
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_visible(&request.task_id, &Identity::of_request(&context.extensions))?;
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_visible(&request.task_id, &Identity::of_request(&context.extensions))?;
        self.tasks.cancel_task(&request.task_id)
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
        all.extend(self.skill_resources(&identity).await);
        // The live sessions' files of /workspace/out, until their session is reset or closed.
        for (key, f) in self.sandbox.files().await {
            if *key.owner() != identity {
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
            return self.read_file(&request.uri, &key, &name).await;
        }
        let identity = Identity::of_request(&context.extensions);
        if let Some(skill) = self.read_skill(&request.uri, &identity).await {
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
        let c = ResourceContents::text(self.capabilities_markdown(), CAPABILITIES_URI)
            .with_mime_type("text/markdown");
        Ok(ReadResourceResult::new(vec![c]).into())
    }

    async fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListSkillsResult, ErrorData> {
        self.list_served_skills(request, &context).await
    }

    async fn get_skill(
        &self,
        request: rmcp::model::GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetSkillResult, ErrorData> {
        self.get_served_skill(&request.uri, &context).await
    }

    /// 2026-07-28 `subscriptions/listen`: resource-list changes, which the skills make.
    fn accepted_subscription_filter(
        &self,
        _requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(super::published::subscription_filter())
    }

    async fn listen(
        &self,
        subscription: rmcp::service::SubscriptionContext,
    ) -> Result<(), ErrorData> {
        self.listen_skills(subscription).await
    }

    #[allow(deprecated)]
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
