//! The hardened container: the one place the sandbox's isolation is defined, the labels that
//! say who owns a container, and the reaping of containers whose bridge died.

use bridge_core::boxed::Boxed;
use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{KillContainerOptionsBuilder, RemoveContainerOptionsBuilder};

pub use crate::engine::ContainerError;
use crate::engine::{Engine, HostIds};
use bridge_core::config::Config;

/// Label present on every container the bridge creates.
pub const LABEL_MANAGED: &str = "io.mcp-code-bridge.managed";
/// `<pid>:<process start time>` of the bridge that owns the container.
pub const LABEL_OWNER: &str = "io.mcp-code-bridge.owner";
/// The session name; empty on a container started for the pool, whose session is not known yet.
pub const LABEL_SESSION: &str = "io.mcp-code-bridge.session";
/// `true` on a container started for the pool of ready sandboxes (labels never change, so it
/// stays on one a session took: its name, renamed at hand-out, tells the two apart).
pub const LABEL_POOL: &str = "io.mcp-code-bridge.pool";
/// What a pooled container's name has until a session takes it: a session's container name never
/// holds a `.` ([`container_name`] replaces it).
pub const POOL_NAME_MARK: &str = ".pool-";
/// What a parked container's name holds, before the time its keeper removes it
/// (`….parked-<expires>-<id>`, `sandbox::park`): the bridge that made it is gone and a keeper
/// holds it for the next bridge, so no reaper takes it while it runs and its time lasts.
pub const PARKED_MARK: &str = ".parked-";
/// What an adopted container's name holds, followed by its owner (`pid_starttime`): its
/// [`LABEL_OWNER`] names the bridge that made and parked it (labels never change).
pub const ADOPTED_MARK: &str = ".adopted-by-";
/// Modules the runtime imports before it says `ready` (image/runtime/boot.py, `_preload`); set only on
/// pooled containers, where that time is spent before any call waits for it.
pub const ENV_PRELOAD: &str = "MCP_BRIDGE_PRELOAD";

/// What a container is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role<'a> {
    /// The named session, which waits for it.
    Session(&'a str),
    /// The pool: booted and preloaded ahead of need, handed to the next new session.
    Pool,
}

/// The engine-side name of a container: this bridge's pid, the session (or the pool) and a serial.
pub fn container_name(role: Role<'_>, serial: u64) -> String {
    let pid = std::process::id();
    match role {
        Role::Pool => format!("mcp-code-bridge-{pid}{POOL_NAME_MARK}{serial}"),
        Role::Session(session) => {
            let clean: String = session
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(40)
                .collect();
            format!("mcp-code-bridge-{pid}-{clean}-{serial}")
        }
    }
}

/// The name of a container that bridge `owner` adopted (`sandbox::park`): `base`, as
/// [`container_name`] makes it, and the owner, which the reapers read before the label.
pub fn adopted_name(base: &str, owner: &str) -> String {
    format!("{base}{ADOPTED_MARK}{}", owner.replace(':', "_"))
}

/// The loader: the container's whole command. It reads the runtime's source from the first frame.
pub const LOADER: &str = include_str!("../../../image/loader.py");

/// Identifies this bridge process across PID reuse: pid plus the kernel's start time of it.
pub fn owner_id() -> String {
    owner_of(std::process::id()).unwrap_or_else(|| format!("{}:0", std::process::id()))
}

/// `pid:starttime` of a running process; `None` when it is gone or a zombie (a killed bridge
/// whose parent has not reaped it yet is dead for our purposes).
fn owner_of(pid: u32) -> Option<String> {
    bridge_core::procfs::running_since(pid).map(|start| format!("{pid}:{start}"))
}

/// Whether the bridge that wrote `owner` is still running on this host.
fn owner_alive(owner: &str) -> bool {
    let Some(pid) = owner.split(':').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    owner_of(pid).as_deref() == Some(owner)
}

