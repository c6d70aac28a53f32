//! Value types of the configuration and their lenient spellings: durations (`30s`), sizes
//! (`512m`), log levels (`WARNING`), the container engine (`auto`, `podman`, a socket URL),
//! booleans written as `1` or `yes`, and empty strings meaning unset.

use super::InvalidValue;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as `30`, `30s`, `1.5s`, `500ms`, `2m`, `1h` or `7d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Secs(pub Duration);

impl Secs {
    /// Read a duration as written (see [`Secs`]): a number of seconds, or a number followed by
    /// `ms`, `s`, `m`, `h` or `d`. Fails on a number that does not parse, an unknown unit, or a
    /// value below 0 or above 10⁹ seconds.
    pub fn parse(s: &str) -> Result<Self, InvalidValue> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num.parse().map_err(|error| InvalidValue::Duration {
            text: s.into(),
            error,
        })?;
        let factor = match unit.trim() {
            "" | "s" | "sec" | "secs" => 1.0,
            "ms" => 0.001,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            u => {
                return Err(InvalidValue::DurationUnit {
                    text: s.into(),
                    unit: u.into(),
                });
            }
        };
        let secs = n * factor;
        if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
            return Err(InvalidValue::OutOfRange { text: s.into() });
        }
        Ok(Secs(Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Secs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(n) if n >= 0 => {
                Secs::parse(&n.to_string()).map_err(serde::de::Error::custom)
            }
            NumOrStr::Float(x) => Secs::parse(&x.to_string()).map_err(serde::de::Error::custom),
            NumOrStr::Str(s) => Secs::parse(&s).map_err(serde::de::Error::custom),
            NumOrStr::Int(n) => Err(serde::de::Error::custom(format!(
                "{n} is negative; a duration is 0 or more"
            ))),
        }
    }
}

/// A byte size written as `536870912`, `512k`, `512m`, `1g` (binary units; `mb`, `MiB` also accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    /// Read a byte size as written (see [`Size`]): bytes, or a number followed by `k`, `m` or
    /// `g` (powers of 1024). Fails on a number that does not parse, an unknown unit, or a value
    /// below 0 or above 10¹⁵ bytes.
    pub fn parse(s: &str) -> Result<Self, InvalidValue> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|error| InvalidValue::Size {
            text: s.into(),
            error,
        })?;
        let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            u => {
                return Err(InvalidValue::SizeUnit {
                    text: s.into(),
                    unit: u.into(),
                });
            }
        };
        let v = n * factor as f64;
        if !v.is_finite() || !(0.0..=1e15).contains(&v) {
            return Err(InvalidValue::OutOfRange { text: s.into() });
        }
        Ok(Size(v as u64))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        match b {
            0 => write!(f, "0"),
            _ if b.is_multiple_of(1 << 30) => write!(f, "{}g", b >> 30),
            _ if b.is_multiple_of(1 << 20) => write!(f, "{}m", b >> 20),
            _ if b.is_multiple_of(1 << 10) => write!(f, "{}k", b >> 10),
            _ => write!(f, "{b}"),
        }
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(n) if n >= 0 => Ok(Size(n as u64)),
            NumOrStr::Float(x) => Size::parse(&x.to_string()).map_err(serde::de::Error::custom),
            NumOrStr::Str(s) => Size::parse(&s).map_err(serde::de::Error::custom),
            NumOrStr::Int(n) => Err(serde::de::Error::custom(format!(
                "{n} is negative; a size is 0 or more"
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Int(i64),
    Float(f64),
    Str(String),
}

/// Which kernel the sandbox's system calls reach. `Container`: the host's, behind namespaces,
/// seccomp and cgroups (runc or crun). `Gvisor`: gVisor's kernel in user space, through the
/// engine's OCI runtime named by `gvisor_runtime`; a kernel exploit through an allowed system
/// call then lands in gVisor, not in the host. Never downgraded: without that runtime, no code
/// runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The host's kernel, behind namespaces, seccomp and cgroups (`container`, the default).
    Container,
    /// gVisor's user-space kernel, through the engine's runtime `gvisor_runtime` (`gvisor`).
    Gvisor,
}

/// How `run_python` renders its text content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    /// One text block per part of the result (`stdout`, `stderr`, `value`, ...), each as a
    /// terminal would show it (`compact`, the default).
    Compact,
    /// One TOON block carrying every field of the result (`toon`).
    Toon,
}

/// The container engine to talk to: one of the engines found by looking in the usual places, or
/// one socket. Parsed at load, so a misspelt engine name is a configuration error naming the
/// key, not a socket URL that fails at the first call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// Podman's sockets, then Docker's, then a podman service of our own.
    Auto,
    /// Podman's sockets, then a podman service of our own.
    Podman,
    /// Docker's socket.
    Docker,
    /// `unix:///path`, `tcp://host:port`, `http://host:port`, or a bare absolute socket path.
    Socket(String),
}

