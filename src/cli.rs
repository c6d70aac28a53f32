//! The command line: `run` (the stdio MCP server, default), `exec`, `doctor`, `servers`,
//! `config` and `image load`. Everything printed for people goes to stdout except in `run`,
//! where stdout is the MCP channel and only the log (stderr) speaks.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config, KEYS, Overrides};
use crate::protocol::Stream;
use crate::sandbox::engine::{Enforcement, Engine};
use crate::sandbox::{ExecRequest, Outcome, Sandbox, image};
use crate::server::{self, Bridge};
use crate::upstream::Upstreams;

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
    #[command(flatten)]
    pub overrides: OverrideArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Command-line values: the last layer, above environment and files.
#[derive(Debug, Args, Default)]
pub struct OverrideArgs {
    /// Container engine: auto, podman, docker, or a socket URL.
    #[arg(long, global = true)]
    pub runtime: Option<String>,
    /// Sandbox image reference.
    #[arg(long, global = true)]
    pub image: Option<String>,
    /// Image archive to load when the image is missing.
    #[arg(long, global = true, value_name = "PATH")]
    pub image_archive: Option<PathBuf>,
    /// Default time limit of a call (30, 30s, 2m).
    #[arg(long, global = true)]
    pub timeout: Option<String>,
    /// Memory limit of the sandbox (512m, 1g).
    #[arg(long, global = true)]
    pub memory: Option<String>,
    /// Response format: compact or toon.
    #[arg(long, global = true)]
    pub output_mode: Option<String>,
    /// Log level: error, warning, info, debug, trace.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// State directory of the bridge.
    #[arg(long, global = true, value_name = "PATH")]
    pub state_dir: Option<PathBuf>,
    /// Run even where the host cannot enforce a resource limit.
    #[arg(long, global = true)]
    pub allow_unenforced_limits: bool,
}

