//! Resolving requirements for a sandbox's interpreter with `uv pip compile`, on the host.
//!
//! uv is a real resolver, maintained, and it resolves for another interpreter than its own
//! (`--python-version`, `--python-platform`) without running any of it: with
//! `--only-binary :all:` it reads wheels' metadata only, so no package's code (a `setup.py`)
//! ever runs on the host. It writes a PEP 751 lock (`pylock.toml`) naming each wheel with its
//! URL, size and sha256, which the bridge then downloads and checks itself (`store`). The
//! image's own distributions are constraints (`name==version`), so a resolution can never ask
//! for another numpy than the image's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::PackageError;
use bridge_core::config::{PackagesConfig, Requirement};
use bridge_core::protocol::Target;

/// One wheel of a resolution.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Wheel {
    /// Normalized distribution name.
    pub name: String,
    /// The version the resolution chose.
    pub version: String,
    /// The wheel's file name (`tabulate-0.9.0-py3-none-any.whl`).
    pub filename: String,
    /// Where it is: a URL of the index, or a file of `find_links`.
    pub url: Option<String>,
    /// The `find_links` file it is, when it is not at a URL.
    pub path: Option<PathBuf>,
    /// As the index says (checked on download); `None` only for a `find_links` file, whose
    /// digest is computed from the file.
    pub size: Option<u64>,
    /// The wheel's SHA-256 (hex) as the index says it (checked on download); `None` for a
    /// `find_links` file until its download computes it.
    pub sha256: Option<String>,
}

/// The `uv pip compile` arguments for `target` under `config`: the interpreter's version and
/// platform, wheels only, the index or none.
pub fn platform_args(target: &Target) -> Result<(String, String), PackageError> {
    let mut parts = target.python.split('.');
    let (major, minor) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let digits = |s: &str| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) {
        return Err(PackageError::UnknownTarget(format!(
            "its Python version is {:?}",
            target.python
        )));
    }
    let arch = match target.machine.as_str() {
        "x86_64" | "amd64" => "x86_64",
        "aarch64" | "arm64" => "aarch64",
        other => {
            return Err(PackageError::UnknownTarget(format!(
                "its machine is {other:?}; wheels are chosen for x86_64 and aarch64"
            )));
        }
    };
    let platform = match target.libc.strip_prefix("glibc ") {
        // uv names manylinux_2_17 to _2_40; a newer glibc runs every wheel of an older one.
        Some(v) => {
            let minor: u32 = v
                .split('.')
                .nth(1)
                .and_then(|m| m.parse().ok())
                .ok_or_else(|| {
                    PackageError::UnknownTarget(format!("its libc is {:?}", target.libc))
                })?;
            format!("{arch}-manylinux_2_{}", minor.clamp(17, 40))
        }
        None => format!("{arch}-unknown-linux-musl"),
    };
    Ok((format!("{major}.{minor}"), platform))
}

/// The image's distributions as constraints: `name==version`, a local label (`+dfsg1`, what
/// Debian adds) dropped, since the index publishes the version without it.
pub fn constraints(target: &Target) -> String {
    let mut out = String::new();
    for (name, version) in &target.dists {
        let v = version.split('+').next().unwrap_or("");
        let ok = |s: &str, extra: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        if ok(name, "-_.") && ok(v, ".!-_") {
            out.push_str(&format!("{name}=={v}\n"));
        }
    }
    out
}

