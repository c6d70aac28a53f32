//! The one tool as `tools/list` shows it (name, description, schemas) and its arguments as a
//! call brings them: what the model pays for on every request, and what a call may ask for.

use std::sync::Arc;

use rmcp::model::{ErrorData, Tool};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::replies::refused;
use bridge_core::identity::{self, Identity, SessionKey};
use bridge_sandbox::DEFAULT_SESSION;

/// The one tool's name, which `tools/call` names.
pub const TOOL_NAME: &str = "run_python";

/// The tool description: how to start, in as few tokens as possible, since it is paid for on
/// every request. `tools/list` must stay within 250 cl100k tokens (the bench's section 1, and
/// `tool_listing_is_within_the_token_budget`; that it stays the same bytes whatever servers are
/// configured is tests/e2e/proxy.rs's, through the real binary), and the title, the argument
/// descriptions, the output schema and the annotations share that budget; the rest of the helper
/// summary is in the capabilities resource (`HELPERS`).
pub const TOOL_DESCRIPTION: &str = "\
Persistent Python sandbox (pandas, numpy; no network: other packages via \
await runtime.install('pkg'); top-level await; display(obj) returns images). Long output \
returns a preview; the whole is a file in /workspace/out/.outputs/. MCP servers: \
`from mcp import runtime`; await runtime.search_tool_docs('query'); load with servers, then \
await mcp_<name>.<tool>(...).";

/// What the tool description leaves out for the budget, in the capabilities resource.
pub const HELPERS: &str = "\
State persists across calls of a session; the last expression is shown like a notebook's. \
`runtime.discovered_servers()` names every configured server; \
`await runtime.query_tool_docs(\"server\", detail=\"full\")` gives a server's tool schemas; \
proxied tools have real signatures (`help(mcp_<name>.<tool>)`) and return Python values. \
`runtime.export_notebook()` writes the session so far as a Jupyter notebook \
(`/workspace/out/session.ipynb`). `runtime.save_skill(func)` keeps a function for every later \
session; `runtime.list_skills()` lists them. `await runtime.install(\"pkg\", \"other==1.2\")` \
installs packages into the session (the bridge downloads them; the user's policy may ask first).";

/// The tool's human-readable name (`title`), which clients show instead of `run_python`.
pub const TOOL_TITLE: &str = "Python sandbox";

/// JSON schema of `run_python`'s arguments, each with a description of a few tokens (the
/// budget above); `timeout` must be positive, which `RunArgs::parse` checks as well.
pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python to run; the last expression is shown"},
            "servers": {"type": "array", "items": {"type": "string"}, "description": "Servers to load"},
            "timeout": {"type": "number", "description": "Seconds", "exclusiveMinimum": 0},
            "session": {"type": "string", "description": "Interpreter name"},
            "reset": {"type": "boolean", "description": "Restart first"}
        },
        "required": ["code"],
        "additionalProperties": false
    })
}

/// The one tool, as `tools/list` shows it. It has no output schema: a result carries its output
/// in `content` alone (`render`), and an output schema would require `structuredContent`. It
/// carries no annotations: what they would say is
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
    Tool::new(TOOL_NAME, TOOL_DESCRIPTION, object(input_schema())).with_title(TOOL_TITLE)
}

/// `run_python`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The Python to run; at most [`MAX_CODE_BYTES`].
    pub code: String,
    /// The upstream servers to load for this call, by name (none: discovery only).
    #[serde(default)]
    pub servers: Vec<String>,
    /// The time limit in seconds, capped at `max_timeout` (none: the configured `timeout`).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// The interpreter to run in (none: the connection's default).
    #[serde(default)]
    pub session: Option<String>,
    /// Restart the session's interpreter first, forgetting its state.
    #[serde(default)]
    pub reset: bool,
}

/// Largest `code` accepted, so a runaway client cannot make us buffer gigabytes.
pub const MAX_CODE_BYTES: usize = 4 << 20;
/// Longest JSON-RPC line read from the client; a longer one is read through without being kept
/// and answered `-32600` (its id is unknown without parsing it).
pub const MAX_REQUEST_LINE_BYTES: usize = 64 << 20;

