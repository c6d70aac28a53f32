//! `mcp-code-bridge servers`, the binary, over a temporary HOME/XDG tree and project directory
//! that hold every discovery source: each server is listed with the file it came from, a broken
//! file is a warning naming it, the first definition of a name wins, and an entry that would
//! launch the bridge itself is skipped with a reason unless `MCP_BRIDGE_ALLOW_SELF_SERVER`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{BIN, Home};
use serde_json::json;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `{"mcpServers": {name: {"command": command}}}`.
fn one(name: &str, command: &str) -> String {
    json!({"mcpServers": {name: {"command": command}}}).to_string()
}

/// Every source of the issue, each defining its own server, plus conflicts, a broken file and
/// a self-launching entry. Returns (home, project dir, servers file, expected name -> file).
fn tree() -> (Home, PathBuf, PathBuf, Vec<(&'static str, PathBuf)>) {
    let home = Home::new();
    let h = home.path().canonicalize().unwrap();
    let cfg = h.join(".config");
    let project = h.join("work/app");
    std::fs::create_dir_all(&project).unwrap();
    let mut expected = Vec::new();

    // [servers.<name>] in the bridge's TOML.
    let toml_file = cfg.join("mcp-code-bridge/config.toml");
    write(
        &toml_file,
        "[servers.from_toml]\ncommand = \"toml-server\"\n\n[servers.dup]\ncommand = \"dup-from-toml\"\n",
    );
    // MCP_BRIDGE_SERVERS_FILE.
    let servers_file = h.join("elsewhere/servers.json");
    write(&servers_file, &one("from_servers_file", "sf-server"));
    expected.push(("from_servers_file", servers_file.clone()));
    // ~/MCPs/*.json, one of them broken, one redefining `dup`.
    let mcps_a = h.join("MCPs/a.json");
    write(
        &mcps_a,
        &json!({"description": "team servers", "mcpServers": {
            "from_mcps": {"command": "mcps-server", "env": {"API_TOKEN": "tok-s3cr3t-mcps"}},
            "dup": {"command": "dup-from-mcps"},
            "self_bridge": {"command": "mcp-code-bridge", "args": ["run"]}
        }})
        .to_string(),
    );
    expected.push(("from_mcps", mcps_a.clone()));
    write(&h.join("MCPs/b-broken.json"), "{ \"mcpServers\": { oops");
    // $XDG_CONFIG_HOME/mcp/mcp.json as home-manager's programs.mcp writes it.
    let hm = cfg.join("mcp/mcp.json");
    write(
        &hm,
        &json!({"mcpServers": {
            "hm_http": {"type": "http", "url": "https://mcp.example.com/mcp?token=q-s3cr3t",
                        "headers": {"Authorization": "Bearer hdr-s3cr3t"}},
            "hm_stdio": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],
                         "env": {"NPM_TOKEN": "{file:/run/secrets/npm}"}}
        }})
        .to_string(),
    );
    expected.push(("hm_http", hm.clone()));
    expected.push(("hm_stdio", hm.clone()));
    // $XDG_CONFIG_HOME/mcp/servers/*.json.
    let xdg_dir = cfg.join("mcp/servers/extra.json");
    write(&xdg_dir, &one("from_xdg_servers_dir", "xdg-dir-server"));
    expected.push(("from_xdg_servers_dir", xdg_dir.clone()));
    // ~/.claude.json: top level and this project's entry (another project's stays out).
    let claude = h.join(".claude.json");
    write(
        &claude,
        &json!({
            "mcpServers": {"claude_user": {"command": "cc-user"}},
            "projects": {
                project.to_str().unwrap(): {"mcpServers": {"claude_project": {"command": "cc-project"}}},
                "/some/other/project": {"mcpServers": {"claude_other": {"command": "cc-other"}}}
            }
        })
        .to_string(),
    );
    expected.push(("claude_user", claude.clone()));
    expected.push(("claude_project", claude.clone()));
    // Claude Desktop on Linux.
    let desktop = cfg.join("Claude/claude_desktop_config.json");
    write(&desktop, &one("from_desktop", "desktop-server"));
    expected.push(("from_desktop", desktop.clone()));
    // The project: ./.mcp.json (redefines dup), ./mcp-servers/*.json, ./.vscode/mcp.json.
    let dot_mcp = project.join(".mcp.json");
    write(
        &dot_mcp,
        &json!({"mcpServers": {"from_project": {"command": "project-server"}, "dup": {"command": "dup-from-project"}}})
            .to_string(),
    );
    expected.push(("from_project", dot_mcp.clone()));
    let proj_dir = project.join("mcp-servers/tools.json");
    write(&proj_dir, &one("from_project_dir", "project-dir-server"));
    expected.push(("from_project_dir", proj_dir.clone()));
    let vscode = project.join(".vscode/mcp.json");
    write(
        &vscode,
        r#"{
            // VS Code's format: a `servers` object, comments and trailing commas allowed
            "servers": {
                "from_vscode": {"type": "stdio", "command": "vscode-server", "args": ["--stdio",],},
            },
        }"#,
    );
    expected.push(("from_vscode", vscode.clone()));
    (home, project, servers_file, expected)
}

/// The environment of a `servers` run: only the private tree and PATH (no image is needed, so
/// `Home::env`'s image archive is left out), and no system config file.
fn discovery_env(home: &Home) -> Vec<(String, String)> {
    home.base_env()
}

