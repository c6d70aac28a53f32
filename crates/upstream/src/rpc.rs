//! The RPCs of one exec: what the code in the sandbox may ask of the upstream side. Docs and
//! search cover every discovered server; `call_tool` only the servers loaded for the exec, whose
//! pool slots the handler keeps, so a proxied call goes to its server without a registry lookup.
//! Errors reach the sandbox as [`Hinted::message`]: what was wrong, then what to do.
//!
//! Every proxied call goes through the user's policy here ([`ExecRpc::call_tool`]), whatever
//! thread of the session's code sent it: the handler is the current exec's, and a thread left
//! by an earlier call reaches the host through it too.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde_json::{Map, Value, json};

use super::catalog::{self, Detail, ServerTools, UnknownTool, Unlisted};
use super::pool::{CallError, Slot};
use super::record::{RecordOnDrop, audit_decision, rule_text};
use super::report::known_servers;
use super::upstreams::{CallContext, Upstreams};
use bridge_core::audit::{Decision as AuditDecision, FlowRecord, ToolCallRecord, ToolStatus};
use bridge_core::error::{Hint, Hinted};
use bridge_core::flows::Labels;
use bridge_core::policy::{Decision, Verdict};
use bridge_core::protocol::{RPC_DENIED, RpcFailure, RpcHandler};
use bridge_core::trace::{self, Within as _};

/// The largest `limit` a search honours.
pub const MAX_SEARCH_LIMIT: usize = 50;
/// The `limit` of a search that gives none.
pub const DEFAULT_SEARCH_LIMIT: usize = 5;
/// Longest search query considered (the rest is ignored).
const MAX_QUERY_CHARS: usize = 1000;

