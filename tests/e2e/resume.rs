//! Sessions that outlive their bridge (`sandbox::parking`): a bridge that exits parks each session
//! that ran code, still running, for `session_linger`; the next bridge on the same state dir
//! takes it on the first call naming it, its state as it was (`"resumed": "live"`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;

use crate::common::served::Served;
use crate::common::{self, Bridge, Home, Outcome};

/// Session parking on: the bridge's own podman service lingers (a parked session lives no
/// longer than it), no pool (every session here is one that ran code). Snapshots off: what
/// these tests find is what was parked alive (tests/e2e/snapshots.rs has the snapshots, and
/// the Python SDK's test here turns them on).
const ENV: [(&str, &str); 4] = [
    ("MCP_BRIDGE_ENGINE_LINGER", "60s"),
    ("MCP_BRIDGE_SESSION_LINGER", "60s"),
    ("MCP_BRIDGE_POOL_SIZE", "0"),
    ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "0"),
];

fn sessions_dir(home: &Home) -> PathBuf {
    home.path()
        .join(".local/state/mcp-code-bridge/engine/sessions")
}

/// The listings of the sessions keepers hold for `home`'s state dir (`<digest>.json`, each
/// removed by its keeper with its socket, which is in the keeper directory).
fn keeper_sockets(home: &Home) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(sessions_dir(home))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The sockets the keepers started by the bridge whose log this is listen on.
pub(crate) fn logged_keeper_sockets(log: &str) -> Vec<PathBuf> {
    log.lines()
        .filter(|l| l.contains("the keeper listens"))
        .filter_map(|l| {
            let at = l.find("socket=")? + "socket=".len();
            let path: String = l[at..]
                .trim_start_matches('"')
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '"')
                .collect();
            Some(PathBuf::from(path))
        })
        .collect()
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

async fn run_in(b: &Bridge, session: &str, code: &str) -> Outcome {
    Outcome(b.call(json!({"code": code, "session": session})).await)
}

/// The containers parked for the next bridge, as `podman ps` names them.
async fn parked_containers() -> Vec<String> {
    common::engine_cli(&["ps", "-a", "--format", "{{.ID}} {{.State}} {{.Names}}"])
        .await
        .lines()
        .filter(|l| l.contains(".parked-"))
        .map(str::to_string)
        .collect()
}

