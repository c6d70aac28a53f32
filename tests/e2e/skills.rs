//! Skills end to end: a function saved with `runtime.save_skill` in one bridge process is defined
//! in the next one's first session (a pooled sandbox), found by `search_tool_docs`, run by
//! `exec`, listed, shown and removed by `mcp-code-bridge skills`; a skill file that no longer
//! compiles is named and the call goes on; each bound of `[skills]` is hit and explained; a
//! skill is one function (a forged `save_skill` with more is refused, and one stored before the
//! check never runs); `skills list|show` print escapes, never what a terminal acts on; a FIFO
//! in the store is refused, never waited on. Real binary, real podman, rmcp's client.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Bridge, Home};

const SAVE: &str = "def sales_total(rows):\n    \
    \"\"\"Sum the amount column of rows (a list of dicts).\"\"\"\n    \
    return sum(r['amount'] for r in rows)\n\
from mcp import runtime\n\
runtime.save_skill(sales_total)";

async fn bridge(state: &Path, env: &[(&str, &str)]) -> Bridge {
    let state = state.display().to_string();
    // Saving is what these tests are about: allowed, as a user who wants skills sets it.
    let mut all = vec![
        ("MCP_BRIDGE_STATE_DIR", state.as_str()),
        ("MCP_BRIDGE_SKILLS_SAVE", "allow"),
    ];
    all.extend_from_slice(env);
    Bridge::start_with(Home::new(), &all, None).await
}

