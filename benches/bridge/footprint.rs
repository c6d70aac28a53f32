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

// ---------------------------------------------------------------------------------------------
// A sandbox's own memory and CPU, as the host accounts them (section 11)
// ---------------------------------------------------------------------------------------------

/// A sandbox container of a bridge, as the engine describes it.
pub(crate) struct Ctr {
    pub(crate) name: String,
    /// The container's first process (its init), in the host's PID namespace.
    pub(crate) pid: u32,
    /// Its conmon, the engine's monitor process on the host (one per container).
    pub(crate) conmon: u32,
}

/// The running containers of bridge `bridge` (`podman inspect` of those `containers_of` finds).
pub(crate) async fn containers_inspected(bridge: u32) -> Vec<Ctr> {
    let ids = containers_of(bridge).await;
    if ids.is_empty() {
        return Vec::new();
    }
    let out = Command::new("podman")
        .args([
            "inspect",
            "--format",
            "{{.Name}} {{.State.Pid}} {{.State.ConmonPid}}",
        ])
        .args(&ids)
        .output()
        .await
        .unwrap_or_else(|e| fail(&format!("podman inspect: {e}")));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?.to_string();
            let pid = f.next()?.parse().ok().filter(|p| *p > 0)?;
            let conmon = f.next()?.parse().ok()?;
            Some(Ctr { name, pid, conmon })
        })
        .collect()
}

/// The cgroup directory of `pid` that holds `controller`: under cgroup v1 the hierarchy mounted
/// for it (`/sys/fs/cgroup/<controllers>/<path>`), under v2 the unified one.
pub(crate) fn cgroup_dir(pid: u32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if unified && controllers.is_empty() {
            return Some(PathBuf::from(format!("/sys/fs/cgroup{path}")));
        }
        if !unified && controllers.split(',').any(|c| c == controller) {
            return Some(PathBuf::from(format!("/sys/fs/cgroup/{controllers}{path}")));
        }
    }
    None
}

/// Which cgroup version the figures come from.
pub(crate) fn cgroup_version() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else {
        "v1"
    }
}

/// One value of a `memory.stat`-style file (`key value` lines).
fn stat_value(dir: &Path, file: &str, key: &str) -> Option<f64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

fn file_value(dir: &Path, file: &str) -> Option<f64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The memory of one sandbox, in MiB.
#[derive(Clone, Copy, Default)]
pub(crate) struct CtrMem {
    /// What its memory limit counts: `memory.usage_in_bytes` (v1) or `memory.current` (v2),
    /// anonymous memory, page cache first touched by it, and kernel memory.
    pub(crate) usage: f64,
    /// Its anonymous memory: `total_rss` of `memory.stat` (v1) or `anon` (v2).
    pub(crate) anon: f64,
    /// `VmRSS` of its processes, summed (pages shared with other containers counted in each).
    pub(crate) rss: f64,
    /// `Pss` of its processes (`smaps_rollup`): shared pages divided among their users.
    pub(crate) pss: f64,
    /// `VmRSS` of its conmon.
    pub(crate) conmon: f64,
}

pub(crate) fn ctr_mem(c: &Ctr) -> CtrMem {
    let mib = |b: Option<f64>| b.map_or(f64::NAN, |b| b / 1048576.0);
    let Some(dir) = cgroup_dir(c.pid, "memory") else {
        return CtrMem {
            usage: f64::NAN,
            anon: f64::NAN,
            rss: f64::NAN,
            pss: f64::NAN,
            conmon: rss_mib(c.conmon),
        };
    };
    let (usage, anon) = if cgroup_version() == "v2" {
        (
            file_value(&dir, "memory.current"),
            stat_value(&dir, "memory.stat", "anon"),
        )
    } else {
        (
            file_value(&dir, "memory.usage_in_bytes"),
            stat_value(&dir, "memory.stat", "total_rss"),
        )
    };
    let procs: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let rss: f64 = procs
        .iter()
        .map(|p| rss_mib(*p))
        .filter(|v| !v.is_nan())
        .sum();
    let pss: f64 = procs
        .iter()
        .filter_map(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).ok()?;
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .sum::<f64>()
        / 1024.0;
    CtrMem {
        usage: mib(usage),
        anon: mib(anon),
        rss,
        pss,
        conmon: rss_mib(c.conmon),
    }
}

/// CPU time the sandbox's processes have used, in ms: `cpuacct.usage` (v1) or `usage_usec` of
/// `cpu.stat` (v2) of its cgroup.
pub(crate) fn ctr_cpu_ms(c: &Ctr) -> f64 {
    if cgroup_version() == "v2" {
        cgroup_dir(c.pid, "cpu")
            .and_then(|d| stat_value(&d, "cpu.stat", "usage_usec"))
            .map_or(f64::NAN, |us| us / 1e3)
    } else {
        cgroup_dir(c.pid, "cpuacct")
            .and_then(|d| file_value(&d, "cpuacct.usage"))
            .map_or(f64::NAN, |ns| ns / 1e6)
    }
}

/// The `podman system service` that bridge `bridge` started for itself (its socket is named
/// after the bridge's pid); `None` when it talks to a socket it did not start.
pub(crate) fn engine_service(bridge: u32) -> Option<u32> {
    let sock = format!("podman-{bridge}.sock");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_podman = args
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "podman"));
        (is_podman && args.iter().any(|a| a.ends_with(&sock))).then_some(pid)
    })
}

/// The whole machine's busy CPU time so far, in ms summed over its CPUs (`/proc/stat`: all but
/// idle and iowait), and the number of CPUs.
pub(crate) fn host_busy_ms() -> (f64, usize) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    let f: Vec<f64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    // SAFETY: sysconf takes a name constant, cannot fail unsafely and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ((total - idle) * 1e3 / hz, cpus.max(1))
}
