//! `run_python` as a task (the 2026-07-28 tasks extension, SEP-2663), through the real binary
//! and rmcp's client declaring the extension: created, polled, completed with the call's
//! result; cancelled, which interrupts the code and keeps the session.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, DetailedTask, GetTaskParams, Implementation, RequestMetaObject, Task,
    TaskPayload,
};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ClientConfig>;

async fn tasks_client(home: &Home) -> Client {
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("tasks-test", "1"),
    )
    .serve(transport(home, &[]))
    .await
    .expect("initialize with the bridge")
}

/// `run_python` with `args`, its request's own capabilities (`_meta`) declaring the tasks
/// extension, as SEP-2663 has a client opt in per request.
fn task_request(args: Value) -> CallToolRequestParams {
    let mut params =
        CallToolRequestParams::new("run_python").with_arguments(args.as_object().cloned().unwrap());
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
    params.meta = Some(meta);
    params
}

/// Start `run_python` with `args`: the bridge must answer with a task handle.
async fn start(client: &Client, args: Value) -> Task {
    let params = task_request(args);
    match client.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Task(create) => create.task,
        other => panic!("expected a task handle, got {other:?}"),
    }
}

/// Poll the task until it ends (at most `within`).
async fn settle(client: &Client, id: &str, within: Duration) -> DetailedTask {
    let deadline = Instant::now() + within;
    loop {
        let t = client
            .peer()
            .get_task(GetTaskParams::new(id.to_string()))
            .await
            .expect("tasks/get")
            .task;
        if t.status().is_terminal() {
            return t;
        }
        assert!(Instant::now() < deadline, "the task did not end: {t:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn result_of(t: &DetailedTask) -> CallToolResult {
    match &t.payload {
        TaskPayload::Completed { result } => {
            serde_json::from_value(Value::Object(result.clone())).expect("a CallToolResult")
        }
        other => panic!("expected a completed task, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_runs_as_a_task_polled_to_its_result() {
    let home = Home::new();
    let client = tasks_client(&home).await;
    let task = start(
        &client,
        json!({"code": "import time\nx = 41\ntime.sleep(2)\nprint('done', x + 1)", "timeout": 60}),
    )
    .await;
    assert!(!task.status.is_terminal(), "{task:?}");
    let done = settle(&client, &task.task_id, Duration::from_secs(240)).await;
    let r = result_of(&done);
    let sc = common::Outcome(r).sc();
    assert_eq!(sc["status"], "ok", "{sc}");
    assert_eq!(sc["stdout"], "done 42\n", "{sc}");
    // The session is the same one a plain call would use.
    let task = start(&client, json!({"code": "print(x)"})).await;
    let sc = common::Outcome(result_of(
        &settle(&client, &task.task_id, Duration::from_secs(60)).await,
    ))
    .sc();
    assert_eq!(sc["stdout"], "41\n", "{sc}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_cancel_interrupts_the_code_and_keeps_the_session() {
    let home = Home::new();
    let client = tasks_client(&home).await;
    // Warm the session, then leave a value in it.
    let t = start(&client, json!({"code": "kept = 'yes'"})).await;
    settle(&client, &t.task_id, Duration::from_secs(240)).await;
    let task = start(
        &client,
        json!({"code": "import time\nwhile True:\n    time.sleep(0.05)", "timeout": 60}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = Instant::now();
    client
        .peer()
        .cancel_task(CancelTaskParams::new(task.task_id.clone()))
        .await
        .expect("tasks/cancel");
    let ended = settle(&client, &task.task_id, Duration::from_secs(30)).await;
    assert!(matches!(ended.payload, TaskPayload::Cancelled), "{ended:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "cancelled in {:?}",
        asked.elapsed()
    );
    let t = start(&client, json!({"code": "print(kept)"})).await;
    let sc = common::Outcome(result_of(
        &settle(&client, &t.task_id, Duration::from_secs(60)).await,
    ))
    .sc();
    assert_eq!(sc["stdout"], "yes\n", "the session was kept: {sc}");
    client.cancel().await.unwrap();
}

/// A client that names the extension at `initialize` only (as the MCP Inspector does, which
/// cannot read a task) gets the call's result itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_declaration_at_initialize_alone_gets_the_result() {
    let home = Home::new();
    let client = tasks_client(&home).await;
    let params = CallToolRequestParams::new("run_python").with_arguments(
        json!({"code": "print(6 * 7)"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    match client.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Complete(r) => {
            assert_eq!(common::Outcome(r).sc()["stdout"], "42\n");
        }
        other => panic!("expected the result itself, got {other:?}"),
    }
    let _ = client.cancel().await;
}

/// The 2025-11-25 form of tasks, through the official TypeScript SDK's tasks API over stdio:
/// see `common::sdk_tasks` (its twin over HTTP is in tests/e2e/http.rs).
#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_runs_a_call_as_a_2025_11_25_task() {
    let home = Home::new();
    sdk_tasks::check(BIN, home.env(), home.path()).await;
}
