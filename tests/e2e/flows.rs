//! `[policy.flows]` through the real bridge binary, real podman and a fixture bank
//! (`tests/fixtures/flows_server.py`: `read_mail` returns a mail whose body carries an injected
//! IBAN, `send_money` writes each transfer it makes to a file). The placements of issue 59: the
//! same script taking the attacker's IBAN from the mail, a literal of a clean model, a later
//! literal after a reply showed the mail, and a script that returns only a count; both
//! `on_suspect` choices (deny with rmcp's client, ask with the official Python SDK client and
//! its elicitation callback).

use crate::common;

use common::{Bridge, Home, Outcome, server_bin};
use serde_json::{Value, json};

/// The attacker's IBAN, as the mail writes it and as a script cleans it.
const ATTACKER: &str = "GB29NWBK60161331926819";
/// The IBAN the user gave.
const USERS: &str = "DE89370400440532013000";

/// `[servers.bank]` (the fixture, writing transfers to `<home>/transfers.jsonl`) and `flows` as
/// the bridge's config file of `home`; the transfers file.
fn write_config(home: &Home, flows: &str) -> std::path::PathBuf {
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let transfers = home.path().join("transfers.jsonl");
    let servers = toml::to_string(&json!({"servers": {"bank": {
        "command": "python3",
        "args": [common::fixture("flows_server.py").display().to_string(), transfers.display().to_string()],
    }}}))
    .unwrap();
    std::fs::write(dir.join("config.toml"), format!("{servers}\n{flows}\n")).unwrap();
    transfers
}

const FLOWS: &str = r#"[policy.flows]
enabled = true
untrusted = ["bank.read_mail"]
acting = ["bank.send_money"]
guard = { "bank.send_money" = ["recipient", "amount"] }
"#;

/// Reads the mail, takes the IBAN the injection names, and sends to it.
const SAME_SCRIPT: &str = r#"
import re
m = str(await mcp_bank.read_mail())
iban = re.search(r"IBAN ([A-Z0-9 ]+?) now", m).group(1).replace(" ", "")
try:
    await mcp_bank.send_money(recipient=iban, amount=5, subject="rent")
    print("SENT")
except PermissionError as e:
    print("DENIED", type(e).__name__, str(e).replace("\n", " "))
"#;

fn send_literal(iban: &str) -> String {
    format!(
        "try:\n    await mcp_bank.send_money(recipient={iban:?}, amount=5, subject=\"rent\")\n    print(\"SENT\")\nexcept PermissionError as e:\n    print(\"DENIED\", type(e).__name__, str(e).replace(\"\\n\", \" \"))\n"
    )
}

async fn py(b: &Bridge, code: &str) -> Outcome {
    Outcome(
        b.call(json!({"code": code, "servers": ["bank"], "timeout": 110}))
            .await,
    )
}