/// Why an RPC from the sandbox was refused or failed. The handler sends [`Hinted::message`].
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// A parameter the method needs (`server`, `tool`, `query`) is absent or not a string.
    #[error("{method} needs a string parameter '{key}'")]
    MissingParam {
        /// The RPC method called.
        method: String,
        /// The parameter's name.
        key: &'static str,
    },
    /// A parameter of the wrong type: `expected` is "a string", "a number", ...
    #[error("{method}: '{key}' must be {expected}")]
    BadParam {
        /// The RPC method called.
        method: &'static str,
        /// The parameter's name.
        key: &'static str,
        /// What it must be, as the message says it.
        expected: &'static str,
    },
    /// The server named is none of the discovered ones (by name, alias, or as an identifier).
    #[error("Unknown MCP server '{name}'")]
    UnknownServer {
        /// The name as the code gave it.
        name: String,
        /// Every discovered server, by name.
        known: Vec<String>,
    },
    /// A `call_tool` of a server that exists but was not loaded for this exec (only the
    /// loaded servers' tools may be called; docs and search cover every server).
    #[error("Server '{server}' is not loaded for this call")]
    NotLoaded {
        /// The server's name.
        server: String,
    },
    /// A method the host does not answer; holds the method as sent.
    #[error("Unknown RPC method '{0}'")]
    UnknownMethod(String),
    /// `query_tool_docs` for a tool the server's catalog does not have (by any spelling).
    #[error(transparent)]
    UnknownTool(#[from] UnknownTool),
    /// A call of a tool the server does not list, even when listed afresh: never sent.
    #[error(transparent)]
    Unlisted(#[from] Unlisted),
    /// Arguments the tool's input schema forbids: never sent.
    #[error(transparent)]
    InvalidArguments(#[from] crate::schema::InvalidArguments),
    /// Listing the server's tools or calling the tool failed (starting it, its connection, a
    /// timeout, its refusal).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The policy, or the user when asked, refused the call. The runtime raises `ToolDenied`.
    #[error(transparent)]
    Denied(Box<Denied>),
}

/// A proxied call refused by the policy or by the user (boxed in [`RpcError`]: it is the
/// largest error and the rarest).
#[derive(Debug, thiserror::Error)]
#[error("{}", denied_text(.server, .tool, .decision, .fallback_origin))]
pub struct Denied {
    /// The server's name.
    pub server: String,
    /// The tool's name as the server lists it.
    pub tool: String,
    /// The verdict, and the rule and file that made it.
    pub decision: Decision,
    /// Where `ask_fallback` is set, for a call that could not be asked about.
    pub fallback_origin: String,
}

/// What a refusal says: the tool, why, the rule and where it is set.
fn denied_text(server: &str, tool: &str, d: &Decision, fallback_origin: &str) -> String {
    let rule = d.rule.as_deref().unwrap_or("the policy");
    let origin = d.origin.as_deref().unwrap_or("default");
    match d.verdict {
        Verdict::AskDenied => format!(
            "The user denied the call {server}.{tool} when asked (asked because of rule {rule}, set in {origin})"
        ),
        Verdict::AskUnavailable => format!(
            "The call {server}.{tool} needs the user's approval (rule {rule}, set in {origin}), but the MCP client cannot be asked (it does not support elicitation), and policy.ask_fallback = \"deny\" (set in {fallback_origin}) refuses it"
        ),
        _ => format!(
            "The call {server}.{tool} is denied by the user's policy: rule {rule}, set in {origin}"
        ),
    }
}

impl Hinted for RpcError {
    fn hint(&self) -> Option<Hint> {
        match self {
            RpcError::UnknownServer { known, .. } => Some(known_servers(known)),
            RpcError::NotLoaded { server } => Some(Hint::clause(format!(
                "pass \"servers\": [\"{server}\"] to run_python to load it"
            ))),
            RpcError::UnknownMethod(_) => Some(Hint::clause(
                "the host answers list_servers, list_tools, query_tool_docs, search_tool_docs, call_tool",
            )),
            RpcError::UnknownTool(e) => e.hint(),
            RpcError::Unlisted(e) => {
                let all = format!(
                    "runtime.list_tools(\"{}\") lists all {}",
                    e.server, e.listed
                );
                Some(Hint::clause(if e.closest.is_empty() {
                    all
                } else {
                    format!("the closest listed: {}; {all}", e.closest.join(", "))
                }))
            }
            RpcError::Call(e) => e.hint(),
            RpcError::InvalidArguments(e) => e.hint(),
            RpcError::Denied(_) => Some(Hint::clause(
                "the user decides this, not the code: do not retry the call; go on without it, or tell the user what it was needed for",
            )),
            _ => None,
        }
    }
}

/// The RPC handler of one exec.
pub(super) struct ExecRpc {
    pub(super) up: Upstreams,
    /// The servers loaded for this exec.
    loaded: Vec<Arc<Slot>>,
    /// The session and the client to ask.
    pub(super) call: CallContext,
    /// The interpreter the exec runs in (see `RpcHandler::on_interpreter`): "allow for this
    /// session" holds for it only.
    pub(super) interpreter: OnceLock<String>,
    /// One question to the user at a time: the code may send many calls at once, and the
    /// answer to the first ("for this session") may settle the others.
    pub(super) asking: tokio::sync::Mutex<()>,
}

fn param_str<'a>(params: &'a Value, key: &'static str, method: &str) -> Result<&'a str, RpcError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::MissingParam {
            method: method.to_string(),
            key,
        })
}

