//! Tasks in their 2025-11-25 form, for the clients that speak it (the TypeScript SDK's
//! `client.experimental.tasks`), beside the tasks extension (SEP-2663) that rmcp models.
//!
//! rmcp 3.9 parses every message into its own types before a handler sees it, and those types
//! know only the extension: a `tools/call` loses its `task` parameter, `tasks/get` must answer
//! with the extension's shape, and `tasks/result` and `tasks/list` do not exist. So the
//! transports translate at the JSON level, on both sides of rmcp:
//!
//! - **in**: on a connection that negotiated 2025-11-25 or older at `initialize` (an MCP session,
//!   over HTTP), a `tools/call` with `task` and the four `tasks/*` requests are renamed into this
//!   bridge's own methods ([`PREFIX`]), which rmcp passes on whole as custom requests, so
//!   `server` answers them: in the 2025-11-25 shapes, or for a task started in the extension's
//!   form (rmcp's own client does so on such a connection) in the extension's;
//! - **out**: the `initialize` result declares the `tasks` capability and `tools/list`
//!   marks `run_python` `execution.taskSupport: "optional"`, when 2025-11-25 was negotiated:
//!   fields rmcp's types have no place for.
//!
//! **Architecture invariant:** this module knows JSON and method names only; it knows nothing
//! of the sandbox, the server's state or the transports that call it.

use std::collections::HashMap;

use serde_json::{Value, json};

/// The methods of the 2025-11-25 form as the server receives them: `PREFIX` + `tools/call`,
/// `tasks/get`, `tasks/result`, `tasks/list` or `tasks/cancel`.
pub const PREFIX: &str = "io.mcp-code-bridge/tasks-2025-11-25/";

/// The protocol revision whose form this is.
pub const VERSION: &str = "2025-11-25";

/// The requests whose answers are translated and not yet sent. A client cannot grow it past
/// this: answers to ids beyond it go out as rmcp wrote them.
const MAX_PENDING: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Initialize,
    ListTools,
}

/// One connection's translation state: whether it negotiated a revision of the `initialize`
/// era (2025-11-25 or older), which one, and which answers still need their fields.
#[derive(Debug, Default)]
pub struct Wire {
    legacy: bool,
    version: Option<String>,
    pending: HashMap<String, Pending>,
}

impl Wire {
    /// A stdio connection: what it is becomes known from the answer to its `initialize`.
    pub fn new() -> Wire {
        Wire::default()
    }

    /// One HTTP request: a request within an MCP session belongs to a connection that began
    /// with `initialize`, at the revision its `MCP-Protocol-Version` header names.
    pub fn for_http(in_session: bool, version: Option<&str>) -> Wire {
        Wire {
            legacy: in_session,
            version: version.map(str::to_owned),
            pending: HashMap::new(),
        }
    }

    /// Whether an answer may need translating: the caller can skip the JSON round trip when not.
    pub fn awaits_answers(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A message from the client, before rmcp parses it.
    pub fn inbound(&mut self, msg: &mut Value) {
        let Some(obj) = msg.as_object_mut() else {
            return;
        };
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            return;
        };
        let id = obj.get("id").map(Value::to_string);
        let renamed = match method {
            "initialize" => {
                self.expect(id, Pending::Initialize);
                None
            }
            _ if !self.legacy => None,
            "tools/list" => {
                self.expect(id, Pending::ListTools);
                None
            }
            "tools/call" => obj
                .get("params")
                .and_then(|p| p.get("task"))
                .is_some_and(Value::is_object)
                .then(|| format!("{PREFIX}tools/call")),
            "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" => {
                Some(format!("{PREFIX}{method}"))
            }
            _ => None,
        };
        if let Some(m) = renamed {
            obj.insert("method".into(), Value::String(m));
        }
    }

