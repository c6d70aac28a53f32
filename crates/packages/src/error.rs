//! Why an install failed ([`PackageError`]): the message says what, the hint what to do, and
//! the sandbox's version of the message names no host path.

use std::path::PathBuf;

use bridge_core::error::{Hint, Hinted};

/// Why an install failed; the message says what, the hint what to do.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{0}")]
    BadRequirement(bridge_core::config::InvalidValue),
    #[error("install refused: {what}, by {rule}")]
    Denied { what: String, rule: String },
    #[error(
        "install refused: {what} was refused before in this session (by {rule}); it is not asked again"
    )]
    RefusedBefore { what: String, rule: String },
    #[error("no install is possible in this sandbox: {0}")]
    Unavailable(String),
    #[error("the packages cannot be chosen for this interpreter: {0}")]
    UnknownTarget(String),
    #[error("the resolver ({uv}) could not be run: {reason}", uv = uv.display())]
    Resolver { uv: PathBuf, reason: String },
    #[error("the requirements could not be resolved:\n{0}")]
    Unresolvable(String),
    #[error("the package index could not be reached:\n{0}")]
    IndexUnreachable(String),
    #[error("{name} {version} has no wheel for this interpreter, only a source distribution")]
    NoWheel { name: String, version: String },
    #[error("the install took longer than packages.timeout{}", if *.0 > 0 { format!(" ({} s)", .0) } else { String::new() })]
    Timeout(u64),
    #[error("the wheel of {name} could not be downloaded: {reason}")]
    Download { name: String, reason: String },
    #[error(
        "the wheel of {name} does not match the index's sha256 (expected {expected}, got {got}); it was not installed"
    )]
    HashMismatch {
        name: String,
        expected: String,
        got: String,
    },
    #[error(
        "{what} is {size} bytes, above the {max} bytes this install may still use (packages.max_size)"
    )]
    TooLarge { what: String, size: u64, max: u64 },
    #[error("the wheel of {name} is refused: {reason}")]
    BadWheel { name: String, reason: String },
    #[error("{0} is already installed in this session by another distribution")]
    FileConflict(String),
    #[error("{name} {have} is installed in this session; {want} was asked for")]
    VersionConflict {
        name: String,
        have: String,
        want: String,
    },
    #[error("a bridge is installing packages now, so the cache is not pruned")]
    CacheBusy,
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PackageError {
    /// The message for the sandbox: [`Hinted::message`] without host paths (a file of the
    /// cache, the resolver's path), which only the bridge's log shows.
    pub fn for_sandbox(&self) -> String {
        match self {
            PackageError::Io { what, source, .. } => {
                let shown = PackageError::Io {
                    what,
                    path: PathBuf::from("the package cache"),
                    source: std::io::Error::new(source.kind(), source.kind().to_string()),
                };
                shown.message()
            }
            PackageError::Resolver { reason, .. } => PackageError::Resolver {
                uv: PathBuf::from("uv"),
                reason: reason.clone(),
            }
            .message(),
            e => e.message(),
        }
    }

    /// Whether it is a refusal (`PackageDenied` in Python) rather than a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            PackageError::Denied { .. } | PackageError::RefusedBefore { .. }
        )
    }

    /// The audit's `error_type`: a kind, never a message.
    pub fn kind(&self) -> &'static str {
        match self {
            PackageError::BadRequirement(_) => "bad_requirement",
            PackageError::Denied { .. } | PackageError::RefusedBefore { .. } => "denied",
            PackageError::Unavailable(_) => "unavailable",
            PackageError::UnknownTarget(_) => "unknown_target",
            PackageError::Resolver { .. } => "resolver",
            PackageError::Unresolvable(_) => "unresolvable",
            PackageError::IndexUnreachable(_) => "index_unreachable",
            PackageError::NoWheel { .. } => "no_wheel",
            PackageError::Timeout(_) => "timeout",
            PackageError::Download { .. } => "download",
            PackageError::HashMismatch { .. } => "hash_mismatch",
            PackageError::TooLarge { .. } => "too_large",
            PackageError::BadWheel { .. } => "bad_wheel",
            PackageError::FileConflict(_) | PackageError::VersionConflict { .. } => "conflict",
            PackageError::CacheBusy | PackageError::Io { .. } => "io",
        }
    }
}

impl Hinted for PackageError {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::sentence(match self {
            PackageError::BadRequirement(_) => {
                "Pass distribution names with optional extras and version clauses, e.g. runtime.install(\"tabulate\", \"openpyxl==3.1.5\")".to_string()
            }
            PackageError::Denied { .. } | PackageError::RefusedBefore { .. } => {
                "Do without it (the image's packages are listed by the capabilities resource), or ask the user to allow it in the bridge's [packages] configuration".into()
            }
            PackageError::Unavailable(_) | PackageError::UnknownTarget(_) => {
                "The bridge's image does not support installs; use what it has".into()
            }
            PackageError::Resolver { .. } => {
                "The bridge needs uv on its host: install it (scripts/setup-debian.sh does), or set packages.uv to its path".into()
            }
            PackageError::Unresolvable(_) => {
                "Check the names and versions: a typo, a version that does not exist, a package with only a source distribution for this Python (none is ever built), or a conflict with the image's own packages, which cannot be replaced".into()
            }
            PackageError::NoWheel { .. } => {
                "Ask for a version that publishes a wheel for this Python, or another package: source distributions are never built".into()
            }
            PackageError::Timeout(_) => {
                "Try again later (the index may be slow), or ask for fewer packages".into()
            }
            PackageError::Download { .. } | PackageError::IndexUnreachable(_) => {
                "Try again later; if it persists, the user's host cannot reach its packages.index_url".into()
            }
            PackageError::HashMismatch { .. } | PackageError::BadWheel { .. } => {
                "Ask for another version; nothing of it was installed".into()
            }
            PackageError::TooLarge { .. } => {
                "Install less in this session, or ask the user to raise packages.max_size".into()
            }
            PackageError::FileConflict(_) | PackageError::VersionConflict { .. } => {
                "A session keeps what it installed; start a new session (reset) to install another version".into()
            }
            PackageError::CacheBusy => "Run it again in a moment".into(),
            PackageError::Io { .. } => {
                "Check that the bridge's state_dir is writable and has room".into()
            }
        }))
    }
}