fn transfers(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_stops_the_injected_iban_in_every_placement_and_lets_the_users_through() {
    let home = Home::new();
    let path = write_config(&home, &format!("{FLOWS}on_suspect = \"deny\"\n"));
    let b = Bridge::start_with(home, &[], None).await;

    // The model is told which tools are guarded.
    let o = py(
        &b,
        "from mcp import runtime\nprint(sorted((t['name'], t['flows']['labels'], t['flows']['guarded']) for t in runtime.describe_server('bank')['tools'] if 'flows' in t))",
    )
    .await;
    assert_eq!(
        o.stdout().trim(),
        "[('post_review', ['untrusted', 'acting', 'open'], 'all'), ('read_mail', ['untrusted'], None), ('send_money', ['acting'], ['recipient', 'amount'])]",
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
    let caps = serde_json::to_string(&r.contents).unwrap();
    assert!(
        caps.contains("## Flows")
            && caps.contains("- acting: `bank.send_money`")
            && caps.contains("refused"),
        "{caps}"
    );

    // (b) A literal the user gave, written by a clean model, runs unasked, mail read or not.
    let o = py(
        &b,
        &format!("m = await mcp_bank.read_mail()\n{}", send_literal(USERS)),
    )
    .await;
    assert_eq!(o.stdout().trim(), "SENT", "{}", o.text());

    // (a) The same script takes the attacker's IBAN from the mail: refused, naming the
    // argument and the tool it came from, never the value (the model would read it).
    let o = py(&b, SAME_SCRIPT).await;
    let out = o.stdout().trim().to_string();
    assert!(out.starts_with("DENIED ToolDenied"), "{}", o.text());
    for part in [
        "bank.send_money",
        "\"recipient\"",
        "bank.read_mail",
        "policy.flows.on_suspect",
        "untrusted",
    ] {
        assert!(out.contains(part), "{part:?} not in {out}");
    }
    assert!(
        !out.contains(ATTACKER),
        "the refusal shows the model the value: {out}"
    );

    // (d) A script that returns only a count keeps the model clean: its next literal (even
    // the attacker's IBAN, which it never saw) is its own.
    let o = py(&b, "m = str(await mcp_bank.read_mail())\nprint(len(m) > 0)").await;
    assert_eq!(o.stdout().trim(), "True", "{}", o.text());
    let o = py(&b, &send_literal(ATTACKER)).await;
    assert_eq!(o.stdout().trim(), "SENT", "{}", o.text());

    // (c) A reply that printed the mail: from now on a literal that the mail holds is suspect,
    // in a new session of the same connection too.
    let o = py(&b, "print(await mcp_bank.read_mail())").await;
    assert!(o.stdout().contains("IGNORE ALL PREVIOUS"), "{}", o.text());
    let o = py(&b, &send_literal(ATTACKER)).await;
    assert!(o.stdout().starts_with("DENIED ToolDenied"), "{}", o.text());
    let o = Outcome(
        b.call(json!({"code": send_literal("GB29 NWBK 6016 1331 9268 19"), "servers": ["bank"], "session": "other", "timeout": 110}))
            .await,
    );
    assert!(o.stdout().starts_with("DENIED ToolDenied"), "{}", o.text());
    // A value the mail does not hold is still the model's own.
    let o = py(&b, &send_literal(USERS)).await;
    assert_eq!(o.stdout().trim(), "SENT", "{}", o.text());

    let sent: Vec<String> = transfers(&path)
        .iter()
        .map(|t| t["recipient"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sent,
        [USERS, ATTACKER, USERS],
        "only the allowed transfers ran"
    );

    // The audit log says what the flow check found, without a value.
    let home = b.shutdown_clean().await;
    let audit = home.path().join(".local/state/mcp-code-bridge/audit.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let records = loop {
        let records: Vec<Value> = std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|r: &Value| r["tool"] == "send_money")
            .collect();
        if records.len() >= 6 || std::time::Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(records.len(), 6, "{records:?}");
    assert_eq!(records[0]["flow"]["decision"], "clean");
    assert_eq!(records[1]["flow"]["decision"], "suspect:deny");
    assert_eq!(records[1]["decision"], "deny");
    assert_eq!(
        records[1]["flow"]["sources"],
        json!(["recipient<-bank.read_mail (untrusted)"])
    );
    assert!(!records.iter().any(|r| r.to_string().contains(ATTACKER)));
}

/// The SDK client: runs each step's code with the bank loaded, answering the bridge's
/// questions from the step's answers; one JSON line per step.
const SDK_CLIENT: &str = r#"
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

answers, asked = [], []

async def on_elicit(context, params):
    d = params.model_dump(mode="json", by_alias=True)
    asked.append(d.get("message"))
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
                res = await session.call_tool("run_python", {"code": step["code"], "servers": ["bank"], "timeout": 100})
                text = "\n".join(getattr(c, "text", "") for c in res.content)
                print(json.dumps({"asked": list(asked), "text": text}), flush=True)

asyncio.run(main())
"#;

#[test]
fn ask_names_argument_value_and_source_and_a_session_grant_covers_that_flow_only() {
    let home = Home::new();
    let path = write_config(&home, FLOWS);
    let script = home.path().join("client.py");
    std::fs::write(&script, SDK_CLIENT).unwrap();
    let amount_from_mail = r#"
import re
m = str(await mcp_bank.read_mail())
try:
    await mcp_bank.send_money(recipient="DE89370400440532013000", amount=int(re.search(r"send (\d+) EUR", m).group(1)))
    print("SENT")
except PermissionError as e:
    print("DENIED")
"#;
    let steps = json!([
        {"code": SAME_SCRIPT, "answers": ["deny"]},
        {"code": SAME_SCRIPT, "answers": ["allow_session"]},
        {"code": SAME_SCRIPT, "answers": []},
        {"code": amount_from_mail, "answers": ["deny"]},
    ]);
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
    assert!(
        out.status.success(),
        "the SDK client failed: {stdout}\n{}",
        std::fs::read_to_string(home.path().join("client.err")).unwrap_or_default()
    );
    let steps: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 4, "{stdout}");
    let asked = |i: usize| steps[i]["asked"].as_array().unwrap().clone();
    let text = |i: usize| steps[i]["text"].as_str().unwrap().to_string();
    // Asked, naming the argument, its value and the tool it came from; denied.
    let q = asked(0);
    assert_eq!(q.len(), 1, "{steps:?}");
    let q = q[0].as_str().unwrap();
    for part in [
        "\"send_money\"",
        "\"bank\"",
        "\"recipient\"",
        &format!("\"{ATTACKER}\""),
        "\"bank.read_mail\"",
        "(end of arguments)",
    ] {
        assert!(q.contains(part), "{part:?} not in {q}");
    }
    assert!(text(0).contains("DENIED ToolDenied"), "{}", text(0));
    // Allowed for the session: that flow runs, and is not asked about again.
    assert!(text(1).contains("SENT"), "{}", text(1));
    assert!(
        asked(2).is_empty() && text(2).contains("SENT"),
        "{:?}",
        steps[2]
    );
    // Another flow of the same tool (the amount, from the mail) is asked about again.
    assert_eq!(asked(3).len(), 1, "{:?}", steps[3]);
    assert!(asked(3)[0].as_str().unwrap().contains("\"amount\""));
    assert!(text(3).contains("DENIED"), "{}", text(3));
    assert_eq!(transfers(&path).len(), 2);
}

/// The same question under 2026-07-28 (the Python SDK's default `Client`): an `input_required`
/// round, answered by the retry; the audit log says which path decided and what the flow was.
#[test]
fn ask_travels_as_input_required_under_2026_07_28() {
    let home = Home::new();
    let path = write_config(&home, FLOWS);
    let steps = json!([
        {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["deny"]},
        {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["allow_once"]},
    ]);
    let got = crate::approvals::python(&home, "auto", common::BIN, steps, &[]);
    assert_eq!(got.len(), 2, "{got:?}");
    for (step, want) in got.iter().zip(["DENIED ToolDenied", "SENT"]) {
        let asked = step["asked"].as_array().unwrap();
        assert_eq!(asked.len(), 1, "{step}");
        let q = asked[0]["message"].as_str().unwrap();
        assert!(
            q.contains("\"recipient\"")
                && q.contains(&format!("\"{ATTACKER}\""))
                && q.contains("\"bank.read_mail\""),
            "{q}"
        );
        assert!(step["text"].as_str().unwrap().contains(want), "{step}");
    }
    assert_eq!(transfers(&path).len(), 1);
    let audit = home.path().join(".local/state/mcp-code-bridge/audit.jsonl");
    let flows: Vec<(String, String)> = std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["tool"] == "send_money")
        .map(|r| {
            (
                r["flow"]["decision"].as_str().unwrap_or("").to_string(),
                r["ask"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        flows,
        [
            (
                "suspect:ask:denied".to_string(),
                "input_required".to_string()
            ),
            (
                "suspect:ask:allowed".to_string(),
                "input_required".to_string()
            ),
        ]
    );
}

/// With only `enabled` and `private` written, the servers' annotations label the rest, and say
/// so; private notes do not leave through an open tool unasked, and a review the model wrote
/// does.
#[tokio::test(flavor = "multi_thread")]
async fn annotations_label_tools_and_private_text_does_not_leave_through_an_open_tool() {
    let home = Home::new();
    let path = write_config(
        &home,
        "[policy.flows]\nenabled = true\nprivate = [\"bank.read_notes\"]\non_suspect = \"deny\"\n",
    );
    let b = Bridge::start_with(home, &[], None).await;
    let o = py(
        &b,
        "from mcp import runtime\nf = {t['name']: t.get('flows') for t in runtime.describe_server('bank')['tools']}\nprint(f['send_money']['labels'], f['send_money']['guarded'], f['send_money']['from']['acting'])\nprint(f['read_mail']['from']['untrusted'])\nprint(f['read_notes']['labels'], f['read_notes']['from']['private'].startswith('policy.flows.private \"bank.read_notes\" ('))",
    )
    .await;
    assert_eq!(
        o.stdout().trim(),
        "['acting'] all annotation destructiveHint\nannotation openWorldHint\n['private'] True",
        "{}",
        o.text()
    );
    let o = py(&b, SAME_SCRIPT).await;
    let out = o.stdout().trim().to_string();
    assert!(
        out.starts_with("DENIED ToolDenied")
            && out.contains("bank.read_mail")
            && out.contains("acting by annotation destructiveHint"),
        "{}",
        o.text()
    );
    let o = py(
        &b,
        "n = str(await mcp_bank.read_notes())\ntry:\n    await mcp_bank.post_review(text='Great bank! ' + n.upper())\n    print('POSTED')\nexcept PermissionError as e:\n    print('DENIED', str(e).replace('\\n', ' '))",
    )
    .await;
    let out = o.stdout().trim().to_string();
    assert!(
        out.starts_with("DENIED")
            && out.contains("bank.read_notes (private)")
            && out.contains("open by annotations"),
        "{}",
        o.text()
    );
    assert!(!out.contains("hunter2"), "{out}");
    let o = py(
        &b,
        "await mcp_bank.post_review(text='Great service, fast transfers.')\nprint('POSTED')",
    )
    .await;
    assert_eq!(o.stdout().trim(), "POSTED", "{}", o.text());
    // The user's own words, written by a clean model, leave though the private notes hold
    // them; once a reply has shown the model the mail, the same literal does not.
    let own = "My pension fund login is hunter2-vault-7781";
    let post_own = format!(
        "try:\n    await mcp_bank.post_review(text={own:?})\n    print('POSTED')\nexcept PermissionError as e:\n    print('DENIED', str(e).replace('\\n', ' '))"
    );
    let o = py(&b, &post_own).await;
    assert_eq!(o.stdout().trim(), "POSTED", "{}", o.text());
    let o = py(&b, "print(await mcp_bank.read_mail())").await;
    assert!(o.stdout().contains("IBAN"), "{}", o.text());
    let o = py(&b, &post_own).await;
    let out = o.stdout().trim().to_string();
    assert!(
        out.starts_with("DENIED") && out.contains("bank.read_notes (private)"),
        "{}",
        o.text()
    );
    assert_eq!(
        transfers(&path),
        [
            json!({"review": "Great service, fast transfers."}),
            json!({"review": own})
        ]
    );
    b.shutdown().await;
}

/// `[policy] ask` on the paying tool beside the flows (`on_suspect` given).
fn policy_and_flows(on_suspect: &str) -> String {
    format!("[policy]\nask = [\"bank.send_money\"]\n\n{FLOWS}on_suspect = \"{on_suspect}\"\n")
}

/// The `send_money` records of the audit log: `(decision, ask, flow decision)`.
fn send_records(home: &Home) -> Vec<(String, String, String)> {
    let audit = home.path().join(".local/state/mcp-code-bridge/audit.jsonl");
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["tool"] == "send_money")
        .map(|r| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (s(&r["decision"]), s(&r["ask"]), s(&r["flow"]["decision"]))
        })
        .collect()
}

fn messages(step: &Value) -> Vec<String> {
    step["asked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["message"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A call the policy asks about whose flow is suspect is one question, in each revision: it
/// names the policy's rule and the suspect argument, its value and source, and its session
/// grant covers the tool and that flow. With `on_suspect = "deny"` the user is not asked about
/// a call the flow refuses anyway; a clean call still gets the policy's own question.
#[test]
fn a_policy_ask_and_a_suspect_flow_are_one_question_and_a_refused_flow_none() {
    let joined = "The policy asks about every call of this tool too";
    for mode in ["auto", "legacy"] {
        let home = Home::new();
        let path = write_config(&home, &policy_and_flows("ask"));
        let steps = json!([
            {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["allow_session"]},
            {"code": SAME_SCRIPT, "servers": ["bank"], "answers": []},
            {"code": send_literal(USERS), "servers": ["bank"], "answers": []},
        ]);
        let got = crate::approvals::python(&home, mode, common::BIN, steps, &[]);
        assert_eq!(got.len(), 3, "{mode}: {got:?}");
        let first = messages(&got[0]);
        assert_eq!(first.len(), 1, "{mode}: one question: {first:?}");
        for part in [
            joined,
            "policy.ask \"bank.send_money\"",
            "\"recipient\"",
            &format!("\"{ATTACKER}\""),
            "\"bank.read_mail\"",
            "(end of arguments)",
        ] {
            assert!(
                first[0].contains(part),
                "{mode}: {part:?} not in {}",
                first[0]
            );
        }
        for (i, step) in got.iter().enumerate() {
            assert!(
                step["text"].as_str().unwrap().contains("SENT"),
                "{mode} step {i}: {step}"
            );
        }
        assert!(messages(&got[1]).is_empty(), "{mode}: {:?}", got[1]);
        assert!(messages(&got[2]).is_empty(), "{mode}: {:?}", got[2]);
        assert_eq!(transfers(&path).len(), 3, "{mode}");
        let how = if mode == "auto" {
            "input_required"
        } else {
            "elicitation"
        };
        let r = send_records(&home);
        assert_eq!(r.len(), 3, "{mode}: {r:?}");
        assert_eq!(
            r[0],
            (
                "ask:allowed".into(),
                how.into(),
                "suspect:ask:allowed".into()
            ),
            "{mode}"
        );
        assert_eq!(r[1].2, "suspect:session_grant", "{mode}: {r:?}");
        assert_eq!(r[2].2, "clean", "{mode}: {r:?}");

        // deny: the injected IBAN is refused unasked; the user's own is asked about by the
        // policy alone.
        let home = Home::new();
        let path = write_config(&home, &policy_and_flows("deny"));
        let steps = json!([
            {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["allow_once"]},
            {"code": send_literal(USERS), "servers": ["bank"], "answers": ["allow_once"]},
        ]);
        let got = crate::approvals::python(&home, mode, common::BIN, steps, &[]);
        assert_eq!(got.len(), 2, "{mode}: {got:?}");
        assert!(messages(&got[0]).is_empty(), "{mode}: {:?}", got[0]);
        let text = got[0]["text"].as_str().unwrap();
        assert!(text.contains("DENIED ToolDenied"), "{mode}: {text}");
        assert!(!text.contains(ATTACKER), "{mode}: {text}");
        let second = messages(&got[1]);
        assert_eq!(second.len(), 1, "{mode}: {second:?}");
        assert!(!second[0].contains(joined), "{mode}: {}", second[0]);
        assert!(got[1]["text"].as_str().unwrap().contains("SENT"), "{mode}");
        let sent = transfers(&path);
        assert_eq!(sent.len(), 1, "{mode}: {sent:?}");
        assert_eq!(sent[0]["recipient"], USERS, "{mode}");
    }
}

/// Over Streamable HTTP (`serve`, an identity by bearer token), with the Python SDK's default
/// client: the flows' question travels as `input_required` and its answer decides.
#[test]
fn ask_about_a_flow_travels_over_http() {
    let home = Home::new();
    let path = write_config(&home, FLOWS);
    let token = "carol-0123456789abcdef0123";
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("carol:{token}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let tokens = tokens.display().to_string();
    let served = common::served::Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let url = served.url.clone();
    let got = crate::approvals::python(
        &served.home,
        "auto",
        &url,
        json!([
            {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["deny"]},
            {"code": SAME_SCRIPT, "servers": ["bank"], "answers": ["allow_once"]},
        ]),
        &["--token", token],
    );
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["protocol"], "2026-07-28", "{:#}", got[0]);
    for (step, want) in got.iter().zip(["DENIED ToolDenied", "SENT"]) {
        let q = messages(step);
        assert_eq!(q.len(), 1, "{step}");
        assert!(
            q[0].contains("\"recipient\"") && q[0].contains(&format!("\"{ATTACKER}\"")),
            "{}",
            q[0]
        );
        assert!(step["text"].as_str().unwrap().contains(want), "{step}");
    }
    assert_eq!(transfers(&path).len(), 1);
}

/// `doctor` says whether flows are checked, and by which labels.
#[test]
fn doctor_says_what_flows_check() {
    let home = Home::new();
    let _ = write_config(&home, &format!("{FLOWS}on_suspect = \"deny\"\n"));
    let out = home.command().args(["doctor", "--quick"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "flows: on_suspect deny; untrusted bank.read_mail; acting bank.send_money; 1 guard rule(s); annotations on"
        ),
        "{text}"
    );
    let off = Home::new();
    let out = off.command().args(["doctor", "--quick"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("flows: off"), "{text}");
}
