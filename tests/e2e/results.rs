//! End to end, what comes back from `run_python` — TOON, notebook values, images,
//! progress while running, cancellation — through the real binary and rmcp's client.

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use common::{Bridge, Home, Outcome};
use futures::StreamExt;
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{CallToolRequestParams, ClientRequest, Request, ServerResult};
use rmcp::service::PeerRequestOptions;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct ProgressClient {
    progress: ProgressDispatcher,
}

impl ClientHandler for ProgressClient {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
    }
}

fn call(args: Value) -> ClientRequest {
    ClientRequest::CallToolRequest(Request::new(
        CallToolRequestParams::new("run_python").with_arguments(args.as_object().cloned().unwrap()),
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn output_streams_as_progress_notifications_while_the_code_runs() {
    let home = Home::new();
    let handler = ProgressClient::default();
    let client = handler
        .clone()
        .serve(common::transport(&home, &[]))
        .await
        .unwrap();
    // Warm the sandbox so the timed part is only the code.
    let warm = client
        .send_cancellable_request(
            call(json!({"code": "pass"})),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    warm.await_response().await.unwrap();

    let code =
        "import time\nfor i in range(5):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)";
    let handle = client
        .send_cancellable_request(
            call(json!({"code": code})),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let mut progress = handler
        .progress
        .subscribe(handle.progress_token.clone())
        .await;
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    let collect = async {
        while let Some(p) = progress.next().await {
            seen.push((started.elapsed(), p.message.clone().unwrap_or_default()));
            if seen.iter().any(|(_, m)| m.contains("tick 4")) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), collect).await;
    let response = handle.await_response().await.unwrap();
    let ServerResult::CallToolResult(r) = response else {
        panic!("unexpected response {response:?}")
    };
    assert_eq!(
        Outcome(r).ok().stdout(),
        "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n"
    );
    let ticks: Vec<_> = seen.iter().filter(|(_, m)| m.contains("tick")).collect();
    assert!(
        ticks.len() >= 3,
        "expected progress while running, got {seen:?}"
    );
    // The first tick arrived while the code was still running, not with the result.
    let first = ticks
        .iter()
        .find(|(_, m)| m.contains("tick 0"))
        .expect("tick 0 as progress");
    let last = ticks
        .iter()
        .find(|(_, m)| m.contains("tick 4"))
        .expect("tick 4 as progress");
    assert!(
        last.0 > first.0 + Duration::from_secs(2),
        "ticks came in one burst: {seen:?}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_interrupts_the_code_and_keeps_the_session() {
    let home = Home::new();
    let client = ().serve(common::transport(&home, &[])).await.unwrap();
    let first = client
        .send_cancellable_request(
            call(json!({"code": "survivor = 'here'"})),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    first.await_response().await.unwrap();
    let code = "import time\nfor i in range(600):\n    time.sleep(0.1)\nfinished = True";
    let handle = client
        .send_cancellable_request(
            call(json!({"code": code})),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    handle.cancel(Some("test cancels".into())).await.unwrap();
    // Right after, the session answers (it was interrupted, not left running for 60 s) and kept state.
    let next = client
        .send_cancellable_request(
            call(json!({"code": "print(survivor, 'finished' in globals())"})),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), next.await_response())
        .await
        .expect("session free after cancel")
        .unwrap();
    let ServerResult::CallToolResult(r) = response else {
        panic!("unexpected response {response:?}")
    };
    assert_eq!(Outcome(r).ok().stdout(), "here False\n");
    client.cancel().await.unwrap();
}

/// Calls queued behind a running one of the same session and cancelled there leave the line:
/// none of their code runs, each is recorded as cancelled, and neither the running call nor
/// the session's state is touched (cancelling them had reset the session, silently).
#[tokio::test(flavor = "multi_thread")]
async fn cancelling_calls_queued_behind_a_running_one_keeps_the_session() {
    let home = Home::new();
    let client = ().serve(common::transport(&home, &[])).await.unwrap();
    let send = |code: String| {
        client.send_cancellable_request(
            call(json!({"code": code})),
            PeerRequestOptions::no_options(),
        )
    };
    let result = |r: ServerResult| match r {
        ServerResult::CallToolResult(r) => Outcome(r),
        other => panic!("unexpected response {other:?}"),
    };
    let first = send("kept = 42\nran = []".into()).await.unwrap();
    result(first.await_response().await.unwrap()).ok();
    let running = send("import time\ntime.sleep(4)\nprint('done', kept)".into())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut queued = Vec::new();
    for i in 0..8 {
        queued.push(send(format!("ran.append({i})")).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for h in queued {
        h.cancel(Some("test cancels".into())).await.unwrap();
    }
    let o = tokio::time::timeout(Duration::from_secs(30), running.await_response())
        .await
        .expect("the running call answers")
        .unwrap();
    let o = result(o).ok();
    assert_eq!(o.stdout(), "done 42\n", "{}", o.text());
    assert!(o.sc().get("notices").is_none(), "{}", o.text());
    let next = send("print(kept, ran)".into()).await.unwrap();
    let o = result(next.await_response().await.unwrap()).ok();
    assert_eq!(o.stdout(), "42 []\n", "{}", o.text());
    assert!(o.sc().get("notices").is_none(), "{}", o.text());
    client.cancel().await.unwrap();
    // The audit log: three calls ran, eight were cancelled, none crashed.
    let path = home.path().join(".local/state/mcp-code-bridge/audit.jsonl");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let statuses = loop {
        let s: Vec<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["kind"] == "exec")
            .map(|r| r["status"].as_str().unwrap_or("").to_string())
            .collect();
        if s.len() >= 11 || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let count = |w: &str| statuses.iter().filter(|s| *s == w).count();
    assert_eq!((count("ok"), count("cancelled")), (3, 8), "{statuses:?}");
}

/// In TOON mode the one text block (part `toon`) decodes to the whole payload: the result's
/// metadata with every part of the output.
#[tokio::test(flavor = "multi_thread")]
async fn toon_mode_decodes_back_to_the_structured_payload() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_OUTPUT_MODE", "toon")], None).await;
    for (code, parts) in [
        (
            "print('hello')\n{'a': 1}",
            json!({"stdout": "hello\n", "value": "{'a': 1}"}),
        ),
        (
            "import sys\nprint('warn', file=sys.stderr)\n1/0",
            json!({"stderr": "warn\n"}),
        ),
    ] {
        let r = b.py(code).await;
        let texts = r.0.content.iter().filter(|c| c.as_text().is_some()).count();
        assert_eq!(texts, 1, "{:?}", r.0.content);
        let toon = r.part("toon").expect("the TOON block");
        let decoded: Value =
            toon_format::decode_default(toon).unwrap_or_else(|e| panic!("not TOON ({e}): {toon}"));
        // Less its parts, the payload is the result's metadata.
        let mut rest = decoded.clone();
        let obj = rest.as_object_mut().unwrap();
        let mut got = serde_json::Map::new();
        for p in ["stdout", "stderr", "value", "notices"] {
            if let Some(v) = obj.remove(p) {
                got.insert(p.into(), v);
            }
        }
        let traceback = obj
            .get_mut("error")
            .and_then(Value::as_object_mut)
            .and_then(|e| e.remove("traceback"));
        assert_eq!(&rest, r.meta(), "{decoded}");
        assert_eq!(Value::Object(got), parts, "{decoded}");
        if r.meta().get("error").is_some() {
            let tb = traceback.expect("the traceback");
            assert!(
                tb.as_str()
                    .is_some_and(|t| t.contains("ZeroDivisionError: division by zero")),
                "{decoded}"
            );
        } else {
            assert_eq!(traceback, None, "{decoded}");
        }
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_expression_is_shown_like_a_notebook() {
    let b = Bridge::start().await;
    let r = b.py("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3, 4], 'y': [10.0, 20.0, 30.0, 40.0]})\ndf.describe()").await.ok();
    let sc = r.sc();
    let v = sc["value"].as_str().unwrap();
    assert!(
        v.contains("count") && v.contains("mean") && v.contains("25.0"),
        "{v}"
    );
    assert!(r.text().contains("mean"));
    // Assignments and None show nothing.
    let r = b.py("z = 5").await.ok();
    assert!(r.sc().get("value").is_none());
    let r = b.py("print('side effect')\nNone").await.ok();
    assert!(r.sc().get("value").is_none());
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_matplotlib_figure_arrives_as_png_image_content() {
    let b = Bridge::start().await;
    let code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), dpi=50)\nax.plot([1, 3, 2])\ndisplay(fig)\nprint('drawn')";
    let r = b.py(code).await.ok();
    assert_eq!(r.stdout(), "drawn\n");
    assert_eq!(r.sc()["images"], 1);
    let images: Vec<_> = r.0.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.len(), 1, "{:?}", r.0.content);
    assert_eq!(images[0].mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    // 4x3 inches at 50 dpi, trimmed to its content like a notebook does (bbox_inches="tight").
    assert!(
        (100..=200).contains(&w) && (75..=150).contains(&h),
        "{w}x{h}"
    );
    // The image is not also pasted into the text as base64.
    assert!(!r.text().contains("iVBOR"));
    b.shutdown().await;
}

/// No notification of a request follows its response: over many calls whose last output comes
/// right before the end, every progress notification of a call is read before its result.
#[tokio::test(flavor = "multi_thread")]
async fn progress_notifications_never_follow_their_response() {
    let mut b = common::RawBridge::start(Home::new(), &[]).await;
    let wait = Duration::from_secs(60);
    let mut late = Vec::new();
    let mut streamed = 0;
    for id in 1..=30i64 {
        b.send_json(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "run_python",
                "arguments": {"code": "for i in range(20):\n    print('line', i)\nprint('end')"},
                "_meta": {"progressToken": format!("t{id}")}
            }}),
        )
        .await;
        let mut answered = false;
        // Read in order until the response, then briefly past it.
        loop {
            let Some(msg) = b
                .next(if answered {
                    Duration::from_millis(200)
                } else {
                    wait
                })
                .await
            else {
                assert!(answered, "no response to call {id}");
                break;
            };
            if msg.get("id") == Some(&json!(id)) {
                answered = true;
            } else if msg.get("method") == Some(&json!("notifications/progress")) {
                let token = msg["params"]["progressToken"].clone();
                if answered && token == json!(format!("t{id}")) {
                    late.push(id);
                }
                streamed += 1;
            }
        }
    }
    assert!(
        streamed >= 30,
        "only {streamed} progress notifications in 30 calls"
    );
    assert!(
        late.is_empty(),
        "calls whose progress followed their response: {late:?}"
    );
}

/// The kind of JSON value each field of a result's metadata (`_meta["mcp-code-bridge/result"]`)
/// is, and no other field: `error` is `{type, message?}`, `kept` a list of `{part, uri, path?,
/// size}`. Empty fields are left out, so only `status`, `session` and `duration_ms` (not in a
/// result that could not start) are always there.
const META_FIELDS: [(&str, &str); 10] = [
    ("status", "string"),
    ("session", "string"),
    ("resumed", "string"),
    ("lost", "array"),
    ("error", "object"),
    ("images", "integer"),
    ("truncated_bytes", "integer"),
    ("session_reset", "boolean"),
    ("duration_ms", "integer"),
    ("kept", "array"),
];

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The official MCP Python SDK reads every result the bridge sends, in the mode a host uses by
/// default (`Client`, `auto`: 2026-07-28) and in legacy mode (`initialize`), over real results
/// of each kind (ok with stdout, stderr and a value; a Python error; a timeout; a timeout whose
/// code ignored the interrupt, so its sandbox was killed and the session reset; an image;
/// truncated output; a call that could not start). The tool declares no output schema and no
/// result has `structuredContent`: each byte of output is in `content` once, each part a text
/// block named in its `_meta`, in order (stdout, stderr, value, error, notices, files), and the
/// rest is in the result's `_meta`, every field of it typed and `session` in each. The
/// listing's title, annotations and argument descriptions are what the SDK parses.
#[test]
fn every_result_reads_in_the_python_sdk_as_named_parts_and_metadata() {
    let home = Home::new();
    let python = common::server_bin("mcp-python");
    let out = std::process::Command::new(python)
        .arg(common::fixture("sdk_result_shape.py"))
        .arg(env!("CARGO_BIN_EXE_mcp-code-bridge"))
        .env_clear()
        .envs(home.env())
        .env("MCP_BRIDGE_OUTPUT_CAP", "4k")
        // Each mode's bridge starts where the last left: no snapshot carries a case's session
        // into the next mode's (tests/e2e/resume.rs has the SDK's restarts).
        .env("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "0")
        .current_dir(home.path())
        .output()
        .expect("run the Python SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for mode in ["auto", "legacy"] {
        let case = |name: &str| -> &Value {
            lines
                .iter()
                .find(|l| l["mode"] == mode && l["case"] == name)
                .unwrap_or_else(|| panic!("no {mode} {name} in {stdout}"))
        };
        let listing = case("tools/list");
        if mode == "auto" {
            assert_eq!(listing["protocol"], "2026-07-28", "{listing}");
            // The tool list is the binary's: the same for every user, for as long as the
            // bridge runs (SEP-2549's caching hints, true ones rather than "do not cache").
            assert_eq!(listing["ttl_ms"], json!(3_600_000), "{listing}");
            assert_eq!(listing["cache_scope"], "public", "{listing}");
        } else {
            // Revisions before 2026-07-28 have no caching hints: none is sent, and the SDK
            // reads its own defaults for a result without them.
            assert_eq!(listing["ttl_ms"], json!(0), "{listing}");
            assert_eq!(listing["cache_scope"], "private", "{listing}");
        }
        assert!(
            listing["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{listing}"
        );
        // No annotations: the specification's defaults (not read-only, destructive, open-world,
        // not idempotent) are what the tool is, and say it for free.
        assert_eq!(listing["annotations"], Value::Null, "{listing}");
        // No output schema: it would require `structuredContent`, which would carry the output
        // a second time.
        assert_eq!(listing["output_schema"], Value::Null, "{listing}");
        // A timeout must be more than 0.
        assert_eq!(
            listing["timeout"]["exclusiveMinimum"],
            json!(0),
            "{listing}"
        );
        // `code` is what the tool runs; the others say in a few words what they do.
        for arg in ["servers", "timeout", "session", "reset"] {
            assert!(
                listing["arguments"][arg]
                    .as_str()
                    .is_some_and(|d| !d.is_empty()),
                "{arg} has no description: {listing}"
            );
        }
        let cases = [
            "ok",
            "error",
            "timeout",
            "killed",
            "images",
            "truncated",
            "setup_error",
        ];
        for name in cases {
            let c = case(name);
            assert_eq!(c["structured"], Value::Null, "{mode} {name}: {c}");
            // Every field of the metadata is one the bridge declares, of its type; every
            // result names the interpreter it ran in (or was for): over stdio, one client,
            // the default one.
            let meta = c["meta"]
                .as_object()
                .unwrap_or_else(|| panic!("{mode} {name}: {c}"));
            for (field, v) in meta {
                let want = META_FIELDS
                    .iter()
                    .find(|(f, _)| f == field)
                    .unwrap_or_else(|| panic!("{mode} {name}: undeclared field {field}: {c}"))
                    .1;
                assert_eq!(json_kind(v), want, "{mode} {name}: {field}: {c}");
            }
            assert_eq!(meta["session"], "default", "{mode} {name}: {c}");
            assert_eq!(
                c["is_error"],
                json!(!matches!(name, "ok" | "images" | "truncated")),
                "{mode} {name}: {c}"
            );
            // The text blocks come first, each part at most once and in order; a result with
            // no part has one unnamed block saying so.
            let blocks = c["content"].as_array().unwrap();
            let order = ["stdout", "stderr", "value", "error", "notices", "files"];
            let parts: Vec<&str> = blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["part"].as_str())
                .collect();
            let mut at = 0;
            for p in &parts {
                let i = order
                    .iter()
                    .position(|o| o == p)
                    .unwrap_or_else(|| panic!("{mode} {name}: unknown part {p}: {c}"));
                assert!(i >= at, "{mode} {name}: parts out of order: {c}");
                at = i + 1;
            }
            let first_other = blocks
                .iter()
                .position(|b| b["type"] != "text")
                .unwrap_or(blocks.len());
            assert!(
                blocks[first_other..].iter().all(|b| b["type"] != "text"),
                "{mode} {name}: {c}"
            );
            if parts.is_empty() {
                assert_eq!(first_other, 1, "{mode} {name}: {c}");
                assert_eq!(blocks[0]["part"], Value::Null, "{mode} {name}: {c}");
            } else {
                assert_eq!(parts.len(), first_other, "{mode} {name}: unnamed text: {c}");
            }
        }
        let parts = |name: &str| -> Vec<(String, String)> {
            case(name)["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| {
                    Some((
                        b["part"].as_str()?.to_string(),
                        b["text"].as_str()?.to_string(),
                    ))
                })
                .collect()
        };
        let meta = |name: &str| case(name)["meta"].clone();
        assert_eq!(meta("ok")["status"], "ok");
        assert!(meta("ok")["duration_ms"].is_u64(), "{stdout}");
        assert_eq!(
            parts("ok"),
            [
                ("stdout".to_string(), "out\n".to_string()),
                ("stderr".to_string(), "[stderr]\nerr\n".to_string()),
                ("value".to_string(), "2".to_string()),
            ],
            "{stdout}"
        );
        assert_eq!(meta("error")["status"], "error");
        assert_eq!(meta("error")["error"]["type"], "ZeroDivisionError");
        let error = parts("error");
        assert_eq!(error.len(), 1, "{stdout}");
        assert_eq!(error[0].0, "error");
        assert!(
            error[0].1.starts_with("Traceback")
                && error[0].1.ends_with("ZeroDivisionError: division by zero"),
            "{stdout}"
        );
        assert_eq!(meta("timeout")["status"], "timeout");
        assert!(
            parts("timeout")
                .iter()
                .any(|(p, t)| p == "notices" && t.starts_with("[bridge] ")),
            "{stdout}"
        );
        assert_eq!(meta("killed")["session_reset"], true, "{stdout}");
        assert_eq!(meta("images")["images"], 1, "{stdout}");
        let images = case("images")["content"].as_array().unwrap();
        assert_eq!(images[0]["text"], "(1 image)", "{stdout}");
        assert_eq!(images[1]["type"], "image", "{stdout}");
        assert!(
            meta("truncated")["truncated_bytes"].as_u64().unwrap_or(0) > 0,
            "{stdout}"
        );
        assert_eq!(parts("truncated")[0].0, "stdout", "{stdout}");
        assert_eq!(meta("setup_error")["status"], "unavailable");
        assert_eq!(meta("setup_error")["error"]["type"], "UnknownServer");
        let setup = parts("setup_error");
        assert_eq!(setup.len(), 1, "{stdout}");
        assert_eq!(setup[0].0, "error");
        assert_eq!(
            setup[0].1,
            format!(
                "[bridge] {}",
                meta("setup_error")["error"]["message"].as_str().unwrap()
            ),
            "{stdout}"
        );
    }
}

/// A DataFrame too large for its preview as the last value: the value shows its head, tail,
/// shape and dtypes, and names a file with its whole data (Parquet when pyarrow is there, else
/// CSV) under `/workspace/out/.outputs/`, which the result links and `resources/read` serves,
/// and which the next call's code reads back whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_dataframe_as_the_last_value_links_its_full_data() {
    let b = Bridge::start().await;
    let r = b
        .py("import pandas as pd\ndf = pd.DataFrame({'n': range(20000), 'sq': [i * i for i in range(20000)], 'tag': ['t%d' % (i % 7) for i in range(20000)]})\ndf")
        .await
        .ok();
    let sc = r.sc();
    let v = sc["value"].as_str().unwrap();
    assert!(v.contains("[20000 rows x 3 columns]"), "{v}");
    let line = v
        .lines()
        .find(|l| l.starts_with("full data: "))
        .unwrap_or_else(|| panic!("no link to the full data in {v}"));
    let path = line["full data: ".len()..].split(' ').next().unwrap();
    assert!(path.starts_with("/workspace/out/.outputs/"), "{line}");
    assert!(
        path.ends_with(".value.parquet") || path.ends_with(".value.csv"),
        "{line}"
    );
    assert!(line.contains("20000 rows \u{d7} 3 columns"), "{line}");
    let name = path.trim_start_matches("/workspace/out/");
    let linked: Vec<String> =
        r.0.content
            .iter()
            .filter_map(|c| match c {
                rmcp::model::ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
                _ => None,
            })
            .collect();
    let uri = linked
        .iter()
        .find(|u| u.ends_with(name))
        .unwrap_or_else(|| panic!("{name} is not linked: {linked:?}"));
    let read = b
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri.as_str()))
        .await
        .expect("resources/read of the full data");
    assert!(!read.contents.is_empty());
    let back = if path.ends_with(".parquet") {
        format!("d = pd.read_parquet({path:?})")
    } else {
        format!("d = pd.read_csv({path:?}, index_col=0)")
    };
    let r = b
        .py(&format!(
            "{back}\nprint(d.shape, int(d.sq.sum()) == int(df.sq.sum()), list(d.tag[:3]))"
        ))
        .await
        .ok();
    assert_eq!(r.stdout(), "(20000, 3) True ['t0', 't1', 't2']\n");
    // A small one is shown whole, with no file.
    let r = b.py("pd.DataFrame({'a': [1, 2]})").await.ok();
    assert!(!r.sc()["value"].as_str().unwrap().contains("full data"));
    b.shutdown().await;
}
