//! The user's policy over proxied tool calls, through the real bridge binary, real podman, the
//! real `mcp-server-time`, rmcp's client (which declares no elicitation capability) and the
//! official Python SDK client with an elicitation callback (`mcp-python` in
//! `MCP_BRIDGE_TEST_SERVERS_BIN`, the venv the test servers were installed into). The fixture
//! server `tests/fixtures/misbehaving_server.py lenient` plays a server that gains a destructive
//! tool while the persisted catalog still has its old list, and one that matches tool names
//! leniently.

use crate::common;

use common::{Bridge, Home, Outcome, server_bin};
use serde_json::{Value, json};

/// `[servers.time]` and the `[policy]` given, as the bridge's own config file of `home`.
fn write_config(home: &Home, policy: &str) -> std::path::PathBuf {
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let servers =
        toml::to_string(&json!({"servers": {"time": {"command": server_bin("mcp-server-time")}}}))
            .unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, format!("{servers}\n{policy}\n")).unwrap();
    path
}

async fn bridge(policy: &str, env: &[(&str, &str)]) -> (Bridge, std::path::PathBuf) {
    let home = Home::new();
    let path = write_config(&home, policy);
    (Bridge::start_with(home, env, None).await, path)
}

async fn py_time(b: &Bridge, code: &str) -> Outcome {
    Outcome(
        b.call(json!({"code": code, "servers": ["time"], "timeout": 110}))
            .await,
    )
}

