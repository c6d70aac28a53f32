//! Skills end to end: a function saved with `runtime.save_skill` in one bridge process is defined
//! in the next one's first session (a pooled sandbox), found by `search_tool_docs`, run by
//! `exec`, listed, shown and removed by `mcp-code-bridge skills`; a skill file that no longer
//! compiles is named and the call goes on; each bound of `[skills]` is hit and explained. Real
//! binary, real podman, rmcp's client.

mod common;

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
    let mut all = vec![("MCP_BRIDGE_STATE_DIR", state.as_str())];
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
    // The host does not compile Python: a skill that does not compile is listed like any
    // other, and named by each session that cannot define it.
    assert!(out.contains("broken_one"), "{out}");
    let (code, out, err) = cli(state.path(), &["skills", "show", "sales_total"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("# skill sales_total, saved "), "{out}");
    assert!(out.contains("def sales_total(rows):"), "{out}");
    let (code, out, err) = cli(state.path(), &["skills", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listing: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listing["skills"][0]["name"], "broken_one");
    assert_eq!(listing["skills"][1]["name"], "sales_total");
    assert_eq!(listing["broken"], serde_json::json!([]));

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
