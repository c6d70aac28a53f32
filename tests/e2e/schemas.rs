//! Tool schemas as the model sees them, through the real binary, real podman and a real
//! pydantic server (`tests/fixtures/schema_server.py`, the `mcp` SDK's MCPServer, run by the
//! test venv's `mcp-python`): `help()` and the signature show a `$ref`'d enum as its allowed
//! values, nested models as types with their fields, optional unions and bounds; the same
//! rendering is `query_tool_docs`' summary and what the search matches; a call whose arguments
//! the schema forbids is refused in the bridge before the server sees it (the fixture records
//! every call it gets), with the allowed values, as the `McpError` other refusals raise.

use crate::common;

use common::{Bridge, Home, Outcome, fixture, server_bin, write_servers};
use serde_json::json;

async fn bridge(calls: &std::path::Path) -> Bridge {
    let home = Home::new();
    write_servers(
        &home,
        json!({"workspace": {
            "command": server_bin("mcp-python"),
            "args": [fixture("schema_server.py")],
            "env": {"SCHEMA_SERVER_CALLS": calls},
        }}),
    );
    Bridge::start_with(home, &[], None).await
}

async fn py(b: &Bridge, code: &str) -> Outcome {
    Outcome(
        b.call(json!({"code": code, "servers": ["workspace"], "timeout": 120}))
            .await,
    )
}

fn recorded(calls: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a recorded call"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn help_shows_the_schema_and_a_forbidden_value_never_reaches_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.jsonl");
    let b = bridge(&calls).await;

    // The signature and help() of a $ref'd enum, nested models, optional unions and bounds.
    let r = py(
        &b,
        "import inspect\n\
         print(inspect.signature(mcp_workspace.share_file))\n\
         print(inspect.signature(mcp_workspace.search_emails))\n\
         help(mcp_workspace.share_file)\n\
         help(mcp_workspace.create_event)\n\
         help(mcp_workspace.make_tree)\n",
    )
    .await
    .ok();
    let out = r.stdout();
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    // (The order of parameters is the order the schema's properties reach the runtime.)
    for want in [
        "permission: Literal['r', 'rw']",
        "folder: Literal['inbox', 'sent', 'archive'] = 'inbox'",
        "limit: int = 10",
        "since: str | None = None",
        "senders: list[str] | None = None",
    ] {
        assert!(flat.contains(want), "the signatures lack {want:?}:\n{out}");
    }
    for want in [
        "permission (Literal['r', 'rw'], required)",
        "event (CalendarEvent, required)",
        "CalendarEvent (dict): An event in the user's calendar.",
        "title (str, required, length 1..120)",
        "duration_minutes (int, optional, default 30, <= 1440, > 0, multiple of 5)",
        "participants (list[Participant], optional, items <= 50)",
        "location (Location | None, optional, default None)",
        "priority (Literal[1, 2, 3], optional, default 2)",
        "Participant (dict): Someone invited to an event.",
        "role (Literal['required', 'optional', 'chair'], optional, default 'required')",
        "floor (int, optional, default 0, -3 <= value <= 60)",
        "root (TreeNode, required)",
        "children (list[TreeNode], optional)",
    ] {
        assert!(out.contains(want), "help() lacks {want:?}:\n{out}");
    }

    // query_tool_docs' summary carries the same lines, and the search finds a tool by an
    // allowed value of a nested field.
    let r = py(
        &b,
        "import json\nfrom mcp import runtime\n\
         d = runtime.query_tool_docs_sync('workspace', 'share_file')[0]\n\
         print(json.dumps(d['parameters']))\n\
         print([h['tool'] for h in runtime.search_tool_docs_sync('chair participant', limit=1)])\n",
    )
    .await
    .ok();
    assert!(
        r.stdout()
            .contains("permission (Literal['r', 'rw'], required)"),
        "{}",
        r.stdout()
    );
    assert!(r.stdout().contains("['create_event']"), "{}", r.stdout());

    // A forbidden value: refused in the bridge, naming the allowed values; the server never
    // saw it. An allowed one goes through.
    let r = py(
        &b,
        "try:\n    await mcp_workspace.share_file(file_id='f1', email='a@example.com', permission='write')\n\
         except runtime.McpError as e:\n    print(type(e).__name__, e)\n\
         print(await mcp_workspace.share_file(file_id='f1', email='a@example.com', permission='rw'))\n",
    )
    .await
    .ok();
    let out = r.stdout();
    assert!(
        out.contains(
            "McpError The arguments of workspace.share_file do not fit its input schema: permission: 'write' is not one of 'r', 'rw'; the call was not sent"
        ),
        "{out}"
    );
    assert!(out.contains("shared f1 with a@example.com (rw)"), "{out}");
    let seen = recorded(&calls);
    assert_eq!(
        seen,
        vec![
            json!({"tool": "share_file", "arguments": {"file_id": "f1", "email": "a@example.com", "permission": "rw"}})
        ],
        "the server saw a call the bridge refused"
    );

    // A nested bound and a missing nested field, each named where it is.
    let r = py(
        &b,
        "try:\n    await mcp_workspace.create_event(event={'title': 'x', 'start': '2026-01-01T10:00:00', 'duration_minutes': 7, 'participants': [{'name': 'n'}]})\n\
         except runtime.McpError as e:\n    print(e)\n",
    )
    .await
    .ok();
    let out = r.stdout();
    assert!(
        out.contains("event['duration_minutes']: 7 is not a multiple of 5")
            || out.contains("event['duration_minutes']: "),
        "{out}"
    );
    assert!(
        out.contains("event['participants'][0]: the required key 'email' is missing"),
        "{out}"
    );
    assert_eq!(
        recorded(&calls).len(),
        1,
        "the refused call reached the server"
    );

    // Arguments the schema allows go to the server, whose answer stays authoritative: its own
    // refusal is the tool's error (McpToolError), with its message.
    let r = py(
        &b,
        "try:\n    await mcp_workspace.make_tree(root={'name': 'a', 'children': [{'name': 'b'}]}, depth_limit=1)\n\
         except runtime.McpToolError as e:\n    print(type(e).__name__, e.mcp_result.get('isError'), e)\n",
    )
    .await
    .ok();
    let out = r.stdout();
    assert!(out.starts_with("McpToolError True "), "{out}");
    assert!(out.contains("make_tree"), "{out}");
    assert_eq!(
        recorded(&calls).len(),
        2,
        "the allowed call did not reach the server"
    );
    b.shutdown().await;
}
