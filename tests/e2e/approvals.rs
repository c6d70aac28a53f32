//! Approvals and servers' questions under the 2026-07-28 revision, where they travel as
//! `input_required` results (SEP-2322) and the paused code resumes on the client's retry,
//! through the real binary, real podman, the real `mcp-server-time` and `mcp-server-everything`,
//! and the official clients in their default modes: the Python SDK's `Client` (`auto`, so
//! 2026-07-28) and the TypeScript client 2.x in `auto` mode, over stdio and over HTTP; and the
//! same clients in `legacy` mode (2025-11-25, `elicitation/create` requests as before).

use crate::common;

use common::served::Served;
use common::{Home, server_bin};
use serde_json::{Value, json};

const ALICE: &str = "alice-0123456789abcdef0123";
const BOB: &str = "bob-fedcba9876543210fedcba98";

/// `[servers]` time and everything, the `[policy]` given and an audit log in the home.
fn home_with(policy: &str) -> Home {
    let home = Home::new();
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let servers = toml::to_string(&json!({"servers": {
        "time": {"command": server_bin("mcp-server-time")},
        "everything": {"command": server_bin("mcp-server-everything")},
    }}))
    .unwrap();
    let audit = home.path().join("audit.jsonl");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "{servers}\n{policy}\n[audit]\npath = {:?}\n",
            audit.display().to_string()
        ),
    )
    .unwrap();
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    home
}

fn audit_tool_calls(home: &Home) -> Vec<Value> {
    std::fs::read_to_string(home.path().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "tool_call")
        .collect()
}

/// Run the Python SDK client fixture; one JSON value per step.
pub(crate) fn python(
    home: &Home,
    mode: &str,
    target: &str,
    steps: Value,
    extra: &[&str],
) -> Vec<Value> {
    let out = std::process::Command::new(server_bin("mcp-python"))
        .arg(common::fixture("sdk_rounds_client.py"))
        .args([mode, target, &steps.to_string()])
        .args(extra)
        .env_clear()
        .envs(home.env())
        .current_dir(home.path())
        .stderr(std::fs::File::create(home.path().join("client.err")).unwrap())
        .output()
        .unwrap();
    lines_of(home, out)
}

/// Run the TypeScript client fixture; one JSON value per step.
pub(crate) fn typescript(
    home: &Home,
    mode: &str,
    target: &str,
    steps: Value,
    token: Option<&str>,
) -> Vec<Value> {
    let out = std::process::Command::new(server_bin("node"))
        .arg(common::fixture("ts_rounds_client.mjs"))
        .args([mode, target, &steps.to_string()])
        .args(token)
        .env_clear()
        .envs(home.env())
        .env("NODE_PATH", common::oidc::node_modules())
        .current_dir(home.path())
        .stderr(std::fs::File::create(home.path().join("client.err")).unwrap())
        .output()
        .unwrap();
    lines_of(home, out)
}

fn lines_of(home: &Home, out: std::process::Output) -> Vec<Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = std::fs::read_to_string(home.path().join("client.err")).unwrap_or_default();
    let tail: String = err
        .chars()
        .rev()
        .take(6000)
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    assert!(
        out.status.success(),
        "the client failed ({:?}):\n{stdout}\n{tail}\nbridge log:\n{}",
        out.status,
        home.log_if_any()
    );
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Code that counts its own runs in the session, then calls an `ask`-ruled tool.
const COUNTED: &str = r#"
try:
    runs += 1
except NameError:
    runs = 1
print("BEFORE", runs)
try:
    r = await mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Europe/Paris")
    print("RAN", "Europe/Paris" in str(r))
except PermissionError as e:
    print("DENIED", type(e).__name__, e)
print("AFTER", runs)
"#;

fn step(code: &str, answers: Value) -> Value {
    json!({"code": code, "servers": ["time"], "answers": answers})
}

fn text(s: &Value) -> &str {
    s["text"].as_str().unwrap_or("")
}