impl ExecRpc {
    pub(super) fn new(up: Upstreams, loaded: Vec<Arc<Slot>>, call: CallContext) -> Self {
        ExecRpc {
            up,
            loaded,
            call,
            interpreter: OnceLock::new(),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// Any discovered server (docs cover them all).
    fn server(&self, name: &str) -> Result<&Arc<Slot>, RpcError> {
        self.up.lookup(name).ok_or_else(|| RpcError::UnknownServer {
            name: name.to_string(),
            known: self.up.known(),
        })
    }

    /// A server loaded for this exec. The runtime sends server names, found among the loaded
    /// few; anything else (an alias) is resolved among all servers, which also tells an unknown
    /// server from one that is not loaded.
    fn loaded_server(&self, name: &str) -> Result<&Arc<Slot>, RpcError> {
        if let Some(slot) = self.loaded.iter().find(|s| s.name() == name) {
            return Ok(slot);
        }
        let slot = self.server(name)?;
        match self.loaded.iter().find(|s| Arc::ptr_eq(s, slot)) {
            Some(slot) => Ok(slot),
            None => Err(RpcError::NotLoaded {
                server: slot.name().to_string(),
            }),
        }
    }

    async fn handle_inner(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        match method {
            "list_servers" => Ok(json!(
                self.loaded
                    .iter()
                    .map(|s| s.name().to_string())
                    .collect::<Vec<_>>()
            )),
            "list_tools" => {
                let slot = self.server(param_str(params, "server", method)?)?;
                Ok(json!(self.up.server_tools(slot).await?.list()))
            }
            "query_tool_docs" => {
                let slot = self.server(param_str(params, "server", method)?)?;
                let tool = match params.get("tool") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.as_str()),
                    Some(_) => {
                        return Err(RpcError::BadParam {
                            method: "query_tool_docs",
                            key: "tool",
                            expected: "a string",
                        });
                    }
                };
                let detail = Detail::parse(params.get("detail").and_then(Value::as_str));
                Ok(json!(self.up.server_tools(slot).await?.docs(tool, detail)?))
            }
            "search_tool_docs" => {
                let query = param_str(params, "query", method)?;
                let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
                let limit = match params.get("limit") {
                    None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
                    Some(v) => v
                        .as_f64()
                        .map(|n| n.clamp(1.0, MAX_SEARCH_LIMIT as f64) as usize)
                        .ok_or(RpcError::BadParam {
                            method: "search_tool_docs",
                            key: "limit",
                            expected: "a number",
                        })?,
                };
                let (catalogs, skipped) = self.up.all_tools().await;
                let refs: Vec<&ServerTools> = catalogs.iter().collect();
                Ok(json!({
                    "results": catalog::search(&refs, &query, limit),
                    "skipped": skipped,
                }))
            }
            "call_tool" => self.call_tool(params).await,
            other => Err(RpcError::UnknownMethod(other.to_string())),
        }
    }
}