/// The `nproc` ulimit (`RLIMIT_NPROC`) of a sandbox's processes. The kernel counts it per real
/// uid across the whole host, so it is a per-sandbox bound only where each sandbox has a host uid
/// of its own ([`HostIds::Own`]), and under gVisor, whose kernel counts the code's tasks alone:
/// there it is `pids`. Where every sandbox runs as the same host uid it would be one budget
/// shared by every sandbox of every tenant (sandboxes holding threads within their own `pids`
/// stopped every other sandbox from starting), so it is [`SHARED_NPROC`], a ceiling no set of
/// sandboxes at their pids limits reaches before the host's own: the pids cgroup is each
/// sandbox's bound (the bridge runs only where it is enforced, unless `allow_unenforced_limits`).
/// With `allow_unenforced_limits` the pids cgroup may be missing, and nothing else bounds the
/// tasks: the shared bound stays (`pids × 4`, 64 to 1000), as `doctor` says.
pub fn nproc_limit(config: &Config, ids: &HostIds) -> i64 {
    let pids = config.pids as i64;
    if config.isolation == bridge_core::config::Isolation::Gvisor || ids.own() {
        pids
    } else if config.allow_unenforced_limits {
        1000.min(pids * 4).max(64)
    } else {
        shared_nproc().max(pids)
    }
}

/// The user namespace of a sandbox with its own ids: podman's `auto` with the range's size
/// given ([`ids_per_sandbox`](super::engine::ids_per_sandbox): what the sandbox's user needs, the size podman would otherwise work
/// out). Without a size, podman 4.3 (containers/storage 1.43) reads the image's layers for the
/// largest id in its passwd and group files, and takes the store's graph lock for it while it
/// holds the layer lock, the reverse of the order a mount or a container's clean-up takes them
/// in: two podman processes then wait on each other until one is killed, and every other podman
/// process waits on them (containers/podman#16062). With a size, that read is never made.
pub fn userns_auto(config: &Config) -> String {
    format!("auto:size={}", super::engine::ids_per_sandbox(config))
}

/// See [`nproc_limit`]: 32768, or the bridge's own hard `RLIMIT_NPROC` when that is lower (the
/// engine it starts inherits it, and no engine can give a container more than it has).
pub const SHARED_NPROC: i64 = 32768;

/// Every sandbox's `oom_score_adj`, the highest there is: under memory overcommitted (many
/// sessions each below its `memory` limit, together past the host's), the kernel's OOM killer
/// takes a sandbox's process first. Raising it needs no privilege, rootless too.
pub const OOM_SCORE_ADJ: i64 = 1000;

fn shared_nproc() -> i64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live, initialised `libc::rlimit` owned by this frame; getrlimit only
    // writes one such struct through the pointer and has no other precondition.
    let own = if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut r) } == 0 {
        i64::try_from(r.rlim_max).unwrap_or(i64::MAX)
    } else {
        SHARED_NPROC
    };
    SHARED_NPROC.min(own)
}

