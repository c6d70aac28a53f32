//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, on Node 22 from the
//! npm registry) against `serve`, every scenario of every suite: the ones a server with one
//! tool and one resource can meet must pass, and the ones that need the suite's own fixture
//! tools, resources or prompts are the baseline (tests/fixtures/conformance-baseline.yml), which
//! the suite also checks: a baseline entry that starts passing fails the run. scripts/test.sh
//! runs this with --nocapture, so the suite's summary is in the test output.

mod common;

use common::Home;
use common::served::Served;

#[tokio::test(flavor = "multi_thread")]
async fn official_conformance_suite() {
    let served = Served::start(Home::new(), &[], &[]);
    let results = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(common::server_bin("conformance"))
        .args([
            "server",
            "--url",
            &served.url,
            "--suite",
            "all",
            "--expected-failures",
        ])
        .arg(common::fixture("conformance-baseline.yml"))
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
    eprintln!("{summary}");
    assert!(
        out.status.success(),
        "the conformance suite failed ({:?}):\n{stdout}\n{stderr}\nbridge log:\n{}",
        out.status,
        served.home.log()
    );
    assert!(
        summary.contains("=== SUMMARY ==="),
        "no summary printed:\n{stdout}\n{stderr}"
    );
    // The scenarios that apply, by name: a suite that silently ran none of them would pass
    // the baseline check.
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "resources-list",
        "logging-set-level",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        assert!(
            summary.contains(&format!("✓ {scenario}:")),
            "{scenario} did not pass:\n{summary}"
        );
    }
}
