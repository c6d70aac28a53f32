//! The MCP server the agent talks to: one tool, `run_python`, and one resource, the capability
//! summary. The standing context (`tools/list`) is built from constants only, so it is the same
//! bytes however many upstream servers exist.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.
use bridge_core::boxed::Boxed;

use std::sync::Arc;

// MCP logging is deprecated in the newest protocol revision (SEP-2577) but still what most
// clients show: the level a client set with `logging/setLevel` is kept.
#[allow(deprecated)]
use rmcp::model::LoggingLevel;
use rmcp::task_manager::TaskManager;

use bridge_core::audit::Audit;
use bridge_core::config::Config;
use bridge_sandbox::Sandbox;
use bridge_upstream::Upstreams;

pub mod budget;
mod handler;
pub mod legacy_tasks;
mod link;
pub mod progress;
pub mod published;
pub mod render;
mod replies;
mod rounds;
mod run;
pub mod stdio;
mod tasks;
mod tool;

pub use link::{APPROVE_DENY, APPROVE_ONCE, APPROVE_SESSION, approval_schema};
pub use tool::{
    HELPERS, MAX_CODE_BYTES, MAX_REQUEST_LINE_BYTES, RunArgs, TOOL_DESCRIPTION, TOOL_TITLE,
    input_schema, tool,
};

pub const TOOL_NAME: &str = "run_python";
/// How often a task's client is told to poll it.
const TASK_POLL_MS: u64 = 500;
/// How long a task's result is kept for its client after the longest call could have ended.
const TASK_RETENTION: std::time::Duration = std::time::Duration::from_secs(300);
pub const CAPABILITIES_URI: &str = "resource://mcp-code-bridge/capabilities";

#[derive(Clone)]
pub struct Bridge {
    config: Arc<Config>,
    sandbox: Arc<Sandbox>,
    upstreams: Upstreams,
    #[allow(deprecated)]
    log_level: Arc<std::sync::Mutex<Option<LoggingLevel>>>,
    audit: Audit,
    /// The saved skills, whose RPC methods every exec's handler answers first.
    skills: Arc<bridge_skills::Store>,
    /// The installer of `runtime.install`, whose RPC methods every exec's handler answers too.
    packages: Arc<bridge_packages::Packages>,
    /// `run_python` calls running as tasks, for clients that declared the tasks extension.
    tasks: TaskManager,
    /// Whose each task is (`None`: the stdio user's) and its form, so one identity cannot read or cancel
    /// another's task by its id. Pruned of the tasks the manager has let go of.
    task_owners: Arc<std::sync::Mutex<std::collections::HashMap<String, tasks::Owner>>>,
    /// `run_python` calls paused on a question under 2026-07-28 (`input_required`), by handle.
    paused: rounds::Paused,
}

impl Bridge {
    /// The bridge of `run`; it opens the audit log configured by `[audit]`.
    pub fn new(config: Arc<Config>, sandbox: Arc<Sandbox>, upstreams: Upstreams) -> Self {
        let audit = Audit::open(&config);
        let skills = Arc::new(bridge_skills::Store::from_config(&config));
        let packages = bridge_packages::Packages::new(&config, audit.clone());
        sandbox.set_audit(audit.clone());
        if !config.packages.preinstall.0.is_empty() {
            sandbox.set_provision(Arc::new(bridge_packages::Preinstall(packages.clone())));
        }
        Bridge {
            skills,
            packages,
            config,
            sandbox,
            upstreams,
            log_level: Default::default(),
            audit,
            tasks: TaskManager::new(),
            task_owners: Default::default(),
            paused: Default::default(),
        }
    }

    /// The bridge as one HTTP client's connection sees it: shared sessions, servers, audit and
    /// tasks, and its own `logging/setLevel`.
    pub fn for_connection(&self) -> Bridge {
        Bridge {
            log_level: Default::default(),
            ..self.clone()
        }
    }

    /// Start the engine, the image and the pool in the background (see `Sandbox::warm_up`),
    /// and load the tokenizer the budget counts with (`budget::prepare`) on a blocking thread.
    pub fn warm_up(&self) {
        self.sandbox.warm_up();
        tokio::task::spawn_blocking(budget::prepare);
    }

