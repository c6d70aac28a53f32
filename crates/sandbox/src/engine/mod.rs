//! The container engine: which socket to talk to, and a `podman system service` of our own when
//! no socket answers. Chosen lazily, at the first `run_python`, so `initialize` and `tools/list`
//! work on a machine with no container runtime at all.

use bridge_core::boxed::Boxed;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, Docker};
use tokio::process::Command;

use bridge_core::config::{Config, Runtime};

mod enforcement;
mod ids;
mod kept;
mod kind;
mod service;

mod error;

pub use enforcement::{Enforcement, SandboxIsolationMissing};
pub use error::{ContainerError, EngineError};
pub use ids::{HostIds, ids_per_sandbox};
pub use kept::{CHECK_AFTER, Kept};
pub use kind::{EngineKind, on_path};
pub use service::own_socket;
use service::{Lingering, OwnService, keep_alive_every, reap_stale_services};

/// Seconds bollard waits for one API request. Image loads of a few hundred MB need a while.
const REQUEST_TIMEOUT_SECS: u64 = 600;
/// How long a candidate socket gets to answer `_ping`.
const PING_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a service being started is looked at: it answers ~60 ms after its start on an idle
/// two-core host, and every ms until it is seen is a ms of a cold first call.
const SERVICE_POLL: Duration = Duration::from_millis(5);
/// How long a podman service the bridge started has to answer. Podman answers in about 0.1 s;
/// one waiting for a lock that another podman process holds (an image load, a removal on a busy
/// host) answers when it gets it.
const SERVICE_START: Duration = Duration::from_secs(60);
/// After this long without an answer, the log says the bridge is still waiting, and why it may.
const SERVICE_SLOW: Duration = Duration::from_secs(20);

/// Logs that a service being started has not answered in [`SERVICE_SLOW`], and what to look at.
fn service_slow(url: &str) {
    tracing::warn!(
        %url,
        "the bridge's own podman service has not answered in {}s; waiting up to {}s (another podman process may hold a lock it needs: `ps -eo pid,etimes,args | grep podman`)",
        SERVICE_SLOW.as_secs(),
        SERVICE_START.as_secs()
    );
}

/// The line of a service that never answered: how long it was given, what it said, what to check.
fn service_silent(url: &str, said: &str) -> String {
    let said = if said.is_empty() {
        "it said nothing".to_string()
    } else {
        format!("it said: {said}")
    };
    format!(
        "  {url} (own podman service): no answer within {}s; {said}. Podman may be waiting for a lock another podman process holds (`ps -eo pid,etimes,args | grep podman` shows them)",
        SERVICE_START.as_secs()
    )
}

/// A connected engine.
pub struct Engine {
    /// The API client, on the endpoint below.
    pub docker: Docker,
    /// Which engine it is.
    pub kind: EngineKind,
    /// The URL we connected to, for `doctor` and error messages.
    pub endpoint: String,
    /// Where that endpoint came from ("DOCKER_HOST", "rootful podman socket", ...).
    pub origin: String,
    /// The engine's version, as it reports it.
    pub version: String,
    /// A podman service we started: stopped by [`Engine::shutdown`], and by its guard when the
    /// engine is dropped or the bridge dies.
    service: tokio::sync::Mutex<Option<OwnService>>,
    /// For [`Engine::get_json`]; see [`Engine::http`].
    http: std::sync::OnceLock<(reqwest::Client, String)>,
    /// On a lingering service (`engine_linger`): the task that keeps it from idling out while
    /// this engine lives; aborted by [`Engine::shutdown`] and when the engine is dropped.
    keep_alive: Option<KeepAlive>,
    /// [`Engine::host_ids`], decided at the first start.
    ids: std::sync::OnceLock<HostIds>,
}

