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
