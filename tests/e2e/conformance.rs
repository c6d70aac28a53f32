//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, on Node 22 from the
//! npm registry) against `serve`, every scenario of every suite, once per protocol revision the
//! bridge speaks: 2025-11-25 (MCP sessions, `initialize`) and 2026-07-28 (requests that stand
//! alone, `server/discover`). The scenarios a server with one tool and one resource can meet
//! must pass; the ones (or the checks of a scenario) that need the suite's own fixture tools,
//! resources or prompts are each revision's baseline (tests/fixtures/conformance-baseline-*.yml,
//! each entry with its reason), which the suite also holds to: a baseline entry that starts
//! passing fails the run. scripts/test.sh runs this with --nocapture, so the suite's summary
//! of each revision is in the test output.

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
