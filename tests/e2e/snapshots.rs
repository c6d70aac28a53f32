//! Sessions kept on disk (`sandbox::snapshots`, `sandbox::carry`): a session closed without a
//! caller (here its idle timeout) leaves a snapshot of its state that the next call naming it
//! restores in a new sandbox (`"resumed": "snapshot"`, with what was lost named);
//! `runtime.fork(name)` copies a session's state into another; every stored byte is bounded,
//! listed and removable, and one identity never sees another's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::served::Served;
use crate::common::{self, Bridge, Home, Outcome};
use crate::resume::{ALICE, BOB, call_on};

/// Sessions closed after 2 s unused (the reaper looks every 0.5 s); no pool, so each session
/// here is one that ran code.
const IDLE: [(&str, &str); 2] = [
    ("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "2s"),
    ("MCP_BRIDGE_POOL_SIZE", "0"),
];

fn snapshots_dir(state: &Path) -> PathBuf {
    state.join("sessions")
}

fn state_of(home: &Home) -> PathBuf {
    home.path().join(".local/state/mcp-code-bridge")
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

async fn run_in(b: &Bridge, session: &str, code: &str) -> Outcome {
    Outcome(b.call(json!({"code": code, "session": session})).await)
}

/// Wait until the bridge's log says `what` `n` times; on a timeout, fail with what the log
/// says of the sessions (their closes, snapshots and restores) and its last lines.
async fn logged(home: &Home, what: &str, n: usize) {
    let start = std::time::Instant::now();
    while home.log().matches(what).count() < n {
        if start.elapsed() > Duration::from_secs(60) {
            let log = home.log_if_any();
            let about: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("snapshot") || l.contains("idle") || l.contains("restor"))
                .collect();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "timed out after 60s waiting for {what:?} {n} time(s)\nsessions:\n{}\nlast lines:\n{}",
                about.join("\n"),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn audit_records(state: &Path) -> Vec<Value> {
    std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A data session closed by its idle timeout comes back at the next call naming it: the
/// DataFrame, a function and a class defined in cells, a module imported under another name,
/// all as they were, `"resumed": "snapshot"` once, and what could not be kept (a generator, a
/// lock, an open file) named in `_meta` and in the notice the model reads. The snapshot is the
/// user's alone (0600 in a 0700 directory, named by a digest, not by the session), listed by
/// `sessions list`, recorded in the audit log (`snapshot`, `restore`), and removed by
/// `sessions rm`; `reset` discards it.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_closed_idle_is_restored_from_its_snapshot_with_what_was_lost_named() {
    let b = Bridge::start_with(Home::new(), &IDLE, None).await;
    run_in(
        &b,
        "data",
        "import numpy as np, pandas as pd, threading\n\
         df = pd.DataFrame({'a': np.arange(1000), 'b': np.arange(1000) * 0.5})\n\
         def total(frame):\n    return float(frame.b.sum())\n\
         class Box:\n    def __init__(self, v):\n        self.v = v\n    def twice(self):\n        return 2 * self.v\n\
         box = Box(21)\n\
         g = (i for i in range(3))\n\
         lock = threading.Lock()\n\
         f = open('/tmp/scratch.txt', 'w')",
    )
    .await
    .ok();
    logged(&b.home, "wrote the session's snapshot", 1).await;
    let state = state_of(&b.home);
    let dir = snapshots_dir(&state);
    assert_eq!(mode_of(&dir), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 2, "a snapshot and its listing: {files:?}");
    for f in &files {
        assert_eq!(mode_of(f), 0o600, "{}", f.display());
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            stem.len() == 32 && stem.chars().all(|c| c.is_ascii_hexdigit()),
            "named by a digest, not the session: {stem}"
        );
    }

    // Listed for a person, and exactly for a program.
    let listed = b
        .home
        .command()
        .args(["sessions", "list", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let snap = &listed["snapshots"][0];
    assert_eq!(snap["session"], "data", "{listed}");
    assert_eq!(snap["why"], "idle", "{listed}");
    assert!(snap["size"].as_u64().unwrap() > 16_000, "{listed}");
    assert!(
        snap["names"].as_array().unwrap().iter().any(|n| n == "df"),
        "{listed}"
    );

    let r = run_in(
        &b,
        "data",
        "print(len(df), total(df), box.twice(), pd.__name__, np.__name__)",
    )
    .await
    .ok();
    assert_eq!(
        r.stdout(),
        "1000 249750.0 42 pandas numpy\n",
        "{}",
        r.text()
    );
    assert_eq!(r.meta()["resumed"], json!("snapshot"), "{:?}", r.meta());
    let lost: Vec<&str> = r.meta()["lost"]
        .as_array()
        .unwrap_or_else(|| panic!("no lost names: {:?}", r.meta()))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in ["g (generator)", "lock", "f (TextIOWrapper)"] {
        assert!(
            lost.iter().any(|l| l.starts_with(name)),
            "{name} not among the lost {lost:?}"
        );
    }
    let text = r.text();
    assert!(
        text.contains("restored this session from its snapshot"),
        "{text}"
    );
    assert!(text.contains("g (generator)"), "{text}");
    // Taken by the restore: the state is in the live session alone, and from then on it is a
    // session like any other.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let again = run_in(&b, "data", "print(box.v)").await.ok();
    assert!(again.meta().get("resumed").is_none(), "{:?}", again.meta());

    let records = audit_records(&state);
    let kinds: Vec<&str> = records
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .filter(|k| matches!(*k, "snapshot" | "restore"))
        .collect();
    assert_eq!(kinds, ["snapshot", "restore"], "{records:?}");
    let restore = records.iter().find(|r| r["kind"] == "restore").unwrap();
    assert_eq!(restore["status"], "ok");
    assert!(
        restore["lost"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "g (generator)"),
        "{restore}"
    );

    // Closed idle again; removed by hand (the audit log says so), and a name that is neither
    // parked nor kept is an error.
    logged(&b.home, "wrote the session's snapshot", 2).await;
    let rm = b
        .home
        .command()
        .args(["sessions", "rm", "data"])
        .output()
        .unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    assert!(String::from_utf8_lossy(&rm.stdout).contains("removed the snapshot of session data"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let none = b
        .home
        .command()
        .args(["sessions", "rm", "data"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no session data is parked or kept"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
    assert!(
        audit_records(&state)
            .iter()
            .any(|r| r["kind"] == "session_end" && r["why"] == "sessions rm")
    );

    let gone = run_in(&b, "data", "print('df' in globals())").await.ok();
    assert_eq!(gone.stdout(), "False\n");
    assert!(gone.meta().get("resumed").is_none());
    // Closed idle again, then a reset: the snapshot goes and nothing comes back.
    run_in(&b, "data", "kept = 1").await.ok();
    logged(&b.home, "wrote the session's snapshot", 3).await;
    let reset = Outcome(
        b.call(json!({"code": "print('kept' in globals())", "session": "data", "reset": true}))
            .await,
    )
    .ok();
    assert_eq!(reset.stdout(), "False\n");
    assert!(reset.meta().get("resumed").is_none());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    b.shutdown_clean().await;
}

/// `await runtime.fork("b")` makes `b` a copy of the caller's state: each then goes its own
/// way. Forking into a session that exists is refused unless the fork resets it
/// (`reset=True`); a session larger than
/// `snapshot_max_size` is refused with its largest values named, and the forking session is
/// untouched.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_diverges_from_its_session_and_never_overwrites_another() {
    let env = [
        ("MCP_BRIDGE_POOL_SIZE", "0"),
        ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "2m"),
    ];
    let b = Bridge::start_with(Home::new(), &env, None).await;
    let forked = run_in(
        &b,
        "a",
        "from mcp import runtime\nx = [1]\ndef grow():\n    x.append(len(x) + 1)\nr = await runtime.fork('b')\ngrow()\nprint(r['session'], x)",
    )
    .await
    .ok();
    assert_eq!(forked.stdout(), "b [1, 2]\n", "{}", forked.text());
    let b_side = run_in(&b, "b", "grow(); grow()\nprint(x)").await.ok();
    assert_eq!(b_side.stdout(), "[1, 2, 3]\n", "{}", b_side.text());
    assert_eq!(b_side.meta()["resumed"], json!("snapshot"));
    let a_side = run_in(&b, "a", "print(x)").await.ok();
    assert_eq!(a_side.stdout(), "[1, 2]\n");

    // b exists (live, and kept on disk): refused, with what to do; b is untouched.
    let refused = run_in(&b, "a", "await runtime.fork('b')").await;
    assert!(refused.is_error(), "{}", refused.text());
    assert!(refused.text().contains("reset=True"), "{}", refused.text());
    assert_eq!(
        run_in(&b, "b", "print(x)").await.ok().stdout(),
        "[1, 2, 3]\n"
    );
    // With reset=True, b is replaced by a's state.
    run_in(&b, "a", "await runtime.fork('b', reset=True)")
        .await
        .ok();
    let replaced = run_in(&b, "b", "print(x)").await.ok();
    assert_eq!(replaced.stdout(), "[1, 2]\n", "{}", replaced.text());
    assert_eq!(replaced.meta()["resumed"], json!("snapshot"));

    // Too large: refused in the code (SnapshotError naming the largest value), nothing kept,
    // the session as it was.
    let big = run_in(
        &b,
        "a",
        "blob = b'x' * (5 << 20)\ntry:\n    await runtime.fork('c')\nexcept Exception as e:\n    print(type(e).__name__, e)\nprint(len(blob), x)",
    )
    .await
    .ok();
    assert!(big.stdout().starts_with("SnapshotError"), "{}", big.text());
    assert!(big.stdout().contains("blob"), "{}", big.stdout());
    assert!(
        big.stdout().ends_with("5242880 [1, 2]\n"),
        "{}",
        big.stdout()
    );
    let c = run_in(&b, "c", "print('x' in globals())").await.ok();
    assert_eq!(c.stdout(), "False\n");
    assert!(c.meta().get("resumed").is_none());
    let fork_records = audit_records(&state_of(&b.home))
        .into_iter()
        .filter(|r| r["kind"] == "fork")
        .count();
    assert_eq!(fork_records, 2, "the two forks kept, not the refused ones");
    b.shutdown_clean().await;
}

/// Over `serve`, a snapshot is its identity's: alice's session `work`, closed idle, comes back
/// to alice only; bob's session of the same name starts fresh and never sees it, and bob
/// cannot fork into alice's name to overwrite it (his fork makes his own `work`).
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_a_snapshot_is_restored_only_for_its_own_identity() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (state_s, tokens_s) = (state.display().to_string(), tokens.display().to_string());
    let mut env: Vec<(&str, &str)> = IDLE.to_vec();
    env.extend([
        ("MCP_BRIDGE_STATE_DIR", state_s.as_str()),
        ("MCP_BRIDGE_TOKEN_FILE", tokens_s.as_str()),
    ]);
    let mut served = Served::start(Home::new(), &env, &[]);
    let alice = served.client(Some(ALICE)).await;
    let bob = served.client(Some(BOB)).await;
    call_on(&alice, "work", "secret = 'alice'").await.ok();
    logged(&served.home, "wrote the session's snapshot", 1).await;
    let b = call_on(&bob, "work", "print(globals().get('secret'))")
        .await
        .ok();
    assert_eq!(b.stdout(), "None\n");
    assert!(b.meta().get("resumed").is_none(), "{:?}", b.meta());
    // bob's fork of his own session into `work2` is his; alice's `work2` does not exist.
    call_on(
        &bob,
        "work",
        "mine = 'bob'\nfrom mcp import runtime\nawait runtime.fork('work2')",
    )
    .await
    .ok();
    let listed = std::process::Command::new(common::BIN)
        .args(["sessions", "list", "--json"])
        .env_clear()
        .envs(served.home.env())
        .env("MCP_BRIDGE_STATE_DIR", &state)
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let owners: Vec<(String, String)> = listed["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["identity"].as_str().unwrap_or("-").to_string(),
                s["session"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        owners.contains(&("alice".into(), "work".into())),
        "{owners:?}"
    );
    assert!(
        owners.contains(&("bob".into(), "work2".into())),
        "{owners:?}"
    );
    let a = call_on(&alice, "work", "print(secret)").await.ok();
    assert_eq!(a.stdout(), "alice\n");
    assert_eq!(a.meta()["resumed"], json!("snapshot"));
    let a2 = call_on(&alice, "work2", "print(globals().get('mine'))")
        .await
        .ok();
    assert_eq!(a2.stdout(), "None\n");
    let b2 = call_on(&bob, "work2", "print(mine)").await.ok();
    assert_eq!(b2.stdout(), "bob\n");
    assert_eq!(b2.meta()["resumed"], json!("snapshot"));
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    served.terminate(Duration::from_secs(60));
}

/// `serve` with `tokens` (`name:token` lines) and `env`, on a state dir of its own (returned).
fn serve_with(
    tokens: &[(&str, &str)],
    env: &[(&str, &str)],
) -> (Served, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = dir.path().join("tokens");
    let lines: String = tokens.iter().map(|(n, t)| format!("{n}:{t}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (state_s, tokens_s) = (state.display().to_string(), file.display().to_string());
    let mut all: Vec<(&str, &str)> = env.to_vec();
    all.extend([
        ("MCP_BRIDGE_STATE_DIR", state_s.as_str()),
        ("MCP_BRIDGE_TOKEN_FILE", tokens_s.as_str()),
    ]);
    (Served::start(Home::new(), &all, &[]), state, dir)
}

/// `sessions ARGS` of the state dir `state`: (exit code, stdout, stderr).
fn sessions_cli(home: &Home, state: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(common::BIN)
        .arg("sessions")
        .args(args)
        .env_clear()
        .envs(home.env())
        .env("MCP_BRIDGE_STATE_DIR", state)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn listed(home: &Home, state: &Path) -> Value {
    let (code, out, err) = sessions_cli(home, state, &["list", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The (identity, session) of every snapshot listed.
fn owners(listed: &Value) -> Vec<(String, String)> {
    listed["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["identity"].as_str().unwrap_or("-").to_string(),
                s["session"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A `run_python` call with `timeout` (seconds) on `client`, and how long it took.
async fn timed_call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    session: &str,
    code: &str,
    timeout: Option<u64>,
) -> (Outcome, Duration) {
    let mut args = json!({"code": code, "session": session});
    if let Some(t) = timeout {
        args["timeout"] = json!(t);
    }
    let params = rmcp::model::CallToolRequestParams::new("run_python")
        .with_arguments(args.as_object().cloned().unwrap());
    let t0 = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(240), client.call_tool(params))
        .await
        .expect("answered within 240s")
        .expect("run_python answered");
    (Outcome(r), t0.elapsed())
}

const CAROL: &str = "carol-00112233445566778899aabb";

/// Over `serve`, the snapshot store is shared, and bounded per identity and in total: bob's
/// forks past his share (`snapshot_store_size` x `http.max_sessions_per_identity` /
/// `max_sessions`: 2 MiB here) remove bob's own oldest, never alice's; carol's fork, at the
/// total bound with her share free but the store holding others' snapshots, is refused with
/// the reason and nothing of anyone's removed. Alice's session comes back whole.
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_one_identity_never_evicts_anothers_snapshot_and_a_full_store_refuses_the_newcomer()
 {
    let env = [
        ("MCP_BRIDGE_POOL_SIZE", "0"),
        ("MCP_BRIDGE_SNAPSHOT_STORE_SIZE", "4m"),
        ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "1536k"),
        ("MCP_BRIDGE_MAX_SESSIONS", "8"),
        ("MCP_BRIDGE_HTTP_MAX_SESSIONS_PER_IDENTITY", "4"),
    ];
    let (mut served, state, _dir) =
        serve_with(&[("alice", ALICE), ("bob", BOB), ("carol", CAROL)], &env);
    let alice = served.client(Some(ALICE)).await;
    let bob = served.client(Some(BOB)).await;
    let carol = served.client(Some(CAROL)).await;
    call_on(
        &alice,
        "work",
        "import os\nfrom mcp import runtime\nblob = os.urandom(1_200_000)\nawait runtime.fork('a1')",
    )
    .await
    .ok();
    let b = call_on(
        &bob,
        "main",
        "import os\nfrom mcp import runtime\nblob = os.urandom(900_000)\nfor i in range(4):\n    await runtime.fork(f'b{i}')\nprint('forked')",
    )
    .await
    .ok();
    assert_eq!(b.stdout(), "forked\n", "{}", b.text());
    let l = listed(&served.home, &state);
    let mut o = owners(&l);
    o.sort();
    assert_eq!(
        o,
        [
            ("alice".to_string(), "a1".to_string()),
            ("bob".into(), "b2".into()),
            ("bob".into(), "b3".into())
        ],
        "bob's oldest made room for bob, alice's stayed: {l}"
    );
    assert!(
        served
            .home
            .log()
            .contains("removing this identity's oldest session snapshot")
    );
    let c = call_on(
        &carol,
        "main",
        "import os\nfrom mcp import runtime\nblob = os.urandom(1_300_000)\ntry:\n    await runtime.fork('c1')\nexcept Exception as e:\n    print(type(e).__name__, e)",
    )
    .await
    .ok();
    assert!(
        c.stdout().contains("the snapshot store is full")
            && c.stdout().contains("snapshot_store_size")
            && c.stdout().contains("never removed to make room"),
        "{}",
        c.text()
    );
    let mut after = owners(&listed(&served.home, &state));
    after.sort();
    assert_eq!(after, o, "nothing removed for a snapshot not kept");
    let a = call_on(&alice, "a1", "print(len(blob))").await.ok();
    assert_eq!(a.stdout(), "1200000\n", "{}", a.text());
    assert_eq!(a.meta()["resumed"], json!("snapshot"));
    for c in [alice, bob, carol] {
        let _ = c.cancel().await;
    }
    served.terminate(Duration::from_secs(60));
}

/// A fork's name follows run_python's rule for `session` (1-64 of letters, digits, '-', '_',
/// '.'), checked in the runtime and again by the bridge: with the runtime's check patched out,
/// the bridge refuses each name (a path, a slash, bidi and zero-width characters, a line
/// separator, 65 and 5,000 characters, another identity's spelling), with the rule; nothing is
/// kept, and a good name still forks.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_name_outside_the_session_name_rule_is_refused_by_the_runtime_and_the_bridge() {
    let env = [("MCP_BRIDGE_POOL_SIZE", "0")];
    let b = Bridge::start_with(Home::new(), &env, None).await;
    let code = "import sys\nfrom mcp import runtime\n\
        sn = sys.modules['__mcp_bridge_runtime__.snapshot']\n\
        bad = ['../x', 'a/b', '/abs', ' ', 'x' * 65, 'x' * 5000, '\\u202ework', 'a\\u200bb', '\\u2066x', 'alice/work', 'a\\u2028b', '']\n\
        x = 1\nout = []\n\
        for n in bad:\n    try:\n        await runtime.fork(n)\n        out.append('kept')\n    except ValueError as e:\n        out.append('V' if 'must be 1-64 characters' in str(e) else 'V?' + str(e)[:300])\n\
        sn._fork_check = lambda name: None\n\
        for n in bad:\n    try:\n        await runtime.fork(n)\n        out.append('kept')\n    except Exception as e:\n        out.append('H' if 'must be 1-64 characters' in str(e) else 'H?' + type(e).__name__ + str(e)[:300])\n\
        print(' '.join(out))\n\
        print((await runtime.fork('ok-1.x'))['session'])";
    let r = run_in(&b, "a", code).await.ok();
    let expected = format!("{} {}\nok-1.x\n", ["V"; 12].join(" "), ["H"; 12].join(" "));
    assert_eq!(r.stdout(), expected, "{}", r.text());
    let l = b
        .home
        .command()
        .args(["sessions", "list", "--json"])
        .output()
        .unwrap();
    let l: Value = serde_json::from_slice(&l.stdout).unwrap();
    assert_eq!(owners(&l), [("-".to_string(), "ok-1.x".to_string())], "{l}");
    b.shutdown_clean().await;
}

/// Everything the host keeps for a session is bounded when written, counted, listed and
/// removable: a runtime patched to describe its snapshot with names of 200 control characters
/// gets a listing cut to its budget (and listed, the rest counted in `more`); a session that
/// sends forged `snap` frames (no fork asked) holds a file being written, which `sessions list`
/// shows and counts; a file planted in the store that is no snapshot is listed as unreadable;
/// `sessions prune` removes them all.
#[tokio::test(flavor = "multi_thread")]
async fn every_stored_byte_is_bounded_listed_counted_and_removed_by_prune() {
    let env = [("MCP_BRIDGE_POOL_SIZE", "0")];
    let b = Bridge::start_with(Home::new(), &env, None).await;
    let code = "import sys\nfrom mcp import runtime\n\
        sn = sys.modules['__mcp_bridge_runtime__.snapshot']\n\
        real = sn._Snapshot.info\n\
        def info(self):\n    i = real(self)\n    junk = ['\\x01' * 200 + str(k) for k in range(200)]\n    i['names'] = junk\n    i['lost'] = [{'name': j, 'type': j, 'why': '\\x02' * 300} for j in junk]\n    i['modules'] = {j: j for j in junk}\n    return i\n\
        sn._Snapshot.info = info\n\
        x = 1\nprint((await runtime.fork('noisy'))['session'])\n\
        sn._Snapshot.info = real\n\
        import base64\n\
        ch = sys.modules['__mcp_bridge_runtime__.channel']\n\
        st = sys.modules['__mcp_bridge_runtime__.state']\n\
        ch.send({'type': 'snap', 'id': st.running.id, 'data': base64.b64encode(b'z' * 500_000).decode()})\n\
        ch.send({'type': 'snap', 'id': st.running.id, 'end': True, 'info': {}})\n\
        print('sent')";
    let r = run_in(&b, "a", code).await.ok();
    assert_eq!(r.stdout(), "noisy\nsent\n", "{}", r.text());
    let state = state_of(&b.home);
    let dir = snapshots_dir(&state);
    std::fs::write(dir.join("planted.json"), vec![b'{'; 300 << 10]).unwrap();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") && name != "planted.json" {
            let len = e.metadata().unwrap().len();
            assert!(len <= 64 << 10, "a listing of {len} bytes");
        }
    }
    let l = listed(&b.home, &state);
    let snap = &l["snapshots"][0];
    assert_eq!(snap["session"], "noisy", "{l}");
    assert!(snap["more"].as_u64().unwrap() > 0, "{snap}");
    assert_eq!(l["unreadable"][0]["file"], "planted.json", "{l}");
    let temporary = l["temporary"].as_array().unwrap();
    assert_eq!(temporary.len(), 1, "the forged frames' file: {l}");
    assert_eq!(temporary[0]["bytes"], 500_000);
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(
        l["store_bytes"].as_u64().unwrap(),
        on_disk,
        "every byte counted: {l}"
    );
    let (_, text, _) = sessions_cli(&b.home, &state, &["list"]);
    assert!(text.contains("unreadable file planted.json"), "{text}");
    assert!(text.contains("being written"), "{text}");
    assert!(!text.contains('\u{1}'), "{text}");
    let (code, out, err) = sessions_cli(&b.home, &state, &["prune"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("removed 1 session snapshot(s)"), "{out}");
    assert!(out.contains("removed 2 other file(s)"), "{out}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    b.shutdown_clean().await;
}

/// Over `serve`, a restore that never ends (bob's snapshot unpickles into an endless loop) is
/// bounded by the call's `timeout` and holds no lock: bob's call with `timeout=5` answers in
/// seconds, fresh, naming the snapshot as set aside; alice's new session meanwhile starts at
/// once; the snapshot is listed as set aside and never restored again. A snapshot whose
/// pickling never ends (bob's session closed idle) keeps no other session's start waiting.
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_a_restore_or_snapshot_that_never_ends_stalls_no_one_and_is_set_aside() {
    let env = [
        ("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "6s"),
        ("MCP_BRIDGE_POOL_SIZE", "0"),
        ("MCP_BRIDGE_MAX_TIMEOUT", "90s"),
    ];
    let (mut served, state, _dir) = serve_with(&[("alice", ALICE), ("bob", BOB)], &env);
    let alice = served.client(Some(ALICE)).await;
    let bob = served.client(Some(BOB)).await;
    call_on(
        &bob,
        "evil",
        "class Evil:\n    def __reduce__(self):\n        return (exec, ('while True: pass',))\ne = Evil()",
    )
    .await
    .ok();
    logged(&served.home, "wrote the session's snapshot", 1).await;
    let (bob_call, alice_call) = tokio::join!(
        timed_call(&bob, "evil", "print('fresh', 'e' in globals())", Some(5)),
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            timed_call(&alice, "other", "print('alice')", None).await
        }
    );
    let (r, took) = bob_call;
    let r = r.ok();
    assert_eq!(r.stdout(), "fresh False\n", "{}", r.text());
    assert!(took < Duration::from_secs(30), "bob's call took {took:?}");
    assert!(r.text().contains("set aside"), "{}", r.text());
    let (a, alice_took) = alice_call;
    assert_eq!(a.ok().stdout(), "alice\n");
    assert!(
        alice_took < Duration::from_secs(20),
        "alice's new session waited {alice_took:?} for bob's restore"
    );
    let l = listed(&served.home, &state);
    let evil = l["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == "evil")
        .unwrap_or_else(|| panic!("{l}"));
    assert!(
        evil["set_aside"]
            .as_str()
            .is_some_and(|w| w.contains("within 5s")),
        "{evil}"
    );

    // Pickling that never ends, as bob's session is closed idle: alice's new session does not
    // wait for it.
    call_on(
        &bob,
        "slow",
        "class Slow:\n    def __reduce__(self):\n        while True:\n            pass\ns = Slow()",
    )
    .await
    .ok();
    common::wait_until(
        "bob's slow session closing",
        Duration::from_secs(60),
        async || {
            served
                .home
                .log()
                .lines()
                .any(|l| l.contains("removing idle sandbox") && l.contains("bob/slow"))
        },
    )
    .await;
    let (a, alice_took) = timed_call(&alice, "third", "print('alice')", None).await;
    assert_eq!(a.ok().stdout(), "alice\n");
    assert!(
        alice_took < Duration::from_secs(20),
        "alice's new session waited {alice_took:?} for bob's snapshot"
    );
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    served.terminate(Duration::from_secs(120));
}

/// A session larger than `snapshot_max_size`, closed idle: what fits is kept (the small values),
/// the large one is named as lost with its size, and the next call naming the session is told.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_too_large_for_its_snapshot_keeps_what_fits_and_names_the_rest() {
    let mut env: Vec<(&str, &str)> = IDLE.to_vec();
    env.push(("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "1m"));
    let b = Bridge::start_with(Home::new(), &env, None).await;
    run_in(
        &b,
        "data",
        "import os\nbig = os.urandom(3_000_000)\nsmall = {'k': 42}\ndef f(n):\n    return n + 1",
    )
    .await
    .ok();
    logged(&b.home, "wrote the session's snapshot", 1).await;
    let r = run_in(&b, "data", "print(small['k'], f(1), 'big' in globals())")
        .await
        .ok();
    assert_eq!(r.stdout(), "42 2 False\n", "{}", r.text());
    assert_eq!(r.meta()["resumed"], json!("snapshot"), "{:?}", r.meta());
    let text = r.text();
    assert!(
        text.contains("big (bytes)") && text.contains("over snapshot_max_size"),
        "{text}"
    );
    b.shutdown_clean().await;
}