impl ExecRpc {
    /// A proxied call: resolve the server (loaded ones only) and the tool's real name, decide
    /// by the policy (asking the user when it says so), then call or refuse.
    async fn call_tool(&self, params: &Value) -> Result<Value, RpcError> {
        let method = "call_tool";
        let slot = self.loaded_server(param_str(params, "server", method)?)?;
        let tool = param_str(params, "tool", method)?;
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => Some(o.clone()),
            Some(_) => {
                return Err(RpcError::BadParam {
                    method: "call_tool",
                    key: "arguments",
                    expected: "an object (keyword arguments)",
                });
            }
        };
        let (tool_name, annotations, check) = match self.listed_tool(slot, tool).await {
            Ok(found) => found,
            Err(e) => {
                self.record_unlisted(slot.name(), tool, arguments.as_ref(), &e);
                return Err(e);
            }
        };
        // What the tool's schema says of the arguments, read where they are (they can be
        // large); it counts only for a call the policy allows.
        let problems = check.map_or_else(Vec::new, |c| {
            c.problems_of(params.get("arguments").unwrap_or(&Value::Null))
        });
        // The call's span (OpenTelemetry's MCP client conventions): its server, tool, decision,
        // status and size, never its arguments; the approval question and the server's own
        // spans (it gets the `traceparent`) are its children.
        let span = trace::Guard::new(trace::client(
            format!("tools/call {tool_name}"),
            vec![
                trace::Attr::new("mcp.method.name", "tools/call"),
                trace::Attr::new("gen_ai.operation.name", "execute_tool"),
                trace::Attr::new("gen_ai.tool.name", tool_name.clone()),
                trace::Attr::new("mcp_code_bridge.server", slot.name().to_string()),
            ],
        ));
        let outcome = self
            .decided_call(slot, tool_name, arguments, annotations, problems)
            .within(span.context().clone())
            .await;
        // Measured only for a span that is sent: a result can be megabytes.
        let measured = trace::recording(span.context());
        let (bytes, error) = match &outcome.0 {
            Ok(v) => (
                if measured {
                    serde_json::to_string(v).map_or(0, |t| t.len())
                } else {
                    0
                },
                (v["isError"] == true).then_some("tool_error"),
            ),
            Err(RpcError::Denied(_)) => (0, Some("denied")),
            Err(RpcError::Call(e)) => (0, Some(e.kind())),
            Err(RpcError::InvalidArguments(_)) => (0, Some("InvalidArguments")),
            Err(_) => (0, Some("BadCall")),
        };
        let mut attrs = vec![
            trace::Attr::new("mcp_code_bridge.decision", outcome.1.verdict.as_str()),
            trace::Attr::new("mcp_code_bridge.result_bytes", bytes as i64),
        ];
        if let Some(flow) = &outcome.2 {
            attrs.push(trace::Attr::new(
                "mcp_code_bridge.flow",
                flow.decision.clone(),
            ));
            if !flow.sources.is_empty() {
                attrs.push(trace::Attr::new(
                    "mcp_code_bridge.flow_sources",
                    flow.sources.join(", "),
                ));
            }
        }
        trace::set(span.context(), attrs);
        span.end(error);
        outcome.0
    }

    /// [`Self::call_tool`] once the tool is known: decided by the policy, then made or
    /// refused, and audited; with the decision.
    async fn decided_call(
        &self,
        slot: &Slot,
        tool_name: String,
        arguments: Option<Map<String, Value>>,
        annotations: Option<rmcp::model::ToolAnnotations>,
        problems: Vec<String>,
    ) -> (Result<Value, RpcError>, Decision, Option<FlowRecord>) {
        let started = Instant::now();
        let destructive = bridge_core::policy::annotated_destructive(annotations.as_ref());
        // Labelled only with flows on: with them off, a call costs nothing more.
        let flows_on = self.up.flows().is_on();
        let labels = if flows_on {
            self.up
                .flows()
                .rules()
                .labels(slot.name(), &tool_name, annotations.as_ref())
        } else {
            Labels::default()
        };
        // A call whose exec ends while the human is still being asked (a client that never
        // answers: its deadline) is recorded as denied, unanswered.
        let mut unanswered = RecordOnDrop {
            audit: &self.call.audit,
            trace: trace::Context::current(),
            started,
            record: Some(self.record(
                slot.name(),
                &tool_name,
                arguments.as_ref(),
                &Decision {
                    verdict: Verdict::AskDenied,
                    allowed: false,
                    rule: None,
                    origin: None,
                    ask: Some("unanswered"),
                },
            )),
            dropped: (ToolStatus::Denied, "unanswered"),
        };
        let flow_check = self.flow_check(slot.name(), &tool_name, &labels, arguments.as_ref());
        let flow = self
            .judge(
                slot.name(),
                &tool_name,
                arguments.as_ref(),
                destructive,
                flow_check,
            )
            .await;
        let (decision, flow) = (flow.decision, flow.record);
        unanswered.record = None;
        // Written however the call ends: a call dropped with its exec (timeout, cancellation)
        // is recorded as failed by the guard.
        let mut record = RecordOnDrop {
            audit: &self.call.audit,
            trace: trace::Context::current(),
            started,
            record: Some(match &flow {
                Some(f) => self
                    .record(slot.name(), &tool_name, arguments.as_ref(), &decision)
                    .with_flow(f.clone()),
                None => self.record(slot.name(), &tool_name, arguments.as_ref(), &decision),
            }),
            dropped: (ToolStatus::Failed, "cancelled"),
        };
        // A call the policy refuses is refused as such, whatever its arguments; one it allows
        // is sent only when its arguments fit the tool's schema.
        let outcome = if decision.allowed && !problems.is_empty() {
            Err(RpcError::InvalidArguments(
                crate::schema::InvalidArguments {
                    server: slot.name().to_string(),
                    tool: tool_name.clone(),
                    problems,
                    server_alias: slot.info.alias.clone(),
                    tool_alias: catalog::sanitize_identifier(&tool_name, "tool"),
                },
            ))
        } else if decision.allowed {
            self.up
                .pool()
                .call_tool(slot, &tool_name, arguments.clone(), &self.call.relay)
                .await
                .map(|r| call_result_json(&r))
                .inspect(|v| {
                    if flows_on {
                        let who = self.call.session.owner();
                        let flows = self.up.flows();
                        let args = arguments.as_ref();
                        flows.record_call(who, slot.name(), &tool_name, &labels, args, v);
                    }
                })
                .map_err(RpcError::from)
        } else {
            Err(RpcError::Denied(Box::new(Denied {
                server: slot.name().to_string(),
                tool: tool_name.clone(),
                decision: decision.clone(),
                fallback_origin: self.up.policy().fallback().1.to_string(),
            })))
        };
        let (status, error_type) = match &outcome {
            Ok(v) if v["isError"] == true => (ToolStatus::Error, None),
            Ok(_) => (ToolStatus::Ok, None),
            Err(RpcError::Denied(_)) => (ToolStatus::Denied, None),
            Err(RpcError::Call(e)) => (ToolStatus::Failed, Some(e.kind())),
            Err(RpcError::InvalidArguments(_)) => (ToolStatus::Failed, Some("InvalidArguments")),
            Err(_) => (ToolStatus::Failed, Some("BadCall")),
        };
        record.finish(status, error_type);
        tracing::debug!(
            server = slot.name(),
            tool = %tool_name,
            decision = decision.verdict.as_str(),
            rule = decision.rule.as_deref().unwrap_or(""),
            ok = outcome.is_ok(),
            duration_ms = started.elapsed().as_millis() as u64,
            "proxied tool call"
        );
        (outcome, decision, flow)
    }

    /// The `tool_call` record of a decided call.
    fn record(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        decision: &Decision,
    ) -> ToolCallRecord {
        let key = &self.call.session;
        let r = ToolCallRecord::new(
            key.name(),
            server,
            tool,
            arguments,
            audit_decision(decision.verdict),
            rule_text(decision).as_deref(),
        );
        let r = match decision.ask {
            Some(path) => r.with_ask(path),
            None => r,
        };
        match key.owner().name() {
            Some(id) => r.with_identity(id),
            None => r,
        }
    }

    /// The name to call for `tool` and whether the server annotates that tool destructive, from
    /// the server's current list: the cached one when it came from the server and names the
    /// tool (the alias the proxies use, another case and the identifier spelling are accepted,
    /// and become the listed name), otherwise a fresh listing ([`Pool::fresh_tools`]). A name
    /// even that does not have is [`Unlisted`]: the policy never judges, and the server never
    /// gets, a name it does not list, and a tool missing from a stale list is never taken for
    /// one without annotations.
    ///
    /// [`Pool::fresh_tools`]: super::pool::Pool::fresh_tools
    async fn listed_tool(&self, slot: &Slot, tool: &str) -> Result<ListedTool, RpcError> {
        let asked = Instant::now();
        let cached = slot.cached_tools().filter(|_| !slot.catalog.is_from_file());
        let mut found = cached.and_then(|tools| {
            let name = listed_name(slot, &tools, tool)?;
            Some((tools, name))
        });
        if found.is_none() {
            let tools = self.up.pool().fresh_tools(slot, asked).await?;
            found = match listed_name(slot, &tools, tool) {
                Some(name) => Some((tools, name)),
                None => return Err(Unlisted::new(slot.name(), tool, &tools).into()),
            };
        }
        let (tools, name) = found.expect("set above");
        let annotations = tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.annotations.clone());
        let check = crate::schema::Schemas::of(&slot.schemas, slot.name(), &tools)
            .check_of(&name)
            .cloned();
        Ok((name, annotations, check))
    }

    /// The `tool_call` record of a call refused before any rule was asked: its tool is not
    /// listed (`denied`), or the server could not be listed (`failed`).
    fn record_unlisted(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        e: &RpcError,
    ) {
        let key = &self.call.session;
        let mut r = ToolCallRecord::new(
            key.name(),
            server,
            tool,
            arguments,
            AuditDecision::Unlisted,
            None,
        );
        r = match e {
            RpcError::Call(e) => r
                .finished(ToolStatus::Failed, std::time::Duration::ZERO)
                .with_error_type(e.kind()),
            _ => r
                .finished(ToolStatus::Denied, std::time::Duration::ZERO)
                .with_error_type("UnlistedTool"),
        };
        if let Some(id) = key.owner().name() {
            r = r.with_identity(id);
        }
        self.call.audit.tool_call(r);
    }
}