fn asks(s: &Value) -> usize {
    s["asked"].as_array().map_or(0, Vec::len)
}

/// The shared scenario: allow once, allow for the session (then no question), and after a reset
/// (a new interpreter forgets the grant) deny; the counter proves the code before each pause
/// ran exactly once and its output is in the result.
fn assert_approval_rounds(steps: &[Value], protocol: &str) {
    assert_eq!(steps.len(), 4, "{steps:#?}");
    for s in steps {
        assert_eq!(s["protocol"], protocol, "{s:#}");
    }
    let q = &steps[0]["asked"][0];
    let message = q["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the tool \"convert_time\" of the MCP server \"time\""),
        "{message}"
    );
    let choices: Vec<&str> = q["schema"]["properties"]["decision"]["oneOf"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["title"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        choices,
        ["Allow once", "Allow for this session", "Deny"],
        "{q:#}"
    );
    for (s, n) in steps.iter().zip([1, 2, 3, 1]) {
        let t = text(s);
        assert_eq!(t.matches("BEFORE").count(), 1, "{t}");
        assert!(
            t.contains(&format!("BEFORE {n}")),
            "the code ran twice or was lost: {t}"
        );
        assert!(t.contains(&format!("AFTER {n}")), "{t}");
    }
    assert_eq!(asks(&steps[0]), 1, "{:#}", steps[0]);
    assert!(text(&steps[0]).contains("RAN True"), "{:#}", steps[0]);
    assert_eq!(asks(&steps[1]), 1, "{:#}", steps[1]);
    assert!(text(&steps[1]).contains("RAN True"), "{:#}", steps[1]);
    assert_eq!(
        asks(&steps[2]),
        0,
        "allowed for the session: {:#}",
        steps[2]
    );
    assert!(text(&steps[2]).contains("RAN True"), "{:#}", steps[2]);
    assert_eq!(asks(&steps[3]), 1, "{:#}", steps[3]);
    assert!(
        text(&steps[3]).contains("DENIED ToolDenied The user denied the call time.convert_time"),
        "{:#}",
        steps[3]
    );
}

fn approval_steps() -> Value {
    let mut last = step(COUNTED, json!(["deny"]));
    last["reset"] = json!(true);
    json!([
        step(COUNTED, json!(["allow_once"])),
        step(COUNTED, json!(["allow_session"])),
        step(COUNTED, json!([])),
        last,
    ])
}

const POLICY: &str = "[policy]\nask = [\"time.convert_*\"]\n";