/// Two sessions with state, their bridge closed: both are parked (each a keeper and a socket of
/// its own, the user's alone), no container of the bridge is left but those. The next bridge's
/// first call naming one finds its variables, functions, imports and files, says `"resumed":
/// "live"` once, and a notice the model reads; a session never used before is fresh; a reset
/// discards the parked one (its keeper and container go). That bridge parks what it has in turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_left_by_its_bridge_is_resumed_live_by_the_next_on_the_first_call_naming_it() {
    let first = Bridge::start_with(Home::new(), &ENV, None).await;
    run_in(
        &first,
        "work",
        "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\ndef twice(x):\n    return x * 2\nopen('/workspace/note.txt', 'w').write('kept')",
    )
    .await
    .ok();
    run_in(&first, "other", "y = 7").await.ok();
    let home = first.shutdown_clean().await;
    let log = home.log();
    assert_eq!(
        log.matches("parked the session for the next bridge")
            .count(),
        2,
        "{log}"
    );
    let sockets = keeper_sockets(&home);
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    assert_eq!(mode_of(&sessions_dir(&home)), 0o700);
    for s in &sockets {
        assert_eq!(mode_of(s), 0o600, "{}", s.display());
        // Named by a digest: no session name (the model's) is a path.
        let name = s.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            name.len() == 32 && name.chars().all(|c| c.is_ascii_hexdigit()),
            "{name}"
        );
    }

    let second = Bridge::start_with(home, &ENV, None).await;
    let r = run_in(
        &second,
        "work",
        "print(df.a.sum(), twice(21), pd.__name__ in sys.modules if (sys := __import__('sys')) else 0, open('/workspace/note.txt').read())",
    )
    .await
    .ok();
    assert_eq!(r.stdout(), "6 42 True kept\n");
    assert_eq!(r.meta()["resumed"], json!("live"), "{:?}", r.meta());
    assert!(r.text().contains("resumed this session"), "{}", r.text());
    // From then on it is this bridge's session like any other.
    let again = run_in(
        &second,
        "work",
        "df['b'] = df.a * 10\nprint(int(df.b.sum()))",
    )
    .await
    .ok();
    assert_eq!(again.stdout(), "60\n");
    assert!(again.meta().get("resumed").is_none(), "{:?}", again.meta());
    // A session nobody parked starts fresh.
    let fresh = run_in(&second, "new", "print('df' in globals())")
        .await
        .ok();
    assert_eq!(fresh.stdout(), "False\n");
    assert!(fresh.meta().get("resumed").is_none());
    // A reset discards the parked session rather than resuming it.
    let reset = Outcome(
        second
            .call(json!({"code": "print('y' in globals())", "session": "other", "reset": true}))
            .await,
    )
    .ok();
    assert_eq!(reset.stdout(), "False\n");
    assert!(reset.meta().get("resumed").is_none());
    assert!(
        keeper_sockets(&second.home).is_empty(),
        "a keeper is left after its session was resumed or discarded: {:?}",
        keeper_sockets(&second.home)
    );
    let log = second.home.log();
    assert!(
        log.contains("closing the parked session: the call asked for a reset"),
        "{log}"
    );
    // It parks its own three when it exits.
    let home = second.shutdown_clean().await;
    assert_eq!(keeper_sockets(&home).len(), 3, "{}", home.log());
    // The third bridge finds `work` with the column the second added.
    let third = Bridge::start_with(home, &ENV, None).await;
    let r = run_in(&third, "work", "print(list(df.columns))").await.ok();
    assert_eq!(r.stdout(), "['a', 'b']\n");
    assert_eq!(r.meta()["resumed"], json!("live"));
    // Closed with session_linger = 0 from here: nothing parked is left behind.
    let home = third.shutdown_clean().await;
    let last = Bridge::start_with(
        home,
        &[
            ("MCP_BRIDGE_ENGINE_LINGER", "60s"),
            ("MCP_BRIDGE_SESSION_LINGER", "0"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "0"),
        ],
        None,
    )
    .await;
    let r = run_in(&last, "work", "print('df' in globals())").await.ok();
    assert_eq!(r.stdout(), "False\n", "session_linger = 0 resumes nothing");
    last.shutdown_clean().await;
}

/// A second bridge on `home`'s state dir, beside the one that owns it: its client and pid.
async fn beside(home: &Home, env: &[(&str, &str)]) -> (RunningService<RoleClient, ()>, u32) {
    let transport = common::transport(home, env);
    let pid = transport.id().expect("the bridge's process id");
    let client = ().serve(transport).await.expect("MCP initialize");
    (client, pid)
}

/// One `run_python` call naming `session` on `client` (also tests/e2e/snapshots.rs's).
pub(crate) async fn call_on(
    client: &RunningService<RoleClient, ()>,
    session: &str,
    code: &str,
) -> Outcome {
    let params = CallToolRequestParams::new("run_python").with_arguments(
        json!({"code": code, "session": session})
            .as_object()
            .cloned()
            .unwrap(),
    );
    Outcome(
        tokio::time::timeout(Duration::from_secs(240), client.call_tool(params))
            .await
            .expect("answered within 240s")
            .expect("run_python answered"),
    )
}