impl Runtime {
    /// The engine names accepted besides a socket URL.
    pub const NAMES: [&'static str; 3] = ["auto", "podman", "docker"];

    /// Read the engine as written: one of [`Runtime::NAMES`], or a socket URL (`unix://`,
    /// `tcp://`, `http://`) or absolute path. Anything else fails, naming the closest engine
    /// name when the text is not a URL.
    pub fn parse(s: &str) -> Result<Runtime, InvalidValue> {
        let t = s.trim();
        Ok(match t {
            "auto" => Runtime::Auto,
            "podman" => Runtime::Podman,
            "docker" => Runtime::Docker,
            _ if ["unix://", "tcp://", "http://", "/"]
                .iter()
                .any(|p| t.starts_with(p)) =>
            {
                Runtime::Socket(t.to_string())
            }
            _ => {
                let closest = if t.contains("://") {
                    None
                } else {
                    let lower = t.to_ascii_lowercase();
                    let near = Self::NAMES
                        .iter()
                        .min_by_key(|n| super::keys::edit_distance(&lower, n))
                        .unwrap_or(&"auto");
                    Some(*near)
                };
                return Err(InvalidValue::Runtime {
                    text: t.into(),
                    closest,
                });
            }
        })
    }

    /// Whether podman's sockets are looked for (and a podman service started when none answers).
    pub fn wants_podman(&self) -> bool {
        matches!(self, Runtime::Auto | Runtime::Podman)
    }

    /// Whether Docker's socket is looked for.
    pub fn wants_docker(&self) -> bool {
        matches!(self, Runtime::Auto | Runtime::Docker)
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Runtime::Auto => f.write_str("auto"),
            Runtime::Podman => f.write_str("podman"),
            Runtime::Docker => f.write_str("docker"),
            Runtime::Socket(url) => f.write_str(url),
        }
    }
}

impl Serialize for Runtime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Runtime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Runtime::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Log verbosity. Accepts the seed's spellings (`INFO`, `warning`, `critical`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Errors only (`error`, also `critical` and `fatal`).
    Error,
    /// Errors and warnings (`warn`, `warning`).
    Warn,
    /// What the bridge does, a line per event worth knowing (`info`, the default).
    Info,
    /// Details for finding a fault (`debug`), the sandbox's own diagnostics among them.
    Debug,
    /// Everything this project logs, the finest details included (`trace`).
    Trace,
}

impl LogLevel {
    /// The level as a `tracing` filter directive names it (`warn`, not `warning`).
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_filter())
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "error" | "critical" | "fatal" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => {
                return Err(serde::de::Error::custom(format!(
                    "{s:?} is not a log level; use error, warning, info, debug or trace"
                )));
            }
        })
    }
}

pub(super) fn flexible_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum B {
        Bool(bool),
        Int(i64),
        Str(String),
    }
    match B::deserialize(d)? {
        B::Bool(b) => Ok(b),
        B::Int(0) => Ok(false),
        B::Int(1) => Ok(true),
        B::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err(serde::de::Error::custom(format!(
                "{s:?} is not a boolean; use true/false or 1/0"
            ))),
        },
        B::Int(n) => Err(serde::de::Error::custom(format!(
            "{n} is not a boolean; use true/false or 1/0"
        ))),
    }
}