/// A task aborted when dropped, and the linger of the service it keeps alive.
struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
    linger: Duration,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KeepAlive {
    /// A request to the service every [`keep_alive_every`]`(linger)`: podman's `--time` counts
    /// from the last active connection, so the service never ends under a live bridge.
    fn start(docker: &Docker, linger: Duration) -> KeepAlive {
        let docker = docker.clone();
        let every = keep_alive_every(linger);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(Err(e)) = tokio::time::timeout(PING_TIMEOUT, docker.ping()).await {
                    tracing::debug!("the lingering podman service did not answer a ping: {e}");
                }
            }
        });
        KeepAlive { task, linger }
    }
}

/// One place an engine may listen, with the reason we look there.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Where it may listen (`unix://…`, `tcp://…`).
    pub url: String,
    /// Why we look there ("DOCKER_HOST", "rootful podman socket", …).
    pub origin: &'static str,
}

/// The sockets an engine name (`auto`, `podman`, `docker`) tries, in order; a socket URL is
/// its only candidate.
pub fn candidates(choice: &Runtime) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Runtime::Socket(url) = choice {
        out.push(Candidate {
            url: url.clone(),
            origin: "runtime setting",
        });
        return out;
    }
    let want_podman = choice.wants_podman();
    let want_docker = choice.wants_docker();
    if want_podman
        && let Ok(h) = std::env::var("CONTAINER_HOST")
        && !h.is_empty()
    {
        out.push(Candidate {
            url: h,
            origin: "CONTAINER_HOST",
        });
    }
    if let Ok(h) = std::env::var("DOCKER_HOST")
        && !h.is_empty()
        && want_docker
    {
        out.push(Candidate {
            url: h,
            origin: "DOCKER_HOST",
        });
    }
    if want_podman {
        // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
        let uid = unsafe { libc::getuid() };
        let runtime_dir =
            std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| format!("/run/user/{uid}"));
        if uid != 0 {
            out.push(Candidate {
                url: format!("unix://{runtime_dir}/podman/podman.sock"),
                origin: "rootless podman socket",
            });
        }
        out.push(Candidate {
            url: "unix:///run/podman/podman.sock".into(),
            origin: "rootful podman socket",
        });
    }
    if want_docker {
        out.push(Candidate {
            url: "unix:///var/run/docker.sock".into(),
            origin: "docker socket",
        });
    }
    out
}

fn connect(url: &str) -> Result<Docker, String> {
    if let Some(path) = url.strip_prefix("unix://") {
        if !Path::new(path).exists() {
            return Err(format!("{path} does not exist"));
        }
        Docker::connect_with_unix(path, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION)
            .map_err(|e| e.to_string())
    } else if url.starts_with("tcp://") || url.starts_with("http://") {
        Docker::connect_with_http(url, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION)
            .map_err(|e| e.to_string())
    } else if url.starts_with('/') {
        connect(&format!("unix://{url}"))
    } else {
        Err(format!(
            "{url:?} is not a socket URL; use unix:///path/to.sock or tcp://host:port"
        ))
    }
}

/// Podman's version as its `/_ping` answer names it (`Libpod-Api-Version`), `None` from an
/// engine that is not podman or did not answer. Podman 4's `/version` runs `conmon` and the OCI
/// runtime to print their versions (0.45-0.8 s on the measured host), `/_ping` answers in a
/// few ms with the same facts in its headers, so podman is recognised there.
async fn podman_ping(url: &str) -> Option<String> {
    let path = url
        .strip_prefix("unix://")
        .or_else(|| url.starts_with('/').then_some(url))?;
    let client = reqwest::Client::builder().unix_socket(path).build().ok()?;
    let reply = client
        .get("http://engine/_ping")
        .timeout(PING_TIMEOUT)
        .send()
        .await
        .ok()?;
    if !reply.status().is_success() {
        return None;
    }
    let version = reply
        .headers()
        .get("Libpod-Api-Version")?
        .to_str()
        .ok()?
        .to_string();
    Some(version)
}