/// Two bridges on the state dir of a parked session, each asking for it at once: exactly one
/// resumes it, the other gets a fresh interpreter, and neither fails. When both exit, each
/// parks its own `s`: one keeper takes it, the other's is closed (one sandbox per slot).
#[tokio::test(flavor = "multi_thread")]
async fn two_bridges_asking_for_one_parked_session_at_once_never_both_take_it() {
    let first = Bridge::start_with(Home::new(), &ENV, None).await;
    run_in(&first, "s", "x = 1").await.ok();
    let home = first.shutdown_clean().await;
    assert_eq!(keeper_sockets(&home).len(), 1, "{}", home.log());

    let a = Bridge::start_with(home, &ENV, None).await;
    let (b, b_pid) = beside(&a.home, &ENV).await;
    let code = "print('x' in globals())";
    let (ra, rb) = tokio::join!(run_in(&a, "s", code), call_on(&b, "s", code));
    let (ra, rb) = (ra.ok(), rb.ok());
    let live = |r: &Outcome| r.meta().get("resumed") == Some(&json!("live"));
    assert!(
        live(&ra) != live(&rb),
        "exactly one resumes it: a {} / b {}",
        ra.text(),
        rb.text()
    );
    let (won, lost) = if live(&ra) { (&ra, &rb) } else { (&rb, &ra) };
    assert_eq!(
        won.stdout(),
        "True
"
    );
    assert_eq!(
        lost.stdout(),
        "False
",
        "{}",
        lost.text()
    );
    let _ = b.cancel().await;
    assert!(
        common::wait_no_containers(b_pid, Duration::from_secs(20))
            .await
            .is_empty()
    );
    let home = a.shutdown_clean().await;
    assert_eq!(keeper_sockets(&home).len(), 1, "{}", home.log());
}

/// A parked session nobody asks for ends with its time (`session_linger`): its keeper, socket,
/// container and package directory go.
#[tokio::test(flavor = "multi_thread")]
async fn a_parked_session_nobody_takes_ends_with_its_time() {
    let brief = [
        ("MCP_BRIDGE_ENGINE_LINGER", "60s"),
        ("MCP_BRIDGE_SESSION_LINGER", "10s"),
        ("MCP_BRIDGE_POOL_SIZE", "0"),
    ];
    let first = Bridge::start_with(Home::new(), &brief, None).await;
    run_in(&first, "t", "z = 1").await.ok();
    let home = first.shutdown_clean().await;
    assert_eq!(keeper_sockets(&home).len(), 1, "{}", home.log());
    let log = home.log();
    let line = log
        .lines()
        .find(|l| l.contains("parked the session for the next bridge"))
        .unwrap();
    let at = line.find("container=").unwrap() + "container=".len();
    let id: String = line[at..]
        .trim_start_matches('"')
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    assert!(
        parked_containers().await.iter().any(|l| l.starts_with(&id)),
        "{id} is not parked"
    );
    // doctor counts it.
    let doctor = home.command().arg("doctor").envs(brief).output().unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains(
            "sessions parked for the next bridge on this state_dir: 1 (session_linger = 10s; `sessions list` shows them)"
        ),
        "{said}"
    );
    let sandboxes = home
        .path()
        .join(".local/state/mcp-code-bridge/packages/sandboxes");
    let dirs_left = || -> Vec<String> {
        std::fs::read_dir(&sandboxes)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    // The keeper unlinks its socket, removes the container, then its package directory.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listings = std::fs::read_dir(sessions_dir(&home))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .count()
            })
            .unwrap_or(0);
        let gone = keeper_sockets(&home).is_empty()
            && listings == 0
            && !parked_containers().await.iter().any(|l| l.starts_with(&id))
            && dirs_left().is_empty();
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the parked session outlived its time: {:?}, package directories {:?}",
            parked_containers().await,
            dirs_left()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The official Python SDK's `Client` (its fixture starts the bridge over stdio and closes it at