/// `mcp-code-bridge <args>` with the state dir; (status code, stdout, stderr).
fn cli(state: &Path, args: &[&str]) -> (i32, String, String) {
    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_STATE_DIR", state)
        .env("MCP_BRIDGE_LOG_LEVEL", "warn")
        .args(args)
        .output()
        .expect("run mcp-code-bridge");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_skill_saved_in_one_bridge_is_defined_in_the_next() {
    let state = tempfile::tempdir().unwrap();
    let skills = state.path().join("skills");

    let first = bridge(state.path(), &[]).await;
    let saved = first.py(SAVE).await.ok();
    assert!(
        saved.text().contains("'replaced': False"),
        "{}",
        saved.text()
    );
    let listed = first.py("runtime.list_skills()").await.ok();
    assert!(listed.text().contains("sales_total"), "{}", listed.text());
    first.shutdown_clean().await;
    let source = skills.join("sales_total.py");
    assert!(
        std::fs::read_to_string(&source)
            .unwrap()
            .contains("def sales_total")
    );
    let mode = std::fs::metadata(&source).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a skill's file is the user's alone");

    // A skill that no longer compiles, put there by hand: named, never fatal.
    std::fs::write(skills.join("broken_one.py"), "def broken_one(:\n").unwrap();

    // The next bridge process (its first call takes the pooled sandbox when the warm-up made one).
    let next = bridge(state.path(), &[]).await;
    let used = next
        .py("sales_total([{'amount': 2}, {'amount': 40}])")
        .await
        .ok();
    assert_eq!(used.sc()["value"], "42", "{}", used.text());
    assert!(
        used.stderr()
            .contains("[skills] not defined in this session")
            && used.stderr().contains("broken_one"),
        "the broken skill is named: {}",
        used.text()
    );
    let found = next
        .py("from mcp import runtime\nruntime.search_tool_docs_sync('sum the amount column')")
        .await
        .ok();
    assert!(
        found.text().contains("'skill': 'sales_total'"),
        "{}",
        found.text()
    );
    // Defined once per interpreter: the second call says nothing of skills.
    let again = next.py("sales_total([{'amount': 1}])").await.ok();
    assert_eq!(again.sc()["value"], "1");
    assert!(!again.stderr().contains("[skills]"), "{}", again.text());

    // The command line sees the same store.
    let (code, out, err) = cli(state.path(), &["skills", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("sales_total") && out.contains("Sum the amount column"),
        "{out}"
    );
    // The host parses every skill it lists: one that does not parse is listed as broken, and
    // named by each session.
    let broken_row = out
        .lines()
        .find(|l| l.starts_with("broken_one"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        broken_row.contains("BROKEN: its source is not Python this bridge can read (line 1"),
        "{broken_row}"
    );
    let (code, out, err) = cli(state.path(), &["skills", "show", "sales_total"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("# skill sales_total, saved "), "{out}");
    assert!(out.contains("def sales_total(rows):"), "{out}");
    let (code, out, err) = cli(state.path(), &["skills", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listing: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listing["skills"][0]["name"], "sales_total");
    assert_eq!(listing["skills"].as_array().unwrap().len(), 1);
    assert_eq!(listing["broken"][0]["name"], "broken_one");

    // `exec` defines them too.
    let (code, out, err) = cli(
        state.path(),
        &["exec", "print(sales_total([{'amount': 5}] * 3))"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "15", "stderr: {err}");

    // Removed: a new session no longer has it; a name that is no skill is an error with a hint.
    let (code, out, _) = cli(state.path(), &["skills", "rm", "sales_total", "broken_one"]);
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = cli(state.path(), &["skills", "rm", "sales_total"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no skill named \"sales_total\"") && err.contains("hint:"),
        "{err}"
    );
    let gone = next
        .call(serde_json::json!({"code": "sales_total([])", "reset": true}))
        .await;
    let gone = common::Outcome(gone);
    assert_eq!(gone.error_type(), "NameError", "{}", gone.text());
    next.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_bound_of_the_store_is_hit_and_explained() {
    let state = tempfile::tempdir().unwrap();
    let b = bridge(
        state.path(),
        &[
            ("MCP_BRIDGE_SKILLS_MAX_SIZE", "256"),
            ("MCP_BRIDGE_SKILLS_MAX_COUNT", "1"),
        ],
    )
    .await;
    // Too large: source and description together above skills.max_size.
    let big = b
        .py("def big():\n    return 1\nfrom mcp import runtime\n\
             runtime.save_skill(big, description='x' * 300)")
        .await;
    assert_eq!(big.error_type(), "McpError", "{}", big.text());
    assert!(
        big.text().contains("skills.max_size (256 bytes)"),
        "{}",
        big.text()
    );
    // One fits; a second is refused by skills.max_count, naming the way out.
    b.py("def one():\n    return 1\nruntime.save_skill(one)")
        .await
        .ok();
    let two = b
        .py("def two():\n    return 2\nruntime.save_skill(two)")
        .await;
    assert_eq!(two.error_type(), "McpError", "{}", two.text());
    assert!(
        two.text().contains("skills.max_count") && two.text().contains("skills rm NAME"),
        "{}",
        two.text()
    );
    // Not a function of its own name (a lambda): refused before anything reaches the host.
    let lambda = b.py("runtime.save_skill(lambda x: x)").await;
    assert!(lambda.is_error(), "{}", lambda.text());
    // Replacing the one saved does not count twice; the bridge still serves.
    b.py("def one():\n    return 11\nruntime.save_skill(one)")
        .await
        .ok();
    assert_eq!(b.py("1 + 1").await.ok().sc()["value"], "2");
    let names: Vec<_> = std::fs::read_dir(state.path().join("skills"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".py"))
        .collect();
    assert_eq!(names, ["one.py"]);
    b.shutdown_clean().await;
}

/// The raw RPC, as forged code sends it: the runtime's own `rpc.request_sync`, without its checks.
const FORGE: &str =
    "from mcp import runtime\nrpc = runtime.call_tool_sync.__globals__['rpc'].request_sync\n";

/// A skill is one function: a forged `save_skill` whose source has code besides the function is
/// refused on the host before anything is stored, and a skill file stored before the check (or
/// by hand) with top-level code is never run by a new session.
#[tokio::test(flavor = "multi_thread")]
async fn a_skill_with_code_besides_its_function_never_runs() {
    let state = tempfile::tempdir().unwrap();
    let skills = state.path().join("skills");
    let b = bridge(state.path(), &[]).await;
    let forged = b
        .py(&format!(
            "{FORGE}try:\n    rpc('save_skill', {{'name': 'evil', 'source': 'def evil():\\n    pass\\nprint(\"TOP-LEVEL RAN\")\\n', 'description': ''}})\n    print('SAVED')\nexcept Exception as e:\n    print(type(e).__name__, e)"
        ))
        .await
        .ok();
    let out = forged.stdout();
    assert!(!out.contains("SAVED"), "{}", forged.text());
    assert!(
        out.contains("McpError")
            && out.contains("skill \"evil\" was not saved: its source has 2 top-level statements (one of them a call)"),
        "{}",
        forged.text()
    );
    assert!(!skills.join("evil.py").exists());
    // The runtime's own save_skill refuses a decorated function before sending it.
    let decorated = b
        .py("def deco(f):\n    return f\n@deco\ndef dd():\n    return 1\nruntime.save_skill(dd)")
        .await;
    assert_eq!(decorated.error_type(), "ValueError", "{}", decorated.text());
    assert!(
        decorated.text().contains("it has a decorator"),
        "{}",
        decorated.text()
    );
    b.shutdown_clean().await;

    // Stored before the check existed: the function and a line that would run at every start.
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("old.py"),
        "def old():\n    return 1\nprint('TOP-LEVEL RAN')\n",
    )
    .unwrap();
    std::fs::write(skills.join("fine.py"), "def fine():\n    return 7\n").unwrap();
    let next = bridge(state.path(), &[]).await;
    let used = next.py("print('old' in globals(), fine())").await.ok();
    assert_eq!(used.stdout().trim(), "False 7", "{}", used.text());
    assert!(!used.text().contains("TOP-LEVEL RAN"), "{}", used.text());
    assert!(
        used.stderr()
            .contains("old: its source has 2 top-level statements"),
        "{}",
        used.text()
    );
    next.shutdown_clean().await;
    let (code, out, err) = cli(state.path(), &["skills", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.starts_with("old ")
            && l.contains("BROKEN: its source has 2 top-level statements")),
        "{out}"
    );
}

/// What `skills list` and `skills show` print is what is stored, every character a terminal
/// would act on shown as an escape: a comment holding "cursor up, erase line" cannot hide the
/// line above it from the review, and a description cannot erase or fake rows. `--json` is
/// exact.
#[tokio::test(flavor = "multi_thread")]
async fn skills_list_and_show_print_escapes_never_terminal_controls() {
    let state = tempfile::tempdir().unwrap();
    let b = bridge(state.path(), &[]).await;
    let code = "def shady():\n    import os\n    os.system('true')\n    return 1  # \u{1b}[1A\u{1b}[2K\u{7}\u{202e} nothing to see\n\
                from mcp import runtime\n\
                runtime.save_skill(shady, description='Adds.\\x1b[2K\\r\\u202eforged\\nfake row')";
    b.py(code).await.ok();
    b.shutdown_clean().await;
    let controls = |s: &str| {
        s.chars()
            .filter(|c| {
                (c.is_control() && *c != '\n')
                    || ('\u{2066}'..='\u{2069}').contains(c)
                    || ('\u{202a}'..='\u{202e}').contains(c)
            })
            .count()
    };
    let (code, out, err) = cli(state.path(), &["skills", "show", "shady"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(controls(&out), 0, "{out:?}");
    assert!(out.contains("    os.system('true')\n"), "{out}");
    assert!(
        out.contains(r"    return 1  # \x1b[1A\x1b[2K\x07\u{202e} nothing to see"),
        "{out}"
    );
    assert!(out.contains(r"# Adds.\x1b[2K\r\u{202e}forged"), "{out}");
    assert!(out.contains("\n# fake row\n"), "{out}");
    let (code, out, err) = cli(state.path(), &["skills", "list"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(controls(&out), 0, "{out:?}");
    assert!(out.contains(r"Adds.\x1b[2K\r\u{202e}forged"), "{out}");
    assert_eq!(
        out.lines().count(),
        3,
        "header, one skill, the count: {out}"
    );
    let (code, out, err) = cli(state.path(), &["skills", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listing: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        listing["skills"][0]["description"],
        "Adds.\u{1b}[2K\r\u{202e}forged\nfake row"
    );
}

/// A FIFO where the store's lock belongs does not hang a save: the call gets an error saying
/// what was found, at once, and the bridge goes on serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_in_the_store_is_refused_not_waited_on() {
    let state = tempfile::tempdir().unwrap();
    let skills = state.path().join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(skills.join(".lock"))
        .arg(skills.join("piped.py"))
        .status()
        .unwrap();
    assert!(status.success());
    let b = bridge(state.path(), &[]).await;
    let start = std::time::Instant::now();
    let saved = b
        .call(serde_json::json!({"code": "def one():\n    return 1\nfrom mcp import runtime\nruntime.save_skill(one)", "timeout": 60}))
        .await;
    let saved = common::Outcome(saved);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(saved.error_type(), "McpError", "{}", saved.text());
    assert!(
        saved
            .text()
            .contains(".lock: it is a FIFO, not a regular file"),
        "{}",
        saved.text()
    );
    assert_eq!(b.py("1 + 1").await.ok().sc()["value"], "2");
    b.shutdown_clean().await;
    let (code, out, err) = cli(state.path(), &["skills", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("piped")
                && l.contains("BROKEN: it is a FIFO, not a regular file")),
        "{out}"
    );
}

// ---- The saved skills as MCP skills (the Skills extension, SEP-2640) ----
//
// Neither official SDK has the extension's methods (the Python SDK `mcp` 2.3 and the TypeScript
// SDK `@modelcontextprotocol/client` 2.3 have no `skills/list` or `skills/get`): both send them
// as raw requests through their own sessions (tests/fixtures/sdk_skills_client.py,
// ts_skills_client.mjs); `resources/list`, `resources/read` and the change notifications are the
// SDKs' own. The conformance suite's sep-2640 scenarios
// are in conformance.rs.

/// A skill as a bridge stores it (`<name>.py`, `<name>.json`), in the store at `dir`: what
/// another bridge process saving it leaves.
fn put_skill(dir: &Path, name: &str, source: &str, description: &str, by: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let meta = serde_json::json!({"description": description, "saved_at": "2026-11-28T21:00:00Z", "saved_by": by});
    std::fs::write(dir.join(format!("{name}.json")), meta.to_string()).unwrap();
    std::fs::write(dir.join(format!("{name}.py")), source).unwrap();
}

const CLEAN: &str = "def clean_sales(rows):\n    \"\"\"Drop refunds.\"\"\"\n    return [r for r in rows if r['amount'] > 0]\n";

/// The Python SDK client fixture with `--wait-change`, running: it has printed what it read and
/// that it waits for a change. `target` is the bridge binary (stdio) or a `serve` URL.
struct SdkSkills {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    err: std::path::PathBuf,
}

impl SdkSkills {
    /// Start it; its first line (what it read) once it waits for a change.
    async fn start(
        home: &Home,
        env: &[(&str, &str)],
        mode: &str,
        target: &str,
        token: Option<&str>,
    ) -> (SdkSkills, serde_json::Value) {
        let mut cmd = tokio::process::Command::new(common::server_bin("mcp-python"));
        cmd.arg(common::fixture("sdk_skills_client.py"))
            .args([mode, target, "--wait-change"]);
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        SdkSkills::spawn(cmd, home, env, mode).await
    }

    /// Run `cmd` (a client fixture given `--wait-change`) in `home` with `env`; its first line
    /// once it says it waits.
    async fn spawn(
        mut cmd: tokio::process::Command,
        home: &Home,
        env: &[(&str, &str)],
        mode: &str,
    ) -> (SdkSkills, serde_json::Value) {
        use tokio::io::AsyncBufReadExt;
        let err = home.path().join(format!("client-{mode}.err"));
        cmd.env_clear()
            .envs(home.env())
            .envs(env.iter().copied())
            .current_dir(home.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&err).unwrap())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut sdk = SdkSkills { child, lines, err };
        let first = sdk.next().await;
        assert_eq!(sdk.next().await["ready"], true);
        (sdk, first)
    }

    async fn next(&mut self) -> serde_json::Value {
        let err = || std::fs::read_to_string(&self.err).unwrap_or_default();
        let line = tokio::time::timeout(std::time::Duration::from_secs(90), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no line from the client in 90 s: {}", err()))
            .unwrap()
            .unwrap_or_else(|| panic!("the client ended early: {}", err()));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Its last line (how it was told of a change, the listing after), and its end.
    async fn told(mut self) -> serde_json::Value {
        let last = self.next().await;
        let status = self.child.wait().await.unwrap();
        assert!(
            status.success(),
            "{}",
            std::fs::read_to_string(&self.err).unwrap_or_default()
        );
        last
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Over stdio, in the Python SDK's default mode (2026-07-28) and its legacy one (2025-11-25):
/// the extension is declared with `resources.listChanged`; `skills/list` gives the one skill
/// whose name maps (`clean_sales` as `clean-sales`; `_helper` is left out) with its frontmatter
/// (who saved it, when, its sha256 under `metadata`) and its one file, whose digest and size are
/// those of what `resources/read` returns (the source inside); `skills/get` gives the same entry
/// and `-32602` for a skill not served; `resources/list` lists its SKILL.md. Then `skills rm`,
/// run by another process, is told (a `notifications/resources/list_changed` in the session, or
/// a `ResourcesListChanged` event of a `subscriptions/listen` stream) and the listing is empty.
#[tokio::test(flavor = "multi_thread")]
async fn saved_skills_are_mcp_skills_to_the_python_sdk_over_stdio_in_both_modes() {
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let home = Home::new();
        let state = tempfile::tempdir().unwrap();
        let store = state.path().join("skills");
        put_skill(
            &store,
            "clean_sales",
            CLEAN,
            "Drop refunds.\n\nRows are dicts.",
            "local/default (skills.save: allow)",
        );
        put_skill(
            &store,
            "_helper",
            "def _helper():\n    return 1\n",
            "Not served.",
            "",
        );
        let state_env = state.path().display().to_string();
        let env = [("MCP_BRIDGE_STATE_DIR", state_env.as_str())];
        let (sdk, first) = SdkSkills::start(&home, &env, mode, common::BIN, None).await;
        let (code, out, err) = cli(state.path(), &["skills", "rm", "clean_sales"]);
        assert_eq!(code, 0, "{out}{err}");
        let last = sdk.told().await;
        assert_eq!(first["protocol"], protocol, "{first}");
        assert_eq!(first["extension"], serde_json::json!({}), "{first}");
        assert_eq!(first["resources"]["listChanged"], true, "{first}");
        let skills = first["list"]["skills"]
            .as_array()
            .unwrap_or_else(|| panic!("{first}"));
        assert_eq!(skills.len(), 1, "only the mappable name is served: {first}");
        let skill = &skills[0];
        assert_eq!(skill["uri"], "skill://clean-sales/SKILL.md");
        assert_eq!(skill["frontmatter"]["name"], "clean-sales");
        assert_eq!(
            skill["frontmatter"]["description"],
            "Drop refunds.\n\nRows are dicts."
        );
        let meta = &skill["frontmatter"]["metadata"];
        assert_eq!(meta["function"], "clean_sales", "{skill}");
        assert_eq!(
            meta["saved-by"], "local/default (skills.save: allow)",
            "{skill}"
        );
        assert_eq!(meta["saved-at"], "2026-11-28T21:00:00Z", "{skill}");
        assert_eq!(meta["sha256"], sha256_hex(CLEAN.as_bytes()), "{skill}");
        let text = first["read"]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{first}"));
        assert_eq!(first["read"]["mimeType"], "text/markdown");
        assert!(
            text.contains(CLEAN),
            "the source is the skill's content: {text}"
        );
        assert_eq!(
            skill["resources"],
            serde_json::json!([{"uri": "skill://clean-sales/SKILL.md", "digest": format!("sha256:{}", sha256_hex(text.as_bytes())), "size": text.len()}])
        );
        assert_eq!(first["get"]["skill"], *skill, "{first}");
        assert_eq!(first["get_unknown"]["error"]["code"], -32602, "{first}");
        assert!(
            first["get_unknown"]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("No skill is served at skill://no-such-skill/SKILL.md"),
            "{first}"
        );
        assert!(
            first["resource_names"]
                .as_array()
                .unwrap()
                .contains(&"clean-sales".into()),
            "{first}"
        );
        // 2026-07-28 results carry their caching hints: this identity's, never fresh.
        if protocol == "2026-07-28" {
            assert_eq!(first["list"]["ttlMs"], 0, "{first}");
            assert_eq!(first["list"]["cacheScope"], "private", "{first}");
            assert_eq!(
                last["honored"],
                serde_json::json!({"resourcesListChanged": true}),
                "{last}"
            );
            assert_eq!(last["told"], "ResourcesListChanged", "{last}");
        } else {
            assert_eq!(
                last["told"], "notifications/resources/list_changed",
                "{last}"
            );
        }
        assert_eq!(
            last["list"]["skills"],
            serde_json::json!([]),
            "removed: {last}"
        );
    }
}

/// Under `serve`, with two identities: each saves a skill from a session (`runtime.save_skill`,
/// the real path), and each identity's client (the Python SDK, alice in the default mode on a
/// `subscriptions/listen` stream, bob in legacy mode on his MCP session's stream) lists only
/// its own; alice's `skills/get` and `resources/read` of bob's skill are `-32602` as for one
/// never saved. `skills --identity alice rm` tells alice, whose listing is then empty; bob's
/// removal tells bob (his listing after the notice is empty: he was not told of alice's).
#[tokio::test(flavor = "multi_thread")]
async fn under_serve_each_identity_sees_and_is_told_of_its_own_skills_only() {
    const ALICE: &str = "alice-0123456789abcdef0123";
    const BOB: &str = "bob-fedcba9876543210fedcba98";
    let home = Home::new();
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let state = tempfile::tempdir().unwrap();
    let (tokens, state_env) = (
        tokens.display().to_string(),
        state.path().display().to_string(),
    );
    let env = [
        ("MCP_BRIDGE_TOKEN_FILE", tokens.as_str()),
        ("MCP_BRIDGE_STATE_DIR", state_env.as_str()),
        ("MCP_BRIDGE_SKILLS_SAVE", "allow"),
    ];
    let served = common::served::Served::start(Home::new(), &env, &[]);
    for (token, name) in [(ALICE, "alices_sum"), (BOB, "bobs_sum")] {
        let client = served.client(Some(token)).await;
        let code = format!(
            "from mcp import runtime\ndef {name}(xs):\n    \"\"\"Sum xs.\"\"\"\n    return sum(xs)\nruntime.save_skill({name})"
        );
        let args = serde_json::json!({"code": code});
        let out = client
            .call_tool(
                rmcp::model::CallToolRequestParams::new("run_python")
                    .with_arguments(args.as_object().cloned().unwrap()),
            )
            .await
            .unwrap();
        let out = common::Outcome(out).ok();
        assert!(out.text().contains("'replaced': False"), "{}", out.text());
        client.cancel().await.unwrap();
    }
    let rm = |who: &str, name: &str| {
        let (code, out, err) = cli(state.path(), &["skills", "--identity", who, "rm", name]);
        assert_eq!(code, 0, "{out}{err}");
    };
    let (alice_home, bob_home) = (Home::new(), Home::new());
    let (bob, b_first) = SdkSkills::start(&bob_home, &[], "legacy", &served.url, Some(BOB)).await;
    let (alice, a_first) =
        SdkSkills::start(&alice_home, &[], "auto", &served.url, Some(ALICE)).await;
    rm("alice", "alices_sum");
    let a_last = alice.told().await;
    // Bob would have been told within a second or two of a change he can see: he is not told
    // of alice's (had he been, his listing after the notice would still hold his skill).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    rm("bob", "bobs_sum");
    let b_last = bob.told().await;
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["list"]["skills"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|s| s["uri"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&a_first),
        ["skill://alices-sum/SKILL.md"],
        "{a_first}"
    );
    assert_eq!(names(&b_first), ["skill://bobs-sum/SKILL.md"], "{b_first}");
    let by = a_first["list"]["skills"][0]["frontmatter"]["metadata"]["saved-by"]
        .as_str()
        .unwrap();
    assert!(by.starts_with("alice/"), "who saved it: {by}");
    assert!(
        !a_first["resource_uris"].to_string().contains("bobs-sum"),
        "{a_first}"
    );
    assert_eq!(a_first["protocol"], "2026-07-28");
    assert_eq!(b_first["protocol"], "2025-11-25");
    assert_eq!(a_last["told"], "ResourcesListChanged", "{a_last}");
    assert_eq!(
        b_last["told"], "notifications/resources/list_changed",
        "{b_last}"
    );
    assert_eq!(a_last["list"]["skills"], serde_json::json!([]), "{a_last}");
    assert_eq!(
        b_last["list"]["skills"],
        serde_json::json!([]),
        "bob was told of his own removal: {b_last}"
    );

    // Another identity's skill is as absent as one never saved (raw requests, rmcp's client).
    let bob_client = served.client(Some(BOB)).await;
    let code =
        "from mcp import runtime\ndef bobs_other(x):\n    return x\nruntime.save_skill(bobs_other)";
    let args = serde_json::json!({"code": code});
    bob_client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("run_python")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    let alice_client = served.client(Some(ALICE)).await;
    let err = alice_client
        .get_skill(rmcp::model::GetSkillRequestParams::new(
            "skill://bobs-other/SKILL.md",
        ))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("-32602") || err.to_string().contains("No skill is served"),
        "{err}"
    );
    let err = alice_client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "skill://bobs-other/SKILL.md",
        ))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("No skill is served"), "{err}");
    let his = bob_client
        .get_skill(rmcp::model::GetSkillRequestParams::new(
            "skill://bobs-other/SKILL.md",
        ))
        .await
        .unwrap();
    assert_eq!(his.skill.frontmatter.name, "bobs-other");
}

/// The TypeScript SDK's client (`@modelcontextprotocol/client`, which has no methods of the
/// extension: raw `Client.request`s, tests/fixtures/ts_skills_client.mjs) over stdio in its
/// default mode (2026-07-28) and legacy mode: the extension is declared, `skills/list` and
/// `skills/get` give the same entry, whose digest is that of the `SKILL.md` `resources/read`
/// returns, and a skill not served is `-32602`. Then `skills rm`, run by another process, reaches
/// the SDK's own `listChanged.resources` handler (legacy: the notification; 2026-07-28: the
/// `subscriptions/listen` stream the SDK opens), whose refetched list no longer has the SKILL.md,
/// and the listing is empty.
#[tokio::test(flavor = "multi_thread")]
async fn saved_skills_are_mcp_skills_to_the_typescript_sdk_over_stdio_in_both_modes() {
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let home = Home::new();
        let state = tempfile::tempdir().unwrap();
        put_skill(
            &state.path().join("skills"),
            "clean_sales",
            CLEAN,
            "Drop refunds.",
            "local/default",
        );
        let mut cmd = tokio::process::Command::new(common::server_bin("node"));
        cmd.arg(common::fixture("ts_skills_client.mjs"))
            .args([mode, common::BIN, "--wait-change"]);
        let state_env = state.path().display().to_string();
        let node_path = common::oidc::node_modules().display().to_string();
        let env = [
            ("MCP_BRIDGE_STATE_DIR", state_env.as_str()),
            ("NODE_PATH", node_path.as_str()),
        ];
        let (sdk, v) = SdkSkills::spawn(cmd, &home, &env, mode).await;
        assert_eq!(v["protocol"], protocol, "{v}");
        assert_eq!(v["extension"], serde_json::json!({}), "{v}");
        let skill = &v["list"]["skills"][0];
        assert_eq!(skill["uri"], "skill://clean-sales/SKILL.md", "{v}");
        assert_eq!(v["get"]["skill"], *skill, "{v}");
        let text = v["read"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(text.contains(CLEAN), "{text}");
        assert_eq!(
            skill["resources"][0]["digest"],
            format!("sha256:{}", sha256_hex(text.as_bytes()))
        );
        assert_eq!(v["get_unknown"]["error"]["code"], -32602, "{v}");

        let (code, out, err) = cli(state.path(), &["skills", "rm", "clean_sales"]);
        assert_eq!(code, 0, "{out}{err}");
        let last = sdk.told().await;
        let refetched = last["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{last}"));
        assert!(!refetched.is_empty(), "{last}");
        assert!(
            !refetched.contains(&"skill://clean-sales/SKILL.md".into()),
            "{last}"
        );
        assert_eq!(last["list"]["skills"], serde_json::json!([]), "{last}");
    }
}

/// The Inspector CLI's SEP-2640 checks (`--verify`: the frontmatter's conformance, and each
/// file's digest and size against what `resources/read` returns) pass over what the bridge
/// serves, by `skills/list` and by `skills/get`, in its 2026-07-28 era and the legacy one.
#[tokio::test(flavor = "multi_thread")]
async fn the_inspector_verifies_the_served_skills_in_both_eras() {
    let home = Home::new();
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("skills");
    put_skill(
        &store,
        "clean_sales",
        CLEAN,
        "Drop refunds.\n\nRows are dicts.",
        "local/default",
    );
    put_skill(
        &store,
        "monthly_totals",
        "def monthly_totals(rows):\n    return {}\n",
        "Totals by month: a description with \"quotes\", a colon: and --- dashes.",
        "alice (skills.save: ask, allowed)",
    );
    for era in ["modern", "legacy"] {
        for method in [
            &["--method", "skills/list"][..],
            &[
                "--method",
                "skills/get",
                "--uri",
                "skill://monthly-totals/SKILL.md",
            ],
        ] {
            let scratch = tempfile::tempdir().unwrap();
            let mut env = vec![format!("MCP_BRIDGE_STATE_DIR={}", state.path().display())];
            env.extend(home.env().into_iter().map(|(k, v)| format!("{k}={v}")));
            let mut cmd = std::process::Command::new(common::server_bin("mcp-inspector"));
            cmd.args(["--cli", common::BIN, "run", "-q", "--protocol-era", era])
                .args(["--format", "json", "--verify", "--require-digests"])
                .args(method)
                .env("HOME", scratch.path());
            for e in &env {
                cmd.args(["-e", e]);
            }
            let out = cmd.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let what = format!("{era} {method:?}");
            assert!(
                out.status.success(),
                "{what}: exit {:?}: {stdout}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            let reports: Vec<serde_json::Value> = stdout
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
            let names: Vec<&str> = reports
                .iter()
                .map(|r| r["name"].as_str().unwrap())
                .collect();
            let want: &[&str] = if method[1] == "skills/list" {
                &["clean-sales", "monthly-totals"]
            } else {
                &["monthly-totals"]
            };
            assert_eq!(names, want, "{what}: {stdout}");
            for r in &reports {
                assert_eq!(r["outcome"], "verified", "{what}: {r}");
                assert_eq!(r["conformance"], serde_json::json!([]), "{what}: {r}");
                let file = &r["files"][0];
                assert_eq!(file["status"], "verified", "{what}: {r}");
                assert_eq!(file["actualDigest"], file["expectedDigest"], "{what}: {r}");
            }
        }
    }
}