    /// The audit log, for whoever records proxied calls (a clone shares the one writer).
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The capabilities' "Packages" section: how to install, what `[packages]` allows, and what
    /// the image has (as the last sandbox to boot said).
    fn packages_markdown(&self) -> String {
        let p = &self.config.packages;
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
        s.push_str(
            "- anything else: the user is asked, shown every dependency that comes with it\n",
        );
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
        if let Some(t) = self.sandbox.seen_target() {
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

    /// The capability summary resource: the tool description, how to load servers, and the
    /// names of the servers discovered (no schemas).
    pub fn capabilities_markdown(&self) -> String {
        let mut s = String::from("# mcp-code-bridge\n\n");
        s.push_str(TOOL_DESCRIPTION);
        s.push_str("\n\n");
        s.push_str(HELPERS);
        s.push_str("\n\n## Files out\n\nFiles the code writes under `/workspace/out/` (make it first: `os.makedirs(\"/workspace/out\", exist_ok=True)`) come back after the call as resource links (new or changed ones only) that the client reads with `resources/read`; images among them are also shown. Only regular files; they last as long as the session.");
        s.push_str(&format!("\n\n## Long output\n\nA result carries at most {} tokens of output. Past that, each part too long (stdout, stderr, the value, the traceback) comes back as its head and tail with a line saying how much was left out, and the whole part is a file: `{}/{}/<call>.<part>.txt`, readable by the next call's code (`open(...)`: grep, slice or summarize it there) and as the resource link in the result. Displayed images past the result's limits are files with links too.", self.config.output_budget, bridge_sandbox::files::OUT_DIR, bridge_sandbox::files::KEPT_DIR));
        s.push_str(&self.packages_markdown());
        if !self.config.inputs.is_empty() {
            s.push_str("\n\n## Files in\n\nThe user's files, copied into every new session (read-only on the host's side: changes stay in the sandbox, a reset brings the originals back):\n");
            for i in &self.config.inputs {
                s.push_str(&format!("- `{}`\n", i.sandbox_path()));
            }
        }
        s.push_str("\n\n## Loading servers\n\nPass `\"servers\": [\"name\", ...]` to `run_python`. Only loaded servers get `mcp_<alias>` proxies and accept calls; discovery helpers (`runtime.discovered_servers()`, `runtime.search_tool_docs()`) see every server. `runtime.describe_server(name)` shows a loaded server's tools and `cwd`.\n\n## Discovered servers\n\n");
        let servers = self.upstreams.discovered();
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
        s.push_str(&self.upstreams.policy().markdown());
        s
    }
}

/// The first SIGTERM or SIGINT, by name: both servers shut down cleanly on either.
pub async fn quit_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    let mut int = signal(SignalKind::interrupt()).expect("signal handler");
    tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" }
}

/// Serve MCP over stdio until the client closes it, then remove every container.
#[inline(never)]
pub fn serve_stdio(bridge: Bridge) -> Boxed<'static, anyhow::Result<()>> {
    Box::pin(serve_stdio_here(bridge))
}

async fn serve_stdio_here(bridge: Bridge) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let this = bridge.clone();
    let transport = stdio::StdioTransport::process(MAX_REQUEST_LINE_BYTES);
    let service = match bridge.serve(transport).await {
        Ok(s) => s,
        // A client that leaves before `initialize` (or `run < /dev/null`, a first try without a
        // client) did nothing wrong: there is nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("stdin closed before initialize: no client, nothing to serve");
            this.shutdown().await;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    tokio::select! {
        r = service.waiting() => { if let Err(e) = r { tracing::warn!("MCP service ended: {e}"); } }
        sig = quit_signal() => tracing::info!("{sig}: shutting down"),
    }
    this.shutdown().await;
    Ok(())
}

impl Bridge {
    /// Remove every container and stop every server; write the audit records still queued.
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.shutdown_here())
    }

    async fn shutdown_here(&self) {
        self.sandbox.shutdown().await;
        self.upstreams.shutdown().await;
        let audit = self.audit.clone();
        let _ = tokio::task::spawn_blocking(move || audit.flush(std::time::Duration::from_secs(5)))
            .await;
    }
}
