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

/// Wait until the bridge's log says `what` `n` times.
async fn logged(home: &Home, what: &str, n: usize) {
    common::wait_until(what, Duration::from_secs(60), async || {
        home.log().matches(what).count() >= n
    })
    .await;
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
