//! The container engine: which socket to talk to, and a `podman system service` of our own when
//! no socket answers. Chosen lazily, at the first `run_python`, so `initialize` and `tools/list`
//! work on a machine with no container runtime at all.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, Docker};
use tokio::process::{Child, Command};

use crate::config::Config;

/// Seconds bollard waits for one API request. Image loads of a few hundred MB need a while.
const REQUEST_TIMEOUT_SECS: u64 = 600;
/// How long a candidate socket gets to answer `_ping`.
const PING_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Podman,
    Docker,
}

/// A connected engine.
pub struct Engine {
    pub docker: Docker,
    pub kind: EngineKind,
    /// The URL we connected to, for `doctor` and error messages.
    pub endpoint: String,
    /// Where that endpoint came from ("DOCKER_HOST", "rootful podman socket", ...).
    pub origin: String,
    pub version: String,
    /// A podman service we started, stopped when the engine is dropped or shut down.
    service: tokio::sync::Mutex<Option<Child>>,
    /// For [`Engine::get_json`]; see [`Engine::http`].
    http: std::sync::OnceLock<(reqwest::Client, String)>,
}

/// Why no engine could be had, phrased for the user.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

/// One place an engine may listen, with the reason we look there.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub url: String,
    pub origin: &'static str,
}