/// The create body of a sandbox container. Every isolation setting lives here, and is the same
/// for a pooled container as for a session's: only labels and the preload list differ. `ids`:
/// whether each container gets host ids of its own (`Engine::host_ids`).
pub fn spec(config: &Config, ids: &HostIds, role: Role<'_>, owner: &str) -> ContainerCreateBody {
    let mut labels = HashMap::new();
    labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    labels.insert(LABEL_OWNER.to_string(), owner.to_string());
    let session = match role {
        Role::Session(s) => s,
        Role::Pool => {
            labels.insert(LABEL_POOL.to_string(), "true".to_string());
            ""
        }
    };
    labels.insert(LABEL_SESSION.to_string(), session.to_string());
    let mut env = vec![
        "HOME=/workspace".to_string(),
        "PYTHONDONTWRITEBYTECODE=1".into(),
        "PYTHONUNBUFFERED=1".into(),
        "MPLBACKEND=Agg".into(),
        "MPLCONFIGDIR=/tmp/.matplotlib".into(),
        "LANG=C.UTF-8".into(),
    ];
    if role == Role::Pool && !config.preload.0.is_empty() {
        env.push(format!("{ENV_PRELOAD}={}", config.preload));
    }

    let tmpfs_opts = |size: u64| format!("rw,noexec,nosuid,nodev,size={size}");
    let mut tmpfs = HashMap::new();
    tmpfs.insert("/tmp".to_string(), tmpfs_opts(config.tmp_size.0));
    tmpfs.insert(
        "/workspace".to_string(),
        tmpfs_opts(config.workspace_size.0),
    );
    // `/workspace/out` (`sandbox::files::OUT_DIR`) is a mount point of its own, so it is always
    // this directory: code cannot remove, rename or replace a mount point (no capability to
    // unmount), so it cannot make the engine's copy of it follow a link elsewhere (a link to
    // `/proc/self` had kept the engine copying for ever, outside every sandbox limit). Mode
    // 1777 as `/workspace`'s (root-owned, sticky): the code writes in it and cannot chmod it.
    tmpfs.insert(
        super::files::OUT_DIR.to_string(),
        format!("{},mode=1777", tmpfs_opts(config.workspace_size.0)),
    );
    // Podman mounts its own writable tmpfs on /var/tmp under a read-only root, without noexec
    // and without a size: ours replaces it (tests/e2e/security.rs::filesystem_exec_from_writable_mounts_is_refused).
    tmpfs.insert("/var/tmp".to_string(), tmpfs_opts(config.tmp_size.0));
    // And its /run (a tmpfs without noexec or size, root's 755): under runc the sandbox's user
    // cannot write it, but gVisor (Debian's runsc 2022) gave it to that user, writable and
    // executable. Ours is root's, 755, noexec and small under every runtime.
    tmpfs.insert(
        "/run".to_string(),
        format!("{},mode=755", tmpfs_opts(1 << 20)),
    );
    // The user's declared inputs are copied here at start (`sandbox::inputs`); no inputs, no mount.
    if !config.inputs.is_empty() {
        tmpfs.insert(
            bridge_core::config::inputs::ROOT.to_string(),
            tmpfs_opts(config.inputs_size.0),
        );
    }

    let memory = config.memory.0 as i64;
    let host = HostConfig {
        // `isolation = "gvisor"`: the engine's gVisor runtime, for pooled containers as for
        // sessions'; `None` is the engine's default (runc, crun).
        runtime: config.oci_runtime().map(str::to_string),
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        memory: Some(memory),
        // Equal to `memory`: no swap on top of the limit.
        memory_swap: Some(memory),
        pids_limit: Some(config.host_pids_limit()),
        nano_cpus: config.cpus.map(|c| (c * 1e9) as i64),
        // Both always given: podman fills a ulimit not given with 1048576 when another is, which a
        // container in a user namespace cannot raise to ("operation not permitted").
        ulimits: Some(vec![
            ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(config.nofile as i64),
                hard: Some(config.nofile as i64),
            },
            ResourcesUlimits {
                name: Some("nproc".into()),
                soft: Some(nproc_limit(config, ids)),
                hard: Some(nproc_limit(config, ids)),
            },
        ]),
        // Each container its own range of the subordinate ids (`HostIds::Own`): its uid 65534
        // is a host uid no other sandbox has.
        userns_mode: ids.own().then(|| userns_auto(config)),
        tmpfs: Some(tmpfs),
        ipc_mode: Some("private".into()),
        // No container log: the engine would otherwise persist everything the code writes to
        // stdout/stderr on the host's disk (podman's k8s-file has no size limit), outside every
        // tmpfs cap. The bridge reads the attach stream, which needs no log.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        auto_remove: Some(false),
        // The first the kernel's OOM killer takes when the host runs out of memory: a sandbox,
        // not the bridge, its engine or the host's other processes (`OOM_SCORE_ADJ`).
        oom_score_adj: Some(OOM_SCORE_ADJ),
        // A tiny init (catatonit, docker-init) as PID 1 reaps orphaned grandchildren, which would
        // otherwise pile up as zombies against the pids limit.
        init: Some(true),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(config.image.clone()),
        user: Some(config.container_user.clone()),
        working_dir: Some("/workspace".into()),
        cmd: Some(vec![
            "python3".into(),
            "-u".into(),
            "-c".into(),
            LOADER.into(),
        ]),
        entrypoint: Some(vec![]),
        env: Some(env),
        labels: Some(labels),
        network_disabled: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(false),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host),
        ..Default::default()
    }
}