/// A listed tool: its name, its annotations, its arguments' check.
type ListedTool = (
    String,
    Option<rmcp::model::ToolAnnotations>,
    Option<Arc<crate::schema::Check>>,
);

/// The listed name `tool` stands for in `tools`: itself, or the tool whose alias, lower-case
/// name or identifier spelling it is (as [`ServerTools::find`] resolves it).
fn listed_name(slot: &Slot, tools: &Arc<Vec<rmcp::model::Tool>>, tool: &str) -> Option<String> {
    // The runtime sends real names: skip building the catalog (it deep-copies every tool's
    // schemas, ~10 % of the bridge's CPU per proxied call).
    if tools.iter().any(|t| t.name == tool) {
        return Some(tool.to_string());
    }
    let schemas = crate::schema::Schemas::of(&slot.schemas, slot.name(), tools);
    ServerTools::from_tools(slot.name(), &slot.info.alias, None, tools, Some(&schemas))
        .find(tool)
        .map(|t| t.name.clone())
}

/// A `CallToolResult` as the sandbox gets it: `content`, `structuredContent` (when present),
/// `isError` (always present), `_meta` (when present).
pub fn call_result_json(result: &rmcp::model::CallToolResult) -> Value {
    let mut v = serde_json::to_value(result)
        .unwrap_or_else(|e| json!({"content": [], "isError": true, "error": e.to_string()}));
    if let Some(o) = v.as_object_mut() {
        o.remove("resultType");
        o.entry("isError").or_insert(Value::Bool(false));
        o.entry("content").or_insert(json!([]));
    }
    v
}