/// Why `run_python`'s arguments were refused: what was wrong and what it takes.
#[derive(Debug, thiserror::Error)]
pub enum BadArguments {
    /// The arguments are not the object `run_python` takes (a missing `code`, a wrong type,
    /// an unknown key).
    #[error(
        "invalid arguments for run_python: {0}; expected {{\"code\": string, \"servers\"?: [string], \"timeout\"?: number, \"session\"?: string, \"reset\"?: bool}}"
    )]
    Malformed(#[source] serde_json::Error),
    /// `timeout` is zero or negative.
    #[error(
        "`timeout` is {0}; it must be a positive number of seconds (leave it out for the default; values above the maximum are capped)"
    )]
    Timeout(f64),
    /// `code` is longer than [`MAX_CODE_BYTES`]; the field is its length in bytes.
    #[error(
        "`code` is {0} bytes; the limit is {MAX_CODE_BYTES}. Send smaller pieces across calls (state persists)."
    )]
    CodeTooLarge(usize),
    /// `session` is not a session name.
    #[error("`session`: {0}")]
    Session(#[source] bridge_sandbox::BadSessionName),
}

impl RunArgs {
    /// The arguments of a `tools/call`, checked: the object's shape, a positive `timeout`
    /// (above 1e9 seconds it is 1e9), the size of `code` and the session's name.
    pub fn parse(args: Option<serde_json::Map<String, Value>>) -> Result<RunArgs, BadArguments> {
        let v = Value::Object(args.unwrap_or_default());
        let mut a: RunArgs = serde_json::from_value(v).map_err(BadArguments::Malformed)?;
        // JSON has no NaN or infinity, so a number that is not positive is the only bad one; a
        // zero or negative limit would otherwise be clamped silently to the floor.
        if let Some(t) = a.timeout
            && (t <= 0.0 || t.is_nan())
        {
            return Err(BadArguments::Timeout(t));
        }
        // `Duration` cannot hold 1e300 seconds (converting it panicked, and the call got no
        // reply); the configured maximum applies anyway.
        a.timeout = a.timeout.map(|t| t.min(1e9));
        if a.code.len() > MAX_CODE_BYTES {
            return Err(BadArguments::CodeTooLarge(a.code.len()));
        }
        if let Some(s) = &a.session {
            // The one rule for every session name, wherever it comes from (forks, listings).
            bridge_sandbox::check_session_name(s).map_err(BadArguments::Session)?;
        }
        Ok(a)
    }
}

/// The arguments of a `tools/call` of `run_python`, or the refusal that says what is wrong.
/// with the key of its session, built here, where the request enters, from the request's
/// identity and the session it names. A call that names no session gets its connection's default: the MCP session's own under
/// Streamable HTTP's `Mcp-Session-Id` (`identity::mcp_session`), else `default` (stdio's one
/// client; a 2026-07-28 request, which has no connection, shares it with every other request
/// of its identity that names none).
pub(super) fn call_args(
    name: std::borrow::Cow<'static, str>,
    arguments: Option<serde_json::Map<String, Value>>,
    extensions: &rmcp::model::Extensions,
) -> Result<(RunArgs, SessionKey), ErrorData> {
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
        .map_err(|e| refused("tools/call", ErrorData::invalid_params(e.to_string(), None)))?;
    if args.session.is_none() {
        args.session = identity::mcp_session(extensions);
    }
    let name = args.session.as_deref().unwrap_or(DEFAULT_SESSION);
    let key = SessionKey::new(Identity::of_request(extensions), name);
    Ok((args, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_core::config::Config;
    use rmcp::model::ListToolsResult;

    #[test]
    fn tool_listing_is_within_the_token_budget() {
        // The budget the bench's section 1 reports against: the whole tools/list result.
        let list = serde_json::to_string(&ListToolsResult::with_all_items(vec![tool()])).unwrap();
        let bpe = tiktoken_rs::cl100k_base().expect("cl100k vocabulary");
        let n = bpe.encode_ordinary(&list).len();
        assert!(n <= 250, "{n} cl100k tokens: {list}");
    }

    #[test]
    fn args_are_checked() {
        let ok = |v: Value| RunArgs::parse(v.as_object().cloned()).map_err(|e| e.to_string());
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