/// the end): one run leaves a DataFrame in session `w`, the next run's first call finds it,
/// resumed live; past its idle timeout the session is closed and the next call finds it again,
/// restored from its snapshot, the generator it held named as lost; in the client's default
/// mode (2026-07-28) and in its legacy one (2025-11-25).
#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_client_finds_its_session_after_a_restart_in_both_modes() {
    for mode in ["auto", "legacy"] {
        let home = Home::new();
        let sdk = |steps: serde_json::Value| {
            let out = std::process::Command::new(common::server_bin("mcp-python"))
                .arg(common::fixture("sdk_rounds_client.py"))
                .args([mode, common::BIN, &steps.to_string()])
                .env_clear()
                .envs(home.env())
                .envs(ENV)
                .env("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "2s")
                .env("MCP_BRIDGE_SNAPSHOT_MAX_SIZE", "256m")
                .current_dir(home.path())
                .stderr(std::fs::File::create(home.path().join("client.err")).unwrap())
                .output()
                .unwrap();
            let err = std::fs::read_to_string(home.path().join("client.err")).unwrap_or_default();
            assert!(out.status.success(), "{mode}: the client failed:\n{err}");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with('{'))
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .collect::<Vec<_>>()
        };
        let first = sdk(json!([{
            "code": "import pandas as pd\ndf = pd.DataFrame({'a': range(5)})\ng = (i for i in df.a)",
            "session": "w"
        }]));
        assert_eq!(
            first[0]["structured"]["status"],
            json!("ok"),
            "{mode}: {first:?}"
        );
        // Its bridge exited with the client: the session is parked.
        let deadline = Instant::now() + Duration::from_secs(20);
        while keeper_sockets(&home).is_empty() {
            assert!(Instant::now() < deadline, "{mode}: nothing parked");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let second = sdk(json!([
            {"code": "print(int(df.a.sum()))", "session": "w"},
            {"code": "print(len(df))", "session": "w"},
            // Past the idle timeout: the session is closed, its state kept as a snapshot.
            {"code": "print(int(df.a.sum()), 'g' in globals())", "session": "w", "sleep": 5}
        ]));
        let (a, b) = (&second[0]["structured"], &second[1]["structured"]);
        assert_eq!(a["stdout"], json!("10\n"), "{mode}: {second:?}");
        assert_eq!(a["resumed"], json!("live"), "{mode}: {a}");
        assert!(
            a["notices"].as_array().is_some_and(|n| n
                .iter()
                .any(|l| l.as_str().unwrap_or("").contains("resumed this session"))),
            "{mode}: {a}"
        );
        assert_eq!(b["stdout"], json!("5\n"));
        assert!(b.get("resumed").is_none(), "{mode}: {b}");
        let c = &second[2]["structured"];
        assert_eq!(c["stdout"], json!("10 False\n"), "{mode}: {c}");
        assert_eq!(c["resumed"], json!("snapshot"), "{mode}: {c}");
        assert_eq!(c["lost"], json!(["g (generator)"]), "{mode}: {c}");
    }
}

/// Two identities' tokens for `serve`.
pub(crate) const ALICE: &str = "alice-0123456789abcdef0123";
pub(crate) const BOB: &str = "bob-fedcba9876543210fedcba98";

/// A state dir and a token file (alice, bob) that two `serve`s in turn share, with [`ENV`] and
/// `extra` for their environment.
struct Team {
    _dir: tempfile::TempDir,
    state: PathBuf,
    env: Vec<(String, String)>,
}