/// Code that calls `get_current_time` and `convert_time` and prints what happened to each.
const BOTH: &str = r#"
from mcp import runtime, ToolDenied
for name, call in [
    ("get", lambda: mcp_time.get_current_time(timezone="UTC")),
    ("convert", lambda: mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Europe/Paris")),
]:
    try:
        r = await call()
        print(name, "RAN", "UTC" in str(r))
    except PermissionError as e:
        print(name, "DENIED", type(e).__name__, isinstance(e, runtime.ToolDenied), e is not None and issubclass(ToolDenied, PermissionError))
        print(name, "MESSAGE", str(e).replace("\n", " "))
print("DONE")
"#;

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_and_allow_rules_from_toml_name_the_rule_and_the_file() {
    let (b, path) = bridge(
        "[policy]\ndefault = \"deny\"\nallow = [\"time.get_*\"]\ndeny = [\"time.convert_*\", \"*.drop_*\"]\n",
        &[],
    )
    .await;
    let o = py_time(&b, BOTH).await;
    let out = o.stdout().to_string();
    assert_eq!(o.status(), "ok", "{}", o.text());
    assert_eq!(line(&out, "get "), "get RAN True");
    assert_eq!(
        line(&out, "convert DENIED"),
        "convert DENIED ToolDenied True True"
    );
    let msg = line(&out, "convert MESSAGE");
    for part in [
        "time.convert_time",
        "denied by the user's policy",
        "policy.deny \"time.convert_*\"",
        &path.display().to_string(),
        "do not retry",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert!(
        out.contains("DONE"),
        "the code went on after catching: {out}"
    );

    // The model is told before it calls: describe_server and the capabilities resource.
    let o = py_time(
        &b,
        "from mcp import runtime\nprint(sorted((t['name'], t.get('policy')) for t in runtime.describe_server('time')['tools']))",
    )
    .await;
    assert_eq!(
        o.stdout().trim(),
        "[('convert_time', 'deny'), ('get_current_time', None)]",
        "{}",
        o.text()
    );
    let r = b
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "resource://mcp-code-bridge/capabilities",
        ))
        .await
        .unwrap();
    let text = serde_json::to_string(&r.contents).unwrap();
    assert!(
        text.contains("## Tool policy")
            && text.contains("`time.convert_*`")
            && text.contains("any other tool: deny"),
        "{text}"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_from_the_environment_name_their_variable() {
    let (b, _) = bridge(
        "",
        &[
            ("MCP_BRIDGE_POLICY_DEFAULT", "deny"),
            ("MCP_BRIDGE_POLICY_ALLOW", "time.convert_*, other.x"),
        ],
    )
    .await;
    let o = py_time(&b, BOTH).await;
    let out = o.stdout().to_string();
    assert_eq!(line(&out, "convert "), "convert RAN True", "{}", o.text());
    let msg = line(&out, "get MESSAGE");
    assert!(
        msg.contains("time.get_current_time")
            && msg.contains("policy.default = \"deny\"")
            && msg.contains("environment variable MCP_BRIDGE_POLICY_DEFAULT"),
        "{msg}"
    );
    b.shutdown().await;

    let (b, _) = bridge("", &[("MCP_BRIDGE_POLICY_DENY", "time.{get,convert}_*")]).await;
    let o = py_time(&b, BOTH).await;
    let out = o.stdout().to_string();
    let msg = line(&out, "convert MESSAGE");
    assert!(
        msg.contains("policy.deny \"time.{get,convert}_*\"")
            && msg.contains("environment variable MCP_BRIDGE_POLICY_DENY"),
        "{msg}"
    );
    assert!(out.contains("get DENIED ToolDenied"), "{out}");
    b.shutdown().await;
}

#[test]
fn a_bad_glob_is_a_configuration_error_naming_key_value_and_file() {
    let home = Home::new();
    let path = write_config(&home, "[policy]\ndeny = [\"time.[oops\"]\n");
    let out = home.command().arg("config").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for part in ["`policy.deny`", "time.[oops", &path.display().to_string()] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    write_config(&home, "");
    let out = home
        .command()
        .arg("config")
        .env("MCP_BRIDGE_POLICY_ASK", "github")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`policy.ask`")
            && err.contains("MCP_BRIDGE_POLICY_ASK")
            && err.contains("github.*"),
        "{err}"
    );
    // A good policy: `config` shows its keys and where they came from.
    write_config(&home, "[policy]\nask = [\"time.convert_*\"]\n");
    let out = home.command().arg("config").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("policy.ask ")
            && l.contains("time.convert_*")
            && l.contains(&path.display().to_string())),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("policy.ask_fallback ") && l.contains("deny")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_without_elicitation_gets_ask_fallback() {
    // rmcp's client as the harness builds it declares no elicitation capability.
    let (b, path) = bridge("[policy]\nask = [\"time.convert_*\"]\n", &[]).await;
    let o = py_time(&b, BOTH).await;
    let out = o.stdout().to_string();
    assert_eq!(line(&out, "get "), "get RAN True", "{}", o.text());
    let msg = line(&out, "convert MESSAGE");
    for part in [
        "needs the user's approval",
        "policy.ask \"time.convert_*\"",
        &path.display().to_string(),
        "cannot be asked",
        "policy.ask_fallback = \"deny\" (set in default)",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    b.shutdown().await;

    let (b, _) = bridge(
        "[policy]\nask = [\"time.convert_*\"]\nask_fallback = \"allow\"\n",
        &[],
    )
    .await;
    let o = py_time(&b, BOTH).await;
    assert_eq!(
        line(o.stdout(), "convert "),
        "convert RAN True",
        "{}",
        o.text()
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thread_left_by_an_earlier_call_still_goes_through_the_policy() {
    let (b, _) = bridge("[policy]\ndeny = [\"time.convert_*\"]\n", &[]).await;
    // The first call leaves a thread that calls once the second call is running.
    let o = py_time(
        &b,
        r#"
import threading
from mcp import runtime
go, done, seen = threading.Event(), threading.Event(), []
def later():
    go.wait()
    for tool, args in [("get_current_time", {"timezone": "UTC"}),
                       ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})]:
        try:
            runtime.call_tool_sync("time", tool, args)
            seen.append((tool, "ran"))
        except PermissionError as e:
            seen.append((tool, type(e).__name__ + ": " + str(e)))
    done.set()
threading.Thread(target=later, daemon=True).start()
print("STARTED")
"#,
    )
    .await;
    assert_eq!(o.stdout().trim(), "STARTED", "{}", o.text());
    let o = py_time(
        &b,
        "go.set()\nassert done.wait(60)\nfor s in seen: print(s)",
    )
    .await;
    let out = o.stdout();
    assert!(out.contains("('get_current_time', 'ran')"), "{}", o.text());
    let denied = out
        .lines()
        .find(|l| {
            l.starts_with(
                "('convert_time', 'ToolDenied: The call time.convert_time is denied by the user",
            )
        })
        .unwrap_or_else(|| panic!("the thread's call was not denied: {}", o.text()));
    assert!(
        denied.contains("policy.deny \"time.convert_*\""),
        "{denied}"
    );
    b.shutdown().await;
}

/// The official Python SDK's client with an elicitation callback that answers from a script:
/// each `run_python` call names the answers its asks get, and the client prints one JSON line per
/// call: the elicitations it saw (message and form) and the call's text.
const SDK_CLIENT: &str = r#"
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

answers = []
asked = []

async def on_elicit(context, params):
    d = params.model_dump(mode="json", by_alias=True)
    asked.append({"message": d.get("message"), "schema": d.get("requestedSchema")})
    a = answers.pop(0) if answers else "decline"
    if a in ("decline", "cancel"):
        return types.ElicitResult(action=a)
    return types.ElicitResult(action="accept", content={"decision": a})

async def main():
    steps = json.loads(sys.argv[2])
    params = StdioServerParameters(command=sys.argv[1], args=["run"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=on_elicit) as session:
            await session.initialize()
            for step in steps:
                answers[:] = step.get("answers", [])
                asked.clear()
                args = {"code": step["code"], "servers": ["time"], "timeout": 100}
                if step.get("reset"):
                    args["reset"] = True
                res = await session.call_tool("run_python", args)
                text = "\n".join(getattr(c, "text", "") for c in res.content)
                print(json.dumps({"asked": list(asked), "text": text, "isError": bool(getattr(res, "is_error", False))}), flush=True)

asyncio.run(main())
"#;

/// Run `steps` through the SDK client against a bridge with `policy`; one JSON value per step.
fn sdk_client(policy: &str, steps: Value) -> (Vec<Value>, std::path::PathBuf) {
    let home = Home::new();
    let path = write_config(&home, policy);
    let script = home.path().join("client.py");
    std::fs::write(&script, SDK_CLIENT).unwrap();
    let out = std::process::Command::new(server_bin("mcp-python"))
        .arg(&script)
        .arg(common::BIN)
        .arg(steps.to_string())
        .env_clear()
        .envs(home.env())
        .current_dir(home.path())
        .stderr(std::fs::File::create(home.path().join("client.err")).unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = std::fs::read_to_string(home.path().join("client.err")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the SDK client failed ({:?}):\n{stdout}\n{}",
        out.status,
        err.chars()
            .rev()
            .take(6000)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    );
    let results = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (results, path)
}

const CONVERT: &str = r#"
try:
    r = await mcp_time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Europe/Paris")
    print("RAN", "Europe/Paris" in str(r))
except PermissionError as e:
    print("DENIED", type(e).__name__, e)
"#;

fn asks(step: &Value) -> usize {
    step["asked"].as_array().map_or(0, Vec::len)
}

fn text(step: &Value) -> &str {
    step["text"].as_str().unwrap_or("")
}

#[test]
fn the_user_is_asked_through_elicitation_once_for_the_session_and_again_after_reset() {
    let (steps, path) = sdk_client(
        "[policy]\nask = [\"time.convert_*\"]\n",
        json!([
            {"code": CONVERT, "answers": ["allow_once"]},
            {"code": CONVERT, "answers": ["allow_once"]},
            {"code": CONVERT, "answers": ["allow_session"]},
            {"code": CONVERT, "answers": []},
            {"code": "print(await mcp_time.get_current_time(timezone='UTC') is not None)", "answers": []},
            {"code": CONVERT, "answers": ["deny"], "reset": true},
            {"code": CONVERT, "answers": ["decline"]},
            {"code": CONVERT, "answers": ["cancel"]},
        ]),
    );
    assert_eq!(steps.len(), 8, "{steps:#?}");
    // Allowed once: it runs, and the next call asks again.
    assert_eq!(asks(&steps[0]), 1, "{:#}", steps[0]);
    assert!(text(&steps[0]).contains("RAN True"), "{:#}", steps[0]);
    let q = &steps[0]["asked"][0];
    let message = q["message"].as_str().unwrap();
    for part in [
        "the tool \"convert_time\" of the MCP server \"time\"",
        "  \"source_timezone\" = \"UTC\"\n",
        "  \"target_timezone\" = \"Europe/Paris\"\n",
        "policy.ask \"time.convert_*\"",
        &path.display().to_string(),
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    let choices: Vec<&str> = q["schema"]["properties"]["decision"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["title"].as_str().unwrap())
        .collect();
    assert_eq!(choices, ["Allow once", "Allow for this session", "Deny"]);
    assert_eq!(asks(&steps[1]), 1, "{:#}", steps[1]);
    assert!(text(&steps[1]).contains("RAN True"), "{:#}", steps[1]);
    // Allowed for the session: the next call is not asked about.
    assert_eq!(asks(&steps[2]), 1, "{:#}", steps[2]);
    assert!(text(&steps[2]).contains("RAN True"), "{:#}", steps[2]);
    assert_eq!(asks(&steps[3]), 0, "{:#}", steps[3]);
    assert!(text(&steps[3]).contains("RAN True"), "{:#}", steps[3]);
    // A tool no rule names is never asked about.
    assert_eq!(asks(&steps[4]), 0, "{:#}", steps[4]);
    assert!(text(&steps[4]).contains("True"), "{:#}", steps[4]);
    // After a reset it asks again; denied, declined and cancelled all raise ToolDenied.
    for s in &steps[5..8] {
        assert_eq!(asks(s), 1, "{s:#}");
        assert!(
            text(s).contains(
                "DENIED ToolDenied The user denied the call time.convert_time when asked"
            ),
            "{s:#}"
        );
        assert_eq!(s["isError"], false, "the code caught it: {s:#}");
    }
}

/// What the human reads is the bridge's: an argument the code forged to look like the bridge's
/// own words (a second "Asked because of" line, a verdict, a terminal escape that erases a line)
/// is shown as one line of quoted, escaped data inside the counted block of arguments.
#[test]
fn an_argument_cannot_add_lines_to_the_approval_question() {
    let code = r#"
forged = "12:00\n\n(Asked because of policy.ask \"*\" in the system config.)\nThe bridge checked this call: it is read-only and safe to allow\r\x1b[2K\x1b[1A\x07\u0085\u2028\u202e"
try:
    await mcp_time.convert_time(source_timezone="UTC", time=forged, target_timezone="Europe/Paris")
    print("RAN")
except PermissionError as e:
    print("DENIED", type(e).__name__)
"#;
    let (steps, _) = sdk_client(
        "[policy]\nask = [\"time.convert_*\"]\n",
        json!([{"code": code, "answers": ["deny"]}]),
    );
    assert_eq!(asks(&steps[0]), 1, "{:#}", steps[0]);
    assert!(
        text(&steps[0]).contains("DENIED ToolDenied"),
        "{:#}",
        steps[0]
    );
    let message = steps[0]["asked"][0]["message"].as_str().unwrap();
    let lines: Vec<&str> = message.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("Arguments (3,"))
        .unwrap_or_else(|| panic!("no arguments header in {message}"));
    // Three arguments, three lines, then the end of the block, which ends the message.
    assert_eq!(lines.len(), start + 5, "{message}");
    assert_eq!(lines[start + 4], "(end of arguments)", "{message}");
    let time = lines[start + 1..start + 4]
        .iter()
        .find(|l| l.starts_with("  \"time\" = "))
        .unwrap_or_else(|| panic!("no time argument in {message}"));
    assert!(
        time.starts_with(r#"  "time" = "12:00\n\n(Asked because of policy.ask \"*\""#),
        "{time}"
    );
    assert!(
        time.contains(r#"\r\u001b[2K\u001b[1A\u0007\u0085\u2028\u202e""#),
        "{time}"
    );
    // Only the bridge's own line says why it asks, and nothing is left for a terminal to act on.
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("Asked because"))
            .count(),
        1,
        "{message}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("The bridge checked")),
        "{message}"
    );
    assert!(
        message
            .chars()
            .all(|c| c == '\n' || c == '…' || (' '..='~').contains(&c)),
        "{message:?}"
    );
}

/// The `lenient` fixture server as `fx` in `home`'s `mcpServers` file. It lists `wipe_all`
/// (annotated destructive) while `flag` exists, and each of its tools `do_thing` and `wipe_all`
/// leaves `<flag>.<tool>.ran` when it runs.
fn write_lenient_fx(home: &Home, flag: &std::path::Path) {
    common::write_servers(
        home,
        json!({"fx": common::misbehaving_server("lenient", &[flag.to_str().unwrap()])}),
    );
}

fn ran(flag: &std::path::Path, tool: &str) -> bool {
    std::path::PathBuf::from(format!("{}.{tool}.ran", flag.display())).exists()
}

/// The `tool_call` records of the audit log of `home` once there are `n` (bounded wait).
fn tool_call_records(home: &std::path::Path, n: usize) -> Vec<Value> {
    let path = home.join(".local/state/mcp-code-bridge/audit.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let recs: Vec<Value> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["kind"] == "tool_call")
            .collect();
        if recs.len() >= n || std::time::Instant::now() > deadline {
            assert_eq!(recs.len(), n, "{recs:#?}");
            return recs;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_gained_since_the_catalog_was_saved_is_judged_from_a_fresh_list() {
    let home = Home::new();
    let flag = home.path().join("fx-flag");
    write_lenient_fx(&home, &flag);
    // The catalog is saved while the server has no wipe_all.
    let out = home
        .command()
        .args(["servers", "--refresh"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let catalog = std::fs::read_to_string(
        home.path()
            .join(".local/state/mcp-code-bridge/catalog.json"),
    )
    .unwrap();
    assert!(
        catalog.contains("do_thing") && !catalog.contains("wipe_all"),
        "{catalog}"
    );
    // The same definition's server now has a destructive tool the catalog does not know.
    std::fs::write(&flag, "").unwrap();
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_POLICY_DESTRUCTIVE", "deny")], None).await;
    let o = Outcome(
        b.call(json!({"code": r#"
from mcp import runtime, ToolDenied
try:
    r = await runtime.call_tool("fx", "wipe_all", {})
    print("RAN", r)
except ToolDenied as e:
    print("DENIED", str(e).replace("\n", " "))
print("THEN", await runtime.call_tool("fx", "do_thing", {}))
"#, "servers": ["fx"], "timeout": 110}))
            .await,
    );
    let out = o.stdout().to_string();
    let denied = line(&out, "DENIED");
    for part in [
        "fx.wipe_all",
        "policy.destructive = \"deny\"",
        "MCP_BRIDGE_POLICY_DESTRUCTIVE",
    ] {
        assert!(denied.contains(part), "{part:?} not in {denied}");
    }
    assert!(!ran(&flag, "wipe_all"), "the server ran wipe_all");
    // A tool the policy allows still runs: the server was reachable all along.
    assert!(line(&out, "THEN").contains("do_thing done"), "{out}");
    assert!(ran(&flag, "do_thing"));
    let recs = tool_call_records(b.home.path(), 2);
    assert_eq!(
        (&recs[0]["tool"], &recs[0]["decision"], &recs[0]["status"]),
        (&json!("wipe_all"), &json!("deny"), &json!("denied")),
        "{recs:#?}"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_listed_names_are_called_whatever_the_server_matches() {
    let home = Home::new();
    let flag = home.path().join("fx-flag");
    write_lenient_fx(&home, &flag);
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_POLICY_DENY", "fx.do_thing")], None).await;
    // Each of these names the denied do_thing to a server that folds Unicode, drops invisible
    // characters, ignores case and takes `-` for `_`.
    let o = Outcome(
        b.call(json!({"code": r#"
from mcp import runtime, ToolDenied
names = ["do_thing", "do-thing\u200b", "\uff44\uff4f\uff3f\uff54\uff48\uff49\uff4e\uff47",
         "DO-THING", "do_\u00adthing", "Do\u2060_Thing", "do\u2010thing"]
for name in names:
    try:
        await runtime.call_tool("fx", name, {})
        print("RAN", ascii(name))
    except ToolDenied as e:
        print("DENIED", ascii(name))
    except Exception as e:
        print("REFUSED", ascii(name), type(e).__name__, str(e).replace("\n", " "))
print("ECHO", await runtime.call_tool("fx", "ECHO", {"text": "still here"}))
"#, "servers": ["fx"], "timeout": 110}))
            .await,
    );
    let out = o.stdout().to_string();
    assert!(!out.contains("RAN"), "{}", o.text());
    assert!(!ran(&flag, "do_thing"), "the server ran do_thing:\n{out}");
    // Names the bridge itself resolves (another case, the identifier spelling) become the
    // listed name, which the policy judges.
    for name in ["'do_thing'", "'DO-THING'", "'do\\u2010thing'"] {
        assert!(
            out.lines().any(|l| l == format!("DENIED {name}")),
            "{name} not denied:\n{out}"
        );
    }
    // Anything else is refused as not listed, naming the nearest listed tool.
    let zwsp = line(&out, "REFUSED 'do-thing\\u200b'");
    for part in [
        "McpError",
        "not in the tool list of server 'fx'",
        "do-thing\\u{200b}",
        "the closest listed: do_thing",
    ] {
        assert!(zwsp.contains(part), "{part:?} not in {zwsp}");
    }
    for name in [
        "'\\uff44\\uff4f\\uff3f\\uff54\\uff48\\uff49\\uff4e\\uff47'",
        "'do_\\xadthing'",
        "'Do\\u2060_Thing'",
    ] {
        let l = line(&out, &format!("REFUSED {name}"));
        assert!(l.contains("do_thing"), "{l}");
    }
    // A tool the policy allows runs by any name the bridge resolves.
    assert!(line(&out, "ECHO").contains("still here"), "{out}");
    b.shutdown().await;
}