async fn probe(url: &str) -> Result<(Docker, EngineKind, String), String> {
    let docker = connect(url)?;
    if let Some(version) = podman_ping(url).await {
        return Ok((docker, EngineKind::Podman, version));
    }
    match tokio::time::timeout(PING_TIMEOUT, docker.version()).await {
        Err(_) => Err("did not answer within 3s".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(v)) => {
            let is_podman = v.components.as_ref().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.name.to_ascii_lowercase().contains("podman"))
            });
            let kind = if is_podman {
                EngineKind::Podman
            } else {
                EngineKind::Docker
            };
            Ok((docker, kind, v.version.unwrap_or_default()))
        }
    }
}

/// Whether podman can run containers under runtime `rt`: `podman --runtime RT info` fails at
/// once for a runtime it cannot find.
async fn gvisor_runtime_runs(podman: &Path, rt: &str) -> Result<(), EngineError> {
    let out = Command::new(podman)
        .args([
            "--runtime",
            rt,
            "info",
            "--format",
            "{{.Host.OCIRuntime.Name}}",
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let podman_said = match tokio::time::timeout(Duration::from_secs(20), out).await {
        Ok(Ok(o)) if o.status.success() => return Ok(()),
        Ok(Ok(o)) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "nothing within 20s".to_string(),
    };
    Err(EngineError::GvisorRuntime {
        missing: SandboxIsolationMissing {
            runtime: rt.to_string(),
            known: Vec::new(),
        },
        podman_said: bridge_core::text::visible(&podman_said)
            .chars()
            .take(300)
            .collect(),
    })
}

/// The default runtime of a podman service when it is not `want` (podman runs every container
/// the compatible API creates under its default, whatever the container asks for); `None` when it
/// is, or the engine did not say (then the bridge's own check, `Enforcement::isolation`, decides).
async fn podman_default_runtime(docker: &Docker, want: &str) -> Option<String> {
    let info = tokio::time::timeout(PING_TIMEOUT, docker.info())
        .await
        .ok()?
        .ok()?;
    let default = info.default_runtime.unwrap_or_default();
    (default != want).then_some(default)
}

impl Engine {
    /// Connect as `config.runtime` says. Tries each candidate; with `auto` or `podman` and none
    /// answering, starts `podman system service` on a socket in the state dir.
    #[inline(never)]
    pub fn connect(config: &Config) -> Boxed<'_, Result<Engine, EngineError>> {
        Box::pin(Engine::connect_here(config))
    }

    async fn connect_here(config: &Config) -> Result<Engine, EngineError> {
        let choice = &config.runtime;
        let reaped = reap_stale_services(&config.state_dir).await;
        if reaped > 0 {
            tracing::info!(
                reaped,
                "stopped podman services left by bridges that are gone"
            );
        }
        let mut tried = Vec::new();
        for c in &candidates(choice) {
            match probe(&c.url).await {
                Ok((docker, kind, _))
                    if kind == EngineKind::Podman
                        && let Some(rt) = config.oci_runtime()
                        && let Some(default) = podman_default_runtime(&docker, rt).await =>
                {
                    tried.push(format!(
                        "  {} ({}): a podman service whose default runtime is {default:?}; podman's API ignores a container's own runtime, so isolation = \"gvisor\" takes a service that runs {rt:?} by default",
                        c.url, c.origin
                    ));
                }
                Ok((docker, kind, version)) => {
                    tracing::info!(endpoint = %c.url, origin = c.origin, ?kind, %version, "container engine found");
                    return Ok(Engine {
                        docker,
                        kind,
                        endpoint: c.url.clone(),
                        origin: c.origin.into(),
                        version,
                        service: Default::default(),
                        http: Default::default(),
                        keep_alive: None,
                        ids: Default::default(),
                    });
                }
                Err(e) => tried.push(format!("  {} ({}): {e}", c.url, c.origin)),
            }
        }
        if choice.wants_podman()
            && let Some(podman) = on_path("podman")
        {
            // Under gVisor the service's own default runtime is the isolation (podman's API
            // ignores a container's), so such a bridge keeps a service of its own.
            if !config.engine_linger.0.is_zero() && config.oci_runtime().is_none() {
                return Self::lingering_service(&podman, config, tried).await;
            }
            return Self::start_service(&podman, config, tried).await;
        }
        Err(EngineError::NoneAnswered {
            runtime: choice.clone(),
            tried,
        })
    }

    async fn start_service(
        podman: &Path,
        config: &Config,
        mut tried: Vec<String>,
    ) -> Result<Engine, EngineError> {
        std::fs::create_dir_all(&config.state_dir).map_err(|source| EngineError::StateDir {
            dir: config.state_dir.clone(),
            source,
        })?;
        let sock = own_socket(&config.state_dir).map_err(|why| EngineError::SocketDir {
            state_dir: config.state_dir.clone(),
            why,
        })?;
        let _ = std::fs::remove_file(&sock);
        let url = format!("unix://{}", sock.display());
        tracing::info!(
            %url,
            "starting the bridge's own `podman system service` (no podman or docker socket is listening; enabling podman.socket saves this start)"
        );
        // Podman's Docker-compatible API ignores the runtime a container asks for (`HostConfig.
        // Runtime`): under isolation = "gvisor" the service's own default is gVisor's runtime,
        // which podman must know (it refuses to start a service on a runtime it cannot find).
        let mut args = Vec::new();
        if let Some(rt) = config.oci_runtime() {
            gvisor_runtime_runs(podman, rt).await?;
            args.extend(["--runtime", rt]);
        }
        args.extend(["system", "service", "--time=0", &url]);
        let (mut service, stderr) =
            OwnService::spawn(podman, &args).map_err(|source| EngineError::ServiceSpawn {
                podman: podman.to_path_buf(),
                source,
            })?;
        let said = bridge_core::logging::LineTail::default();
        if let Some(err) = stderr {
            tokio::spawn(bridge_core::logging::forward_lines(
                err,
                "podman service".to_string(),
                Some(said.clone()),
            ));
        }
        let started = tokio::time::Instant::now();
        let deadline = started + SERVICE_START;
        let mut told = false;
        loop {
            if let Ok(Some(_)) = service.guard.try_wait() {
                // Its last words reach the tail before the guard's own line, which follows its end.
                tokio::time::sleep(Duration::from_millis(100)).await;
                tried.push(format!(
                    "  {url} (own podman service): exited before answering; it said: {}",
                    said.joined()
                ));
                break;
            }
            if sock.exists()
                && let Ok((docker, kind, version)) = probe(&url).await
            {
                tracing::info!(%url, %version, "own podman service is up");
                return Ok(Engine {
                    docker,
                    kind,
                    endpoint: url,
                    origin: "own podman service".into(),
                    version,
                    service: tokio::sync::Mutex::new(Some(service)),
                    http: Default::default(),
                    keep_alive: None,
                    ids: Default::default(),
                });
            }
            if !told && started.elapsed() > SERVICE_SLOW {
                told = true;
                service_slow(&url);
            }
            if tokio::time::Instant::now() > deadline {
                service.stop().await;
                tried.push(service_silent(&url, &said.joined()));
                break;
            }
            tokio::time::sleep(SERVICE_POLL).await;
        }
        Err(EngineError::ServiceSilent { tried })
    }

    /// The service that outlives its bridges for `engine_linger` ([`Lingering`]): the one a
    /// bridge left in the state dir when it still answers, else one started now, with podman's
    /// own idle timer set to the linger.
    async fn lingering_service(
        podman: &Path,
        config: &Config,
        mut tried: Vec<String>,
    ) -> Result<Engine, EngineError> {
        let linger = config.engine_linger.0;
        std::fs::create_dir_all(&config.state_dir).map_err(|source| EngineError::StateDir {
            dir: config.state_dir.clone(),
            source,
        })?;
        let shared = Lingering::new(&config.state_dir).map_err(|why| EngineError::SocketDir {
            state_dir: config.state_dir.clone(),
            why,
        })?;
        // Held until this bridge knows the service answers: a second bridge waits for it and
        // then finds the service instead of starting another.
        let _lock = shared
            .lock(Duration::from_secs(30))
            .await
            .map_err(|source| EngineError::StateDir {
                dir: shared.dir.clone(),
                source,
            })?;
        let url = shared.url();
        let engine = |docker: Docker, kind, version, origin: &str| {
            let keep_alive = Some(KeepAlive::start(&docker, linger));
            Engine {
                docker,
                kind,
                endpoint: url.clone(),
                origin: origin.into(),
                version,
                service: Default::default(),
                http: Default::default(),
                keep_alive,
                ids: Default::default(),
            }
        };
        if shared.socket().exists() {
            match probe(&url).await {
                Ok((docker, kind, version)) => {
                    tracing::info!(%url, %version, "found the podman service an earlier bridge left (engine_linger)");
                    return Ok(engine(docker, kind, version, "lingering podman service"));
                }
                Err(e) => tracing::debug!(%url, "no lingering podman service answers: {e}"),
            }
        }
        tracing::info!(
            %url,
            linger_secs = linger.as_secs(),
            "starting the bridge's own `podman system service` (no podman or docker socket is listening; enabling podman.socket saves this start); it stays for engine_linger after the last bridge"
        );
        let time = format!("--time={}", linger.as_secs().max(1));
        let mut guard = shared
            .spawn(podman, &["system", "service", &time, &url])
            .map_err(|source| EngineError::ServiceSpawn {
                podman: podman.to_path_buf(),
                source,
            })?;
        let started = tokio::time::Instant::now();
        let deadline = started + SERVICE_START;
        let mut told = false;
        loop {
            if let Ok(Some(_)) = guard.try_wait() {
                tried.push(format!(
                    "  {url} (own podman service): exited before answering: {}",
                    shared.log_tail()
                ));
                break;
            }
            if shared.socket().exists()
                && let Ok((docker, kind, version)) = probe(&url).await
            {
                shared.restrict_socket();
                tracing::info!(%url, %version, "own podman service is up");
                return Ok(engine(docker, kind, version, "own podman service"));
            }
            if !told && started.elapsed() > SERVICE_SLOW {
                told = true;
                service_slow(&url);
            }
            if tokio::time::Instant::now() > deadline {
                // Its guard leads the group: stop all of it.
                if let Some(pid) = guard.id() {
                    // SAFETY: kill only sends a signal and touches no memory of ours. `guard`
                    // was spawned with `process_group(0)` and has not been reaped (`id()` is
                    // `Some`), so its pid (> 0) still names its own process group and cannot
                    // have been reused.
                    unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
                }
                tried.push(service_silent(&url, &shared.log_tail()));
                break;
            }
            tokio::time::sleep(SERVICE_POLL).await;
        }
        Err(EngineError::ServiceSilent { tried })
    }

    /// An HTTP client for the endpoint and the base URL to put paths on; built at first use
    /// (the reaper lists containers every few seconds).
    fn http(&self) -> Result<&(reqwest::Client, String), String> {
        if let Some(h) = self.http.get() {
            return Ok(h);
        }
        let endpoint = self.endpoint.as_str();
        let built = if let Some(sock) = endpoint
            .strip_prefix("unix://")
            .or_else(|| endpoint.starts_with('/').then_some(endpoint))
        {
            let client = reqwest::Client::builder().unix_socket(sock).build();
            // The host part is ignored over a unix socket; the path is what the engine routes.
            (client, "http://engine".to_string())
        } else {
            let base = endpoint
                .strip_prefix("tcp://")
                .map(|rest| format!("http://{rest}"))
                .unwrap_or_else(|| endpoint.to_string());
            (reqwest::Client::builder().build(), base)
        };
        let client = built
            .0
            .map_err(|e| format!("could not build an HTTP client for {endpoint}: {e}"))?;
        Ok(self.http.get_or_init(|| (client, built.1)))
    }

    /// Whether each sandbox of `config` gets host ids of its own on this engine
    /// ([`HostIds::of`]), decided once: a bridge has one configuration.
    pub fn host_ids(&self, config: &Config) -> &HostIds {
        self.ids.get_or_init(|| {
            let ids = HostIds::of(self.kind, self.unix_socket(), &self.endpoint, config);
            tracing::debug!(?ids, "the sandboxes' host identity");
            ids
        })
    }

    /// The engine's Unix socket, when it is reached through one (`sandbox::attach` connects to
    /// it itself).
    pub fn unix_socket(&self) -> Option<std::path::PathBuf> {
        self.endpoint
            .strip_prefix("unix://")
            .map(std::path::PathBuf::from)
    }

    /// GET `path` (with `query`) from the engine's API and return the body as untyped JSON.
    ///
    /// Only for answers bollard's typed models cannot read. Podman 4 lists a container whose
    /// process has ended but whose clean-up has not run yet as `"State": "stopped"`, a value
    /// Docker's API does not have; bollard then rejects the whole list, and one such container
    /// anywhere on the host would hide every orphan from the reaper.
    pub(crate) async fn get_json(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<serde_json::Value, ContainerError> {
        let endpoint = self.endpoint.as_str();
        let (client, base) = self.http()?;
        let mut url = reqwest::Url::parse(&format!("{}{path}", base.trim_end_matches('/')))
            .map_err(|e| format!("{endpoint}{path} is not a URL: {e}"))?;
        url.query_pairs_mut().extend_pairs(query);
        let reply = client
            .get(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| format!("GET {path} from {endpoint}: {e}"))?;
        let status = reply.status();
        let body = reply
            .bytes()
            .await
            .map_err(|e| format!("GET {path} from {endpoint}: reading the body: {e}"))?;
        if !status.is_success() {
            return Err(ContainerError::Engine(format!(
                "GET {path} from {endpoint}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(500)])
            )));
        }
        serde_json::from_slice(&body).map_err(|e| {
            ContainerError::Engine(format!(
                "GET {path} from {endpoint}: the body is not JSON: {e}"
            ))
        })
    }

    /// On the bridge's own podman service that outlives its bridges (`engine_linger`): how long
    /// it stays, idle, once this process and every other bridge using it are gone. `None` for
    /// any other engine, and for a service that goes with its bridge. Every command that
    /// connects the engine (`run`, `serve`, `exec`, `doctor`, `image load`) may leave it so.
    pub fn linger(&self) -> Option<Duration> {
        self.keep_alive.as_ref().map(|k| k.linger)
    }

    /// Stop the podman service we started, if any; a lingering one is left to its idle timer.
    #[inline(never)]
    pub fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(self.shutdown_here())
    }

    async fn shutdown_here(&self) {
        if let Some(k) = &self.keep_alive {
            k.task.abort();
        }
        if let Some(service) = self.service.lock().await.take() {
            service.stop().await;
            if let Some(path) = self.endpoint.strip_prefix("unix://") {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::service::{bridge_gone, own_socket_pid};
    use super::*;

    #[test]
    fn own_sockets_name_their_bridge() {
        let dir = Path::new("/home/u/.local/state/mcp-code-bridge");
        let url = format!("unix://{}", own_socket(dir).unwrap().display());
        assert_eq!(own_socket_pid(dir, &url), Some(std::process::id()));
        for other in [
            "unix:///home/u/.local/state/mcp-code-bridge/podman-12.sock.beside",
            "unix:///home/u/.local/state/mcp-code-bridge/podman-x.sock",
            "unix:///home/u/.local/state/mcp-code-bridge/sub/podman-12.sock",
            "unix:///elsewhere/podman-12.sock",
            "/home/u/.local/state/mcp-code-bridge/podman-12.sock",
        ] {
            assert_eq!(own_socket_pid(dir, other), None, "{other}");
        }
    }

    #[test]
    fn a_state_dir_too_long_for_a_socket_has_its_own_service_listen_in_the_keeper_directory() {
        let long = std::path::PathBuf::from(format!("/home/u/{}", "s".repeat(100)));
        let keepers = crate::keeperdir::keeper_base();
        let url = format!("unix://{}/podman-12.sock", keepers.display());
        assert_eq!(own_socket_pid(&long, &url), Some(12));
        let beside = format!("unix://{}/podman-12.sock", long.display());
        assert_eq!(own_socket_pid(&long, &beside), None);
        // The longest name still fits where the state dir is short enough.
        let edge = std::path::PathBuf::from(format!("/{}", "e".repeat(107 - 1 - 1 - 19)));
        let url = format!("unix://{}/podman-4194304.sock", edge.display());
        assert_eq!(own_socket_pid(&edge, &url), Some(4194304));
    }

    #[test]
    fn a_lingering_service_is_kept_alive_well_within_its_idle_timer() {
        use super::service::keep_alive_every;
        assert_eq!(
            keep_alive_every(Duration::from_secs(300)),
            Duration::from_secs(60)
        );
        assert_eq!(
            keep_alive_every(Duration::from_secs(3)),
            Duration::from_millis(750)
        );
        assert_eq!(
            keep_alive_every(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(
            keep_alive_every(Duration::from_secs(20)),
            Duration::from_secs(5)
        );
        assert_eq!(
            keep_alive_every(Duration::from_secs(86_400)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_bridge_is_gone_when_dead_or_younger_than_its_service() {
        let me = std::process::id();
        let my_start = bridge_core::procfs::running_since(me).unwrap();
        // A service this process started (later than it) has a live bridge.
        assert!(!bridge_gone(me, my_start + 100));
        // A service older than the process now at that pid: the pid was reused.
        assert!(bridge_gone(me, my_start - 1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(bridge_gone(pid, my_start));
    }

    /// Live (not zombie) processes in process group `pgid`.
    fn live_in_group(pgid: u32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    return false;
                };
                let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
                    .split_whitespace()
                    .collect();
                fields[0] != "Z" && fields[2] == pgid.to_string()
            })
            .collect()
    }

    /// The group's live members once it has had `within` to go: a SIGKILLed process leaves
    /// `/proc` a moment after the signal, later on a loaded machine.
    fn left_in_group(pgid: u32, within: Duration) -> Vec<u32> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = live_in_group(pgid);
            if left.is_empty() || std::time::Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A stand-in service: a shell with a child of its own, like rootless podman and the podman it
    /// re-executes, optionally ignoring SIGTERM (inherited by the child).
    fn service(script: &str) -> (OwnService, u32) {
        let (s, _) = OwnService::spawn(Path::new("/bin/sh"), &["-c", script]).unwrap();
        let pgid = s.guard.id().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while live_in_group(pgid).len() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "the service did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (s, pgid)
    }

    #[tokio::test]
    async fn the_guard_stops_the_whole_group_when_its_pipe_closes() {
        // Guard, reader, the service's shell and its child.
        let (mut s, pgid) = service("sleep 600 & wait");
        let start = std::time::Instant::now();
        drop(s.lifeline.take());
        tokio::time::timeout(Duration::from_secs(3), s.guard.wait())
            .await
            .expect("the guard did not end")
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(
            left_in_group(pgid, Duration::from_secs(2)),
            Vec::<u32>::new()
        );
    }

    #[tokio::test]
    async fn the_guard_kills_what_ignores_sigterm_after_its_grace() {
        let (s, pgid) = service("trap '' TERM; sleep 600 & wait");
        let start = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(15), s.stop())
            .await
            .expect("stop did not return");
        assert!(
            start.elapsed() >= Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(
            left_in_group(pgid, Duration::from_secs(2)),
            Vec::<u32>::new()
        );
    }

    #[tokio::test]
    async fn the_guard_ends_the_group_when_the_service_ends() {
        // The service's shell exits and leaves its child behind, as an outer podman killed
        // outright leaves the one in the user namespace; the guard takes the rest down.
        let (mut s, pgid) = service("sleep 600 & sleep 1");
        tokio::time::timeout(Duration::from_secs(5), s.guard.wait())
            .await
            .expect("the guard did not end with its service")
            .unwrap();
        assert_eq!(
            left_in_group(pgid, Duration::from_secs(2)),
            Vec::<u32>::new()
        );
        // The pipe is still open: nothing but the service's end stopped it.
        assert!(s.lifeline.is_some());
    }
}
