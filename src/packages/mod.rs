//! Packages on demand: `runtime.install(...)` in the sandbox, done by the host with the
//! sandbox's network still off.
//!
//! An install is: the requirements checked ([`crate::config::Requirement`]: names, extras and
//! version clauses only); resolved for the interpreter the sandbox said it is at boot
//! (`resolve`, uv on the host, wheels only, the image's distributions as constraints), or taken
//! from a resolution already made (`store` plans: no index reached); decided under
//! `[packages]` (deny > allow > ask, over every distribution that would come, dependencies
//! included; asking names each with its version and size); each wheel downloaded once into the
//! host's cache and checked against the index's sha256, unpacked once with bounds; then
//! hard-linked into the session's package directory, which the sandbox sees read-only at
//! `protocol::PACKAGES_DIR`. A failure anywhere takes back what the install linked: nothing is
//! left half-installed. Every install is one audit record.
//!
//! **Knows** `config`, `policy` (the `Approver` it asks through and the question's form),
//! `audit`, `protocol` and the ground-floor helpers; nothing of `sandbox/`, `upstream/` or
//! `server`.

pub mod resolve;
pub mod rpc;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use globset::GlobSet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::audit::{Audit, InstallRecord, ResolvedDist};
use crate::config::packages::NameGlobs;
use crate::config::policy::Fallback;
use crate::config::{Config, PackagesConfig, Requirement};
use crate::error::{Hint, Hinted};
use crate::policy::{Approval, ApprovalRequest, Approver};
use crate::protocol::{Interpreter, Target};
use resolve::Wheel;
use store::Store;

/// The file in a session's package directory where the bridge keeps what it installed there
/// (the sandbox can read it, not write it).
const STATE_FILE: &str = ".mcp-code-bridge-installs.json";
/// Requirement sets refused in one session that are remembered (refused again unasked).
const MAX_REMEMBERED_REFUSALS: usize = 256;

/// Why an install failed; the message says what, the hint what to do.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{0}")]
    BadRequirement(String),
    #[error("install refused: {what}, by {rule}")]
    Denied { what: String, rule: String },
    #[error(
        "install refused: the same install was refused before in this session (by {rule}); it is not asked again"
    )]
    RefusedBefore { rule: String },
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

/// One installed distribution, as `runtime.install` returns it and the session's state keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub sha256: String,
    /// Unpacked bytes.
    pub size: u64,
    /// Taken from the host's cache (no download).
    pub cached: bool,
    /// Named by an install (not only a dependency).
    pub requested: bool,
}

/// What the bridge keeps of one session's installs, in its package directory.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SessionState {
    installed: Vec<Installed>,
    /// Keys of requirement sets refused in this session, with the rule that refused them.
    refused: BTreeMap<String, String>,
}

impl SessionState {
    fn read(dir: &Path) -> SessionState {
        use std::io::Read;
        let mut text = String::new();
        let ok = crate::statefile::open_read(&dir.join(STATE_FILE))
            .ok()
            .and_then(|f| f.take(16 << 20).read_to_string(&mut text).ok());
        ok.and_then(|_| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    fn write(&self, dir: &Path, tmp: &Path) -> Result<(), PackageError> {
        let path = dir.join(STATE_FILE);
        let text = serde_json::to_vec(self).expect("the state serializes");
        store::write_atomic(tmp, &path, &text).map_err(|source| PackageError::Io {
            what: "could not write",
            path: path.clone(),
            source,
        })?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444));
        Ok(())
    }

    fn bytes(&self) -> u64 {
        self.installed.iter().map(|i| i.size).sum()
    }
}

/// Who asks for an install, for the audit and the question.
pub struct Asker<'a> {
    pub session: &'a str,
    pub identity: Option<&'a str>,
    /// The client to ask; `None` for `preinstall` (the user's own list: never asked).
    pub approver: Option<&'a Arc<dyn Approver>>,
    /// Whether the install is the user's own `preinstall`.
    pub preinstall: bool,
}