/// The sockets `auto` tries, in order.
pub fn candidates(choice: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    let want_podman = matches!(choice, "auto" | "podman");
    let want_docker = matches!(choice, "auto" | "docker");
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
        && (want_docker || choice == "auto")
    {
        out.push(Candidate {
            url: h,
            origin: "DOCKER_HOST",
        });
    }
    if want_podman {
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

async fn probe(url: &str) -> Result<(Docker, EngineKind, String), String> {
    let docker = connect(url)?;
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

/// Where our own podman service listens: one socket per bridge process, because every bridge
/// of a user shares the state dir, and a second bridge replacing the first one's socket took
/// its engine away (tests/security_rootless.rs runs two at once).
pub fn own_socket(state_dir: &Path) -> PathBuf {
    state_dir.join(format!("podman-{}.sock", std::process::id()))
}

/// Whether an executable named `name` is on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Engine {
    /// Connect as `config.runtime` says. Tries each candidate; with `auto` or `podman` and none
    /// answering, starts `podman system service` on a socket in the state dir.
    pub async fn connect(config: &Config) -> Result<Engine, EngineError> {
        let choice = config.runtime.trim();
        let mut tried = Vec::new();
        let cands = if matches!(choice, "auto" | "podman" | "docker") {
            candidates(choice)
        } else {
            vec![Candidate {
                url: choice.to_string(),
                origin: "runtime setting",
            }]
        };
        for c in &cands {
            match probe(&c.url).await {
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
                    });
                }
                Err(e) => tried.push(format!("  {} ({}): {e}", c.url, c.origin)),
            }
        }
        if matches!(choice, "auto" | "podman")
            && let Some(podman) = on_path("podman")
        {
            return Self::start_service(&podman, config, tried).await;
        }
        let what = if matches!(choice, "auto" | "podman" | "docker") {
            "Install podman (Debian/Ubuntu: `sudo apt-get install podman`; Fedora: `sudo dnf install podman`; macOS: `brew install podman && podman machine init && podman machine start`) or start Docker, or point MCP_BRIDGE_RUNTIME at a socket URL."
        } else {
            "Check that the engine behind that socket is running, or set MCP_BRIDGE_RUNTIME=auto."
        };
        Err(EngineError(format!(
            "no container engine answered (runtime = {choice:?}). Tried:\n{}\n{what}",
            tried.join("\n")
        )))
    }

    async fn start_service(
        podman: &Path,
        config: &Config,
        mut tried: Vec<String>,
    ) -> Result<Engine, EngineError> {
        let sock = own_socket(&config.state_dir);
        std::fs::create_dir_all(&config.state_dir).map_err(|e| {
            EngineError(format!(
                "cannot create state dir {}: {e}; set MCP_BRIDGE_STATE_DIR to a writable directory",
                config.state_dir.display()
            ))
        })?;
        let _ = std::fs::remove_file(&sock);
        let url = format!("unix://{}", sock.display());
        tracing::info!(%url, "no engine socket answered; starting `podman system service`");
        let mut cmd = Command::new(podman);
        cmd.args(["system", "service", "--time=0", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // If the bridge is killed outright, the service must not outlive it.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            EngineError(format!(
                "could not start {} system service: {e}",
                podman.display()
            ))
        })?;
        if let Some(err) = child.stderr.take() {
            tokio::spawn(crate::logging::forward_lines(
                err,
                "podman service".to_string(),
            ));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                tried.push(format!(
                    "  {url} (own podman service): exited with {status}"
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
                    service: tokio::sync::Mutex::new(Some(child)),
                    http: Default::default(),
                });
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.kill().await;
                tried.push(format!(
                    "  {url} (own podman service): no answer within 20s"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(EngineError(format!(
            "podman is installed but no engine answered. Tried:\n{}\nRun `podman info` to see what is wrong (on hosts where crun fails, set runtime = \"runc\" in /etc/containers/containers.conf).",
            tried.join("\n")
        )))
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

    /// GET `path` (with `query`) from the engine's API and return the body as untyped JSON.
    ///
    /// Only for answers bollard's typed models cannot read. Podman 4 lists a container whose
    /// process has ended but whose clean-up has not run yet as `"State": "stopped"`, a value
    /// Docker's API does not have; bollard then rejects the whole list, and one such container
    /// anywhere on the host would hide every orphan from the reaper.
    pub async fn get_json(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<serde_json::Value, String> {
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
            return Err(format!(
                "GET {path} from {endpoint}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(500)])
            ));
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("GET {path} from {endpoint}: the body is not JSON: {e}"))
    }

    /// Stop the podman service we started, if any.
    pub async fn shutdown(&self) {
        if let Some(mut child) = self.service.lock().await.take() {
            unsafe { libc::kill(child.id().unwrap_or(0) as i32, libc::SIGTERM) };
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
            if let Some(path) = self.endpoint.strip_prefix("unix://") {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Whether `dir` (the engine's storage root) is a local directory owned by this process's
/// user, and that user is not root: the engine runs as us, rootless.
fn storage_is_ours_and_not_root(dir: Option<&str>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let uid = unsafe { libc::geteuid() };
    uid != 0
        && dir
            .and_then(|d| std::fs::metadata(d).ok())
            .is_some_and(|m| m.uid() == uid)
}

/// What the engine can enforce, from its `/info`.
#[derive(Debug, Clone, Default)]
pub struct Enforcement {
    pub rootless: bool,
    pub cgroup_version: String,
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
}

impl Enforcement {
    pub async fn query(docker: &Docker) -> Result<Self, bollard::errors::Error> {
        let info = docker.info().await?;
        // Rootless Docker says so in its security options. Podman's compatible /info does not
        // (and reports MemoryLimit even where rootless cgroup v1 drops every limit), but its
        // storage root gives it away: a local directory owned by us, a non-root user.
        let rootless = info
            .security_options
            .as_ref()
            .is_some_and(|o| o.iter().any(|s| s.contains("rootless")))
            || storage_is_ours_and_not_root(info.docker_root_dir.as_deref());
        let cgroup_version = info
            .cgroup_version
            .map(|v| v.to_string())
            .unwrap_or_default();
        let v1_rootless = rootless && cgroup_version == "1";
        Ok(Enforcement {
            rootless,
            memory: info.memory_limit.unwrap_or(false) && !v1_rootless,
            pids: info.pids_limit.unwrap_or(false) && !v1_rootless,
            cpu: info.cpu_cfs_quota.unwrap_or(false) && !v1_rootless,
            cgroup_version,
        })
    }

    /// The limits the config asks for that this host cannot enforce, each with the reason.
    pub fn missing(&self, config: &Config) -> Vec<String> {
        let why = if self.rootless && self.cgroup_version == "1" {
            "rootless containers on cgroup v1 cannot have resource limits"
        } else {
            "the engine reports the cgroup controller unavailable (rootless cgroup v2 needs it delegated: see systemd's Delegate=)"
        };
        let mut out = Vec::new();
        if !self.memory {
            out.push(format!("memory ({}): {why}", config.memory));
        }
        if !self.pids {
            out.push(format!("pids ({}): {why}", config.pids));
        }
        if config.cpus.is_some() && !self.cpu {
            out.push(format!("cpus ({}): {why}", config.cpus.unwrap_or_default()));
        }
        out
    }
}
