//! The command line: `run` (the stdio MCP server, default), `serve` (Streamable HTTP), `exec`, `doctor`, `servers`,
//! `config` and `image load`. Everything printed for people goes to stdout except in `run`,
//! where stdout is the MCP channel and only the log (stderr) speaks.
//!
//! Exit codes: every command exits with 2 when the configuration is refused; `exec` exits with
//! 0 (ran), 1 (the code failed), 124 (timed out), or 2 when it could not set up (code to read,
//! server names, engine, image); `image load` with 2 without an archive or an engine; `doctor`
//! with 1 when a check fails.
//!
//! One module per command group: `exec`, `doctor`, `servers` (`--refresh`), `show` (`config`), `image`,
//! `audit`.

// The commands that print for people (Cargo.toml's lints refuse a print anywhere else: stdout
// is the MCP channel of `run`, which prints nothing).
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod audit;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod doctor;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod exec;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod image;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod packages;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod servers;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod sessions;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod show;
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod skills;
mod term;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use bridge_core::config::{self, Overrides};
use bridge_sandbox::Sandbox;
use bridge_server::Bridge;
use bridge_upstream::Upstreams;
use term::{Usage, fail};

/// The command line as parsed: the global flags and the command.
#[derive(Debug, Parser)]
#[command(
    name = "mcp-code-bridge",
    version,
    about = "An MCP server with one tool, run_python: code mode over your MCP servers, in a hardened container"
)]
pub struct Cli {
    /// Extra TOML config file, read after /etc/mcp-code-bridge/config.toml and the user's.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Command-line values: the last layer, above environment and files.
    #[command(flatten)]
    pub overrides: Overrides,
    /// The command; none is `run`.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve MCP over stdio (the default).
    Run,
    /// Serve MCP over Streamable HTTP at /mcp, for a team or remote clients (--listen,
    /// token_file or [oauth] for who may call it).
    Serve,
    /// Run code once in a fresh sandbox and print what it prints.
    Exec {
        /// The code; `-`, or none without -f, reads it from stdin.
        code: Option<String>,
        /// Read the code from this file.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// MCP servers to load, comma-separated.
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
        /// Copy a host file or directory into the sandbox, at /data/<its name> or at the
        /// /data/... path after a colon (repeatable; added to the configured [[inputs]]).
        #[arg(long = "input", value_name = "HOST[:/data/PATH]")]
        inputs: Vec<String>,
        /// Write the images the code displays, and the files it leaves in /workspace/out, to
        /// this directory (made if missing).
        #[arg(long = "out", value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Check the runtime, socket, image, limits and servers, and say what is wrong.
    Doctor {
        /// Skip starting a sandbox.
        #[arg(long)]
        quick: bool,
    },
    /// List discovered MCP servers, each with the file it came from.
    Servers {
        /// Start every server to list its tools into the saved tool catalog (progress on stderr).
        #[arg(long)]
        refresh: bool,
    },
    /// Show the effective configuration and where each value came from.
    Config,
    /// Show the audit log: every run_python call and proxied tool call, oldest first.
    Audit {
        /// Keep printing new records as they are written (across rotations).
        #[arg(long)]
        follow: bool,
        /// Only the records of this session.
        #[arg(long)]
        session: Option<String>,
        /// Print the records as JSON lines, as stored.
        #[arg(long)]
        json: bool,
    },
    /// Manage the sandbox image.
    Image {
        /// What to do with it.
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Hold a parked sandbox for the next bridge: started by a bridge as it exits, never by
    /// hand (`sandbox::park`).
    #[command(name = "keep-parked", hide = true)]
    KeepParked {
        /// The container kept (only shown, in the process list).
        container: Option<String>,
    },
    /// The functions sessions saved (runtime.save_skill), which every new session defines.
    Skills {
        /// The skills of this `serve` identity (a token_file name or an OAuth `sub`), kept in
        /// <state_dir>/skills/users/; without it, the stdio user's.
        #[arg(long, global = true, value_name = "IDENTITY")]
        identity: Option<String>,
        /// What to do with them.
        #[command(subcommand)]
        command: SkillsCommand,
    },
    /// Sessions kept past their bridge: the ones keepers hold for the next bridge
    /// (session_linger, <state_dir>/engine/sessions) and their snapshots on disk
    /// (snapshot_max_size, <state_dir>/sessions).
    Sessions {
        /// What to do with them.
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// The host's cache of installed packages (runtime.install), <state_dir>/packages.
    Packages {
        /// What to do with it.
        #[command(subcommand)]
        command: PackagesCommand,
    },
}

/// `packages`: the host's cache of installed packages.
#[derive(Debug, Subcommand)]
pub enum PackagesCommand {
    /// List the cached wheels (distribution, size, sha256).
    List {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove cached wheels, least recently used first, down to packages.cache_max_size
    /// (or all of them with --all). Sessions keep what they installed.
    Prune {
        /// Remove every cached wheel, whatever the cache's size.
        #[arg(long)]
        all: bool,
    },
}

/// `sessions`: the sessions kept past their bridge.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List the sessions' snapshots (identity, name, size, age, time left, what they hold)
    /// and the parked sessions (identity, name, parked for, time left, container).
    List {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// End parked sessions and remove their snapshots before their time: NAME, or
    /// IDENTITY/NAME for one of `serve`.
    Rm {
        /// The sessions: NAME, or IDENTITY/NAME.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// End every parked session and remove every snapshot.
    Prune,
}

/// `skills`: the functions sessions saved.
#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// List the saved skills (name, when saved, description) and any that cannot be loaded.
    List {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a skill's source, its description and save time as comments before it.
    Show {
        /// The skill: its function's name.
        name: String,
    },
    /// Remove skills: new sessions no longer define them.
    Rm {
        /// The skills: their functions' names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `image`: the sandbox image.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Load the image archive into the engine (even if the image is present).
    Load {
        /// Archive to load instead of the configured one.
        #[arg(long)]
        archive: Option<PathBuf>,
    },
}

/// The whole program: the command line parsed, then the command run on a runtime of its own
/// (a keeper of a parked sandbox needs neither configuration nor runtime). In the library, so
/// that the binary instantiates none of the async code it runs: `src/main.rs` is one call.
pub fn entry() -> ExitCode {
    use clap::Parser as _;
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::KeepParked { .. })) {
        return bridge_sandbox::park::keeper_main();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return fail(
                &Usage::new(format!("cannot start the async runtime: {e}")),
                2,
            );
        }
    };
    let code = runtime.block_on(main(cli));
    // Background tasks (idle reapers, pipes) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    crate::otel::shutdown();
    code
}

/// Run the command `cli` names, on the runtime [`entry`] made: load the configuration (a
/// refused one exits with 2), start logging, then the command; its exit status.
pub async fn main(cli: Cli) -> ExitCode {
    let loaded = match config::load(cli.config.as_deref(), &cli.overrides) {
        Ok(l) => l,
        Err(e) => return fail(&e, 2),
    };
    let command = cli.command.unwrap_or(Command::Run);
    // `exec` and `doctor` print for a person on the same terminal as the log: unless the user
    // chose a level, only warnings and errors join their output.
    let level = match command {
        Command::Exec { .. } | Command::Doctor { .. }
            if matches!(loaded.source("log_level"), config::Source::Default) =>
        {
            config::LogLevel::Warn
        }
        _ => loaded.config.log_level,
    };
    bridge_core::logging::init(level);
    let config = Arc::new(loaded.config.clone());
    // `doctor` and `config` show these in their report; everything else logs them.
    if !matches!(command, Command::Doctor { .. } | Command::Config) {
        for w in &loaded.warnings {
            tracing::warn!("{w}");
        }
        for n in &loaded.notes {
            tracing::info!("{n}");
        }
    }
    if matches!(command, Command::Run | Command::Serve)
        && let Err(e) = crate::otel::init(&config)
    {
        return fail(&e, 2);
    }
    match command {
        Command::Run => {
            let sandbox = Sandbox::new(config.clone());
            sandbox.park_sessions_at_exit();
            let ups = Upstreams::from_loaded(&loaded);
            ups.log_discovery();
            let bridge = Bridge::new(config.clone(), sandbox, ups);
            // At process start, not at `initialized`: an agent that sends its first call at
            // once finds the engine (and the image check) under way. In the background: the
            // answers to `initialize` and `tools/list` never wait for it.
            bridge.warm_up();
            match bridge_server::serve_stdio(bridge).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve => {
            let sandbox = Sandbox::new(config.clone());
            sandbox.park_sessions_at_exit();
            let ups = Upstreams::from_loaded(&loaded);
            ups.log_discovery();
            let bridge = Bridge::new(config.clone(), sandbox, ups);
            // Clients come and go: warm up now rather than at each one's `initialized`.
            bridge.warm_up();
            match crate::http::serve(bridge, config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e, 2),
            }
        }
        Command::Exec {
            code,
            file,
            servers,
            inputs,
            out,
        } => {
            let config = if inputs.is_empty() {
                config
            } else {
                let mut c = (*config).clone();
                c.inputs
                    .extend(inputs.iter().map(|i| config::inputs::parse_flag(i)));
                if let Err((_, why)) = config::inputs::check(&c.inputs) {
                    return fail(&Usage::new(format!("--input: {why}")), 2);
                }
                Arc::new(c)
            };
            let ups = Upstreams::from_loaded(&loaded);
            exec::exec(config, ups, exec::Code { code, file }, servers, out).await
        }
        Command::Doctor { quick } => doctor::doctor(config, &loaded, quick).await,
        Command::Servers { refresh } => {
            let ups = Upstreams::from_loaded(&loaded);
            servers::print_report(&ups);
            if refresh {
                return servers::refresh_catalog(&ups).await;
            }
            ExitCode::SUCCESS
        }
        Command::Config => {
            show::print_config(&loaded);
            ExitCode::SUCCESS
        }
        Command::Audit {
            follow,
            session,
            json,
        } => audit::audit(
            &loaded,
            audit::Options {
                follow,
                session,
                json,
            },
        ),
        Command::Image {
            command: ImageCommand::Load { archive },
        } => image::image_load(config, archive).await,
        Command::Packages { command } => match command {
            PackagesCommand::List { json } => packages::list(&config, json),
            PackagesCommand::Prune { all } => packages::prune(&config, all),
        },
        Command::Sessions { command } => match command {
            SessionsCommand::List { json } => sessions::list(&config, json),
            SessionsCommand::Rm { names } => sessions::rm(&config, &names),
            SessionsCommand::Prune => sessions::prune(&config),
        },
        Command::KeepParked { .. } => bridge_sandbox::park::keeper_main(),
        Command::Skills { identity, command } => {
            let store = skills::store(&config, identity.as_deref());
            match command {
                SkillsCommand::List { json } => skills::list(&store, json),
                SkillsCommand::Show { name } => skills::show(&store, &name),
                SkillsCommand::Rm { names } => skills::rm(&store, &names),
            }
        }
    }
}