#[async_trait::async_trait]
impl RpcHandler for ExecRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        self.handle_inner(method, &params).await.map_err(|e| {
            let kind = matches!(e, RpcError::Denied(_)).then_some(RPC_DENIED);
            RpcFailure {
                message: e.message(),
                kind,
            }
        })
    }

    fn on_interpreter(&self, interpreter: &bridge_core::protocol::Interpreter) {
        let _ = self.interpreter.set(interpreter.id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection;
    use crate::upstreams::tests::ups;

    #[tokio::test]
    async fn rpc_enforces_loaded_servers_and_validates_params() {
        let u = ups(&["alpha", "beta"]);
        let b = u.load(&[]).await.unwrap();
        assert!(b.servers.is_empty());
        assert_eq!(b.discovered.len(), 2);
        // As the sandbox sees it: the message with its advice.
        let e = b
            .rpc
            .handle(
                "call_tool",
                json!({"server": "beta", "tool": "x", "arguments": {}}),
            )
            .await
            .unwrap_err()
            .message;
        assert_eq!(
            e,
            "Server 'beta' is not loaded for this call; pass \"servers\": [\"beta\"] to run_python to load it"
        );
        // The same handler, typed.
        let rpc = ExecRpc::new(u.clone(), Vec::new(), CallContext::default());
        let call = |params: Value| {
            let rpc = &rpc;
            async move { rpc.handle_inner("call_tool", &params).await }
        };
        assert_eq!(
            rpc.handle_inner("list_servers", &json!({})).await.unwrap(),
            json!([])
        );
        let e = call(json!({"server": "beta", "tool": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RpcError::NotLoaded { server } if server == "beta"),
            "{e}"
        );
        // An alias names the server too.
        let e = call(json!({"server": "Beta", "tool": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RpcError::NotLoaded { server } if server == "beta"),
            "{e}"
        );
        let e = call(json!({"server": "zeta", "tool": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RpcError::UnknownServer { name, known } if name == "zeta" && known == &["alpha", "beta"]),
            "{e}"
        );
        assert!(e.message().starts_with("Unknown MCP server 'zeta'"));
        let e = call(json!({"tool": "x"})).await.unwrap_err();
        assert!(
            matches!(e, RpcError::MissingParam { key: "server", .. }),
            "{e}"
        );
        let e = rpc
            .handle_inner("list_tools", &json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(e, RpcError::MissingParam { key: "server", .. }),
            "{e}"
        );
        let e = rpc
            .handle_inner("frobnicate", &json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RpcError::UnknownMethod(m) if m == "frobnicate"),
            "{e}"
        );
        // Search skips servers that cannot start, says why, and answers.
        let found = rpc
            .handle_inner("search_tool_docs", &json!({"query": "x"}))
            .await
            .unwrap();
        assert_eq!(found["results"], json!([]));
        let skipped = found["skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 2, "{found}");
        assert_eq!(skipped[0]["server"], "alpha");
        assert!(
            skipped[0]["reason"]
                .as_str()
                .unwrap()
                .contains("command 'mcb-no-such-command-xyz' not found"),
            "{found}"
        );
        // A second search does not try them again, and says so.
        let again = rpc
            .handle_inner("search_tool_docs", &json!({"query": "x"}))
            .await
            .unwrap();
        assert!(
            again["skipped"][1]["reason"]
                .as_str()
                .unwrap()
                .contains("searches try it again after 60s"),
            "{again}"
        );
        let e = rpc
            .handle_inner("search_tool_docs", &json!({"query": "x", "limit": "a"}))
            .await
            .unwrap_err();
        assert!(matches!(e, RpcError::BadParam { key: "limit", .. }), "{e}");
    }

    #[tokio::test]
    async fn a_loaded_server_is_called_through_its_slot() {
        let u = ups(&["alpha", "beta"]);
        let beta = u.lookup("beta").unwrap().clone();
        let rpc = ExecRpc::new(u.clone(), vec![beta], CallContext::default());
        assert_eq!(
            rpc.handle_inner("list_servers", &json!({})).await.unwrap(),
            json!(["beta"])
        );
        // Loaded, so the call reaches the server (which cannot start here).
        for name in ["beta", "BETA"] {
            let e = rpc
                .handle_inner("call_tool", &json!({"server": name, "tool": "x"}))
                .await
                .unwrap_err();
            assert!(
                matches!(&e, RpcError::Call(CallError::Start(connection::StartError::CommandNotFound { server, .. })) if server == "beta"),
                "{e}"
            );
        }
        let e = rpc
            .handle_inner("call_tool", &json!({"server": "alpha", "tool": "x"}))
            .await
            .unwrap_err();
        assert!(matches!(e, RpcError::NotLoaded { .. }), "{e}");
    }

    #[test]
    fn call_results_keep_the_protocol_fields() {
        let r = rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text("hi")]);
        let v = call_result_json(&r);
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["isError"], false);
        assert!(v.get("resultType").is_none());
    }
}
