//! What proxied calls relay to the bridge's client while `run_python` runs: their progress and
//! their servers' questions (elicitation), through the real binary, the official Python SDK
//! client, and server-everything.

use crate::common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// One `run_python` call by the Python SDK client of `tests/fixtures/sdk_client.py` against a
/// bridge of `home`; with `answer`, the client accepts every question with it.
fn sdk_call(home: &Home, answer: Option<Value>, code: &str, servers: &[&str]) -> Value {
    let mut cmd = Command::new(server_bin("mcp-python"));
    cmd.arg(fixture("sdk_client.py"));
    if let Some(a) = answer {
        cmd.arg("--answer").arg(a.to_string());
    }
    let out = cmd
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

/// A home whose only upstream server is server-everything.
fn everything_home() -> Home {
    let home = Home::new();
    write_servers(
        &home,
        json!({"everything": {"command": server_bin("mcp-server-everything"), "args": []}}),
    );
    home
}

/// server-everything's long-running tool reports each step; the Python SDK client sees them as
/// progress of its `run_python` call, named by server and tool, before the result, apart from
/// the code's own output.
#[test]
fn a_proxied_calls_progress_reaches_the_client_before_the_result() {
    let home = everything_home();
    let code = "print('before')\n\
                r = await mcp_everything.trigger_long_running_operation(duration=2, steps=4)\n\
                print('after')";
    let v = sdk_call(&home, None, code, &["everything"]);
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
    let (r, _) = everything_call(
        "r = await mcp_everything.trigger_long_running_operation(duration=1, steps=2)\nprint(r)",
    );
    assert_eq!(r.status(), "ok", "{}", r.text());
    assert!(
        r.stdout().to_lowercase().contains("completed"),
        "{}",
        r.stdout()
    );
}

/// One `run_python` call with server-everything loaded, by rmcp's client (no progress token);
/// its outcome and the bridge's log after it.
fn everything_call(code: &str) -> (Outcome, String) {
    let home = everything_home();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = Bridge::start_with(home, &[], None).await;
        let r = Outcome(
            b.call(json!({"code": code, "servers": ["everything"], "timeout": 120}))
                .await,
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let log = b.home.log();
        b.shutdown().await;
        (r, log)
    })
}

const ELICIT: &str = "r = await mcp_everything.trigger_elicitation_request()\n\
                      print(r)";

/// server-everything asks its client for a form; the bridge asks its own client (the Python SDK
/// with an elicitation callback), naming the server, and the answer reaches the tool.
#[test]
fn a_servers_question_is_asked_of_the_bridges_client_naming_the_server() {
    let home = everything_home();
    let answer = json!({"name": "Ada Lovelace", "check": true, "integer": 7});
    let v = sdk_call(&home, Some(answer), ELICIT, &["everything"]);
    assert_eq!(v["structured"]["status"], "ok", "{v}");
    let asked = v["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{v}");
    let message = asked[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("MCP server 'everything' asks: "),
        "{message}"
    );
    let stdout = v["structured"]["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("User provided the requested information"),
        "{stdout}"
    );
    assert!(stdout.contains("Name: Ada Lovelace"), "{stdout}");
    assert!(stdout.contains("Favorite Integer: 7"), "{stdout}");
}

/// A client that declared no elicitation is not asked: the server gets a decline at once, its
/// tool says so, and the bridge's log says why.
#[test]
fn a_client_without_elicitation_gets_the_server_a_decline() {
    let home = everything_home();
    let v = sdk_call(&home, None, ELICIT, &["everything"]);
    assert_eq!(v["structured"]["status"], "ok", "{v}");
    assert_eq!(v["asked"], json!([]), "{v}");
    let stdout = v["structured"]["stdout"].as_str().unwrap();
    assert!(stdout.contains("declined"), "{stdout}");
}

/// server-everything's log notifications reach the bridge's log, named by server, and no faster
/// than the budget of a server's log messages (60 a minute), however often the code makes the
/// server log: 150 toggles of its simulated logging each send one message at once.
#[test]
fn a_servers_log_messages_reach_the_bridges_log_within_a_budget() {
    let (r, log) = everything_call(
        "for _ in range(300):\n    await mcp_everything.toggle_simulated_logging()\nprint('toggled')",
    );
    assert_eq!(r.status(), "ok", "{}", r.text());
    let logged = log
        .lines()
        .filter(|l| l.contains("server=everything"))
        .filter(|l| l.contains("-level message") || l.contains("level-message"))
        .count();
    eprintln!("{logged} log messages of the server logged");
    assert!(
        logged >= 1,
        "no log message of the server reached the log:\n{log}"
    );
    assert!(
        logged <= 60,
        "{logged} log messages in under a minute, over the budget of 60"
    );
}
