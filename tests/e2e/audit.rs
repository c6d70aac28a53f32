//! The audit log through the real binary, the real engine and a real upstream server: `exec`
//! and `tool_call` records field by field (decisions of the policy included), `code = "full"`,
//! `off`, rotation, the `audit` command (table,
//! `--json`, `--session`, `--follow`), and a secret-bearing upstream whose secrets never reach
//! the log.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use common::{Bridge, Home, server_bin, write_servers};

fn log_path(home: &Home) -> PathBuf {
    home.path().join(".local/state/mcp-code-bridge/audit.jsonl")
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The records once there are `n` (they are written just after each call answers).
fn wait_records(path: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = records(path);
        if r.len() >= n || Instant::now() > deadline {
            assert_eq!(r.len(), n, "records in {}: {r:#?}", path.display());
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `session` of each JSON line of `jsonl`, in order.
fn sessions_of(jsonl: &str) -> Vec<String> {
    jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["session"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn sha256(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// `mcp-code-bridge audit ARGS` in `home`: (exit code, stdout, stderr).
fn audit_cmd(home: &Home, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let out = home
        .command()
        .envs(env.iter().copied())
        .arg("audit")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn exec_records_field_by_field_and_the_audit_command_prints_them() {
    let b = Bridge::start().await;
    let ok_code = "x = 6 * 7\nprint(x)";
    let err_code = "1 / 0";
    b.call(json!({"code": ok_code, "session": "alpha"})).await;
    b.call(json!({"code": err_code, "session": "beta"})).await;
    let setup = b
        .call(json!({"code": "1", "session": "beta", "servers": ["nosuch"]}))
        .await;
    assert_eq!(setup.is_error, Some(true));
    let path = log_path(&b.home);
    let recs = wait_records(&path, 3);

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the log is private");

    let (ok, err, bad) = (&recs[0], &recs[1], &recs[2]);
    for r in &recs {
        assert_eq!(r["kind"], "exec");
        let ts = r["ts"].as_str().unwrap();
        assert!(chrono_like_rfc3339(ts), "ts is RFC 3339 in UTC: {ts}");
        assert!(r["duration_ms"].is_u64(), "{r}");
        assert!(r.get("code").is_none(), "sha256 mode keeps no code: {r}");
        assert!(r.get("identity").is_none(), "no identity over stdio: {r}");
    }
    assert_eq!(ok["session"], "alpha");
    assert_eq!(ok["status"], "ok");
    assert_eq!(ok["code_sha256"], sha256(ok_code).as_str());
    assert_eq!(ok["servers"], json!([]));
    assert!(ok.get("error_type").is_none());
    assert_eq!(err["session"], "beta");
    assert_eq!(err["status"], "error");
    assert_eq!(err["error_type"], "ZeroDivisionError");
    assert_eq!(err["code_sha256"], sha256(err_code).as_str());
    assert_eq!(bad["status"], "setup_error");
    assert_eq!(bad["servers"], json!(["nosuch"]));
    assert!(
        bad["error_type"].as_str().is_some_and(|t| !t.is_empty()),
        "{bad}"
    );

    // The table: one row per record, with the session, the code's digest prefix and the status.
    let (code, table, stderr) = audit_cmd(&b.home, &[], &[]);
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 4, "header and three rows:\n{table}");
    assert!(rows[0].starts_with("TIME"), "{table}");
    assert!(
        rows[1].contains("alpha")
            && rows[1].contains(&format!("exec {}", &sha256(ok_code)[..12]))
            && rows[1].contains(" ok"),
        "{table}"
    );
    assert!(
        rows[2].contains("beta") && rows[2].contains("error ZeroDivisionError"),
        "{table}"
    );
    assert!(
        rows[3].contains("setup_error") && rows[3].contains("[nosuch]"),
        "{table}"
    );

    // --json: the stored lines, as stored.
    let (code, jsonl, _) = audit_cmd(&b.home, &[], &["--json"]);
    assert_eq!(code, 0);
    assert_eq!(jsonl, std::fs::read_to_string(&path).unwrap());

    // --session: only that session's records.
    let (_, only, _) = audit_cmd(&b.home, &[], &["--json", "--session", "beta"]);
    let sessions = sessions_of(&only);
    assert_eq!(sessions, ["beta", "beta"]);
    let (_, table_beta, _) = audit_cmd(&b.home, &[], &["--session", "beta"]);
    assert_eq!(table_beta.lines().count(), 3, "{table_beta}");
    assert!(!table_beta.contains("alpha"));
    b.shutdown_clean().await;
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, parsed by hand so the test does not trust the bridge's formatter.
fn chrono_like_rfc3339(ts: &str) -> bool {
    let b = ts.as_bytes();
    ts.len() == 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z'
        && ts[..4].parse::<u32>().is_ok_and(|y| y >= 2024)
}

#[tokio::test]
async fn full_keeps_the_code_and_off_writes_nothing() {
    let code = "print('kept in full')";
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_AUDIT_CODE", "full")], None).await;
    b.py(code).await.ok();
    let recs = wait_records(&log_path(&b.home), 1);
    assert_eq!(recs[0]["code"], code);
    assert_eq!(recs[0]["code_sha256"], sha256(code).as_str());
    assert_eq!(recs[0]["session"], "default");
    b.shutdown_clean().await;

    let off = [("MCP_BRIDGE_AUDIT_PATH", "off")];
    let b = Bridge::start_with(Home::new(), &off, None).await;
    b.py("print(1)").await.ok();
    b.py("print(2)").await.ok();
    let (code, _, stderr) = audit_cmd(&b.home, &off, &[]);
    // The home outlives the bridge here: read after a drop, its state directory would be gone
    // and show no audit file whatever the bridge had written.
    let home = b.shutdown_clean().await;
    let state = home.path().join(".local/state/mcp-code-bridge");
    let audit_files: Vec<_> = match std::fs::read_dir(&state) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("audit"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot list {}: {e}", state.display()),
    };
    assert!(
        audit_files.is_empty(),
        "off wrote {audit_files:?} in {}",
        home.path().display()
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("audit log is off") && stderr.contains("MCP_BRIDGE_AUDIT_PATH"),
        "{stderr}"
    );
}

#[tokio::test]
async fn rotation_through_the_binary_keeps_the_bound_and_the_command_reads_oldest_first() {
    // Snapshots off: the sessions closed to stay within max_sessions would add their records
    // between the calls' (tests/e2e/snapshots.rs has those).
    let env = [
        ("MCP_BRIDGE_AUDIT_MAX_SIZE", "1k"),
        ("MCP_BRIDGE_AUDIT_KEEP", "2"),
        ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "0"),
    ];
    let b = Bridge::start_with(Home::new(), &env, None).await;
    let n = 16;
    for i in 0..n {
        b.call(json!({"code": format!("{i}"), "session": format!("c{i:02}")}))
            .await;
    }
    let path = log_path(&b.home);
    // The last record is in the current file once it is written.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&path)
        .unwrap_or_default()
        .contains("\"c15\"")
    {
        assert!(Instant::now() < deadline, "the last record was not written");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = path.parent().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("audit.jsonl") && !n.ends_with(".lock"))
        .collect();
    names.sort();
    assert_eq!(names, ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]);
    for name in &names {
        let len = std::fs::metadata(dir.join(name)).unwrap().len();
        assert!(len <= 1024, "{name} is {len} bytes, over max_size");
    }
    let (code, out, stderr) = audit_cmd(&b.home, &env, &["--json"]);
    assert_eq!(code, 0, "{stderr}");
    let sessions = sessions_of(&out);
    assert!(
        sessions.len() < n,
        "older records were rotated away: {sessions:?}"
    );
    let mut sorted = sessions.clone();
    sorted.sort();
    assert_eq!(sessions, sorted, "oldest first");
    assert_eq!(sessions.last().unwrap(), "c15");
    b.shutdown_clean().await;
}

#[tokio::test]
async fn follow_prints_a_record_written_after_it_started() {
    let b = Bridge::start().await;
    b.call(json!({"code": "1", "session": "before"})).await;
    wait_records(&log_path(&b.home), 1);
    let mut child = b
        .home
        .command()
        .args(["audit", "--follow", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the existing record");
    assert!(first.contains("\"before\""), "{first}");
    b.call(json!({"code": "2", "session": "later"})).await;
    let next = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("--follow printed the new record");
    assert!(next.contains("\"later\""), "{next}");
    let _ = child.kill();
    let _ = child.wait();
    b.shutdown_clean().await;
}

#[tokio::test]
async fn a_secret_bearing_upstream_never_reaches_the_log() {
    const ENV_SECRET: &str = "sk-env-secret-4f9a1c";
    const HEADER_SECRET: &str = "Bearer hdr-secret-7b2e";
    const URL_SECRET: &str = "url-secret-91d0";
    let home = Home::new();
    write_servers(
        &home,
        json!({
            "time": {
                "command": server_bin("mcp-server-time"),
                "args": ["--local-timezone", "UTC"],
                "env": {"TIME_API_TOKEN": ENV_SECRET}
            },
            "remote": {
                "url": format!("http://127.0.0.1:9/mcp?token={URL_SECRET}"),
                "headers": {"Authorization": HEADER_SECRET}
            }
        }),
    );
    let b = Bridge::start_with(home, &[("MCP_BRIDGE_AUDIT_CODE", "full")], None).await;
    let code = "r = await mcp_time.get_current_time(timezone='UTC')\nprint(type(r).__name__)";
    let out = common::Outcome(
        b.call(json!({"code": code, "servers": ["time"], "timeout": 110}))
            .await,
    );
    assert_eq!(out.status(), "ok", "{}", out.text());
    // Loading the unreachable one fails at set-up; its record names it and nothing of it.
    b.call(json!({"code": "1", "servers": ["remote"], "timeout": 20}))
        .await;
    let path = log_path(&b.home);
    // The proxied call's record, then the two calls'.
    let all = wait_records(&path, 3);
    assert_eq!(all[0]["kind"], "tool_call", "{all:#?}");
    let recs: Vec<&Value> = all.iter().filter(|r| r["kind"] == "exec").collect();
    assert_eq!(recs[0]["servers"], json!(["time"]));
    assert_eq!(recs[0]["status"], "ok");
    assert_eq!(recs[1]["servers"], json!(["remote"]));
    let text = std::fs::read_to_string(&path).unwrap();
    b.shutdown_clean().await;
    for secret in [
        ENV_SECRET,
        HEADER_SECRET,
        "hdr-secret",
        URL_SECRET,
        "TIME_API_TOKEN",
        "127.0.0.1",
    ] {
        assert!(
            !text.contains(secret),
            "{secret:?} is in the audit log:\n{text}"
        );
    }
}

/// Each proxied call leaves a `tool_call` record: server, tool, the SHA-256 of its arguments
/// as forwarded, the policy's decision and rule (with where it is set), status and duration; a
/// refused call is recorded as denied, a tool's own error as error; and the `audit` command
/// shows them.
#[tokio::test]
async fn tool_call_records_name_the_decision_rule_and_status() {
    let home = Home::new();
    write_servers(
        &home,
        json!({"time": {"command": server_bin("mcp-server-time"), "args": ["--local-timezone", "UTC"]}}),
    );
    let b = Bridge::start_with(
        home,
        &[
            ("MCP_BRIDGE_POLICY_ALLOW", "time.get_*"),
            ("MCP_BRIDGE_POLICY_DENY", "time.convert_*"),
        ],
        None,
    )
    .await;
    let code = "from mcp import ToolDenied\n\
                await mcp_time.get_current_time(timezone='UTC')\n\
                try:\n    await mcp_time.get_current_time(timezone='Nowhere/Nope')\n\
                except Exception as e:\n    print('tool error', type(e).__name__)\n\
                try:\n    await mcp_time.convert_time(source_timezone='UTC', time='12:00', target_timezone='UTC')\n\
                except ToolDenied:\n    print('denied')";
    let out = common::Outcome(
        b.call(json!({"code": code, "servers": ["time"], "session": "s1", "timeout": 110}))
            .await,
    );
    assert_eq!(out.status(), "ok", "{}", out.text());
    assert!(out.stdout().contains("denied"), "{}", out.stdout());
    let path = log_path(&b.home);
    let recs = wait_records(&path, 4);
    let calls: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "tool_call").collect();
    assert_eq!(calls.len(), 3, "{recs:#?}");
    for c in &calls {
        assert_eq!(c["session"], "s1");
        assert_eq!(c["server"], "time");
        assert!(c["duration_ms"].is_u64(), "{c}");
        assert!(chrono_like_rfc3339(c["ts"].as_str().unwrap()), "{c}");
    }
    assert_eq!(calls[0]["tool"], "get_current_time");
    assert_eq!(calls[0]["decision"], "allow");
    assert_eq!(calls[0]["status"], "ok");
    assert_eq!(
        calls[0]["arguments_sha256"],
        sha256(r#"{"timezone":"UTC"}"#),
        "the digest of the arguments as forwarded"
    );
    let rule = calls[0]["rule"].as_str().unwrap();
    assert!(
        rule.contains("time.get_*") && rule.contains("MCP_BRIDGE_POLICY_ALLOW"),
        "{rule}"
    );
    assert_eq!(
        calls[1]["status"], "error",
        "the tool's own error: {}",
        calls[1]
    );
    assert_eq!(calls[2]["tool"], "convert_time");
    assert_eq!(calls[2]["decision"], "deny");
    assert_eq!(calls[2]["status"], "denied");
    assert!(
        calls[2]["rule"]
            .as_str()
            .unwrap()
            .contains("time.convert_*")
    );
    // The exec's record comes after its calls'.
    assert_eq!(recs[3]["kind"], "exec");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("Nowhere/Nope"),
        "arguments never enter the log"
    );
    let (code, table, err) = audit_cmd(&b.home, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let denied_row = table
        .lines()
        .find(|l| l.contains("time.convert_time"))
        .unwrap_or_else(|| panic!("no row of the denied call:\n{table}"));
    assert!(denied_row.contains("deny"), "{denied_row}");
    b.shutdown_clean().await;
}

/// Names in the log are the code's choice: a tool name holding a newline, a carriage return,
/// escape sequences (erase line, cursor up, a C1 CSI), BEL and a bidi override is one row of
/// the table with each of those shown as an escape, so it can neither erase the rows above
/// nor print a fake "deny → denied" row; `--json` prints the record exactly.
#[tokio::test]
async fn the_table_shows_names_the_code_chose_as_escapes() {
    let home = Home::new();
    write_servers(
        &home,
        json!({"time": {"command": server_bin("mcp-server-time"), "args": ["--local-timezone", "UTC"]}}),
    );
    let b = Bridge::start_with(home, &[], None).await;
    let code = "from mcp import runtime\n\
                rpc = runtime.call_tool_sync.__globals__['rpc'].request_sync\n\
                forged = 'x\\r\\x1b[2K\\x1b[1A\\x07\\x9b2J\\u202e\\n2026-11-25 10:00:00  default  github.delete_repo  deny → denied'\n\
                try:\n    rpc('call_tool', {'server': 'time', 'tool': forged, 'arguments': {}})\n\
                except Exception as e:\n    print(type(e).__name__)";
    let out = common::Outcome(
        b.call(json!({"code": code, "servers": ["time"], "session": "s1", "timeout": 110}))
            .await,
    );
    assert_eq!(out.status(), "ok", "{}", out.text());
    let path = log_path(&b.home);
    let recs = wait_records(&path, 2);
    let forged = recs[0]["tool"]
        .as_str()
        .unwrap_or_else(|| panic!("{recs:#?}"));
    assert!(forged.starts_with("x\r\u{1b}[2K"), "{forged:?}");
    let (code, table, err) = audit_cmd(&b.home, &[], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(table.lines().count(), 3, "header and two rows:\n{table}");
    assert!(
        table
            .chars()
            .all(|c| c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c))),
        "{table:?}"
    );
    let row = table.lines().nth(1).unwrap();
    assert!(row.contains(r"time.x\r\x1b[2K\x1b[1A\x07\u{9b}2J"), "{row}");
    assert!(
        !table.lines().any(|l| l.starts_with("2026-11-25 10:00:00")),
        "{table}"
    );
    // --json: the record as written, byte for byte.
    let (code, jsonl, err) = audit_cmd(&b.home, &[], &["--json"]);
    assert_eq!(code, 0, "{err}");
    let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(first["tool"].as_str(), Some(forged));
    b.shutdown_clean().await;
}

#[test]
fn exec_from_the_command_line_is_audited_as_run_python_is() {
    let home = Home::new();
    write_servers(
        &home,
        json!({"fx": common::misbehaving_server("normal", &[])}),
    );
    let code = "from mcp import ToolDenied\n\
                print(await mcp_fx.echo(text='hi'))\n\
                try:\n    await mcp_fx.pid()\n\
                except ToolDenied:\n    print('denied')";
    let out = home
        .command()
        .env("MCP_BRIDGE_POLICY_DENY", "fx.pid")
        .args(["exec", "--servers", "fx", code])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("denied"), "{stdout}");
    // Written before the command exits: no wait.
    let recs = records(&log_path(&home));
    assert_eq!(recs.len(), 3, "{recs:#?}");
    let session = recs[2]["session"].as_str().unwrap();
    assert!(session.starts_with("exec-"), "{session}");
    for r in &recs {
        assert_eq!(r["session"], session, "{r}");
    }
    let brief = |r: &Value| {
        ["kind", "tool", "decision", "status"]
            .map(|k| r[k].as_str().unwrap_or("-").to_string())
            .join(" ")
    };
    assert_eq!(brief(&recs[0]), "tool_call echo allow ok");
    assert_eq!(brief(&recs[1]), "tool_call pid deny denied");
    assert!(
        recs[1]["rule"]
            .as_str()
            .unwrap()
            .contains("MCP_BRIDGE_POLICY_DENY"),
        "{}",
        recs[1]
    );
    assert_eq!(recs[2]["kind"], "exec");
    assert_eq!(recs[2]["code_sha256"], sha256(code));
    assert_eq!(recs[2]["servers"], json!(["fx"]));
    assert_eq!(recs[2]["status"], "ok");
    // A run that cannot be set up leaves its record too.
    let out = home
        .command()
        .args(["exec", "--servers", "nope", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let recs = records(&log_path(&home));
    assert_eq!(recs.len(), 4, "{recs:#?}");
    assert_eq!(recs[3]["status"], "setup_error");
    assert_eq!(recs[3]["error_type"], "UnknownServer");
}
