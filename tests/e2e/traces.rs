//! Traces through the real binary to a real OTLP receiver (tests/fixtures/otlp_receiver.py, on
//! the official `opentelemetry-proto` package, decoding the protobuf the exporter really sends):
//! one trace per `run_python` call with its sandbox, its proxied calls to the real
//! `mcp-server-time`, under the client's `traceparent` when it sends one (SEP-414) and a trace
//! of its own when not; the trace id in the result's `_meta` and in the audit records; never the
//! code, output or arguments unless `otel_content`; over stdio and `serve` (each identity's
//! call its own), with the official Python and TypeScript SDKs in their default (2026-07-28)
//! and legacy modes; and a collector that hangs costs a call nothing, its dropped spans logged
//! once.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, MetaObject, RequestMetaObject};
use serde_json::{Value, json};

use common::served::Served;
use common::{Bridge, Home, server_bin};

const ALICE: &str = "alice-0123456789abcdef0123";
const BOB: &str = "bob-fedcba9876543210fedcba98";

/// The client's trace: W3C `traceparent` of a sampled span.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-01")
}

/// A running receiver and the spans it decoded so far.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start(args: &[&str]) -> Receiver {
        let mut child = Command::new(server_bin("mcp-python"))
            .arg(common::fixture("otlp_receiver.py"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the OTLP receiver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the receiver's first line").unwrap();
        let port = first
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver said {first:?}"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s, r) = (spans.clone(), requests.clone());
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Some(req) = line.strip_prefix("REQUEST ") {
                    r.lock().unwrap().push(req.to_string());
                } else if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    s.lock().unwrap().push(v);
                }
            }
        });
        Receiver {
            child,
            port,
            spans,
            requests,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans of `trace` once `f` holds of them (within 30 s: the exporter sends every 5 s,
    /// and at the bridge's exit).
    fn trace_when(&self, trace: &str, what: &str, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<Value> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s["trace_id"] == trace)
                .cloned()
                .collect();
            if f(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the spans of trace {trace} never did: {spans:#?}\nall: {:#?}",
                self.spans.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn all(&self) -> Vec<Value> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A home with `time` configured, an audit log in it, `otel_endpoint` and the tokens of two
/// identities (for `serve`).
fn home_for(endpoint: &str, extra: &str) -> Home {
    let home = Home::new();
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let servers = toml::to_string(&json!({"servers": {
        "time": {"command": server_bin("mcp-server-time")},
    }}))
    .unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "otel_endpoint = {endpoint:?}\n{extra}\n{servers}\n[audit]\npath = {:?}\n",
            home.path().join("audit.jsonl").display().to_string()
        ),
    )
    .unwrap();
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    home
}

/// Two proxied calls, the second with arguments no span may carry.
const TWO_CALLS: &str = r#"
a = await mcp_time.get_current_time(timezone="UTC")
b = await mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Pacific/Chatham")
print("CALLED", "Pacific/Chatham" in str(b))
"#;

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one span {name:?} in {spans:#?}");
    found[0]
}

/// Every attribute value of every span, as text: what a span carries.
fn carried(spans: &[Value]) -> String {
    spans
        .iter()
        .map(|s| s["attributes"].to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn call_with_meta(bridge: &Bridge, code: &str, meta: Option<Value>) -> Value {
    let mut params = CallToolRequestParams::new("run_python").with_arguments(
        json!({"code": code, "servers": ["time"], "timeout": 120})
            .as_object()
            .cloned()
            .unwrap(),
    );
    if let Some(Value::Object(m)) = meta {
        params.meta = Some(RequestMetaObject(MetaObject(m)));
    }
    let r = bridge.client.call_tool(params).await.expect("run_python");
    serde_json::to_value(r).unwrap()
}

fn result_meta(result: &Value) -> &Value {
    &result["_meta"]["mcp-code-bridge/result"]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_is_one_trace_under_the_clients_traceparent_with_its_sandbox_and_proxied_calls() {
    let receiver = Receiver::start(&[]);
    let home = home_for(&receiver.endpoint(), "");
    let bridge = Bridge::start_with(home, &[("OTEL_BSP_SCHEDULE_DELAY", "100")], None).await;

    // With the client's traceparent: its trace, the call's span a child of the client's.
    let r = call_with_meta(
        &bridge,
        TWO_CALLS,
        Some(json!({"traceparent": traceparent()})),
    )
    .await;
    let text = r.to_string();
    assert!(text.contains("CALLED True"), "{text}");
    assert_eq!(result_meta(&r)["trace_id"], TRACE, "{r:#}");
    let spans = receiver.trace_when(TRACE, "the first call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
            && named(s, "tools/call convert_time").len() == 1
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["kind"], "SPAN_KIND_SERVER");
    assert_eq!(call["parent_span_id"], CLIENT_SPAN);
    assert_eq!(call["service"], "mcp-code-bridge");
    assert_eq!(call["scope"], "mcp-code-bridge");
    let a = &call["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.tool.name"], "run_python");
    assert_eq!(a["mcp_code_bridge.session"], "default");
    assert_eq!(a["mcp_code_bridge.status"], "ok");
    assert_eq!(a["mcp_code_bridge.output_bytes"], "CALLED True\n".len());
    assert!(a.get("mcp_code_bridge.code").is_none(), "{a}");
    assert_eq!(call["status"], "STATUS_CODE_UNSET");

    let sandbox = one(&spans, "sandbox");
    assert_eq!(sandbox["parent_span_id"], call["span_id"]);
    assert_eq!(
        sandbox["attributes"]["mcp_code_bridge.sandbox.session"],
        "new"
    );
    let from = sandbox["attributes"]["mcp_code_bridge.sandbox.from"].clone();
    assert!(from == "pool" || from == "started", "{sandbox}");

    for tool in ["get_current_time", "convert_time"] {
        let t = one(&spans, &format!("tools/call {tool}"));
        assert_eq!(t["kind"], "SPAN_KIND_CLIENT", "{t}");
        assert_eq!(t["parent_span_id"], call["span_id"], "{t}");
        assert_eq!(t["attributes"]["mcp_code_bridge.server"], "time", "{t}");
        assert_eq!(t["attributes"]["mcp_code_bridge.decision"], "allow", "{t}");
        assert!(
            t["attributes"]["mcp_code_bridge.result_bytes"]
                .as_i64()
                .unwrap()
                > 0,
            "{t}"
        );
        // Within the call's time.
        assert!(t["start_ns"].as_u64() >= call["start_ns"].as_u64(), "{t}");
        assert!(t["end_ns"].as_u64() <= call["end_ns"].as_u64(), "{t}");
    }
    // Never the arguments, the code or the output.
    let all = carried(&spans);
    assert!(!all.contains("Pacific/Chatham"), "{all}");
    assert!(!all.contains("CALLED"), "{all}");

    // A call without a traceparent is a trace of its own, its id in the result.
    let r = call_with_meta(&bridge, "print(6 * 7)", None).await;
    let own = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    assert_eq!(own.len(), 32, "{r:#}");
    assert_ne!(own, TRACE);
    let spans = receiver.trace_when(&own, "the second call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["parent_span_id"], "", "a root span: {call}");
    assert_eq!(
        one(&spans, "sandbox")["attributes"]["mcp_code_bridge.sandbox.session"],
        "running"
    );

    // An error is the span's error, by its type.
    let r = call_with_meta(&bridge, "1 / 0", None).await;
    let failed = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&failed, "the failed call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["status"], "STATUS_CODE_ERROR", "{call}");
    assert_eq!(
        call["attributes"]["error.type"], "ZeroDivisionError",
        "{call}"
    );

    // The audit records of each call name its trace.
    let home = bridge.shutdown_clean().await;
    let records: Vec<Value> = std::fs::read_to_string(home.path().join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str, trace: &str| {
        records
            .iter()
            .filter(|r| r["kind"] == kind && r["trace_id"] == trace)
            .count()
    };
    assert_eq!(of("exec", TRACE), 1, "{records:#?}");
    assert_eq!(of("tool_call", TRACE), 2, "{records:#?}");
    assert_eq!(of("exec", &own), 1, "{records:#?}");
    assert_eq!(of("exec", &failed), 1, "{records:#?}");
    // The requests were OTLP's protobuf, to its traces path.
    let requests = receiver.requests.lock().unwrap().clone();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|r| r == "application/x-protobuf /v1/traces"),
        "{requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_otel_content_the_code_and_output_are_on_the_span_and_service_name_is_honoured() {
    let receiver = Receiver::start(&[]);
    let home = home_for(&receiver.endpoint(), "otel_content = true");
    let bridge = Bridge::start_with(
        home,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "bridge-of-team-a"),
        ],
        None,
    )
    .await;
    let code = "print('visible' * 2)";
    let r = call_with_meta(&bridge, code, None).await;
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["attributes"]["mcp_code_bridge.code"], code);
    assert_eq!(
        call["attributes"]["mcp_code_bridge.output"],
        "visiblevisible\n"
    );
    assert_eq!(call["service"], "bridge-of-team-a");
    bridge.shutdown().await;
}

/// Over `serve` with two identities: the Python SDK's `Client` and the TypeScript SDK's client,
/// each in its default mode (2026-07-28) and legacy mode, and the Inspector CLI in both eras,
/// send the parent in the call's `_meta`; each call is its own trace under that parent, with
/// its caller's identity; an approval is a span of the proxied call that asked.
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_each_identitys_call_is_its_trace_and_the_sdks_send_the_parent_in_both_modes() {
    let receiver = Receiver::start(&[]);
    let home = home_for(
        &receiver.endpoint(),
        "[policy]\nask = [\"time.convert_time\"]",
    );
    let tokens = home.path().join("tokens").display().to_string();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
        &[],
    );
    let step = |code: &str, trace: &str| {
        json!([{"code": code, "servers": ["time"],
                "meta": {"traceparent": format!("00-{trace}-{CLIENT_SPAN}-01")}}])
    };
    let cases = [
        ("python", "auto", ALICE, "11111111111111111111111111111111"),
        ("python", "legacy", BOB, "22222222222222222222222222222222"),
        (
            "typescript",
            "auto",
            BOB,
            "33333333333333333333333333333333",
        ),
        (
            "typescript",
            "legacy",
            ALICE,
            "44444444444444444444444444444444",
        ),
    ];
    for (sdk, mode, token, trace) in cases {
        let code = "r = await mcp_time.get_current_time(timezone='UTC'); print('OK')";
        let steps = step(code, trace);
        let out = match sdk {
            "python" => crate::approvals::python(
                &served.home,
                mode,
                &served.url,
                steps,
                &["--token", token],
            ),
            _ => crate::approvals::typescript(&served.home, mode, &served.url, steps, Some(token)),
        };
        let what = format!("{sdk} {mode}");
        assert_eq!(out[0]["structured"]["stdout"], "OK\n", "{what}: {out:?}");
        assert_eq!(out[0]["structured"]["trace_id"], trace, "{what}: {out:?}");
        let spans = receiver.trace_when(trace, &what, |s| {
            s.iter().any(|s| s["name"] == "tools/call run_python")
                && s.iter().any(|s| s["name"] == "tools/call get_current_time")
        });
        let call = one(&spans, "tools/call run_python");
        assert_eq!(call["parent_span_id"], CLIENT_SPAN, "{what}: {call}");
        let who = if token == ALICE { "alice" } else { "bob" };
        assert_eq!(call["attributes"]["enduser.id"], who, "{what}: {call}");
        let tool = one(&spans, "tools/call get_current_time");
        assert_eq!(tool["parent_span_id"], call["span_id"], "{what}: {tool}");
    }
    // A question to the user is a span of the proxied call that asked, with the answer.
    let trace = "55555555555555555555555555555555";
    let code = "r = await mcp_time.convert_time(source_timezone='UTC', time='12:00', target_timezone='Asia/Tokyo'); print('OK')";
    let mut steps = step(code, trace);
    steps[0]["answers"] = json!(["allow_once"]);
    let out = crate::approvals::python(
        &served.home,
        "auto",
        &served.url,
        steps,
        &["--token", ALICE],
    );
    assert_eq!(out[0]["asked"].as_array().unwrap().len(), 1, "{out:?}");
    assert_eq!(out[0]["structured"]["stdout"], "OK\n", "{out:?}");
    let spans = receiver.trace_when(trace, "the asked call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
            && s.iter().any(|s| s["name"] == "approval")
    });
    let tool = one(&spans, "tools/call convert_time");
    assert_eq!(
        tool["attributes"]["mcp_code_bridge.decision"], "ask:allowed",
        "{tool}"
    );
    let approval = one(&spans, "approval");
    assert_eq!(approval["parent_span_id"], tool["span_id"], "{approval}");
    let a = &approval["attributes"];
    assert_eq!(a["mcp_code_bridge.ask.path"], "input_required", "{a}");
    assert_eq!(a["mcp_code_bridge.ask.answer"], "allow_once", "{a}");
    assert_eq!(a["gen_ai.tool.name"], "convert_time", "{a}");
    assert!(!carried(&spans).contains("Asia/Tokyo"), "{spans:#?}");

    // The Inspector CLI sends the parent as the call's `_meta` (`--tool-metadata`), in its
    // 2026-07-28 era and the legacy one.
    for (era, trace) in [
        ("modern", "66666666666666666666666666666666"),
        ("legacy", "77777777777777777777777777777777"),
    ] {
        let scratch = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(server_bin("mcp-inspector"))
            .args([
                "--cli",
                &served.url,
                "--protocol-era",
                era,
                "--format",
                "json",
            ])
            .args(["--method", "tools/call", "--tool-name", "run_python"])
            .args(["--tool-arg", "code=print('OK')"])
            .args(["--header", &format!("Authorization: Bearer {BOB}")])
            .args([
                "--tool-metadata",
                &format!("traceparent=00-{trace}-{CLIENT_SPAN}-01"),
            ])
            .env("HOME", scratch.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{era}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value =
            serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(result_meta(&v["result"])["trace_id"], trace, "{era}: {v}");
        let spans = receiver.trace_when(trace, era, |s| {
            s.iter().any(|s| s["name"] == "tools/call run_python")
        });
        let call = one(&spans, "tools/call run_python");
        assert_eq!(call["parent_span_id"], CLIENT_SPAN, "{era}: {call}");
        assert_eq!(call["attributes"]["enduser.id"], "bob", "{era}: {call}");
    }

    // One trace per call: no span of one client's call is in another's trace.
    let traces: std::collections::BTreeSet<String> = receiver
        .all()
        .iter()
        .filter(|s| s["name"] == "tools/call run_python")
        .map(|s| s["trace_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(traces.len(), 7, "{traces:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_hangs_costs_a_call_nothing_and_its_dropped_spans_are_logged_once() {
    let receiver = Receiver::start(&["--hang"]);
    let home = home_for(&receiver.endpoint(), "");
    // A queue of two spans, a batch every 50 ms: the hung export fills it at once.
    let bridge = Bridge::start_with(
        home,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "2"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
        ],
        None,
    )
    .await;
    let first = Instant::now();
    assert_eq!(bridge.py("print(1)").await.stdout(), "1\n");
    let warm = Instant::now();
    for i in 0..20 {
        let out = bridge.py(&format!("print({i})")).await;
        assert_eq!(out.stdout(), format!("{i}\n"), "{}", bridge.home.log());
    }
    // Twenty calls (three spans each) while the collector holds the exporter: each answered
    // as it would be without one (well under a second each on any machine here).
    let per_call = warm.elapsed() / 20;
    assert!(
        per_call < Duration::from_secs(2),
        "{per_call:?} per call with a hung collector (first {:?})",
        warm - first
    );
    let log = bridge.home.log();
    assert_eq!(
        log.matches("BatchSpanProcessor dropped a Span").count(),
        1,
        "the first drop logged once:\n{log}"
    );
    assert!(receiver.all().is_empty());
    bridge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_otel_endpoint_is_refused_with_what_to_give() {
    let home = Home::new();
    let out = home
        .command()
        .arg("run")
        .env("MCP_BRIDGE_OTEL_ENDPOINT", "ftp://collector")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("otel_endpoint"), "{err}");
    assert!(err.contains("http://127.0.0.1:4318"), "{err}");
    // And a protocol this build does not send, named with its fix.
    let out = home
        .command()
        .arg("run")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{err}");
    assert!(err.contains("http/protobuf"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_install_is_a_span_of_its_call_with_what_was_asked_and_installed() {
    let receiver = Receiver::start(&[]);
    let index = crate::packages::Index::start(&[]);
    let home = home_for(
        &receiver.endpoint(),
        &format!(
            "[packages]\nindex_url = {:?}\nallow = [\"tabulate\"]",
            index.url
        ),
    );
    let bridge = Bridge::start_with(
        home,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("MCP_BRIDGE_TIMEOUT", "120"),
        ],
        None,
    )
    .await;
    let r = call_with_meta(
        &bridge,
        "from mcp import runtime\nawait runtime.install('tabulate')\nimport tabulate\nprint('IMPORTED')",
        None,
    )
    .await;
    assert!(r.to_string().contains("IMPORTED"), "{r:#}");
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the install", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
            && s.iter().any(|s| s["name"] == "packages.install")
    });
    let call = one(&spans, "tools/call run_python");
    let install = one(&spans, "packages.install");
    assert_eq!(install["parent_span_id"], call["span_id"], "{install}");
    let a = &install["attributes"];
    assert_eq!(a["mcp_code_bridge.packages.requested"], "tabulate", "{a}");
    assert_eq!(a["mcp_code_bridge.packages.installed"], 1, "{a}");
    assert_eq!(install["status"], "STATUS_CODE_UNSET", "{install}");
    // One that fails (no such distribution) is the span's error, by its kind.
    let r = call_with_meta(
        &bridge,
        "from mcp import runtime\ntry:\n    await runtime.install('no-such-distribution')\nexcept runtime.PackageError:\n    print('FAILED')",
        None,
    )
    .await;
    assert!(r.to_string().contains("FAILED"), "{r:#}");
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the failed install", |s| {
        s.iter().any(|s| s["name"] == "packages.install")
    });
    let install = one(&spans, "packages.install");
    assert_eq!(install["status"], "STATUS_CODE_ERROR", "{install}");
    assert!(install["attributes"]["error.type"].is_string(), "{install}");
    bridge.shutdown().await;
}

/// With `otel_content` off (the default), no span carries what the code chose to send out: an
/// install of a "requirement" that is a customer's card number has it on no span (only the
/// count of requirements that were not valid), and an exception whose class `__qualname__` is
/// 20,000 characters long is the call span's `error.type` and status as `_OTHER`, not its name.
#[tokio::test(flavor = "multi_thread")]
async fn with_otel_content_off_no_span_carries_a_requirements_text_or_an_exceptions_long_name() {
    let receiver = Receiver::start(&[]);
    let index = crate::packages::Index::start(&[]);
    let home = home_for(
        &receiver.endpoint(),
        &format!(
            "[packages]\nindex_url = {:?}\nallow = [\"tabulate\"]",
            index.url
        ),
    );
    let bridge = Bridge::start_with(
        home,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("MCP_BRIDGE_TIMEOUT", "120"),
        ],
        None,
    )
    .await;
    let r = call_with_meta(
        &bridge,
        "from mcp import runtime\ntry:\n    await runtime.install('LEAK: customer 4111-1111-1111-1111', 'tabulate==0.9.0')\nexcept runtime.PackageError:\n    print('REFUSED')",
        None,
    )
    .await;
    assert!(r.to_string().contains("REFUSED"), "{r:#}");
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the refused install", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
            && s.iter().any(|s| s["name"] == "packages.install")
    });
    let install = one(&spans, "packages.install");
    let a = &install["attributes"];
    assert_eq!(
        a["mcp_code_bridge.packages.requested"], "tabulate==0.9.0",
        "{a}"
    );
    assert_eq!(a["mcp_code_bridge.packages.requested_invalid"], 1, "{a}");
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains("4111") && !all.contains("LEAK"), "{all}");

    let code =
        "class Secret(Exception):\n    pass\nSecret.__qualname__ = 'Q' * 20000\nraise Secret('x')";
    let r = call_with_meta(&bridge, code, None).await;
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the failed call", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["status"], "STATUS_CODE_ERROR", "{call}");
    assert_eq!(call["attributes"]["error.type"], "_OTHER", "{call}");
    assert_eq!(call["status_message"], "_OTHER", "{call}");
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains("QQQQ"), "a span carries the long name");
    assert!(all.len() < 16 << 10, "{} bytes of spans", all.len());
    // An exception of an ordinary name is still named.
    let r = call_with_meta(&bridge, "raise KeyError('k')", None).await;
    let id = result_meta(&r)["trace_id"].as_str().unwrap().to_string();
    let spans = receiver.trace_when(&id, "the KeyError", |s| {
        s.iter().any(|s| s["name"] == "tools/call run_python")
    });
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["attributes"]["error.type"], "KeyError", "{call}");
    bridge.shutdown().await;
}