impl Team {
    fn new(extra: &[(&str, &str)]) -> Team {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
        let env = ENV
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([
                ("MCP_BRIDGE_STATE_DIR".into(), state.display().to_string()),
                ("MCP_BRIDGE_TOKEN_FILE".into(), tokens.display().to_string()),
            ])
            .collect();
        Team {
            _dir: dir,
            state,
            env,
        }
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// Over `serve`, a session is its identity's: alice and bob each leave state in a session of the
/// same name, `serve` is stopped (SIGTERM) and started again on the same state dir, and each
/// finds exactly their own, resumed live; neither resumes, reads or ends the other's.
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_each_identity_resumes_only_its_own_session_of_a_shared_name() {
    let team = Team::new(&[]);
    let (state, env) = (&team.state, team.env());

    let mut first = Served::start(Home::new(), &env, &[]);
    let alice = first.client(Some(ALICE)).await;
    let bob = first.client(Some(BOB)).await;
    call_on(&alice, "work", "mine = 'alice'").await.ok();
    call_on(&bob, "work", "mine = 'bob'").await.ok();
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    assert!(
        first.terminate(Duration::from_secs(60)).is_some(),
        "serve did not stop"
    );
    let log = first.home.log();
    assert_eq!(
        log.matches("parked the session for the next bridge")
            .count(),
        2,
        "{log}"
    );

    // `sessions list` names each one's identity apart from the shared session name.
    let out = Home::new()
        .command()
        .args(["sessions", "list", "--json"])
        .env("MCP_BRIDGE_STATE_DIR", state)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut who: Vec<(String, String)> = v["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["identity"].as_str().unwrap_or("-").to_string(),
                p["session"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    who.sort();
    assert_eq!(
        who,
        [
            ("alice".into(), "work".into()),
            ("bob".into(), "work".into())
        ],
        "{v}"
    );

    let second = Served::start(Home::new(), &env, &[]);
    let bob = second.client(Some(BOB)).await;
    let r = call_on(&bob, "work", "print(mine)").await.ok();
    assert_eq!(r.stdout(), "bob\n", "{}", r.text());
    assert_eq!(r.meta()["resumed"], json!("live"));
    let alice = second.client(Some(ALICE)).await;
    let r = call_on(&alice, "work", "print(mine)").await.ok();
    assert_eq!(r.stdout(), "alice\n", "{}", r.text());
    assert_eq!(r.meta()["resumed"], json!("live"));
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
}

/// `mcp-code-bridge <args>` in `home`: status, stdout, stderr.
fn cli(home: &Home, args: &[&str]) -> (i32, String, String) {
    let out = home.command().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn listed(home: &Home) -> Vec<String> {
    let (code, out, err) = cli(home, &["sessions", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut names: Vec<String> = v["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["expires_in_secs"].as_u64().unwrap() > 0, "{p}");
            assert!(p["identity"].is_null(), "{p}");
            p["session"].as_str().unwrap().to_string()
        })
        .collect();
    names.sort();
    names
}

/// Parked sessions under control (issue 46, point 4): `sessions list` shows what keepers hold
/// (table and `--json`), `sessions rm NAME` ends one (its container goes; an unknown name is an
/// error with a hint), a parked session counts toward the next bridge's `max_sessions` (the
/// oldest is ended before any live one, with a notice, and the call naming it later is told
/// why it is fresh), and `sessions prune` ends the rest.
#[tokio::test(flavor = "multi_thread")]
async fn parked_sessions_are_listed_ended_by_hand_and_count_toward_max_sessions() {
    let first = Bridge::start_with(Home::new(), &ENV, None).await;
    for (s, code) in [("a", "x = 1"), ("b", "y = 2"), ("gone", "z = 3")] {
        run_in(&first, s, code).await.ok();
    }
    let pid = first.pid;
    let home = first.shutdown_clean().await;
    assert_eq!(listed(&home), ["a", "b", "gone"]);
    let (code, table, _) = cli(&home, &["sessions", "list"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("SESSION") && table.contains("3 session(s) parked"),
        "{table}"
    );

    let (code, out, err) = cli(&home, &["sessions", "rm", "gone", "nope"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("ended parked session gone"), "{out}");
    assert!(err.contains("error: no session nope is parked"), "{err}");
    assert!(err.contains("hint: "), "{err}");
    assert_eq!(listed(&home), ["a", "b"]);
    let mine = format!("mcp-code-bridge-{pid}.parked-");
    let left = parked_containers().await;
    assert_eq!(
        left.iter().filter(|c| c.contains(&mine)).count(),
        2,
        "{left:?}"
    );

    let mut env: Vec<(&str, &str)> = ENV.to_vec();
    env.push(("MCP_BRIDGE_MAX_SESSIONS", "2"));
    let second = Bridge::start_with(home, &env, None).await;
    // Two parked and one more asked for: the oldest parked one (a) is ended to make room.
    let c = run_in(&second, "c", "print('c')").await.ok();
    assert!(
        c.text().contains("session \"a\", parked by the bridge before this one, was closed to stay within max_sessions = 2"),
        "{}",
        c.text()
    );
    assert_eq!(listed(&second.home), ["b"]);
    let b = run_in(&second, "b", "print(y)").await.ok();
    assert_eq!(b.stdout(), "2\n", "b was not ended: {}", b.text());
    let a = run_in(&second, "a", "print('x' in globals())").await.ok();
    assert_eq!(a.stdout(), "False\n");
    assert!(a.text().contains("max_sessions = 2"), "{}", a.text());
    let gone = run_in(&second, "gone", "print('z' in globals())")
        .await
        .ok();
    assert_eq!(gone.stdout(), "False\n", "ended by hand, never resumed");
    let home = second.shutdown_clean().await;
    assert_eq!(
        listed(&home).len(),
        2,
        "within max_sessions: {}",
        home.log()
    );
    let (code, out, _) = cli(&home, &["sessions", "prune"]);
    assert_eq!(code, 0);
    assert!(out.contains("ended 2 parked session(s)"), "{out}");
    assert!(listed(&home).is_empty());
    assert!(
        keeper_sockets(&home).is_empty(),
        "{:?}",
        keeper_sockets(&home)
    );
}

/// Over `serve`, an identity's parked sessions count toward its own
/// `http.max_sessions_per_identity`: alice at her bound has her oldest parked session ended
/// (she is told), never bob's, whose session is still there to resume.
#[tokio::test(flavor = "multi_thread")]
async fn over_serve_an_identitys_parked_sessions_count_toward_its_own_bound() {
    let team = Team::new(&[("MCP_BRIDGE_HTTP_MAX_SESSIONS_PER_IDENTITY", "2")]);
    let env = team.env();
    let mut first = Served::start(Home::new(), &env, &[]);
    let alice = first.client(Some(ALICE)).await;
    let bob = first.client(Some(BOB)).await;
    call_on(&alice, "a1", "v = 1").await.ok();
    call_on(&bob, "b1", "v = 'bob'").await.ok();
    call_on(&alice, "a2", "v = 2").await.ok();
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
    assert!(
        first.terminate(Duration::from_secs(60)).is_some(),
        "serve did not stop"
    );

    let second = Served::start(Home::new(), &env, &[]);
    let alice = second.client(Some(ALICE)).await;
    let r = call_on(&alice, "a3", "print('a3')").await.ok();
    assert!(
        r.text().contains("session \"a1\", parked by the bridge before this one, was closed to stay within http.max_sessions_per_identity = 2"),
        "{}",
        r.text()
    );
    let r = call_on(&alice, "a2", "print(v)").await.ok();
    assert_eq!(r.stdout(), "2\n", "{}", r.text());
    let bob = second.client(Some(BOB)).await;
    let r = call_on(&bob, "b1", "print(v)").await.ok();
    assert_eq!(r.stdout(), "bob\n", "{}", r.text());
    assert_eq!(r.meta()["resumed"], json!("live"));
    let _ = alice.cancel().await;
    let _ = bob.cancel().await;
}

/// A state dir whose path is too long for a socket in it (here 150 bytes, over the 107 of a
/// socket's path): the bridge's own podman service (one per bridge, and the lingering one
/// bridges share) listens in the keeper directory, and sessions are handed over all the same
/// through keepers' sockets there, of this user's alone (0700), whose paths do not grow with
/// the state dir's. `doctor` names that directory.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_long_state_dir_a_session_is_still_handed_live_to_the_next_bridge() {
    use std::os::unix::fs::MetadataExt;
    let home = Home::new();
    let base = home.path().display().to_string();
    let state = format!("{base}/{}", "s".repeat(150 - base.len() - 1));
    assert_eq!(state.len(), 150);
    let mut env: Vec<(&str, &str)> = ENV.to_vec();
    env.push(("MCP_BRIDGE_STATE_DIR", &state));
    let first = Bridge::start_with(home, &env, None).await;
    run_in(&first, "work", "x = 41").await.ok();
    let home = first.shutdown_clean().await;
    let log = home.log();
    assert!(
        log.contains("parked the session for the next bridge"),
        "{log}"
    );
    let sockets = logged_keeper_sockets(&log);
    assert_eq!(sockets.len(), 1, "{log}");
    let sock = &sockets[0];
    assert!(sock.as_os_str().len() <= 107, "{}", sock.display());
    assert!(!sock.starts_with(&state), "{}", sock.display());
    assert!(sock.exists(), "{}", sock.display());
    assert_eq!(mode_of(sock), 0o600);
    let dir = sock.parent().unwrap();
    let m = std::fs::symlink_metadata(dir).unwrap();
    assert!(m.is_dir() && m.mode() & 0o777 == 0o700, "{:o}", m.mode());
    assert_eq!(m.uid(), unsafe { libc::getuid() });
    // No podman socket answers for the harness: the bridge started the lingering service
    // there (engine_linger), named by the state dir.
    let lingering = format!("unix://{}/engine-", dir.display());
    assert!(log.contains(&lingering), "{lingering} not in {log}");
    let doctor = home
        .command()
        .args(["doctor", "--quick"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains(&format!(
            "hand-over to the next bridge: keepers listen in {}",
            dir.display()
        )),
        "{said}"
    );

    let second = Bridge::start_with(home, &env, None).await;
    let r = run_in(&second, "work", "print(x + 1)").await.ok();
    assert_eq!(r.stdout(), "42\n", "{}", second.home.log());
    assert_eq!(r.meta()["resumed"], json!("live"), "{:?}", r.meta());
    assert!(!sock.exists(), "the keeper's socket outlived its hand-over");
    let home = second.shutdown_clean().await;
    let last = Bridge::start_with(
        home,
        &[
            // A service of its own (podman-<pid>.sock), not the lingering one.
            ("MCP_BRIDGE_ENGINE_LINGER", "0"),
            ("MCP_BRIDGE_SESSION_LINGER", "0"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_STATE_DIR", &state),
        ],
        None,
    )
    .await;
    // Its own session, parked again by the second bridge, ends with this one's reset.
    let r = Outcome(
        last.call(json!({"code": "print('x' in globals())", "session": "work", "reset": true}))
            .await,
    )
    .ok();
    assert_eq!(r.stdout(), "False\n");
    let log = last.shutdown_clean().await.log();
    let own = format!("unix://{}/podman-", dir.display());
    assert!(log.contains(&own), "{own} not in {log}");
}

/// The keeper directory is where another local user could act first: a link in its place
/// (to a directory of theirs), or a directory open to others, is refused, said at WARN with
/// the fix; no socket is made through it and the next bridge starts afresh. `doctor` fails on
/// it with the same words.
#[tokio::test(flavor = "multi_thread")]
async fn a_keeper_directory_prepared_by_another_user_is_refused_and_doctor_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let home = Home::new();
    let run = home.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let theirs = home.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let keeper_dir = run.join("mcp-code-bridge");
    std::os::unix::fs::symlink(&theirs, &keeper_dir).unwrap();
    let run_s = run.display().to_string();
    let mut env: Vec<(&str, &str)> = ENV.to_vec();
    env.push(("XDG_RUNTIME_DIR", &run_s));
    let doctor = |home: &Home| {
        let out = home
            .command()
            .args(["doctor", "--quick"])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = doctor(&home);
    assert!(
        said.contains(&format!(
            "hand-over to the next bridge cannot work: the keeper directory {} is a symbolic link",
            keeper_dir.display()
        )),
        "{said}"
    );
    assert!(said.contains("fix: remove it (`rm -r"), "{said}");

    let first = Bridge::start_with(home, &env, None).await;
    run_in(&first, "work", "x = 41").await.ok();
    let home = first.shutdown_clean().await;
    let log = home.log();
    assert!(
        log.contains("WARN")
            && log.contains("is a symbolic link: another local user may have prepared it"),
        "{log}"
    );
    assert!(
        !log.contains("parked the session for the next bridge"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_dir(&theirs).unwrap().count(),
        0,
        "something was made through the link"
    );
    let second = Bridge::start_with(home, &env, None).await;
    let r = run_in(&second, "work", "print('x' in globals())")
        .await
        .ok();
    assert_eq!(r.stdout(), "False\n");
    let home = second.shutdown_clean().await;

    // A directory of the right name open to others, and (as root) one of another owner.
    std::fs::remove_file(&keeper_dir).unwrap();
    std::fs::create_dir(&keeper_dir).unwrap();
    std::fs::set_permissions(&keeper_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let said = doctor(&home);
    assert!(said.contains("has mode 0777, not 0700"), "{said}");
    if unsafe { libc::getuid() } == 0 {
        std::fs::set_permissions(&keeper_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&keeper_dir, Some(65534), Some(65534)).unwrap();
        let said = doctor(&home);
        assert!(
            said.contains("belongs to uid 65534, not to this user (uid 0)"),
            "{said}"
        );
    }
}
