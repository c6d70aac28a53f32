//! Section 5: footprint.

use super::*;

/// Calls one tool of each of the five real servers in one run_python (all five loaded).
pub(crate) fn warm_all_code(fx: &Fixtures) -> String {
    format!(
        "await mcp_everything.echo(message='hi')\n\
         await mcp_filesystem.list_allowed_directories()\n\
         await mcp_docs.list_allowed_directories()\n\
         await mcp_time.get_current_time(timezone='UTC')\n\
         await mcp_git.git_status(repo_path={:?})\n\
         print('warm')",
        fx.repo.to_string_lossy()
    )
}

pub(crate) const ALL5: [&str; 5] = ["everything", "filesystem", "docs", "time", "git"];

/// RSS of fresh bridges after one call to each of the five real servers (each its own bridge,
/// so the figure is not inflated by what earlier sections did to a long-lived one).
pub(crate) async fn warm_rss(o: &Opts, fx: &Fixtures) -> Vec<f64> {
    let mut v = Vec::new();
    let code = warm_all_code(fx);
    for _ in 0..o.warm_rss {
        let live = Live::start(Home::new(&fx.real())).await;
        live.ok(json!({"code": code, "servers": ALL5, "timeout": 120}))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        v.push(rss_mib(live.pid));
        live.shutdown().await;
    }
    v
}

pub(crate) async fn image_figures(o: &Opts, t: &mut Table) {
    let image = "mcp-code-bridge-sandbox:latest";
    let out = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Size}}", image])
        .output()
        .await
        .unwrap_or_else(|e| fail(&format!("podman image inspect: {e}")));
    let size: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(f64::NAN);
    let archive = image_archive();
    let archive_mib = std::fs::metadata(&archive)
        .map(|m| m.len() as f64 / 1048576.0)
        .unwrap_or(f64::NAN);
    t.fact(
        &format!("image size (`podman image inspect {image}`); archive {archive_mib:.0} MiB"),
        "1 (deterministic)",
        fmt(size / 1048576.0, Unit::MiB),
        "",
        "",
    );
    let mut load = Vec::new();
    for i in 0..o.image_load {
        let tag = format!(
            "localhost/mcp-code-bridge-bench-load-{}-{i}:latest",
            std::process::id()
        );
        let home = Home::new(&[]);
        let t0 = Instant::now();
        let out = Command::new(bridge_bin())
            .args(["image", "load"])
            .env_clear()
            .envs(home.env())
            .env("MCP_BRIDGE_IMAGE", &tag)
            .current_dir(home.path())
            .output()
            .await
            .unwrap_or_else(|e| fail(&format!("mcp-code-bridge image load: {e}")));
        let el = t0.elapsed().as_secs_f64();
        if !out.status.success() {
            fail(&format!(
                "mcp-code-bridge image load failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        load.push(el);
        let _ = Command::new("podman").args(["rmi", &tag]).output().await;
    }
    t.samples(
        "first-run image load (`mcp-code-bridge image load` under a fresh tag, process wall time)",
        &load,
        Unit::S,
        Target::None,
    );
}