/// Mount `dir` read-only at `protocol::PACKAGES_DIR`: a bind mount, so it is the same files on
/// the host and inside under every runtime (gVisor's gofer serves it as runc's kernel does),
/// and without `noexec`, so that C extensions load. Writable XOR executable holds: the
/// sandbox's user cannot write it (read-only mount, files the bridge owns), and everything it
/// can write (`/tmp`, `/workspace`, `/run`, `/var/tmp`) is `noexec`.
pub fn mount_packages(body: &mut ContainerCreateBody, dir: &std::path::Path) {
    let host = body.host_config.get_or_insert_with(Default::default);
    host.mounts
        .get_or_insert_with(Vec::new)
        .push(bollard::models::Mount {
            target: Some(bridge_core::protocol::PACKAGES_DIR.to_string()),
            source: Some(dir.to_string_lossy().into_owned()),
            typ: Some(bollard::models::MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        });
}

/// Rename container `id` to `name`, within 10 s: names say who holds a pooled, parked or
/// adopted container ([`Listed::holder`]), and `doctor` shows them.
pub(crate) async fn rename(docker: &Docker, id: &str, name: &str) -> Result<(), ContainerError> {
    let opts = bollard::query_parameters::RenameContainerOptionsBuilder::default()
        .name(name)
        .build();
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        docker.rename_container(id, opts),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ContainerError::Engine(e.to_string())),
        Err(_) => Err(ContainerError::NoAnswer(10)),
    }
}

/// Whether container `id` exists and runs, as the engine says within 5 s (`false` when it
/// does not answer): a parked sandbox is adopted only then.
pub(crate) async fn running(docker: &Docker, id: &str) -> bool {
    let inspect = docker.inspect_container(id, None);
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(5), inspect).await,
        Ok(Ok(c)) if c.state.as_ref().and_then(|s| s.running) == Some(true)
    )
}

/// How long removing a container may take before it is left to the reaper.
const REMOVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the SIGKILL before a removal may take; the removal follows whatever it answered.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Remove a container, whatever its state. Errors are logged, not returned: removal is cleanup.
pub(crate) async fn remove(docker: &Docker, id: &str) {
    // SIGKILL first: a forced removal of a running container stops it the polite way (SIGTERM,
    // a wait, then SIGKILL), which costs seconds when the code ignores SIGTERM or is stopped
    // (SIGSTOP), and a call whose sandbox is killed replies only after this.
    let kill = KillContainerOptionsBuilder::default()
        .signal("SIGKILL")
        .build();
    let _ = tokio::time::timeout(KILL_TIMEOUT, docker.kill_container(id, Some(kill))).await;
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    // Bounded like every other await a call can reach: an engine that hangs here leaves a stray,
    // which the reaper removes later (`Table::reap_strays`).
    let removed =
        tokio::time::timeout(REMOVE_TIMEOUT, docker.remove_container(id, Some(opts))).await;
    let Ok(removed) = removed else {
        tracing::warn!(
            container = id,
            "the engine did not remove the container within {}s; it is retried later",
            REMOVE_TIMEOUT.as_secs()
        );
        return;
    };
    if let Err(e) = removed {
        let msg = e.to_string();
        if !msg.contains("No such container")
            && !msg.contains("no such container")
            && !msg.contains("404")
        {
            tracing::warn!(container = id, "could not remove container: {msg}");
        }
    }
}

/// A container as the engine lists it: only the fields the bridge relies on.
#[derive(Debug, serde::Deserialize)]
pub struct Listed {
    #[serde(rename = "Id")]
    /// The container's id.
    pub id: String,
    #[serde(rename = "Labels", default)]
    /// Its labels (the bridge's own say whose it is and what it serves).
    pub labels: Option<HashMap<String, String>>,
    #[serde(rename = "Names", default)]
    /// Its names, each with the engine's leading `/`.
    pub names: Option<Vec<String>>,
    /// `running`, `exited`, ... (podman 4 also says `stopped`, `configured`).
    #[serde(rename = "State", default)]
    pub state: Option<serde_json::Value>,
}

/// Who answers for a listed container.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// A bridge, as `pid:starttime`: the adopter its name says, else the one its label says.
    Bridge(String),
    /// A keeper, while the parked container runs (`sandbox::park`).
    Keeper,
}

