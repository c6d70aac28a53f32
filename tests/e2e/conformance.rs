//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, on Node 22 from the
//! npm registry) against `serve`, every scenario of every suite, once per protocol revision the
//! bridge speaks: 2025-11-25 (MCP sessions, `initialize`) and 2026-07-28 (requests that stand
//! alone, `server/discover`). The scenarios a server with one tool and one resource can meet
//! must pass; the ones (or the checks of a scenario) that need the suite's own fixture tools,
//! resources or prompts are each revision's baseline (tests/fixtures/conformance-baseline-*.yml,
//! each entry with its reason), which the suite also holds to: a baseline entry that starts
//! passing fails the run. scripts/test.sh runs this with --nocapture, so the suite's summary
//! of each revision is in the test output. The Skills extension's scenarios (sep-2640), which
//! no revision's suite runs, run against a store with a skill in
//! `sep_2640_skills_scenarios_pass_at_both_revisions`.

use crate::common;

use common::Home;
use common::served::Served;

/// Run the suite at `revision` against a fresh `serve`; every scenario in `passing` must have
/// passed (a suite that silently ran none of them would pass the baseline check).
async fn suite(revision: &str, passing: &[&str]) {
    let served = Served::start(Home::new(), &[], &[]);
    let results = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(common::server_bin("conformance"))
        .args([
            "server",
            "--url",
            &served.url,
            "--suite",
            "all",
            "--spec-version",
            revision,
            "--expected-failures",
        ])
        .arg(common::fixture(&format!(
            "conformance-baseline-{revision}.yml"
        )))
        .arg("--output-dir")
        .arg(results.path())
        .current_dir(results.path())
        .output()
        .await
        .expect("run the conformance suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout
        .find("=== SUMMARY ===")
        .map(|i| &stdout[i..])
        .unwrap_or(&stdout);
    eprintln!("conformance suite at protocol revision {revision}:\n{summary}");
    assert!(
        out.status.success(),
        "the conformance suite failed at {revision} ({:?}):\n{stdout}\n{stderr}\nbridge log:\n{}",
        out.status,
        served.home.log()
    );
    assert!(
        summary.contains("=== SUMMARY ==="),
        "no summary printed:\n{stdout}\n{stderr}"
    );
    for scenario in passing {
        assert!(
            summary.contains(&format!("✓ {scenario}:")),
            "{scenario} did not pass at {revision}:\n{summary}"
        );
    }
    // Nothing the suite sent is an error of the bridge's own.
    let log = served.home.log();
    assert!(
        !log.lines().any(|l| l.contains(" ERROR ")),
        "ERROR lines in the bridge's log at {revision}:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn official_conformance_suite_2025_11_25() {
    suite(
        "2025-11-25",
        &[
            "server-initialize",
            "server-session-lifecycle",
            "ping",
            "completion-complete",
            "tools-list",
            "resources-list",
            "logging-set-level",
            "server-sse-multiple-streams",
            "dns-rebinding-protection",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn official_conformance_suite_2026_07_28() {
    suite(
        "2026-07-28",
        &[
            "completion-complete",
            "tools-list",
            "resources-list",
            "sep-2164-resource-not-found",
            "server-sse-multiple-streams",
            "dns-rebinding-protection",
            "http-header-validation",
            "input-required-result-unsupported-methods",
            "input-required-result-validate-input",
        ],
    )
    .await;
}

/// The suite's sep-2640 scenarios (the Skills extension, tagged `[extension]`: not on a
/// revision's timeline, so `--suite all` skips them and they run here with `--force`) against a
/// `serve` whose store holds one saved skill, at each revision. Every check of
/// `sep-2640-skills-enumeration` and `sep-2640-skills-manifest` must succeed but the two
/// caching checks at 2025-11-25 (caching hints are 2026-07-28's), which the suite skips there;
/// `sep-2640-skills-directory` skips its checks, as `directoryRead` (optional: each skill is one
/// file) is not declared.
#[tokio::test(flavor = "multi_thread")]
async fn sep_2640_skills_scenarios_pass_at_both_revisions() {
    let home = Home::new();
    let state = home.path().join("state");
    let store = state.join("skills");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(
        store.join("clean_sales.py"),
        "def clean_sales(rows):\n    \"\"\"Drop refunds.\"\"\"\n    return [r for r in rows if r['amount'] > 0]\n",
    )
    .unwrap();
    std::fs::write(
        store.join("clean_sales.json"),
        r#"{"description": "Drop refunds: \"amount\" <= 0.\n\nRows are dicts.", "saved_at": "2026-11-28T21:00:00Z", "saved_by": "local/default (skills.save: allow)"}"#,
    )
    .unwrap();
    let state = state.display().to_string();
    let served = Served::start(home, &[("MCP_BRIDGE_STATE_DIR", &state)], &[]);
    for revision in ["2026-07-28", "2025-11-25"] {
        for (scenario, want) in [
            ("sep-2640-skills-enumeration", 31),
            ("sep-2640-skills-manifest", 5),
            ("sep-2640-skills-directory", 0),
        ] {
            let results = tempfile::tempdir().unwrap();
            let out = tokio::process::Command::new(common::server_bin("conformance"))
                .args(["server", "--url", &served.url, "--scenario", scenario])
                .args(["--spec-version", revision, "--force", "--output-dir"])
                .arg(results.path())
                .current_dir(results.path())
                .output()
                .await
                .expect("run the conformance suite");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{scenario} at {revision}:\n{stdout}");
            let dir = std::fs::read_dir(results.path())
                .unwrap()
                .flatten()
                .find(|e| e.path().join("checks.json").exists())
                .unwrap_or_else(|| panic!("no checks.json:\n{stdout}"));
            let checks: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("checks.json")).unwrap())
                    .unwrap();
            let mut passed = 0;
            for c in checks.as_array().unwrap() {
                let (id, status) = (c["id"].as_str().unwrap(), c["status"].as_str().unwrap());
                if !id.starts_with("sep-2640-") {
                    assert_eq!(status, "SUCCESS", "{scenario} at {revision}: {c}");
                    continue;
                }
                let skipped_here = scenario == "sep-2640-skills-directory"
                    || (revision == "2025-11-25" && id.ends_with("-cache-attributes"));
                match status {
                    "SUCCESS" if !skipped_here => passed += 1,
                    "SKIPPED" if skipped_here => {}
                    _ => panic!("{scenario} at {revision}: {c}"),
                }
            }
            let want = if revision == "2025-11-25" && scenario.ends_with("enumeration") {
                want - 2
            } else {
                want
            };
            assert_eq!(passed, want, "{scenario} at {revision}:\n{stdout}");
            eprintln!("{scenario} at {revision}: {passed} sep-2640 checks passed");
        }
    }
    let log = served.home.log();
    assert!(
        !log.lines().any(|l| l.contains(" ERROR ")),
        "ERROR lines in the bridge's log:\n{log}"
    );
}
