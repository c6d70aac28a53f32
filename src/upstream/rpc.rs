//! The RPCs of one exec: what the code in the sandbox may ask of the upstream side. Docs and
//! search cover every discovered server; `call_tool` only the servers loaded for the exec, whose
//! pool slots the handler keeps, so a proxied call goes to its server without a registry lookup.
//! Errors reach the sandbox as [`Hinted::message`]: what was wrong, then what to do.

use std::sync::Arc;

use serde_json::{Value, json};

use super::catalog::{self, Detail, ServerTools, UnknownTool};
use super::error::{Hint, Hinted};
use super::pool::{CallError, Slot};
use super::{CallRelay, Upstreams, known_servers};
use crate::protocol::RpcHandler;

/// The largest `limit` a search honours.
pub const MAX_SEARCH_LIMIT: usize = 50;
/// The `limit` of a search that gives none.
pub const DEFAULT_SEARCH_LIMIT: usize = 5;
/// Longest search query considered (the rest is ignored).
const MAX_QUERY_CHARS: usize = 1000;

/// Why an RPC from the sandbox was refused or failed. The handler sends [`Hinted::message`].
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("{method} needs a string parameter '{key}'")]
    MissingParam { method: String, key: &'static str },
    /// A parameter of the wrong type: `expected` is "a string", "a number", ...
    #[error("{method}: '{key}' must be {expected}")]
    BadParam {
        method: &'static str,
        key: &'static str,
        expected: &'static str,
    },
    #[error("Unknown MCP server '{name}'")]
    UnknownServer {
        name: String,
        /// Every discovered server, by name.
        known: Vec<String>,
    },
    #[error("Server '{server}' is not loaded for this call")]
    NotLoaded { server: String },
    #[error("Unknown RPC method '{0}'")]
    UnknownMethod(String),
    #[error(transparent)]
    UnknownTool(#[from] UnknownTool),
    #[error(transparent)]
    Call(#[from] CallError),
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
            RpcError::Call(e) => e.hint(),
            _ => None,
        }
    }
}

/// The RPC handler of one exec.
pub(super) struct ExecRpc {
    up: Upstreams,
    /// The servers loaded for this exec.
    loaded: Vec<Arc<Slot>>,
    /// What its proxied calls relay to the `run_python` call (progress, questions).
    relay: CallRelay,
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
    pub(super) fn new(up: Upstreams, loaded: Vec<Arc<Slot>>, relay: CallRelay) -> Self {
        ExecRpc { up, loaded, relay }
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
            "call_tool" => {
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
                // Accept the alias the proxies use; pass unknown names through for the server to judge.
                let tool_name = match slot.cached_tools() {
                    // The runtime sends real names: skip building the catalog (it deep-copies
                    // every tool's schemas, ~10 % of the bridge's CPU per proxied call).
                    Some(tools) if tools.iter().any(|t| t.name == tool) => tool.to_string(),
                    Some(tools) => {
                        let st =
                            ServerTools::from_tools(slot.name(), &slot.info.alias, None, &tools);
                        st.find(tool)
                            .map(|t| t.name.clone())
                            .unwrap_or_else(|| tool.to_string())
                    }
                    None => tool.to_string(),
                };
                let result = self
                    .up
                    .inner
                    .pool
                    .call_tool(slot, &tool_name, arguments, &self.relay)
                    .await?;
                Ok(call_result_json(&result))
            }
            other => Err(RpcError::UnknownMethod(other.to_string())),
        }
    }
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
    async fn handle(&self, method: &str, params: Value) -> Result<Value, String> {
        self.handle_inner(method, &params)
            .await
            .map_err(|e| e.message())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ups;
    use super::*;
    use crate::upstream::connection;

    #[tokio::test]
    async fn rpc_enforces_loaded_servers_and_validates_params() {
        let u = ups(&["alpha", "beta"]);
        let b = u.load(&[], CallRelay::default()).await.unwrap();
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
            .unwrap_err();
        assert_eq!(
            e,
            "Server 'beta' is not loaded for this call; pass \"servers\": [\"beta\"] to run_python to load it"
        );
        // The same handler, typed.
        let rpc = ExecRpc::new(u.clone(), Vec::new(), CallRelay::default());
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
        let rpc = ExecRpc::new(u.clone(), vec![beta], CallRelay::default());
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