fn servers_cmd(home: &Home, project: &Path, servers_file: &Path, extra: &[(&str, &str)]) -> String {
    let out = Command::new(BIN)
        .arg("servers")
        .env_clear()
        .envs(discovery_env(home))
        .env("MCP_BRIDGE_SERVERS_FILE", servers_file)
        .envs(extra.iter().copied())
        .current_dir(project)
        .output()
        .expect("run mcp-code-bridge servers");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "servers failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The "from ..." line printed under the server's own line in the server list.
fn origin_of<'a>(report: &'a str, name: &str) -> Option<&'a str> {
    let listing = report.split("\nSkipped:").next().unwrap();
    let mut lines = listing.lines();
    while let Some(l) = lines.next() {
        if l.starts_with(&format!("  {name} ")) {
            return lines.next().and_then(|n| n.trim().strip_prefix("from "));
        }
    }
    None
}

fn section<'a>(report: &'a str, title: &str) -> &'a str {
    let start = report
        .find(&format!("\n{title}:\n"))
        .unwrap_or_else(|| panic!("no {title} section in:\n{report}"));
    let rest = &report[start + title.len() + 3..];
    let end = rest.find("\n\n").unwrap_or(rest.len());
    &rest[..end]
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_lists_every_source_with_its_file() {
    let (home, project, servers_file, expected) = tree();
    let report = servers_cmd(&home, &project, &servers_file, &[]);

    for (name, file) in &expected {
        let origin =
            origin_of(&report, name).unwrap_or_else(|| panic!("{name} not listed:\n{report}"));
        assert!(
            origin.starts_with(file.to_str().unwrap()),
            "{name} comes from {origin}, expected {}:\n{report}",
            file.display()
        );
    }
    // The TOML's servers name the very file; Claude Code's project entry names the project.
    assert!(
        origin_of(&report, "from_toml").unwrap().contains(
            home.path()
                .canonicalize()
                .unwrap()
                .join(".config/mcp-code-bridge/config.toml")
                .to_str()
                .unwrap()
        ),
        "{report}"
    );
    assert!(
        origin_of(&report, "claude_project")
            .unwrap()
            .contains(&format!("projects[\"{}\"]", project.display())),
        "{report}"
    );
    assert!(origin_of(&report, "claude_other").is_none(), "{report}");
    // A file-level description applies to the file's servers.
    assert!(report.contains("      team servers\n"), "{report}");
    // Transport and target, never secrets.
    assert!(
        report.contains("  hm_http  http https://mcp.example.com/mcp\n"),
        "{report}"
    );
    assert!(report.contains("  hm_stdio  stdio npx\n"), "{report}");
    assert!(!report.contains("s3cr3t"), "a secret is printed:\n{report}");
    let listed = report.lines().next().unwrap();
    assert_eq!(
        listed,
        format!("{} MCP server(s):", expected.len() + 2),
        "{report}"
    );

    // First definition wins: the TOML's dup; the others are skipped naming the winner.
    assert!(
        report.contains("  dup  stdio dup-from-toml\n"),
        "the TOML's definition wins:\n{report}"
    );
    let skipped = section(&report, "Skipped");
    for file in [home.path().join("MCPs/a.json"), project.join(".mcp.json")] {
        let file = file.canonicalize().unwrap();
        assert!(
            skipped.contains(&format!(
                "  dup  ({})\n      already defined by",
                file.display()
            )),
            "dup from {} not skipped:\n{report}",
            file.display()
        );
    }

    // The self-launching entry is skipped with the reason and how to allow it.
    assert!(origin_of(&report, "self_bridge").is_none(), "{report}");
    let self_skip = skipped
        .split_once("  self_bridge  (")
        .and_then(|(_, rest)| rest.lines().nth(1))
        .unwrap_or_else(|| panic!("self_bridge not skipped:\n{report}"));
    assert!(
        self_skip.contains("start this bridge itself")
            && self_skip.contains("MCP_BRIDGE_ALLOW_SELF_SERVER"),
        "{self_skip}"
    );

    // The broken file is a warning naming it; its neighbours still loaded (checked above).
    let warnings = section(&report, "Warnings");
    let broken = home
        .path()
        .canonicalize()
        .unwrap()
        .join("MCPs/b-broken.json");
    assert!(
        warnings.contains(broken.to_str().unwrap()) && warnings.contains("not valid JSON"),
        "{report}"
    );

    // The places read, in precedence order, each marked.
    let sources = report.split("Sources, in precedence order").nth(1).unwrap();
    assert!(
        sources.contains(&format!("read: {}", servers_file.display())),
        "{report}"
    );
    assert!(
        sources.contains(&format!(
            "read: {}",
            project.join(".vscode/mcp.json").display()
        )),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn self_server_is_listed_when_allowed() {
    let (home, project, servers_file, _) = tree();
    let report = servers_cmd(
        &home,
        &project,
        &servers_file,
        &[("MCP_BRIDGE_ALLOW_SELF_SERVER", "1")],
    );
    let origin = origin_of(&report, "self_bridge").unwrap_or_else(|| panic!("{report}"));
    assert!(origin.ends_with("MCPs/a.json"), "{origin}");
    assert!(
        report.contains("  self_bridge  stdio mcp-code-bridge\n"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_servers_file_and_no_sources_are_explained() {
    let home = Home::new();
    let project = home.path().join("empty-project");
    std::fs::create_dir_all(&project).unwrap();
    let missing = home.path().join("no-such-servers.json");
    let report = servers_cmd(&home, &project, &missing, &[]);
    assert!(report.starts_with("No MCP servers discovered."), "{report}");
    let warnings = section(&report, "Warnings");
    assert!(
        warnings.contains(missing.to_str().unwrap()) && warnings.contains("no such file"),
        "{report}"
    );
}
