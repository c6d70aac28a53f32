//! The capability summary, a resource the client reads when it wants more than `tools/list`
//! says: the tool description and the helpers it leaves out, files in and out, long output,
//! packages, how to load servers, the servers discovered (names only, no schemas) and the tool
//! policy. Built on each read, from the configuration, the image as the last sandbox to boot
//! saw it, and the servers.

use bridge_core::config::Config;
use bridge_sandbox::Sandbox;
use bridge_upstream::Upstreams;

use crate::tool::{HELPERS, TOOL_DESCRIPTION};

/// The URI of the capability summary, the one resource every identity sees.
pub const CAPABILITIES_URI: &str = "resource://mcp-code-bridge/capabilities";

/// The capabilities' "Packages" section: how to install, what `[packages]` allows, and what
/// the image has (as the last sandbox to boot said).
fn packages_markdown(config: &Config, sandbox: &Sandbox) -> String {
    let p = &config.packages;
    let mut s = String::from(
        "\n\n## Packages\n\n`await runtime.install(\"name\", \"other==1.2\")` installs distributions into this session: the bridge resolves and downloads them on the host (the sandbox stays offline), from wheels only, never replacing the image's own packages. It returns `[{name, version, cached, size}]`; `runtime.installed()` lists the session's installs. A refusal raises `PackageDenied` (a `PermissionError`: do not retry), a failure `PackageError`.\n",
    );
    let globs = |l: &bridge_core::config::packages::NameGlobs| {
        l.0.iter()
            .map(|g| format!("`{g}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !p.allow.0.is_empty() {
        s.push_str(&format!(
            "- installed without asking: {}\n",
            globs(&p.allow)
        ));
    }
    if !p.deny.0.is_empty() {
        s.push_str(&format!("- refused: {}\n", globs(&p.deny)));
    }
    s.push_str("- anything else: the user is asked, shown every dependency that comes with it\n");
    if !p.preinstall.0.is_empty() {
        s.push_str(&format!(
            "- in every session already: {}\n",
            p.preinstall
                .0
                .iter()
                .map(|r| format!("`{r}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(t) = sandbox.seen_target() {
        let names: Vec<String> = t
            .dists
            .iter()
            .take(200)
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        s.push_str(&format!(
            "\nThe image has Python {} and: {}.",
            t.python,
            names.join(", ")
        ));
    }
    s
}

/// The capability summary as Markdown, as `resources/read` of [`CAPABILITIES_URI`] gives it.
pub(crate) fn markdown(config: &Config, sandbox: &Sandbox, upstreams: &Upstreams) -> String {
    let mut s = String::from("# mcp-code-bridge\n\n");
    s.push_str(TOOL_DESCRIPTION);
    s.push_str("\n\n");
    s.push_str(HELPERS);
    s.push_str("\n\n## Files out\n\nFiles the code writes under `/workspace/out/` (make it first: `os.makedirs(\"/workspace/out\", exist_ok=True)`) come back after the call as resource links (new or changed ones only) that the client reads with `resources/read`; images among them are also shown. Only regular files; they last as long as the session.");
    s.push_str(&format!("\n\n## Long output\n\nA result carries at most {} tokens of output. Past that, each part too long (stdout, stderr, the value, the traceback) comes back as its head and tail with a line saying how much was left out, and the whole part is a file: `{}/{}/<call>.<part>.txt`, readable by the next call's code (`open(...)`: grep, slice or summarize it there) and as the resource link in the result. Displayed images past the result's limits are files with links too.", config.output_budget, bridge_sandbox::files::OUT_DIR, bridge_sandbox::files::KEPT_DIR));
    s.push_str(&packages_markdown(config, sandbox));
    if !config.inputs.is_empty() {
        s.push_str("\n\n## Files in\n\nThe user's files, copied into every new session (read-only on the host's side: changes stay in the sandbox, a reset brings the originals back):\n");
        for i in &config.inputs {
            s.push_str(&format!("- `{}`\n", i.sandbox_path()));
        }
    }
    s.push_str("\n\n## Loading servers\n\nPass `\"servers\": [\"name\", ...]` to `run_python`. Only loaded servers get `mcp_<alias>` proxies and accept calls; discovery helpers (`runtime.discovered_servers()`, `runtime.search_tool_docs()`) see every server. `runtime.describe_server(name)` shows a loaded server's tools and `cwd`.\n\n## Discovered servers\n\n");
    let servers = upstreams.discovered();
    if servers.is_empty() {
        s.push_str("(none configured: see `mcp-code-bridge servers`)\n");
    }
    for d in servers {
        s.push_str(&format!(
            "- `{}` (alias `mcp_{}`){}\n",
            d.name,
            d.alias,
            d.description.map(|x| format!(": {x}")).unwrap_or_default()
        ));
    }
    s.push_str("\n## Tool policy\n\nThe user decides which tool calls run (`server.tool` globs on real names):\n");
    s.push_str(&upstreams.policy().markdown());
    let flows = upstreams.flows().rules().markdown();
    if !flows.is_empty() {
        s.push_str("\n## Flows\n\n");
        s.push_str(&flows);
    }
    s
}