/// Resolve `requirements` for `target`: every wheel the install needs, the image's own
/// distributions included (the caller drops them). `work` is an empty directory for uv's
/// input and output; `uv_cache` its cache.
pub(crate) async fn resolve(
    config: &PackagesConfig,
    target: &Target,
    requirements: &[Requirement],
    work: &Path,
    uv_cache: &Path,
    timeout: Duration,
) -> Result<Vec<Wheel>, PackageError> {
    let (python, platform) = platform_args(target)?;
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| PackageError::Io { what, path, source }
    };
    let input = work.join("requirements.in");
    let text: String = requirements
        .iter()
        .map(|r| format!("{}\n", r.text))
        .collect();
    std::fs::write(&input, text).map_err(io("could not write", &input))?;
    let cons = work.join("constraints.txt");
    std::fs::write(&cons, constraints(target)).map_err(io("could not write", &cons))?;
    let out = work.join("pylock.toml");

    // uv runs in `work` and is given its files by name, so that what it says of them (a line
    // it could not parse) names no host path.
    let mut cmd = tokio::process::Command::new(&config.uv);
    cmd.current_dir(work)
        .arg("pip")
        .arg("compile")
        .arg("requirements.in")
        .args([
            "--format",
            "pylock.toml",
            "--no-header",
            "--quiet",
            "--color",
            "never",
        ])
        .args(["--no-config", "--no-progress", "--only-binary", ":all:"])
        .args(["--python-version", &python, "--python-platform", &platform])
        .args(["--constraint", "constraints.txt"])
        .arg("--cache-dir")
        .arg(uv_cache)
        .args(["-o", "pylock.toml"]);
    if config.offline {
        cmd.args(["--offline", "--no-index"]);
    } else {
        cmd.args(["--index-url", &config.index_url]);
    }
    if let Some(dir) = &config.find_links {
        cmd.arg("--find-links").arg(dir);
    }
    // uv wants an interpreter even when it resolves for another one; naming the system's saves
    // its search of PATH (through version-manager shims, a second).
    if Path::new("/usr/bin/python3").is_file() {
        cmd.args(["--python", "/usr/bin/python3"]);
    }
    cmd.arg("--no-python-downloads");
    // uv reads no configuration of the user's (`--no-config`) and only the environment that
    // reaches an index: PATH for itself, HOME for nothing else, proxies and certificates.
    cmd.env_clear();
    for key in [
        "PATH",
        "HOME",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    ] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    // The host's own certificate store, as every other program of the host uses (an index
    // behind the organisation's proxy included): `UV_SYSTEM_CERTS` in today's uv,
    // `UV_NATIVE_TLS` in older ones.
    cmd.env("UV_PYTHON_DOWNLOADS", "never")
        .env("UV_SYSTEM_CERTS", "1")
        .env("UV_NATIVE_TLS", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| PackageError::Resolver {
        uv: config.uv.clone(),
        reason: e.to_string(),
    })?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(r) => r.map_err(|e| PackageError::Resolver {
            uv: config.uv.clone(),
            reason: e.to_string(),
        })?,
        Err(_) => return Err(PackageError::Timeout(timeout.as_secs())),
    };
    if !output.status.success() {
        // The sandbox reads this: no host path in it.
        let mut hide: Vec<(&Path, &str)> = vec![(work, ""), (uv_cache, "<uv cache>")];
        if let Some(dir) = &config.find_links {
            hide.push((dir, "<packages.find_links>"));
        }
        let stderr = scrub(&String::from_utf8_lossy(&output.stderr), &hide);
        let unreachable = [
            "Failed to fetch",
            "error sending request",
            "Could not connect",
            "dns error",
        ]
        .iter()
        .any(|m| stderr.contains(m));
        if unreachable {
            return Err(PackageError::IndexUnreachable(tail(&stderr, 2000)));
        }
        return Err(PackageError::Unresolvable(tail(&stderr, 2000)));
    }
    let text = std::fs::read_to_string(&out).map_err(io("could not read uv's lock", &out))?;
    parse_lock(&text, work, config.find_links.as_deref())
}

/// `text` with each of the host paths `hide` replaced by its stand-in: a path inside one
/// (`<path>/x`) becomes `<stand-in>/x`, or `x` for an empty stand-in.
pub(crate) fn scrub(text: &str, hide: &[(&Path, &str)]) -> String {
    let mut out = text.to_string();
    for (path, instead) in hide {
        let p = path.display().to_string();
        if p.is_empty() || p == "/" {
            continue;
        }
        let inside = if instead.is_empty() {
            String::new()
        } else {
            format!("{instead}/")
        };
        out = out.replace(&format!("{p}/"), &inside);
        out = out.replace(&p, if instead.is_empty() { "." } else { instead });
    }
    out
}

