//! What proxied calls relay to the bridge's client while `run_python` runs: their progress,
//! through the real binary, the official Python SDK client, and server-everything.

mod common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// The Python SDK client of `tests/fixtures/sdk_progress_client.py` against a bridge of `home`.
fn sdk_progress_call(home: &Home, code: &str, servers: &[&str]) -> Value {
    let out = Command::new(server_bin("mcp-python"))
        .arg(fixture("sdk_progress_client.py"))
        .arg(BIN)
        .arg(code)
        .args(servers)
        .env_clear()
        .envs(home.env())
        .current_dir(home.path())
        .output()
        .expect("run the Python SDK client");
    assert!(
        out.status.success(),
        "client failed (its stderr has the bridge's log too):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// server-everything's long-running tool reports each step; the Python SDK client sees them as
/// progress of its `run_python` call, named by server and tool, before the result, apart from
/// the code's own output.
#[test]
fn a_proxied_calls_progress_reaches_the_client_before_the_result() {
    let home = Home::new();
    write_servers(
        &home,
        json!({"everything": {"command": server_bin("mcp-server-everything"), "args": []}}),
    );
    let code = "print('before')\n\
                r = await mcp_everything.trigger_long_running_operation(duration=2, steps=4)\n\
                print('after')";
    let v = sdk_progress_call(&home, code, &["everything"]);
    assert_eq!(v["is_error"], false, "{v}");
    assert_eq!(v["structured"]["status"], "ok", "{v}");
    assert_eq!(v["structured"]["stdout"], "before\nafter\n", "{v}");
    let progress: Vec<&str> = v["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let steps: Vec<&&str> = progress
        .iter()
        .filter(|m| m.starts_with("everything.trigger-long-running-operation:"))
        .collect();
    assert!(
        steps.len() >= 3,
        "expected the server's steps as progress, got {progress:?}"
    );
    assert!(steps.iter().any(|m| m.contains("/4)")), "{steps:?}");
    // In order: the code's output before the call, the steps, the output after it.
    let pos = |needle: &str| {
        progress
            .iter()
            .position(|m| m.contains(needle))
            .unwrap_or_else(|| panic!("no progress message with {needle:?}: {progress:?}"))
    };
    let (before, first, after) = (pos("before"), pos("everything."), pos("after"));
    assert!(
        before < first && first < after,
        "out of order: {progress:?}"
    );
    assert_eq!(v["after_result"], json!([]), "{v}");
}

/// A `run_python` call made without a progress token has nowhere to send a proxied call's
/// progress: the server's notifications are dropped and its answer still arrives.
#[test]
fn without_a_progress_token_the_proxied_call_still_answers() {
    let home = Home::new();
    write_servers(
        &home,
        json!({"everything": {"command": server_bin("mcp-server-everything"), "args": []}}),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = Bridge::start_with(home, &[], None).await;
        let r = Outcome(
            b.call(json!({
                "code": "r = await mcp_everything.trigger_long_running_operation(duration=1, steps=2)\nprint(r)",
                "servers": ["everything"],
                "timeout": 60,
            }))
            .await,
        );
        assert_eq!(r.status(), "ok", "{}", r.text());
        assert!(r.stdout().to_lowercase().contains("completed"), "{}", r.stdout());
        b.shutdown().await;
    });
}