/// How the decision went, for the audit.
struct Ruling {
    decision: String,
    rule: Option<String>,
    ask: Option<String>,
}

/// The installer: one per bridge, shared by every session.
pub struct Packages {
    config: PackagesConfig,
    /// `policy.ask_fallback`, what `packages.ask_fallback` follows when unset.
    policy_fallback: Fallback,
    store: Store,
    allow: GlobSet,
    deny: GlobSet,
    audit: Audit,
    client: reqwest::Client,
    /// One install at a time per session directory.
    locks: Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>,
}

fn globset(list: &NameGlobs) -> GlobSet {
    let mut b = globset::GlobSetBuilder::new();
    for p in &list.0 {
        if let Ok(g) = NameGlobs::compile(p) {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

impl Packages {
    pub fn new(config: &Config, audit: Audit) -> Arc<Packages> {
        let p = &config.packages;
        Arc::new(Packages {
            config: p.clone(),
            policy_fallback: config.policy.ask_fallback,
            store: Store::new(config.state_dir.join("packages").join("cache")),
            allow: globset(&p.allow),
            deny: globset(&p.deny),
            audit,
            client: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(30))
                .user_agent(concat!("mcp-code-bridge/", env!("CARGO_PKG_VERSION")))
                .build()
                .unwrap_or_default(),
            locks: Mutex::new(HashMap::new()),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &PackagesConfig {
        &self.config
    }

    /// What `[packages]` says of `name` (normalized): `deny`, `allow` or `ask`.
    pub fn rule_for(&self, name: &str) -> crate::config::policy::Action {
        use crate::config::policy::Action;
        if self.deny.is_match(name) {
            Action::Deny
        } else if self.allow.is_match(name) {
            Action::Allow
        } else {
            Action::Ask
        }
    }

    fn fallback(&self) -> Fallback {
        self.config.ask_fallback.unwrap_or(self.policy_fallback)
    }

    fn session_lock(&self, dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap();
        locks.retain(|_, w| w.strong_count() > 0);
        if let Some(l) = locks.get(dir).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(dir.to_path_buf(), Arc::downgrade(&l));
        l
    }

    /// What the session of `interpreter` installed.
    pub fn installed(&self, interpreter: &Interpreter) -> Vec<Installed> {
        interpreter
            .packages
            .as_deref()
            .map(|d| SessionState::read(d).installed)
            .unwrap_or_default()
    }

    /// Install `requirements` into the session of `interpreter`, within `packages.timeout`.
    /// Audited however it ends.
    pub async fn install(
        &self,
        interpreter: &Interpreter,
        requirements: &[String],
        who: Asker<'_>,
    ) -> Result<Vec<Installed>, PackageError> {
        let t0 = Instant::now();
        let mut record = InstallRecord {
            session: who.session.to_string(),
            identity: who.identity.map(str::to_string),
            requested: requirements.to_vec(),
            decision: "none".into(),
            ..Default::default()
        };
        let result = self
            .install_inner(interpreter, requirements, &who, &mut record)
            .await;
        record.duration_ms = t0.elapsed().as_millis() as u64;
        match &result {
            Ok(_) => record.status = "ok".into(),
            Err(e) => {
                record.status = if e.is_refusal() { "denied" } else { "failed" }.into();
                record.error_type = Some(e.kind().into());
            }
        }
        self.audit.install(record);
        result
    }

    async fn install_inner(
        &self,
        interpreter: &Interpreter,
        requirements: &[String],
        who: &Asker<'_>,
        record: &mut InstallRecord,
    ) -> Result<Vec<Installed>, PackageError> {
        use crate::config::packages::MAX_REQUIREMENTS;
        if requirements.is_empty() || requirements.len() > MAX_REQUIREMENTS {
            return Err(PackageError::BadRequirement(format!(
                "{} requirements; an install names 1 to {MAX_REQUIREMENTS}",
                requirements.len()
            )));
        }
        let reqs = requirements
            .iter()
            .map(|r| Requirement::parse(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(PackageError::BadRequirement)?;
        let (Some(dir), Some(target)) = (&interpreter.packages, &interpreter.target) else {
            return Err(PackageError::Unavailable(
                "the sandbox has no package directory, or its runtime did not describe its interpreter".into(),
            ));
        };
        let deadline = tokio::time::Instant::now() + self.config.timeout.0;
        let lock = self.session_lock(dir);
        let _one = lock.lock().await;
        let mut state = SessionState::read(dir);
        let key = set_key(&reqs, target, &self.config);
        if let Some(rule) = state.refused.get(&key) {
            record.decision = "deny".into();
            return Err(PackageError::RefusedBefore { rule: rule.clone() });
        }
        // What the code names is refused before anything is resolved when a deny rule says so.
        for r in &reqs {
            if self.deny.is_match(&r.name) && !who.preinstall {
                let rule = format!(
                    "packages.deny (matches {})",
                    crate::policy::shown_name(&r.name)
                );
                record.decision = "deny".into();
                record.rule = Some(rule.clone());
                remember_refusal(&mut state, &key, &rule, dir, self.store.root());
                return Err(PackageError::Denied {
                    what: crate::policy::shown_name(&r.name),
                    rule,
                });
            }
        }

        let cache_lock = {
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.open_shared())
                .await
                .map_err(|e| PackageError::Unavailable(e.to_string()))??
        };
        let (mut wheels, from_plan) = match self.store.plan(&key) {
            Some(w) => (w, true),
            None => {
                let work = self.store.work_dir()?;
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                let w = resolve::resolve(
                    &self.config,
                    target,
                    &reqs,
                    work.path(),
                    &self.store.uv_cache(),
                    remaining,
                )
                .await
                .map_err(|e| match e {
                    PackageError::Timeout(_) => {
                        PackageError::Timeout(self.config.timeout.0.as_secs())
                    }
                    e => e,
                })?;
                (w, false)
            }
        };
        let resolved_all = wheels.clone();
        // The image has these already (the resolution pinned them to its versions), and the
        // session may have some: only the rest is installed.
        let image: std::collections::HashSet<String> = target
            .dists
            .iter()
            .map(|(n, _)| crate::config::packages::normalize(n))
            .collect();
        wheels.retain(|w| !image.contains(&w.name));
        let mut new = Vec::new();
        for w in wheels {
            match state.installed.iter().find(|i| i.name == w.name) {
                Some(i) if i.version == w.version => {}
                Some(i) => {
                    return Err(PackageError::VersionConflict {
                        name: w.name.clone(),
                        have: i.version.clone(),
                        want: w.version.clone(),
                    });
                }
                None => new.push(w),
            }
        }
        record.resolved = new
            .iter()
            .map(|w| ResolvedDist {
                name: w.name.clone(),
                version: w.version.clone(),
                sha256: w.sha256.clone().unwrap_or_default(),
            })
            .collect();
        if new.is_empty() {
            record.decision = "allow".into();
            record.rule = Some("already installed".into());
            return Ok(Vec::new());
        }

        let requested: std::collections::HashSet<&str> =
            reqs.iter().map(|r| r.name.as_str()).collect();
        let ruling = if who.preinstall {
            Ruling {
                decision: "preinstall".into(),
                rule: Some("packages.preinstall".into()),
                ask: None,
            }
        } else {
            match self.decide(&new, &requested, who).await {
                Ok(r) => r,
                Err((r, e)) => {
                    record.decision = r.decision;
                    record.rule = r.rule.clone();
                    record.ask = r.ask;
                    remember_refusal(
                        &mut state,
                        &key,
                        r.rule.as_deref().unwrap_or("the user"),
                        dir,
                        self.store.root(),
                    );
                    return Err(e);
                }
            }
        };
        record.decision = ruling.decision;
        record.rule = ruling.rule;
        record.ask = ruling.ask;

        let budget = self.config.max_size.0.saturating_sub(state.bytes());
        let mut done = Vec::new();
        let mut created = Vec::new();
        let outcome: Result<(), PackageError> = async {
            for mut w in new {
                let left = budget.saturating_sub(done.iter().map(|i: &Installed| i.size).sum());
                let cached = tokio::time::timeout_at(
                    deadline,
                    self.store.fetch(&self.client, &mut w, left, deadline),
                )
                .await
                .map_err(|_| PackageError::Timeout(self.config.timeout.0.as_secs()))?
                .map_err(|e| match e {
                    PackageError::Timeout(_) => {
                        PackageError::Timeout(self.config.timeout.0.as_secs())
                    }
                    e => e,
                })?;
                let sha = w.sha256.clone().unwrap_or_default();
                let (tree, size) = {
                    let store = self.store.clone();
                    let (name, sha) = (w.name.clone(), sha.clone());
                    tokio::task::spawn_blocking(move || store.tree(&name, &sha, left))
                        .await
                        .map_err(|e| PackageError::Unavailable(e.to_string()))??
                };
                if size > left {
                    return Err(PackageError::TooLarge {
                        what: format!("{} {} unpacked", w.name, w.version),
                        size,
                        max: left,
                    });
                }
                let dest = dir.clone();
                let mut made = Vec::new();
                let linked = tokio::task::spawn_blocking(move || {
                    let r = store::link_tree(&tree, &dest, &mut made);
                    (r, made)
                })
                .await
                .map_err(|e| PackageError::Unavailable(e.to_string()))?;
                created.extend(linked.1);
                linked.0?;
                done.push(Installed {
                    requested: requested.contains(w.name.as_str()),
                    name: w.name,
                    version: w.version,
                    sha256: sha,
                    size,
                    cached: cached || from_plan,
                });
            }
            Ok(())
        }
        .await;
        if let Err(e) = outcome {
            let c = created.clone();
            let _ = tokio::task::spawn_blocking(move || store::unlink_created(&c)).await;
            return Err(e);
        }
        if !from_plan {
            // With the digests the downloads computed (a find_links file has none before).
            let mut plan = resolved_all;
            for p in &mut plan {
                if let Some(d) = done.iter().find(|d| d.name == p.name) {
                    p.sha256 = Some(d.sha256.clone());
                }
            }
            if plan.iter().all(|w| w.sha256.is_some()) {
                self.store.save_plan(&key, &plan);
            }
        }
        state.installed.extend(done.iter().cloned());
        if let Err(e) = state.write(dir, self.store.root().join("tmp").as_path()) {
            let c = created.clone();
            let _ = tokio::task::spawn_blocking(move || store::unlink_created(&c)).await;
            return Err(e);
        }
        drop(cache_lock);
        self.prune_quietly();
        Ok(done)
    }

    /// deny > allow > ask over every distribution that would come. The refusal carries the
    /// ruling for the audit beside the error (once per install: its size is no cost).
    #[allow(clippy::result_large_err)]
    async fn decide(
        &self,
        new: &[Wheel],
        requested: &std::collections::HashSet<&str>,
        who: &Asker<'_>,
    ) -> Result<Ruling, (Ruling, PackageError)> {
        use crate::config::policy::Action;
        if let Some(w) = new.iter().find(|w| self.deny.is_match(&w.name)) {
            let rule = format!(
                "packages.deny (matches {})",
                crate::policy::shown_name(&w.name)
            );
            return Err((
                Ruling {
                    decision: "deny".into(),
                    rule: Some(rule.clone()),
                    ask: None,
                },
                PackageError::Denied {
                    what: format!(
                        "{} (a dependency of what was asked)",
                        crate::policy::shown_name(&w.name)
                    ),
                    rule,
                },
            ));
        }
        let unallowed: Vec<&Wheel> = new
            .iter()
            .filter(|w| self.rule_for(&w.name) != Action::Allow)
            .collect();
        if unallowed.is_empty() {
            return Ok(Ruling {
                decision: "allow".into(),
                rule: Some("packages.allow".into()),
                ask: None,
            });
        }
        let rule = "no packages.allow rule matching".to_string();
        let fallback = |why: &str| {
            let r = Ruling {
                decision: "ask:unavailable".into(),
                rule: Some(format!(
                    "{rule}; packages.ask_fallback = {}",
                    self.fallback().action()
                )),
                ask: Some(why.to_string()),
            };
            match self.fallback() {
                Fallback::Allow => Ok(r),
                Fallback::Deny => Err((
                    r,
                    PackageError::Denied {
                        what: listing_names(&unallowed),
                        rule: "packages.ask_fallback = deny (the client cannot be asked)".into(),
                    },
                )),
            }
        };
        let Some(approver) = who.approver.filter(|a| a.can_ask()) else {
            return fallback("fallback");
        };
        let request = ApprovalRequest::other(
            "Allow this install?",
            question(new, requested),
            rule.clone(),
            "the bridge's [packages] configuration".into(),
        );
        let path = approver.path();
        match approver.ask(&request).await {
            Approval::Once | Approval::Session => Ok(Ruling {
                decision: "ask:allowed".into(),
                rule: Some(rule),
                ask: Some(path.into()),
            }),
            Approval::Denied => Err((
                Ruling {
                    decision: "ask:denied".into(),
                    rule: Some("the user, when asked".into()),
                    ask: Some(path.into()),
                },
                PackageError::Denied {
                    what: listing_names(&unallowed),
                    rule: "the user, when asked".into(),
                },
            )),
            Approval::Unavailable(why) => {
                tracing::warn!("the client could not be asked about an install: {why}");
                fallback("fallback")
            }
        }
    }

    /// Prune the cache to `cache_max_size` when it is over, unless someone is installing.
    fn prune_quietly(&self) {
        let store = self.store.clone();
        let max = self.config.cache_max_size.0;
        tokio::task::spawn_blocking(move || {
            let total: u64 = store.list().iter().map(|c| c.size).sum();
            if total > max {
                match store.prune(max) {
                    Ok(Some((n, freed))) => tracing::info!(
                        wheels = n,
                        freed,
                        "package cache pruned to packages.cache_max_size"
                    ),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("could not prune the package cache: {}", e.message()),
                }
            }
        });
    }
}

/// Import names whose distribution is named otherwise, for the hint of a missing module.
const IMPORT_NAMES: &[(&str, &str)] = &[
    ("sklearn", "scikit-learn"),
    ("skimage", "scikit-image"),
    ("cv2", "opencv-python-headless"),
    ("PIL", "pillow"),
    ("yaml", "pyyaml"),
    ("bs4", "beautifulsoup4"),
    ("dateutil", "python-dateutil"),
    ("docx", "python-docx"),
    ("pptx", "python-pptx"),
    ("Bio", "biopython"),
    ("Crypto", "pycryptodome"),
    ("jwt", "pyjwt"),
    ("dotenv", "python-dotenv"),
];

impl Packages {
    /// What the model is told when its code failed with `ModuleNotFoundError: No module named
    /// 'x'`: the call that installs it, when `[packages]` would allow it or ask the user (and the
    /// user can be asked, or the fallback allows); nothing when it would be refused.
    pub fn missing_module_hint(&self, message: &str, can_ask: bool) -> Option<String> {
        use crate::config::policy::Action;
        let module = message
            .strip_prefix("No module named '")?
            .split('\'')
            .next()?
            .split('.')
            .next()?;
        if module.is_empty()
            || module.len() > 64
            || !module
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            || module == "mcp"
        {
            return None;
        }
        let dist = IMPORT_NAMES.iter().find(|(m, _)| *m == module).map_or_else(
            || crate::config::packages::normalize(module),
            |(_, d)| d.to_string(),
        );
        let how = match self.rule_for(&dist) {
            Action::Deny => return None,
            Action::Allow => "allowed by packages.allow",
            Action::Ask if can_ask => "the user is asked first",
            Action::Ask if self.fallback() == Fallback::Allow => "allowed by packages.ask_fallback",
            Action::Ask => return None,
        };
        Some(format!(
            "{module} is not in the sandbox's image; `await runtime.install(\"{dist}\")` installs it into this session ({how}), then import it again."
        ))
    }
}

/// The question: every distribution that would come, each a line of its own with its version
/// and size, in a counted block the code cannot end early (names and versions are the
/// index's and the code's words, so each is quoted and escaped).
fn question(new: &[Wheel], requested: &std::collections::HashSet<&str>) -> String {
    let total: u64 = new.iter().filter_map(|w| w.size).sum();
    let mut s = format!(
        "Code running in run_python wants to install Python packages into its session (the host downloads them; the sandbox stays offline).\n{} distribution(s), {} to download:\n",
        new.len(),
        human(total)
    );
    for w in new.iter().take(64) {
        s.push_str(&format!(
            "  {} {} ({}){}\n",
            crate::policy::shown_name(&w.name),
            crate::policy::shown_name(&w.version),
            w.size.map_or("size unknown".into(), human),
            if requested.contains(w.name.as_str()) {
                ", asked for"
            } else {
                ", a dependency"
            }
        ));
    }
    if new.len() > 64 {
        s.push_str(&format!("  ... and {} more\n", new.len() - 64));
    }
    s.push_str("(end of packages)");
    s
}

fn listing_names(ws: &[&Wheel]) -> String {
    let names: Vec<String> = ws
        .iter()
        .take(8)
        .map(|w| crate::policy::shown_name(&w.name))
        .collect();
    let more = if ws.len() > 8 {
        format!(" and {} more", ws.len() - 8)
    } else {
        String::new()
    };
    format!("{}{more}", names.join(", "))
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// The key of a requirement set for one target and one source of packages: the same install
/// in another session of the same image finds the resolution made before.
fn set_key(reqs: &[Requirement], target: &Target, config: &PackagesConfig) -> String {
    let mut texts: Vec<&str> = reqs.iter().map(|r| r.text.as_str()).collect();
    texts.sort_unstable();
    let mut h = Sha256::new();
    for part in [
        serde_json::to_string(&texts).unwrap_or_default(),
        serde_json::to_string(target).unwrap_or_default(),
        config.index_url.clone(),
        format!("{:?}{}", config.find_links, config.offline),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

fn remember_refusal(state: &mut SessionState, key: &str, rule: &str, dir: &Path, root: &Path) {
    if state.refused.len() >= MAX_REMEMBERED_REFUSALS {
        return;
    }
    state.refused.insert(key.to_string(), rule.to_string());
    let _ = state.write(dir, &root.join("tmp"));
}

/// `packages.preinstall` for every new sandbox (`protocol::Provision`).
pub struct Preinstall(pub Arc<Packages>);

#[async_trait::async_trait]
impl crate::protocol::Provision for Preinstall {
    async fn provision(&self, interpreter: &Interpreter) -> Vec<String> {
        let list = self.0.config.preinstall.0.clone();
        if list.is_empty() {
            return Vec::new();
        }
        let who = Asker {
            session: "preinstall",
            identity: None,
            approver: None,
            preinstall: true,
        };
        match self.0.install(interpreter, &list, who).await {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!(
                "packages.preinstall failed, so this session does not have them: {}",
                e.message()
            )],
        }
    }
}