/// The last `max` bytes of uv's message, without its colour or blank lines.
fn tail(s: &str, max: usize) -> String {
    let lines: Vec<&str> = s
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let joined = lines.join("\n");
    if joined.len() <= max {
        return joined;
    }
    let start = joined.len() - max;
    let start = (start..joined.len())
        .find(|i| joined.is_char_boundary(*i))
        .unwrap_or(0);
    format!("…{}", &joined[start..])
}

#[derive(Deserialize)]
struct Lock {
    #[serde(default)]
    packages: Vec<LockPackage>,
}

#[derive(Deserialize)]
struct LockPackage {
    name: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    wheels: Vec<LockWheel>,
}

#[derive(Deserialize)]
struct LockWheel {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    hashes: std::collections::BTreeMap<String, String>,
}

/// The wheels of a `pylock.toml`. A package with no wheel (only an sdist) is refused: building
/// it would run its code on the host. A wheel of the index must carry its sha256; a relative
/// path is the lock's own (`work`) and must name a file of `find_links`.
pub fn parse_lock(
    text: &str,
    work: &Path,
    find_links: Option<&Path>,
) -> Result<Vec<Wheel>, PackageError> {
    let lock: Lock = toml::from_str(text)
        .map_err(|e| PackageError::Unresolvable(format!("uv's lock could not be read: {e}")))?;
    let mut out = Vec::new();
    for p in lock.packages {
        let name = bridge_core::config::packages::normalize(&p.name);
        let version = p.version.unwrap_or_default();
        let Some(w) = p.wheels.into_iter().next() else {
            return Err(PackageError::NoWheel { name, version });
        };
        let sha256 = w.hashes.get("sha256").map(|h| h.to_ascii_lowercase());
        if let Some(h) = &sha256
            && (h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(PackageError::Unresolvable(format!(
                "the index gave {name} a sha256 that is not one: {h:?}"
            )));
        }
        // A `find_links` wheel is a `file://` URL in uv's lock: a path like any other.
        let (w_url, w_path) = match w.url {
            Some(u) if u.starts_with("file://") => {
                let p = url::Url::parse(&u)
                    .ok()
                    .and_then(|u| u.to_file_path().ok())
                    .map(|p| p.display().to_string());
                (None, p.or(Some(u)))
            }
            u => (u, w.path),
        };
        let (url, path) = match (w_url, w_path) {
            (Some(u), _) => {
                if !(u.starts_with("https://") || u.starts_with("http://")) {
                    return Err(PackageError::Unresolvable(format!(
                        "the wheel of {name} is at {u:?}, not an http(s) URL"
                    )));
                }
                if sha256.is_none() {
                    return Err(PackageError::Unresolvable(format!(
                        "the index gave no sha256 for the wheel of {name}; only wheels with a published digest are installed"
                    )));
                }
                (Some(u), None)
            }
            (None, Some(p)) => {
                let full = work.join(&p);
                let inside =
                    find_links.is_some_and(|d| match (full.canonicalize(), d.canonicalize()) {
                        (Ok(f), Ok(d)) => f.starts_with(d),
                        _ => false,
                    });
                if !inside {
                    return Err(PackageError::Unresolvable(format!(
                        "the wheel of {name} is a file outside packages.find_links: {p:?}"
                    )));
                }
                (None, Some(full))
            }
            (None, None) => return Err(PackageError::NoWheel { name, version }),
        };
        let filename = w
            .name
            .or_else(|| {
                url.as_deref()
                    .and_then(|u| u.rsplit('/').next())
                    .or_else(|| {
                        path.as_deref()
                            .and_then(|p| p.file_name())
                            .and_then(|f| f.to_str())
                    })
                    .map(|f| f.split('#').next().unwrap_or(f).to_string())
            })
            .unwrap_or_default();
        if !filename.ends_with(".whl") {
            return Err(PackageError::NoWheel { name, version });
        }
        out.push(Wheel {
            name,
            version,
            filename,
            url,
            path,
            size: w.size,
            sha256,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            python: "3.14.1".into(),
            machine: "x86_64".into(),
            libc: "glibc 2.43".into(),
            dists: vec![
                ("numpy".into(), "2.4.6".into()),
                ("matplotlib".into(), "3.10.9+dfsg1".into()),
                ("bad name".into(), "1".into()),
            ],
        }
    }

    #[test]
    fn the_target_picks_version_and_platform() {
        assert_eq!(
            platform_args(&target()).unwrap(),
            ("3.14".to_string(), "x86_64-manylinux_2_40".to_string())
        );
        let mut t = target();
        t.libc = "glibc 2.28".into();
        t.machine = "aarch64".into();
        assert_eq!(platform_args(&t).unwrap().1, "aarch64-manylinux_2_28");
        t.libc = String::new();
        assert_eq!(platform_args(&t).unwrap().1, "aarch64-unknown-linux-musl");
        t.machine = "sparc".into();
        assert!(platform_args(&t).is_err());
        t.machine = "x86_64".into();
        t.python = "3;rm".into();
        assert!(platform_args(&t).is_err());
    }

    #[test]
    fn image_dists_are_constraints_without_local_labels() {
        assert_eq!(constraints(&target()), "numpy==2.4.6\nmatplotlib==3.10.9\n");
    }

    #[test]
    fn a_lock_gives_wheels_and_refuses_what_is_not_one() {
        let ok = r#"
lock-version = "1.0"
[[packages]]
name = "Python_Slugify"
version = "8.0.4"
wheels = [{ url = "https://files.example/python_slugify-8.0.4-py2.py3-none-any.whl", size = 10, hashes = { sha256 = "AB00000000000000000000000000000000000000000000000000000000000000" } }]
"#;
        let w = parse_lock(ok, Path::new("/nonexistent"), None).unwrap();
        assert_eq!(w[0].name, "python-slugify");
        assert_eq!(w[0].filename, "python_slugify-8.0.4-py2.py3-none-any.whl");
        assert!(w[0].sha256.as_deref().unwrap().starts_with("ab00"));
        let sdist = "[[packages]]\nname = \"x\"\nversion = \"1\"\nsdist = { url = \"https://e/x-1.tar.gz\" }\n";
        assert!(matches!(
            parse_lock(sdist, Path::new("/"), None),
            Err(PackageError::NoWheel { .. })
        ));
        let nohash = "[[packages]]\nname = \"x\"\nversion = \"1\"\nwheels = [{ url = \"https://e/x-1-py3-none-any.whl\" }]\n";
        assert!(parse_lock(nohash, Path::new("/"), None).is_err());
        let file = "[[packages]]\nname = \"x\"\nversion = \"1\"\nwheels = [{ url = \"file:///etc/passwd\" }]\n";
        assert!(parse_lock(file, Path::new("/"), Some(Path::new("/srv/wheels"))).is_err());
        let dir = tempfile::tempdir().unwrap();
        let whl = dir.path().join("x-1-py3-none-any.whl");
        std::fs::write(&whl, b"zip").unwrap();
        let inside = format!(
            "[[packages]]\nname = \"x\"\nversion = \"1\"\nwheels = [{{ url = \"file://{}\" }}]\n",
            whl.display()
        );
        let w = parse_lock(&inside, Path::new("/"), Some(dir.path())).unwrap();
        assert_eq!(w[0].path.as_deref(), Some(whl.as_path()));
        assert_eq!(w[0].filename, "x-1-py3-none-any.whl");
        let outside =
            "[[packages]]\nname = \"x\"\nversion = \"1\"\nwheels = [{ path = \"/etc/passwd\" }]\n";
        assert!(parse_lock(outside, Path::new("/"), Some(Path::new("/srv/wheels"))).is_err());
    }
}