impl Listed {
    fn holder(&self) -> Holder {
        let names = self.names.iter().flatten();
        for n in names {
            if let Some((_, owner)) = n.split_once(ADOPTED_MARK) {
                return Holder::Bridge(owner.replacen('_', ":", 1));
            }
            let running = self
                .state
                .as_ref()
                .and_then(|s| s.as_str())
                .is_some_and(|s| s.eq_ignore_ascii_case("running"));
            // `….parked-<expires>-<id>`: its keeper's (or, between a bridge's taking it and
            // renaming it, that bridge's) while it runs and its time is not over; then its dead
            // maker's, as the label says.
            if let Some((_, rest)) = n.split_once(PARKED_MARK) {
                let expires = rest.split('-').next().and_then(|t| t.parse::<u64>().ok());
                if running && expires.is_some_and(|t| bridge_core::clock::now_secs() <= t + 60) {
                    return Holder::Keeper;
                }
            }
        }
        Holder::Bridge(self.label(LABEL_OWNER).to_string())
    }

    fn label(&self, key: &str) -> &str {
        self.labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// Every container (running or not) carrying `label` (`key=value`).
///
/// Read untyped through [`Engine::get_json`], not bollard's `list_containers`: podman 4 reports
/// containers between exit and clean-up in a state Docker's models do not know, which would fail
/// the whole list (see there).
pub(crate) async fn list(engine: &Engine, label: &str) -> Result<Vec<Listed>, ContainerError> {
    let filters = serde_json::json!({ "label": [label] }).to_string();
    let body = engine
        .get_json(
            "/containers/json",
            &[("all", "true"), ("filters", &filters)],
        )
        .await?;
    parse_list(body).map_err(ContainerError::Engine)
}

fn parse_list(body: serde_json::Value) -> Result<Vec<Listed>, String> {
    serde_json::from_value(body).map_err(|e| {
        format!("the engine's container list is not what the Docker API describes: {e}")
    })
}

/// The containers bridge `owner` created, whatever their state.
pub(crate) async fn owned_by(engine: &Engine, owner: &str) -> Result<Vec<String>, ContainerError> {
    Ok(list(engine, &format!("{LABEL_OWNER}={owner}"))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect())
}

/// The sandboxes of the bridges running on this host, as `doctor` shows them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Containers serving a session.
    pub sessions: usize,
    /// Containers waiting in a pool, not handed to any session yet.
    pub pooled: usize,
}

/// Count the containers of running bridges: in sessions, and pooled (a pooled container is
/// renamed when a session takes it, so its name tells whether it still waits).
#[inline(never)]
pub fn census(engine: &Engine) -> Boxed<'_, Result<Census, ContainerError>> {
    Box::pin(census_here(engine))
}

async fn census_here(engine: &Engine) -> Result<Census, ContainerError> {
    let mut c = Census::default();
    for l in list(engine, &format!("{LABEL_MANAGED}=true")).await? {
        match l.holder() {
            Holder::Bridge(owner) if owner_alive(&owner) => {}
            _ => continue,
        }
        let waiting = l.label(LABEL_POOL) == "true"
            && l.names.iter().flatten().any(|n| n.contains(POOL_NAME_MARK));
        if waiting {
            c.pooled += 1;
        } else {
            c.sessions += 1;
        }
    }
    Ok(c)
}