#[test]
fn the_python_sdks_default_client_is_asked_by_input_required_over_stdio() {
    let home = home_with(POLICY);
    let got = python(&home, "auto", common::BIN, approval_steps(), &[]);
    assert_approval_rounds(&got, "2026-07-28");
    // The audit log says which path decided each time.
    let asks: Vec<(String, String)> = audit_tool_calls(&home)
        .iter()
        .map(|r| {
            (
                r["decision"].as_str().unwrap_or("").into(),
                r["ask"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    let want = [
        ("ask:allowed", "input_required"),
        ("ask:allowed", "input_required"),
        ("ask:allowed", "session_grant"),
        ("ask:denied", "input_required"),
    ]
    .map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(asks, want, "{asks:?}");
}

/// The same client in legacy mode (2025-11-25): the questions are `elicitation/create` requests,
/// as before, and the audit log says so.
#[test]
fn the_python_sdks_legacy_client_is_asked_by_elicitation() {
    let home = home_with(POLICY);
    let got = python(&home, "legacy", common::BIN, approval_steps(), &[]);
    assert_approval_rounds(&got, "2025-11-25");
    let paths: Vec<String> = audit_tool_calls(&home)
        .iter()
        .map(|r| r["ask"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        paths,
        ["elicitation", "elicitation", "session_grant", "elicitation"]
    );
}

/// Several questions in one execution are one round each, and "allow for this session" ends
/// them for that tool; the code between the questions runs once.
#[test]
fn a_loop_of_asked_calls_is_one_round_each() {
    let home = home_with(POLICY);
    let code = r#"
seen = []
for i in range(4):
    seen.append(i)
    try:
        await mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Europe/Paris")
        print("call", i, "RAN")
    except PermissionError:
        print("call", i, "DENIED")
print("SEEN", seen)
"#;
    let got = python(
        &home,
        "auto",
        common::BIN,
        json!([step(code, json!(["allow_once", "deny", "allow_session"]))]),
        &[],
    );
    let t = text(&got[0]);
    assert_eq!(asks(&got[0]), 3, "{:#}", got[0]);
    for line in [
        "call 0 RAN",
        "call 1 DENIED",
        "call 2 RAN",
        "call 3 RAN",
        "SEEN [0, 1, 2, 3]",
    ] {
        assert!(t.contains(line), "{line:?} not in {t}");
    }
}

/// A host that declares no elicitation cannot be asked: `ask_fallback` decides, and the audit
/// log says it was the fallback.
#[test]
fn a_2026_client_without_elicitation_gets_the_fallback() {
    let home = home_with(&format!("{POLICY}ask_fallback = \"deny\"\n"));
    let got = python(
        &home,
        "auto",
        common::BIN,
        json!([step(COUNTED, json!([]))]),
        &["--no-elicit"],
    );
    assert_eq!(got[0]["protocol"], "2026-07-28");
    assert_eq!(asks(&got[0]), 0);
    assert!(text(&got[0]).contains("cannot be asked"), "{:#}", got[0]);
    let calls = audit_tool_calls(&home);
    assert_eq!(calls[0]["ask"], "fallback", "{calls:?}");
    assert_eq!(calls[0]["decision"], "ask:unavailable", "{calls:?}");
}

/// An upstream server's own question reaches a 2026-07-28 client as a round, answered and
/// declined.
#[test]
fn a_servers_question_reaches_a_2026_client_as_a_round() {
    let home = home_with("");
    let code = "r = await mcp_everything.trigger_elicitation_request()\nprint(r)";
    let answer = json!({"action": "accept", "content": {"name": "Ada Lovelace", "check": true, "integer": 7}});
    let got = python(
        &home,
        "auto",
        common::BIN,
        json!([
            {"code": code, "servers": ["everything"], "answers": [answer]},
            {"code": code, "servers": ["everything"], "answers": ["decline"]},
        ]),
        &[],
    );
    assert_eq!(asks(&got[0]), 1, "{:#}", got[0]);
    let message = got[0]["asked"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("MCP server 'everything' asks: "),
        "{message}"
    );
    assert!(text(&got[0]).contains("Name: Ada Lovelace"), "{:#}", got[0]);
    assert_eq!(asks(&got[1]), 1, "{:#}", got[1]);
    assert!(
        text(&got[1]).to_lowercase().contains("declined"),
        "{:#}",
        got[1]
    );
}

/// A forged `requestState` and a replayed one are refused and change nothing; a client that
/// abandons a paused call leaves it to its deadline, after which the session serves again with
/// its state.
#[test]
fn forged_replayed_and_abandoned_request_states() {
    let home = home_with(POLICY);
    let got = python(
        &home,
        "auto",
        common::BIN,
        json!([
            {"code": COUNTED, "servers": ["time"], "manual": "forge"},
            {"code": COUNTED, "servers": ["time"], "manual": "replay"},
            {"code": COUNTED, "servers": ["time"], "manual": "abandon", "timeout": 4},
            {"code": "print('RUNS', runs)", "answers": []},
        ]),
        &[],
    );
    let forged = &got[0];
    let errors = forged["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{forged:#}");
    for e in errors {
        assert!(
            e.as_str().unwrap().contains("requestState is unknown"),
            "{forged:#}"
        );
    }
    assert!(
        text(forged).contains("BEFORE 1") && text(forged).contains("RAN True"),
        "{forged:#}"
    );
    let replayed = &got[1];
    assert!(
        text(replayed).contains("BEFORE 2") && text(replayed).contains("RAN True"),
        "{replayed:#}"
    );
    let errors = replayed["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{replayed:#}");
    assert!(
        errors[0]
            .as_str()
            .unwrap()
            .contains("requestState is unknown"),
        "{replayed:#}"
    );
    // Abandoned at its question: its code ran up to the question (runs = 3) and was stopped at
    // its 4 s deadline; the next call of the session runs after it, in the same interpreter.
    assert!(text(&got[3]).contains("RUNS 3"), "{:#}", got[3]);
    let calls = audit_tool_calls(&home);
    assert_eq!(calls.len(), 3, "{calls:#?}");
    assert_eq!(calls[2]["status"], "denied", "{calls:#?}");
    assert_eq!(calls[2]["ask"], "unanswered", "{calls:#?}");
}

/// The TypeScript client 2.x in auto mode (2026-07-28) over stdio, and in legacy mode
/// (2025-11-25, `elicitation/create`), asked the same questions.
#[test]
fn the_typescript_client_is_asked_in_both_revisions_over_stdio() {
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let home = home_with(POLICY);
        let got = typescript(
            &home,
            mode,
            common::BIN,
            json!([
                step(COUNTED, json!(["allow_once"])),
                step(COUNTED, json!(["deny"]))
            ]),
            None,
        );
        assert_eq!(got.len(), 2, "{mode}: {got:#?}");
        for (i, s) in got.iter().enumerate() {
            assert_eq!(s["protocol"], protocol, "{mode}: {s:#}");
            assert_eq!(asks(s), 1, "{mode}: {s:#}");
            assert!(
                text(s).contains(&format!("BEFORE {}", i + 1)),
                "{mode}: {s:#}"
            );
            assert_eq!(text(s).matches("BEFORE").count(), 1, "{mode}: {s:#}");
        }
        assert!(text(&got[0]).contains("RAN True"), "{mode}: {:#}", got[0]);
        assert!(
            text(&got[1]).contains("DENIED ToolDenied"),
            "{mode}: {:#}",
            got[1]
        );
    }
}

/// Over HTTP (`serve`): the Python SDK's default client and the TypeScript client in auto mode
/// are asked by rounds; another identity's `requestState` is unknown to it, and the owner's
/// retry still works after that.
#[test]
fn rounds_over_http_are_kept_to_their_identity() {
    let home = home_with(POLICY);
    let tokens = home.path().join("tokens").display().to_string();
    let served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let url = served.url.clone();
    let got = python(
        &served.home,
        "auto",
        &url,
        json!([
            step(COUNTED, json!(["allow_once"])),
            {"code": COUNTED, "servers": ["time"], "manual": "foreign", "peer": BOB},
        ]),
        &["--token", ALICE],
    );
    assert_eq!(got[0]["protocol"], "2026-07-28", "{:#}", got[0]);
    assert!(
        text(&got[0]).contains("BEFORE 1") && text(&got[0]).contains("RAN True"),
        "{:#}",
        got[0]
    );
    let foreign = &got[1];
    let errors = foreign["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{foreign:#}");
    assert!(
        errors[0]
            .as_str()
            .unwrap()
            .contains("requestState is unknown"),
        "{foreign:#}"
    );
    assert!(
        text(foreign).contains("BEFORE 2") && text(foreign).contains("RAN True"),
        "{foreign:#}"
    );
    let ts = typescript(
        &served.home,
        "auto",
        &url,
        json!([step(COUNTED, json!(["allow_once"]))]),
        Some(BOB),
    );
    assert_eq!(ts[0]["protocol"], "2026-07-28", "{:#}", ts[0]);
    assert_eq!(asks(&ts[0]), 1, "{:#}", ts[0]);
    assert!(text(&ts[0]).contains("RAN True"), "{:#}", ts[0]);
}
