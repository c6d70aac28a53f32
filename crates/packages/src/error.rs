//! Why an install failed ([`PackageError`]): the message says what, the hint what to do, and
//! the sandbox's version of the message names no host path.

use std::path::PathBuf;

use bridge_core::error::{Hint, Hinted};

/// Why an install failed; the message says what, the hint what to do.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A requirement is not one the bridge takes (names, extras and version clauses only), or
    /// there are none or too many: refused before anything is resolved.
    #[error("{0}")]
    BadRequirement(bridge_core::config::InvalidValue),
    /// A `packages.deny` rule, the user when asked, the `ask_fallback`, or the bound on
    /// questions per session refused the install.
    #[error("install refused: {what}, by {rule}")]
    Denied {
        /// The distributions refused, as shown to people (at most eight named).
        what: String,
        /// What refused them, and where it is set (`packages.deny (matches x)`).
        rule: String,
    },
    /// The same requirements, or a distribution among them, were refused earlier in this
    /// session: refused again without asking.
    #[error(
        "install refused: {what} was refused before in this session (by {rule}); it is not asked again"
    )]
    RefusedBefore {
        /// The distribution or requirements refused before.
        what: String,
        /// What refused them then.
        rule: String,
    },
    /// The sandbox has no package directory or its runtime did not describe its interpreter,
    /// or a blocking task of the install could not be run (its panic or cancellation, as text).
    #[error("no install is possible in this sandbox: {0}")]
    Unavailable(String),
    /// The interpreter's Python version, machine or libc is not one wheels can be chosen for;
    /// says which.
    #[error("the packages cannot be chosen for this interpreter: {0}")]
    UnknownTarget(String),
    /// The resolver, uv, could not be started or waited for.
    #[error("the resolver ({uv}) could not be run: {reason}", uv = uv.display())]
    Resolver {
        /// The uv the bridge tried to run (a host path: [`PackageError::for_sandbox`] hides it).
        uv: PathBuf,
        /// The operating system's error.
        reason: String,
    },
    /// uv found no set of wheels that satisfies the requirements with the image's packages, or
    /// its answer could not be read: the end of what it said (host paths removed), or what was
    /// wrong with its answer.
    #[error("the requirements could not be resolved:\n{0}")]
    Unresolvable(String),
    /// uv could not reach the package index: the end of what it said.
    #[error("the package index could not be reached:\n{0}")]
    IndexUnreachable(String),
    /// A distribution of the resolution has no wheel for this interpreter (source
    /// distributions are never built).
    #[error("{name} {version} has no wheel for this interpreter, only a source distribution")]
    NoWheel {
        /// The distribution's normalized name.
        name: String,
        /// The version the resolution chose.
        version: String,
    },
    /// The install went past `packages.timeout`: its seconds (0 from a step that does not know
    /// them; the install puts them in before it returns).
    #[error("the install took longer than packages.timeout{}", if *.0 > 0 { format!(" ({} s)", .0) } else { String::new() })]
    Timeout(u64),
    /// A wheel's download failed (connection, HTTP status), or fewer or more bytes came than
    /// the index said.
    #[error("the wheel of {name} could not be downloaded: {reason}")]
    Download {
        /// The distribution whose wheel it is.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// A wheel's sha256, downloaded or in the cache, is not the index's; the file is not used.
    #[error(
        "the wheel of {name} does not match the index's sha256 (expected {expected}, got {got}); it was not installed"
    )]
    HashMismatch {
        /// The distribution whose wheel it is.
        name: String,
        /// The sha256 the index (or the saved plan) gave, in hex.
        expected: String,
        /// The sha256 of the bytes that came, in hex.
        got: String,
    },
    /// A wheel, downloaded or unpacked, would take the session past `packages.max_size`.
    #[error(
        "{what} is {size} bytes, above the {max} bytes this install may still use (packages.max_size)"
    )]
    TooLarge {
        /// What is too large (`the wheel of x 1.0`, or the tree unpacked, with its counts).
        what: String,
        /// Its size in bytes (an unpacked tree's entries charged too).
        size: u64,
        /// The bytes the session had left.
        max: u64,
    },
    /// A wheel is not one the bridge unpacks: not a zip, an entry that cannot be read, a
    /// symbolic link, a name that escapes its directory or comes twice, too many entries.
    #[error("the wheel of {name} is refused: {reason}")]
    BadWheel {
        /// The distribution whose wheel it is.
        name: String,
        /// Which rule it broke.
        reason: String,
    },
    /// A file of the wheel is already in the session's directory, put there by another
    /// distribution: the path, relative to that directory.
    #[error("{0} is already installed in this session by another distribution")]
    FileConflict(String),
    /// The session has another version of a distribution the resolution needs.
    #[error("{name} {have} is installed in this session; {want} was asked for")]
    VersionConflict {
        /// The distribution's normalized name.
        name: String,
        /// The version the session has.
        have: String,
        /// The version the resolution chose.
        want: String,
    },
    /// `packages prune` found the cache's lock held by an install: nothing was removed.
    #[error("a bridge is installing packages now, so the cache is not pruned")]
    CacheBusy,
    /// A file or directory of the cache or of the session could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`could not write`).
        what: &'static str,
        /// The file or directory (a host path: [`PackageError::for_sandbox`] hides it).
        path: PathBuf,
        /// The operating system's error.
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
    /// What to do next, for the model.
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
