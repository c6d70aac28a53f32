//! The official TypeScript SDK's tasks API (the 2025-11-25 form) against the bridge, over stdio
//! or HTTP (tests/fixtures/sdk_tasks_client.mjs), and what it must see: the capability and the
//! tool's task support declared, so `callToolStream` makes the call a task; the task polled to
//! its result, which `tasks/result` gives again tied to its task; a long task cancelled (the
//! code interrupted, the session kept); `tasks/list` showing both; an unknown id an error; a
//! job longer than the client's request timeout ending as a task where a plain call times out.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// Run the SDK client against `target` (the binary, for stdio, or the `/mcp` URL) with `env`
/// (for HTTP, `MCP_TOKEN` among it), and check what it saw.
pub async fn check(target: &str, env: Vec<(String, String)>, cwd: &Path) {
    let node = tokio::process::Command::new(super::server_bin("node"))
        .arg(super::fixture("sdk_tasks_client.mjs"))
        .args([
            target,
            "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\nprint('end')",
        ])
        .env_clear()
        .envs(env)
        .env("NODE_PATH", super::oidc::node_modules())
        .current_dir(cwd)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), node)
        .await
        .expect("the SDK client ended")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    eprintln!("the SDK client saw: {v}");

    assert_eq!(
        v["capability"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{v}"
    );
    assert_eq!(v["execution"], json!({"taskSupport": "optional"}), "{v}");
    // A task was made, polled while working, and ended with the call's result.
    let stream: Vec<&str> = v["stream"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(stream.first(), Some(&"taskCreated"), "{v}");
    assert!(stream.contains(&"working"), "never seen working: {v}");
    assert_eq!(stream.last(), Some(&"result"), "{v}");
    assert_eq!(v["result"]["status"], "ok", "{v}");
    assert_eq!(v["result"]["stdout"], "0\n1\n2\nend\n", "{v}");
    assert_eq!(v["result_again"], v["result"], "{v}");
    assert_eq!(v["related"]["taskId"], v["task_id"], "{v}");
    // Cancelled: the code stopped, the task says so, it has no result, the session lives.
    assert_eq!(v["long_created"], "working", "{v}");
    assert_eq!(v["cancel_status"], "cancelled", "{v}");
    assert!(v["cancel_ms"].as_u64().unwrap() < 20_000, "{v}");
    assert_eq!(v["cancelled_get"], "cancelled", "{v}");
    assert!(
        v["cancelled_result"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{v}"
    );
    assert_eq!(v["after_cancel"]["stdout"], "42\n", "{v}");
    let listed: Vec<(String, String)> = serde_json::from_value(v["listed"].clone()).unwrap();
    assert_eq!(listed.len(), 2, "{v}");
    assert_eq!(
        listed[0],
        (
            v["task_id"].as_str().unwrap().to_string(),
            "completed".into()
        )
    );
    assert_eq!(listed[1].1, "cancelled", "{v}");
    assert!(
        v["unknown"].as_str().unwrap().contains("no-such-task"),
        "{v}"
    );
    // A job longer than the client's own request timeout: the plain call gives up, the task
    // (each of its requests answered at once) ends with the job's result.
    assert!(
        v["plain_slow"].as_str().unwrap().contains("timed out"),
        "{v}"
    );
    assert_eq!(v["task_slow"]["stdout"], "slow done\n", "{v}");
}
