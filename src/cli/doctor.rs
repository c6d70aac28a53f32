//! `doctor`: check the configuration, engine, limits, image archive, image and servers, then
//! (unless `--quick`) start a sandbox, and say for each failure what repairs it.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use bridge_core::config::{self, Config};
use bridge_core::error::Hinted as _;
use bridge_sandbox::engine::{Enforcement, Engine};
use bridge_sandbox::{ExecRequest, Outcome, Sandbox, image};
use bridge_upstream::Upstreams;

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

pub(super) async fn doctor(config: Arc<Config>, loaded: &config::Loaded, quick: bool) -> ExitCode {
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
    // One sandbox for the whole report: its engine is the one checked here and the one the
    // trial run below uses, so a podman service the bridge has to start is started once.
    let sandbox = Sandbox::new(config.clone());
    let engine = match sandbox.engine().await {
        Ok(e) => {
            c.ok(&format!(
                "container engine: {:?} {} at {} ({})",
                e.kind, e.version, e.endpoint, e.origin
            ));
            if let Some(linger) = e.linger() {
                c.note(&format!(
                    "this podman service is the bridge's own: it stays for {} after the last \
                     bridge using it exits (doctor's run included), so the next bridge or `exec` \
                     skips its start; engine_linger = 0 stops it with its bridge",
                    config::Secs(linger)
                ));
            }
            Some(e)
        }
        Err(e) => {
            c.bad("container engine: none answered", &e.message());
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
                host_identity(&c, &config, engine, &enf);
                match (config.oci_runtime(), enf.isolation(&config)) {
                    (None, _) => c.ok(
                        "isolation: container (the host's kernel; the engine's default runtime)",
                    ),
                    (Some(rt), Ok(())) => {
                        let path = enf.runtimes.get(rt).cloned().unwrap_or_default();
                        c.ok(&format!(
                            "isolation: gvisor, through the engine's runtime {rt} ({path}{})",
                            runsc_details(&path).await
                        ));
                    }
                    (Some(_), Err(e)) => c.bad(
                        &format!("isolation: {e}"),
                        &e.hint().map(|h| h.to_string()).unwrap_or_default(),
                    ),
                }
            }
            Err(e) => c.bad(
                &format!("engine info: {e}"),
                "check the engine with `podman info`",
            ),
        }
    }
    // `serve` for a team beyond this machine runs everyone's code on the host's kernel.
    if config.isolation == config::Isolation::Container
        && let Ok(addr) = config.listen.parse::<std::net::SocketAddr>()
        && !addr.ip().is_loopback()
    {
        c.note(&format!(
            "warning: `serve` listens on {addr}, beyond this machine, and its sandboxes share the \
             host's kernel (isolation = \"container\"); isolation = \"gvisor\" puts a second \
             kernel in between (SECURITY.md, Kernel isolation)"
        ));
    }
    if let Some(engine) = &engine
        && let Ok(n) = bridge_sandbox::container::census(engine).await
    {
        c.ok(&format!(
            "sandboxes of running bridges: {} in sessions, {} pooled (ready, pool_size = {})",
            n.sessions, n.pooled, config.pool_size
        ));
    }
    let parked = bridge_sandbox::parked::parked_sessions(&config.state_dir);
    c.note(&format!(
        "sessions parked for the next bridge on this state_dir: {parked} (session_linger = {}{}; `sessions list` shows them)",
        config.session_linger,
        if bridge_sandbox::park::sessions_eligible(&config) {
            ""
        } else {
            "; this configuration parks none: it needs engine_linger, isolation = \"container\" and no inputs"
        }
    ));
    if bridge_sandbox::park::eligible(&config) {
        match bridge_sandbox::park::keeper_dir() {
            Ok(dir) => c.ok(&format!(
                "hand-over to the next bridge: keepers listen in {} (this user's alone)",
                dir.display()
            )),
            Err(off) => c.bad(
                &format!(
                    "hand-over to the next bridge cannot work: {} (each bridge starts its own sandboxes)",
                    off.problem
                ),
                &off.fix,
            ),
        }
    }
    let stored = bridge_sandbox::snapshots::list(&config.state_dir);
    c.note(&format!(
        "session snapshots on disk: {} ({} bytes of snapshot_store_size = {}; snapshot_max_size = {}, snapshot_ttl = {}; `sessions list` shows them)",
        stored.len(),
        stored.iter().map(|l| l.size).sum::<u64>(),
        config.snapshot_store_size,
        config.snapshot_max_size,
        config.snapshot_ttl
    ));
    let archive_ok = check_archive(&mut c, loaded, quick).await;
    if let Some(engine) = &engine {
        let image_src = loaded.source("image");
        match engine.docker.inspect_image(&config.image).await {
            Ok(img) => c.ok(&format!(
                "image {} present ({} MiB, profile {})",
                config.image,
                img.size.unwrap_or(0) >> 20,
                image::profile(&img)
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
    c.note(&format!("policy: {}", ups.policy().summary()));
    c.note(&format!("flows: {}", ups.flows().rules().summary()));
    if engine.is_some() && c.failed == 0 && !quick {
        let req = ExecRequest {
            code: "import sys, os, platform\nprint(sys.version.split()[0], os.getuid(), platform.release())"
                .into(),
            timeout: std::time::Duration::from_secs(60),
            max_timeout: config.max_timeout.0,
            output_cap: 4096,
            spill: None,
            binding: bridge_core::protocol::ExecBinding::empty(),
            cancel: Default::default(),
            on_output: None,
        };
        let started = std::time::Instant::now();
        match sandbox
            .run(
                &bridge_core::identity::SessionKey::local("doctor"),
                false,
                req,
            )
            .await
        {
            Ok(o) if o.outcome == Outcome::Ok => {
                let out = o.stdout.trim().to_string();
                let mut words = out.split(' ');
                let (python, uid, kernel) = (
                    words.next().unwrap_or(""),
                    words.next().unwrap_or("?"),
                    words.next().unwrap_or("?"),
                );
                c.ok(&format!(
                    "sandbox runs: python {python} as uid {uid} (first call {:.1}s)",
                    started.elapsed().as_secs_f64()
                ));
                // The proof that the isolation asked for is the one in force: under gVisor the
                // code sees gVisor's kernel, not the host's.
                let host = bridge_sandbox::kernel::host().release;
                match config.isolation {
                    config::Isolation::Gvisor if kernel == host => c.bad(
                        &format!(
                            "isolation: the sandbox sees the host's kernel ({host}), not gVisor's"
                        ),
                        "the runtime named by gvisor_runtime is not gVisor: register runsc under that name",
                    ),
                    config::Isolation::Gvisor => c.ok(&format!(
                        "the sandbox's kernel is gVisor's ({kernel}), not the host's ({host})"
                    )),
                    config::Isolation::Container => {
                        c.ok(&format!("the sandbox's kernel is the host's ({kernel})"))
                    }
                }
            }
            Ok(o) => c.bad(
                &format!(
                    "sandbox ran but failed: {}",
                    bridge_server::render::compact_text(&o)
                ),
                "run with MCP_BRIDGE_LOG_LEVEL=debug for details",
            ),
            Err(e) => c.bad(
                &format!("sandbox did not start: {e}"),
                &e.hint()
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "see the message above".into()),
            ),
        }
    }
    // Stops the engine's own podman service too, when the sandbox had to start one, unless it
    // lingers (`engine_linger`, said above): then it stays for the next bridge, as after `run`.
    sandbox.shutdown().await;
    if c.failed == 0 {
        println!("all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("{} check(s) failed", c.failed);
        ExitCode::FAILURE
    }
}

/// `, runsc version …, platform …` of a gVisor runtime at `path` on this host: its version as
/// it prints it, and the platform a wrapper script (as setup-debian.sh writes) passes it. Empty
/// where the path is not here (a remote engine) or says nothing.
/// Which host identity the sandboxes run as (`sandbox::engine::HostIds`), and what bounds their
/// tasks: their own `nproc`, or the pids cgroup with no per-uid budget shared.
fn host_identity(c: &Checklist, config: &Config, engine: &Engine, enf: &Enforcement) {
    use bridge_sandbox::container::nproc_limit;
    use bridge_sandbox::engine::HostIds;
    let ids = engine.host_ids(config);
    let nproc = nproc_limit(config, ids);
    if enf.userns_remap {
        c.note("Docker's userns-remap is on: every container runs in its one remapped range");
    }
    match ids {
        HostIds::Own { owner, sandboxes } => c.ok(&format!(
            "host identity: each sandbox a host uid of its own (podman --userns=auto, from the \
             subordinate ids of {owner:?}: room for {sandboxes} sandboxes at once); its nproc \
             ulimit, {nproc}, counts its own tasks alone"
        )),
        HostIds::Shared(why) if config.allow_unenforced_limits => c.note(&format!(
            "host identity: every sandbox the same host uid ({why}). With \
             allow_unenforced_limits the pids cgroup may be missing, so nproc {nproc} bounds \
             their tasks: one budget for every sandbox of that uid, which one tenant's threads \
             can take from another's. For a host uid of each sandbox's own, give podman \
             subordinate ids (scripts/setup-debian.sh, docs/setup.md)"
        )),
        HostIds::Shared(why) => c.ok(&format!(
            "host identity: every sandbox the same host uid ({why}); each sandbox's tasks are \
             bounded by its pids cgroup ({}), and no per-uid budget binds them (nproc {nproc}). \
             For a host uid of each sandbox's own, give podman subordinate ids \
             (scripts/setup-debian.sh, docs/setup.md)",
            config.host_pids_limit()
        )),
    }
}

async fn runsc_details(path: &str) -> String {
    let mut out = String::new();
    if path.is_empty() {
        return out;
    }
    let version = tokio::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    if let Ok(Ok(o)) = tokio::time::timeout(std::time::Duration::from_secs(5), version).await
        && let Some(line) = String::from_utf8_lossy(&o.stdout).lines().next()
    {
        out.push_str(&format!(", {}", bridge_core::text::visible(line.trim())));
    }
    let script = std::fs::metadata(path)
        .ok()
        .filter(|m| m.len() < 4096)
        .and_then(|_| std::fs::read_to_string(path).ok())
        .unwrap_or_default();
    if let Some(p) = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--platform="))
    {
        out.push_str(&format!(", platform {}", bridge_core::text::visible(p)));
    }
    out
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