pub(super) fn flexible_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match NumOrStr::deserialize(d)? {
        NumOrStr::Int(n) => u32::try_from(n).map_err(|_| {
            serde::de::Error::custom(format!("{n} is out of range (0 to {})", u32::MAX))
        }),
        NumOrStr::Str(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number"))),
        NumOrStr::Float(x) => Err(serde::de::Error::custom(format!(
            "{x} is not a whole number"
        ))),
    }
}

/// Python modules to import ahead of need: a list in TOML, comma-separated in the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleList(pub Vec<String>);

impl ModuleList {
    /// A dotted Python name: only such names are ever imported, and none holds a comma.
    pub fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.split('.').all(|p| {
                p.chars()
                    .next()
                    .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                    && p.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
            })
    }
}

impl fmt::Display for ModuleList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl Serialize for ModuleList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ModuleList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        list_or_string(d, |s| s.split(',').map(str::to_string).collect()).map(ModuleList)
    }
}

/// A list of names given as a TOML list or as one string (the environment's form), cut by
/// `split`; each item trimmed, empty ones dropped.
pub(super) fn list_or_string<'de, D: Deserializer<'de>>(
    d: D,
    split: impl FnOnce(&str) -> Vec<String>,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum L {
        List(Vec<String>),
        Str(String),
    }
    let items = match L::deserialize(d)? {
        L::List(v) => v,
        L::Str(s) => split(&s),
    };
    Ok(items
        .into_iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect())
}

pub(super) fn empty_as_none<'de, D: Deserializer<'de>, T: From<String>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    Ok(s.filter(|s| !s.trim().is_empty()).map(T::from))
}

pub(super) fn empty_as_none_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrStr::Int(n)) => Ok(Some(n as f64)),
        Some(NumOrStr::Float(x)) => Ok(Some(x)),
        Some(NumOrStr::Str(s)) if s.trim().is_empty() => Ok(None),
        Some(NumOrStr::Str(s)) => s.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!("{s:?} is not a number; write e.g. 1 or 0.5"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(Secs::parse("30").unwrap().0, Duration::from_secs(30));
        assert_eq!(Secs::parse("30s").unwrap().0, Duration::from_secs(30));
        assert_eq!(Secs::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert_eq!(Secs::parse("2m").unwrap().0, Duration::from_secs(120));
        assert!(Secs::parse("abc").is_err());
        assert!(Secs::parse("3 parsecs").is_err());
        assert_eq!(Size::parse("512m").unwrap().0, 512 << 20);
        assert_eq!(Size::parse("1G").unwrap().0, 1 << 30);
        assert_eq!(Size::parse("65536").unwrap().0, 65536);
        assert!(Size::parse("lots").is_err());
        assert_eq!(Size(512 << 20).to_string(), "512m");
        assert_eq!(Secs(Duration::from_secs(30)).to_string(), "30s");
    }

    #[test]
    fn runtime_is_an_engine_name_or_a_socket_and_a_typo_names_the_closest() {
        assert_eq!(Runtime::parse(" podman ").unwrap(), Runtime::Podman);
        assert_eq!(
            Runtime::parse("unix:///run/podman/podman.sock").unwrap(),
            Runtime::Socket("unix:///run/podman/podman.sock".into())
        );
        assert_eq!(
            Runtime::parse("tcp://h:2375").unwrap().to_string(),
            "tcp://h:2375"
        );
        let err = Runtime::parse("podmn").unwrap_err().to_string();
        assert!(
            err.contains("`podmn`")
                && err.contains("auto, podman, docker")
                && err.ends_with("did you mean `podman`?"),
            "{err}"
        );
        assert!(
            !Runtime::parse("ftp://h")
                .unwrap_err()
                .to_string()
                .contains("did you mean")
        );
    }
}