    /// A message to the client, after rmcp wrote it.
    pub fn outbound(&mut self, msg: &mut Value) {
        let Some(obj) = msg.as_object_mut() else {
            return;
        };
        if obj.contains_key("method") {
            return;
        }
        let Some(pending) = obj
            .get("id")
            .and_then(|id| self.pending.remove(&id.to_string()))
        else {
            return;
        };
        let Some(result) = obj.get_mut("result").and_then(Value::as_object_mut) else {
            return;
        };
        match pending {
            Pending::Initialize => {
                self.version = result
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                // Revisions are dates: the `initialize` era ends with 2025-11-25.
                self.legacy = self.version.as_deref().is_some_and(|v| v <= VERSION);
                if self.speaks_it()
                    && let Some(caps) = result
                        .get_mut("capabilities")
                        .and_then(Value::as_object_mut)
                {
                    caps.insert("tasks".into(), capability());
                }
            }
            Pending::ListTools if self.speaks_it() => {
                if let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) {
                    for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
                        tool.insert("execution".into(), json!({"taskSupport": "optional"}));
                    }
                }
            }
            Pending::ListTools => {}
        }
    }

    fn speaks_it(&self) -> bool {
        self.version.as_deref() == Some(VERSION)
    }

    fn expect(&mut self, id: Option<String>, what: Pending) {
        if let Some(id) = id
            && self.pending.len() < MAX_PENDING
        {
            self.pending.insert(id, what);
        }
    }
}

/// The server's `tasks` capability of 2025-11-25: `tools/call` may run as a task, and tasks
/// can be listed and cancelled.
fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initialize(w: &mut Wire, version: &str) -> Value {
        let mut req = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}}});
        w.inbound(&mut req);
        let mut res = json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": version,
            "capabilities": {"tools": {}}, "serverInfo": {"name": "x", "version": "1"}}});
        w.outbound(&mut res);
        res
    }

    #[test]
    fn a_2025_11_25_connection_gets_the_capability_and_renamed_requests() {
        let mut w = Wire::new();
        let res = initialize(&mut w, VERSION);
        assert_eq!(res["result"]["capabilities"]["tasks"], capability());

        let mut list = json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list"});
        w.inbound(&mut list);
        assert!(w.awaits_answers());
        let mut tools =
            json!({"jsonrpc": "2.0", "id": "l", "result": {"tools": [{"name": "run_python"}]}});
        w.outbound(&mut tools);
        assert_eq!(
            tools["result"]["tools"][0]["execution"]["taskSupport"],
            "optional"
        );
        assert!(!w.awaits_answers());

        let mut call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "1"}, "task": {"ttl": 5}}});
        w.inbound(&mut call);
        assert_eq!(call["method"], format!("{PREFIX}tools/call"));
        assert_eq!(call["params"]["task"]["ttl"], 5);

        let mut plain = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "1"}}});
        w.inbound(&mut plain);
        assert_eq!(plain["method"], "tools/call");

        for m in ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"] {
            let mut r = json!({"jsonrpc": "2.0", "id": 4, "method": m, "params": {"taskId": "t"}});
            w.inbound(&mut r);
            assert_eq!(r["method"], format!("{PREFIX}{m}"));
        }
    }

    #[test]
    fn older_revisions_and_connections_without_initialize_are_left_as_they_are() {
        let mut w = Wire::new();
        let res = initialize(&mut w, "2025-06-18");
        assert!(res["result"]["capabilities"].get("tasks").is_none());
        let mut list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        w.inbound(&mut list);
        let mut tools =
            json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "run_python"}]}});
        w.outbound(&mut tools);
        assert!(tools["result"]["tools"][0].get("execution").is_none());

        // 2026-07-28: no initialize era; tasks/get is the extension's, which rmcp answers.
        let mut w = Wire::new();
        initialize(&mut w, "2026-07-28");
        let mut get =
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t"}});
        w.inbound(&mut get);
        assert_eq!(get["method"], "tasks/get");
        let mut w = Wire::for_http(false, Some("2026-07-28"));
        w.inbound(&mut get);
        assert_eq!(get["method"], "tasks/get");
        let mut w = Wire::for_http(true, Some(VERSION));
        w.inbound(&mut get);
        assert_eq!(get["method"], format!("{PREFIX}tasks/get"));
    }

    #[test]
    fn pending_answers_are_bounded_and_odd_messages_pass() {
        let mut w = Wire::new();
        initialize(&mut w, VERSION);
        for i in 0..(MAX_PENDING + 50) {
            let mut r = json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"});
            w.inbound(&mut r);
        }
        assert_eq!(w.pending.len(), MAX_PENDING);
        for mut odd in [
            json!(null),
            json!([1, 2]),
            json!({"id": 1}),
            json!({"method": 3}),
        ] {
            let before = odd.clone();
            w.inbound(&mut odd);
            assert_eq!(odd, before);
        }
        // An error answer to a pending request is left alone and forgets it.
        let mut e = json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -1, "message": "x"}});
        w.outbound(&mut e);
        assert!(e.get("result").is_none());
        assert_eq!(w.pending.len(), MAX_PENDING - 1);
    }
}
