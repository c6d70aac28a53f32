//! Section 13: packages on demand. The first install of a small pure-Python package from a
//! local index (the tests' `pyindex.py` fixture over the set-up's wheelhouse) with an empty
//! cache, the same install in a new session from the cache, and statsmodels from the public
//! index (reported, not a target). Each figure is the time of `await runtime.install(...)`
//! measured inside the sandbox, so a session's start is not in it.

use super::*;

/// The local index: (child, URL).
fn index() -> (std::process::Child, String) {
    let wheels = std::env::var("MCP_BRIDGE_TEST_WHEELHOUSE").unwrap_or_else(|_| {
        fail(
            "MCP_BRIDGE_TEST_WHEELHOUSE is not set (scripts/setup-debian.sh --test-deps writes it)",
        )
    });
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pyindex.py");
    let log = std::env::temp_dir().join(format!("mcb-bench-index-{}.log", std::process::id()));
    let mut child = std::process::Command::new("python3")
        .arg(fixture)
        .args(["--wheels", &wheels, "--log"])
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("python3 tests/fixtures/pyindex.py: {e}")));
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line.trim().to_string())
}

fn home_with(packages: &str) -> Home {
    let home = Home::new(&[]);
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), format!("[packages]\n{packages}\n")).unwrap();
    home
}

/// ms of one install in session `session`, and whether it came from the cache.
async fn install(live: &Live, session: &str, spec: &str) -> (f64, bool) {
    let code = format!(
        "import time\nfrom mcp import runtime\nt = time.perf_counter()\ngot = await runtime.install({spec:?})\nprint((time.perf_counter() - t) * 1e3, all(g['cached'] for g in got))"
    );
    let (out, _) = live
        .ok(json!({"code": code, "session": session, "timeout": 600}))
        .await;
    let mut it = out.split_whitespace();
    let ms: f64 = it
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| fail(&out));
    (ms, it.next() == Some("True"))
}

pub(crate) async fn packages_section(o: &Opts, t: &mut Table) {
    t.section(
        13,
        "13. Packages on demand (runtime.install; the host resolves with uv and downloads)",
    );
    let (mut child, url) = index();
    let runs = if o.quick { 3 } else { 9 };
    let home = home_with(&format!("index_url = {url:?}\nallow = [\"tabulate\"]"));
    let env = home.env();
    let live = Live::start(home).await;
    live.ok(json!({"code": "pass"})).await;
    let (mut first, mut cached) = (Vec::new(), Vec::new());
    for i in 0..runs {
        // An empty cache each time: the first install resolves, downloads and unpacks.
        let out = std::process::Command::new(bridge_bin())
            .args(["packages", "prune", "--all"])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        if !out.status.success() {
            fail(&format!(
                "packages prune: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (ms, was_cached) = install(&live, &format!("first-{i}"), "tabulate").await;
        if was_cached {
            fail("the first install after a prune came from the cache");
        }
        first.push(ms);
        let (ms, was_cached) = install(&live, &format!("again-{i}"), "tabulate").await;
        if !was_cached {
            fail("the second session's install did not come from the cache");
        }
        cached.push(ms);
    }
    t.samples(
        "install of tabulate (pure Python, 1 wheel), empty cache, local index",
        &first,
        Unit::Ms,
        Target::AtMost(1000.0),
    );
    t.samples(
        "the same install in a new session, from the cache (no index request)",
        &cached,
        Unit::Ms,
        Target::AtMost(200.0),
    );
    live.shutdown().await;
    let _ = child.kill();
    let _ = child.wait();

    let live = Live::start(home_with("allow = [\"*\"]")).await;
    live.ok(json!({"code": "pass"})).await;
    let (ms, _) = install(&live, "statsmodels", "statsmodels").await;
    t.row(
        "install of statsmodels and its dependencies from the public index, empty cache",
        "1".into(),
        ms,
        ms,
        Unit::Ms,
        Target::None,
    );
    let (ms, _) = install(&live, "statsmodels-again", "statsmodels").await;
    t.row(
        "statsmodels again, in a new session, from the cache",
        "1".into(),
        ms,
        ms,
        Unit::Ms,
        Target::None,
    );
    live.shutdown().await;
}