/// Remove every managed container whose owning bridge is no longer running. Returns how many.
pub(crate) async fn reap_orphans(engine: &Engine) -> usize {
    let list = match list(engine, &format!("{LABEL_MANAGED}=true")).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("could not list containers to reap orphans: {e}");
            return 0;
        }
    };
    let mut reaped = 0;
    for c in list {
        let owner = match c.holder() {
            Holder::Keeper => continue,
            Holder::Bridge(o) if owner_alive(&o) => continue,
            Holder::Bridge(o) => o,
        };
        tracing::info!(container = %c.id, %owner, "removing container orphaned by a bridge that is gone");
        remove(&engine.docker, &c.id).await;
        reaped += 1;
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> HostIds {
        HostIds::Shared("a test".into())
    }

    #[test]
    fn the_nproc_ulimit_is_per_sandbox_or_no_shared_budget() {
        let c = Config::default();
        let own = HostIds::Own {
            owner: "containers".into(),
            sandboxes: 100,
        };
        let body = serde_json::to_value(spec(&c, &own, Role::Pool, "1:2")).unwrap();
        // The size given (what `container_user` 65534:65534 needs), so podman never reads the
        // image for it under its layer lock.
        assert_eq!(body["HostConfig"]["UsernsMode"], "auto:size=65535");
        let small = Config {
            container_user: "1000:1000".into(),
            ..Config::default()
        };
        let body_small = serde_json::to_value(spec(&small, &own, Role::Pool, "1:2")).unwrap();
        assert_eq!(body_small["HostConfig"]["UsernsMode"], "auto:size=1001");
        assert_eq!(body["HostConfig"]["Ulimits"][1]["Name"], "nproc");
        assert_eq!(body["HostConfig"]["Ulimits"][1]["Hard"], 128);
        // Both ulimits given, or podman fills the other with what a user namespace cannot have.
        assert_eq!(body["HostConfig"]["Ulimits"][0]["Name"], "nofile");
        let body = serde_json::to_value(spec(&c, &shared(), Role::Pool, "1:2")).unwrap();
        assert!(body["HostConfig"].get("UsernsMode").is_none());
        let ceiling = body["HostConfig"]["Ulimits"][1]["Hard"].as_i64().unwrap();
        assert!(
            (128..=SHARED_NPROC).contains(&ceiling),
            "{ceiling}: no budget sandboxes at their pids limit share"
        );
        assert_eq!(ceiling, nproc_limit(&c, &shared()));
        // Where the pids cgroup may be missing, the shared bound stays.
        let loose = Config {
            allow_unenforced_limits: true,
            ..Config::default()
        };
        assert_eq!(nproc_limit(&loose, &shared()), 512);
        assert_eq!(nproc_limit(&loose, &own), 128);
    }

    #[test]
    fn a_list_with_podmans_stopped_state_is_read() {
        // As podman 4.3 answers while a container's clean-up has not run yet.
        let body = serde_json::json!([
            {"Id": "aaa", "State": "stopped", "Status": "Exited (0) 1 second ago",
             "Labels": {"io.mcp-code-bridge.owner": "1:2"}},
            {"Id": "bbb", "State": "running", "Labels": null},
            {"Id": "ccc", "State": "something-new"}
        ]);
        let list = parse_list(body).unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[0].label(LABEL_OWNER), "1:2");
        assert_eq!(list[1].label(LABEL_OWNER), "");
        assert_eq!(list[2].id, "ccc");
        let bad = parse_list(serde_json::json!({"message": "oops"})).unwrap_err();
        assert!(bad.contains("container list"), "{bad}");
    }

    #[test]
    fn a_containers_holder_is_its_adopter_its_keeper_or_its_label() {
        let listed = |name: &str, state: &str| Listed {
            id: "x".into(),
            labels: Some(HashMap::from([(
                LABEL_OWNER.to_string(),
                "1:2".to_string(),
            )])),
            names: Some(vec![format!("/{name}")]),
            state: Some(serde_json::json!(state)),
        };
        assert_eq!(
            listed("mcp-code-bridge-1-default-3", "running").holder(),
            Holder::Bridge("1:2".into())
        );
        let later = bridge_core::clock::now_secs() + 30;
        let parked = format!("mcp-code-bridge-1.parked-{later}-0123456789ab");
        assert_eq!(listed(&parked, "running").holder(), Holder::Keeper);
        // A parked container that no longer runs (its keeper is gone) is its dead maker's, and
        // so is one past its time.
        assert_eq!(
            listed(&parked, "exited").holder(),
            Holder::Bridge("1:2".into())
        );
        assert_eq!(
            listed("mcp-code-bridge-1.parked-1000-0123456789ab", "running").holder(),
            Holder::Bridge("1:2".into())
        );
        let adopted = adopted_name("mcp-code-bridge-7.pool-4", "7:99");
        assert_eq!(
            listed(&adopted, "running").holder(),
            Holder::Bridge("7:99".into())
        );
        assert!(
            adopted.contains(POOL_NAME_MARK),
            "still pooled for the census"
        );
    }

    #[test]
    fn spec_is_hardened() {
        let c = Config::default();
        let s = spec(&c, &shared(), Role::Session("default"), "1:2");
        let h = s.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(h.memory, Some(512 << 20));
        assert_eq!(h.memory_swap, h.memory);
        assert_eq!(h.pids_limit, Some(128));
        assert_eq!(h.log_config.and_then(|l| l.typ).as_deref(), Some("none"));
        assert_eq!(h.runtime, None, "the engine's default runtime");
        let tmpfs = h.tmpfs.unwrap();
        assert!(
            tmpfs["/tmp"].contains("noexec")
                && tmpfs["/tmp"].contains("nosuid")
                && tmpfs["/tmp"].contains("nodev")
        );
        assert!(tmpfs["/var/tmp"].contains("noexec") && tmpfs["/var/tmp"].contains("size="));
        assert!(tmpfs["/run"].contains("noexec") && tmpfs["/run"].contains("mode=755"));
        assert!(
            tmpfs["/workspace/out"].contains("noexec") && tmpfs["/workspace/out"].contains("size=")
        );
        assert_eq!(s.user.as_deref(), Some("65534:65534"));
        assert_eq!(s.labels.unwrap()[LABEL_MANAGED], "true");
        assert!(!s.env.unwrap().iter().any(|e| e.starts_with(ENV_PRELOAD)));
    }

    #[test]
    fn a_pooled_container_is_isolated_as_a_sessions_and_only_labelled_apart() {
        let c = Config::default();
        let session = spec(&c, &shared(), Role::Session("default"), "1:2");
        let pooled = spec(&c, &shared(), Role::Pool, "1:2");
        assert_eq!(
            serde_json::to_value(&session.host_config).unwrap(),
            serde_json::to_value(&pooled.host_config).unwrap()
        );
        assert_eq!(session.user, pooled.user);
        assert_eq!(session.cmd, pooled.cmd);
        let labels = pooled.labels.unwrap();
        assert_eq!(labels[LABEL_POOL], "true");
        assert_eq!(labels[LABEL_SESSION], "");
        assert!(
            pooled
                .env
                .unwrap()
                .contains(&format!("{ENV_PRELOAD}=numpy,pandas"))
        );
        assert!(container_name(Role::Pool, 3).contains(POOL_NAME_MARK));
        assert!(!container_name(Role::Session("a.pool-b"), 3).contains('.'));
    }

    #[test]
    fn under_gvisor_every_container_names_the_gvisor_runtime_and_changes_only_the_pids_bounds() {
        let runc = Config::default();
        let gvisor = Config {
            isolation: bridge_core::config::Isolation::Gvisor,
            gvisor_runtime: "runsc-test".into(),
            ..Config::default()
        };
        for role in [Role::Session("default"), Role::Pool] {
            let mut a = serde_json::to_value(spec(&runc, &shared(), role, "1:2")).unwrap();
            let b = serde_json::to_value(spec(&gvisor, &shared(), role, "1:2")).unwrap();
            assert_eq!(b["HostConfig"]["Runtime"], "runsc-test");
            a["HostConfig"]["Runtime"] = "runsc-test".into();
            // The code's tasks held to `pids` inside gVisor, the host's cgroup with room for
            // gVisor's own threads (Config::host_pids_limit).
            assert_eq!(b["HostConfig"]["PidsLimit"], 128 * 8 + 64);
            let nproc = &b["HostConfig"]["Ulimits"][1];
            assert_eq!(
                (&nproc["Name"], &nproc["Soft"]),
                (&"nproc".into(), &128.into())
            );
            a["HostConfig"]["PidsLimit"] = b["HostConfig"]["PidsLimit"].clone();
            a["HostConfig"]["Ulimits"] = b["HostConfig"]["Ulimits"].clone();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn a_zombie_owner_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for yet: a zombie once it has exited.
        for _ in 0..100 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(owner_of(pid), None);
        child.wait().unwrap();
    }

    #[test]
    fn own_process_is_alive_and_a_dead_owner_is_not() {
        assert!(owner_alive(&owner_id()));
        assert!(!owner_alive(&format!("{}:1", std::process::id())));
        assert!(!owner_alive("garbage"));
    }
}