impl OverrideArgs {
    fn to_overrides(&self) -> Overrides {
        Overrides {
            runtime: self.runtime.clone(),
            image: self.image.clone(),
            image_archive: self.image_archive.clone(),
            timeout: self.timeout.clone(),
            memory: self.memory.clone(),
            output_mode: self.output_mode.clone(),
            log_level: self.log_level.clone(),
            state_dir: self.state_dir.clone(),
            allow_unenforced_limits: self.allow_unenforced_limits.then_some(true),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve MCP over stdio (the default).
    Run,
    /// Run code once in a fresh sandbox and print what it prints.
    Exec {
        /// The code; without it and without -f, it is read from stdin.
        code: Option<String>,
        /// Read the code from this file.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// MCP servers to load, comma-separated.
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
    },
    /// Check the runtime, socket, image, limits and servers, and say what is wrong.
    Doctor {
        /// Skip starting a sandbox.
        #[arg(long)]
        quick: bool,
    },
    /// List discovered MCP servers, each with the file it came from.
    Servers,
    /// Show the effective configuration and where each value came from.
    Config,
    /// Manage the sandbox image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Load the image archive into the engine (even if the image is present).
    Load {
        /// Archive to load instead of the configured one.
        #[arg(long)]
        archive: Option<PathBuf>,
    },
}

pub async fn main(cli: Cli) -> ExitCode {
    let loaded = match config::load(cli.config.as_deref(), &cli.overrides.to_overrides()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    crate::logging::init(loaded.config.log_level);
    let config = Arc::new(loaded.config.clone());
    let command = cli.command.unwrap_or(Command::Run);
    // `doctor` and `config` show these in their report; everything else logs them.
    if !matches!(command, Command::Doctor { .. } | Command::Config) {
        for w in &loaded.warnings {
            tracing::warn!("{w}");
        }
        for n in &loaded.notes {
            tracing::info!("{n}");
        }
    }
    match command {
        Command::Run => {
            let sandbox = Sandbox::new(config.clone());
            let ups = Upstreams::from_loaded(&loaded);
            ups.log_discovery();
            let bridge = Bridge::new(config.clone(), sandbox, ups);
            match server::serve_stdio(bridge).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Exec {
            code,
            file,
            servers,
        } => exec(config, Upstreams::from_loaded(&loaded), code, file, servers).await,
        Command::Doctor { quick } => doctor(config, &loaded, quick).await,
        Command::Servers => {
            print!("{}", Upstreams::from_loaded(&loaded).report());
            ExitCode::SUCCESS
        }
        Command::Config => {
            print_config(&loaded);
            ExitCode::SUCCESS
        }
        Command::Image {
            command: ImageCommand::Load { archive },
        } => image_load(config, archive).await,
    }
}

fn read_code(code: Option<String>, file: Option<PathBuf>) -> Result<String, String> {
    match (code, file) {
        (Some(_), Some(_)) => Err("give the code as an argument or with -f, not both".into()),
        (Some(c), None) => Ok(c),
        (None, Some(f)) => {
            std::fs::read_to_string(&f).map_err(|e| format!("cannot read {}: {e}", f.display()))
        }
        (None, None) => {
            if std::io::stdin().is_terminal() {
                eprintln!("(reading code from stdin; end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            Ok(s)
        }
    }
}

struct Paint {
    on: bool,
}

impl Paint {
    fn red(&self, s: &str) -> String {
        if self.on {
            format!("\x1b[31m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn dim(&self, s: &str) -> String {
        if self.on {
            format!("\x1b[2m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

async fn exec(
    config: Arc<Config>,
    ups: Upstreams,
    code: Option<String>,
    file: Option<PathBuf>,
    servers: Vec<String>,
) -> ExitCode {
    let code = match read_code(code, file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let binding = match ups.bind(&servers).await {
        Ok(b) => b,
        Err(e) => {
            ups.shutdown().await;
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let sandbox = Sandbox::new(config.clone());
    let bar = load_bar(&config);
    if let Some((_, report)) = &bar {
        sandbox.set_load_progress(report.clone());
    }
    let err_paint = Paint {
        on: std::io::stderr().is_terminal(),
    };
    let sink: crate::sandbox::OutputSink = Arc::new(move |stream, data: &str| match stream {
        Stream::Stdout => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(data.as_bytes());
            let _ = o.flush();
        }
        Stream::Stderr => {
            let _ = std::io::stderr().lock().write_all(data.as_bytes());
        }
    });
    let req = ExecRequest {
        code,
        timeout: config.timeout.0,
        max_timeout: config.max_timeout.0,
        output_cap: config.output_cap.0 as usize,
        binding,
        cancel: tokio_util::sync::CancellationToken::new(),
        on_output: Some(sink),
    };
    let session = format!("exec-{}", std::process::id());
    let result = sandbox.run(&session, false, req).await;
    if let Some((bar, _)) = bar {
        bar.finish_and_clear();
    }
    sandbox.shutdown().await;
    ups.shutdown().await;
    let o = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{}", err_paint.red(&format!("error: {}", e.with_hint())));
            return ExitCode::from(2);
        }
    };
    if let Some(v) = &o.value {
        println!("{v}");
    }
    if !o.images.is_empty() {
        println!(
            "{}",
            Paint {
                on: std::io::stdout().is_terminal()
            }
            .dim(&format!(
                "[{} image(s) displayed; use run_python over MCP to receive them]",
                o.images.len()
            ))
        );
    }
    if let Some(e) = &o.error {
        let text = if e.traceback.is_empty() {
            format!("{}: {}", e.kind, e.message)
        } else {
            e.traceback.trim_end().to_string()
        };
        eprintln!("{}", err_paint.red(&text));
    }
    for n in &o.notices {
        eprintln!("{}", err_paint.dim(&format!("[bridge] {n}")));
    }
    match o.outcome {
        Outcome::Ok => ExitCode::SUCCESS,
        Outcome::Timeout => ExitCode::from(124),
        _ => ExitCode::FAILURE,
    }
}

/// A progress bar for loading the image archive, on a terminal only.
fn load_bar(config: &Config) -> Option<(indicatif::ProgressBar, crate::sandbox::LoadProgress)> {
    use std::os::unix::fs::PermissionsExt;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    // A stream script (executable archive) has no size to show: a spinner with bytes then.
    let total = config
        .image_archive
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .filter(|m| m.permissions().mode() & 0o111 == 0);
    let style = |t: &str| {
        indicatif::ProgressStyle::with_template(t)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    };
    let bar = match total {
        Some(m) => indicatif::ProgressBar::new(m.len()).with_style(style(
            "loading sandbox image {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )),
        None => indicatif::ProgressBar::new_spinner().with_style(style(
            "{spinner} loading sandbox image {bytes} ({bytes_per_sec})",
        )),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let b = bar.clone();
    Some((bar, Arc::new(move |bytes| b.set_position(bytes))))
}

fn print_config(loaded: &config::Loaded) {
    let v = serde_json::to_value(&loaded.config).unwrap_or_default();
    let width = KEYS.iter().map(|k| k.name.len()).max().unwrap_or(10);
    for k in KEYS {
        let val = match &v[k.name] {
            serde_json::Value::Null => "(unset)".to_string(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut source = loaded.source_of(k.name);
        if k.name == "image_sha256" && loaded.config.image_sha256.is_none() && source != "default" {
            source.push_str(", ignored (see the note below)");
        }
        println!("{:width$} = {:24} # {source}", k.name, val);
    }
    for (name, entry) in &loaded.config.servers {
        let what = entry
            .command
            .clone()
            .or(entry.url.clone())
            .unwrap_or_default();
        println!(
            "servers.{name} = {what} # {}",
            loaded.source_of(&format!("servers.{name}"))
        );
    }
    let list = |files: &[PathBuf]| {
        files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if loaded.files.is_empty() {
        println!(
            "# no config file found; looked at: {}",
            list(&config::config_files(None))
        );
    } else {
        println!("# config files read: {}", list(&loaded.files));
    }
    match &loaded.system {
        config::SystemConfig::Default(_) => {}
        config::SystemConfig::FromEnv(p) => println!(
            "# system config file {} (from {})",
            p.display(),
            config::SYSTEM_CONFIG_ENV
        ),
        config::SystemConfig::Disabled => println!(
            "# no system config file ({}=none)",
            config::SYSTEM_CONFIG_ENV
        ),
    }
    for n in &loaded.notes {
        println!("# note: {n}");
    }
    for w in &loaded.warnings {
        println!("# warning: {w}");
    }
}

struct Checklist {
    failed: usize,
    paint: bool,
}

impl Checklist {
    fn ok(&self, what: &str) {
        let mark = if self.paint {
            "\x1b[32m✓\x1b[0m"
        } else {
            "✓"
        };
        println!("{mark} {what}");
    }
    fn bad(&mut self, what: &str, fix: &str) {
        self.failed += 1;
        let mark = if self.paint {
            "\x1b[31m✗\x1b[0m"
        } else {
            "✗"
        };
        println!("{mark} {what}\n    fix: {fix}");
    }
    fn note(&self, what: &str) {
        println!("  {what}");
    }
}

async fn doctor(config: Arc<Config>, loaded: &config::Loaded, quick: bool) -> ExitCode {
    let mut c = Checklist {
        failed: 0,
        paint: std::io::stdout().is_terminal(),
    };
    let system = match &loaded.system {
        config::SystemConfig::Default(_) => String::new(),
        config::SystemConfig::FromEnv(_) => {
            format!(" (the system file from {})", config::SYSTEM_CONFIG_ENV)
        }
        config::SystemConfig::Disabled => {
            format!(" (no system file: {}=none)", config::SYSTEM_CONFIG_ENV)
        }
    };
    if loaded.files.is_empty() {
        c.ok(&format!(
            "configuration: built-in defaults and environment (no config file){system}"
        ));
    } else {
        c.ok(&format!(
            "configuration: {}{system}",
            loaded
                .files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for w in &loaded.warnings {
        c.note(&format!("warning: {w}"));
    }
    for n in &loaded.notes {
        c.note(&format!("note: {n}"));
    }
    let engine = match Engine::connect(&config).await {
        Ok(e) => {
            c.ok(&format!(
                "container engine: {:?} {} at {} ({})",
                e.kind, e.version, e.endpoint, e.origin
            ));
            Some(e)
        }
        Err(e) => {
            c.bad("container engine: none answered", &e.0);
            None
        }
    };
    if let Some(engine) = &engine {
        match Enforcement::query(&engine.docker).await {
            Ok(enf) => {
                c.ok(&format!(
                    "cgroup v{}, {}",
                    enf.cgroup_version,
                    if enf.rootless { "rootless" } else { "rootful" }
                ));
                let missing = enf.missing(&config);
                if missing.is_empty() {
                    c.ok(&format!(
                        "limits enforceable: memory {}, pids {}{}",
                        config.memory,
                        config.pids,
                        config
                            .cpus
                            .map(|x| format!(", cpus {x}"))
                            .unwrap_or_default()
                    ));
                } else if config.allow_unenforced_limits {
                    c.ok(&format!(
                        "limits NOT enforced (allowed by allow_unenforced_limits): {}",
                        missing.join("; ")
                    ));
                } else {
                    c.bad(
                        &format!(
                            "limits the host cannot enforce: {} (memory {} from {}, pids {} from {})",
                            missing.join("; "),
                            config.memory,
                            loaded.source("memory"),
                            config.pids,
                            loaded.source("pids"),
                        ),
                        "use cgroup v2 with controller delegation (rootless) or a rootful engine; or accept \
                         unenforced limits with MCP_BRIDGE_ALLOW_UNENFORCED_LIMITS=1",
                    );
                }
            }
            Err(e) => c.bad(
                &format!("engine info: {e}"),
                "check the engine with `podman info`",
            ),
        }
    }
    if let Some(engine) = &engine
        && let Ok(n) = crate::sandbox::container::census(engine).await
    {
        c.ok(&format!(
            "sandboxes of running bridges: {} in sessions, {} pooled (ready, pool_size = {})",
            n.sessions, n.pooled, config.pool_size
        ));
    }
    let archive_ok = check_archive(&mut c, loaded, quick).await;
    if let Some(engine) = &engine {
        let image_src = loaded.source("image");
        match engine.docker.inspect_image(&config.image).await {
            Ok(img) => c.ok(&format!(
                "image {} present ({} MiB)",
                config.image,
                img.size.unwrap_or(0) >> 20
            )),
            Err(_) => match &config.image_archive {
                Some(a) if archive_ok => c.ok(&format!(
                    "image {} not loaded yet; will load from {} on first use",
                    config.image,
                    a.display()
                )),
                // The archive's own check failed above and says how to repair it.
                Some(_) => c.note(&format!(
                    "image {} is not loaded, and its archive cannot load it (above)",
                    config.image
                )),
                None if image::names_registry(&config.image) => c.ok(&format!(
                    "image {} will be pulled on first use",
                    config.image
                )),
                None => c.bad(
                    &format!(
                        "image {} (from {image_src}) is not in the engine and no image_archive is configured",
                        config.image
                    ),
                    "on Debian or Ubuntu, run `scripts/setup-debian.sh --configure` (as root, or with sudo) \
                     from a checkout of mcp-code-bridge: it builds the image archive and configures it; \
                     elsewhere build one with `image/build-debian.sh --output sandbox.tar` and run \
                     `mcp-code-bridge image load --archive sandbox.tar`",
                ),
            },
        }
    }
    let ups = Upstreams::from_loaded(loaded);
    let servers = ups.discovered();
    c.ok(&format!(
        "{} MCP server(s) discovered (details: `mcp-code-bridge servers`)",
        servers.len()
    ));
    for w in ups.warnings() {
        c.note(&format!("warning: {w}"));
    }
    if engine.is_some() && c.failed == 0 && !quick {
        let sandbox = Sandbox::new(config.clone());
        let req = ExecRequest {
            code: "import sys, os\nprint(sys.version.split()[0], os.getuid())".into(),
            timeout: std::time::Duration::from_secs(60),
            max_timeout: config.max_timeout.0,
            output_cap: 4096,
            binding: crate::protocol::ExecBinding::empty(),
            cancel: Default::default(),
            on_output: None,
        };
        let started = std::time::Instant::now();
        match sandbox.run("doctor", false, req).await {
            Ok(o) if o.outcome == Outcome::Ok => {
                let out = o.stdout.trim().to_string();
                c.ok(&format!(
                    "sandbox runs: python {} as uid {} (first call {:.1}s)",
                    out.split(' ').next().unwrap_or(""),
                    out.split(' ').nth(1).unwrap_or("?"),
                    started.elapsed().as_secs_f64()
                ));
            }
            Ok(o) => c.bad(
                &format!(
                    "sandbox ran but failed: {}",
                    crate::render::compact_text(&o)
                ),
                "run with MCP_BRIDGE_LOG_LEVEL=debug for details",
            ),
            Err(e) => c.bad(
                &format!("sandbox did not start: {e}"),
                &e.hint().unwrap_or_else(|| "see the message above".into()),
            ),
        }
        sandbox.shutdown().await;
    }
    if let Some(e) = engine {
        e.shutdown().await;
    }
    if c.failed == 0 {
        println!("all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("{} check(s) failed", c.failed);
        ExitCode::FAILURE
    }
}

/// The one command that repairs `key`'s value, by where it came from.
fn repair(loaded: &config::Loaded, key: &str) -> String {
    let env = format!("{}{}", config::ENV_PREFIX, key.to_ascii_uppercase());
    match loaded.source(key) {
        src @ config::Source::File(_) if src.written_by_setup() => format!(
            "run `scripts/setup-debian.sh --configure` (as root, or with sudo) from a checkout of \
             mcp-code-bridge: it rebuilds the image archive and rewrites {src}"
        ),
        config::Source::File(p) if p.starts_with("/nix/store") => format!(
            "{} comes from your Nix configuration: rebuild it (`nixos-rebuild switch` or \
             `home-manager switch`)",
            p.display()
        ),
        config::Source::File(p) => format!(
            "edit `{key}` in {}: build an archive with `image/build-debian.sh --output FILE` \
             (or run `scripts/setup-debian.sh --configure`, which writes both keys to {})",
            p.display(),
            config::SYSTEM_CONFIG
        ),
        config::Source::Env(var) => format!(
            "unset {var}, or set it to the right value (`image/build-debian.sh --output FILE` builds an archive)"
        ),
        config::Source::CommandLine(flag) => format!("pass the right value to {flag}"),
        config::Source::Default => format!("set {env}"),
    }
}

/// Check the configured image archive: it exists and (unless `quick`) matches `image_sha256`.
/// Returns whether it can be loaded.
async fn check_archive(c: &mut Checklist, loaded: &config::Loaded, quick: bool) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let config = &loaded.config;
    let Some(archive) = &config.image_archive else {
        return true;
    };
    let from = loaded.source("image_archive");
    let meta = match std::fs::metadata(archive) {
        Ok(m) if m.is_file() => m,
        Ok(_) | Err(_) => {
            c.bad(
                &format!(
                    "image archive {} (image_archive from {from}) does not exist",
                    archive.display()
                ),
                &repair(loaded, "image_archive"),
            );
            return false;
        }
    };
    let mib = meta.len() >> 20;
    if meta.permissions().mode() & 0o111 != 0 {
        c.ok(&format!(
            "image archive {} is a stream script (image_archive from {from}); its output is checked while it loads",
            archive.display()
        ));
        return true;
    }
    let Some(want) = &config.image_sha256 else {
        c.ok(&format!(
            "image archive {} ({mib} MiB, image_archive from {from}; no image_sha256 to check it against)",
            archive.display()
        ));
        return true;
    };
    if quick {
        c.ok(&format!(
            "image archive {} ({mib} MiB, from {from}; sha256 not checked with --quick)",
            archive.display()
        ));
        return true;
    }
    match image::file_sha256(archive).await {
        Ok(got) if got.eq_ignore_ascii_case(want) => {
            c.ok(&format!(
                "image archive {} ({mib} MiB, from {from}) matches its sha256",
                archive.display()
            ));
            true
        }
        Ok(got) => {
            let digest_from = loaded.source("image_sha256");
            let fix = if digest_from == from {
                repair(loaded, "image_archive")
            } else {
                format!(
                    "the two keys come from different places: {}; or {}",
                    repair(loaded, "image_archive"),
                    repair(loaded, "image_sha256")
                )
            };
            c.bad(
                &format!(
                    "image archive {} has sha256 {got}, but image_sha256 (from {digest_from}) expects {want}",
                    archive.display()
                ),
                &fix,
            );
            false
        }
        Err(e) => {
            c.bad(
                &format!("image archive {}: {e}", archive.display()),
                &repair(loaded, "image_archive"),
            );
            false
        }
    }
}

async fn image_load(config: Arc<Config>, archive: Option<PathBuf>) -> ExitCode {
    let Some(archive) = archive.or(config.image_archive.clone()) else {
        eprintln!(
            "error: no image archive to load\nhint: pass --archive FILE, or set image_archive \
             (MCP_BRIDGE_IMAGE_ARCHIVE); `scripts/setup-debian.sh --configure` builds and configures one"
        );
        return ExitCode::from(2);
    };
    let engine = match Engine::connect(&config).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The configured digest is of the configured archive: another one is loaded unchecked.
    let image_sha256 = if config.image_archive.as_ref() == Some(&archive) {
        config.image_sha256.clone()
    } else {
        if config.image_sha256.is_some() {
            tracing::info!(
                "not checking {} against image_sha256: that is the digest of the configured archive",
                archive.display()
            );
        }
        None
    };
    let config = Arc::new(Config {
        image_archive: Some(archive.clone()),
        image_sha256,
        ..(*config).clone()
    });
    let bar = load_bar(&config);
    let report = |bytes: u64| {
        if let Some((_, f)) = &bar {
            f(bytes)
        }
    };
    let r = image::load(&engine.docker, &config, &archive, &report).await;
    if let Some((bar, _)) = &bar {
        bar.finish_and_clear();
    }
    engine.shutdown().await;
    match r {
        Ok(image::Provenance::Loaded { bytes, seconds, .. }) => {
            println!(
                "loaded {} ({} MiB in {seconds:.1}s)",
                config.image,
                bytes >> 20
            );
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(h) = e.hint() {
                eprintln!("hint: {h}");
            }
            ExitCode::FAILURE
        }
    }
}
