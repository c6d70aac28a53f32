//! The installer, [`Packages`]: one install from the requirements the code wrote to the files
//! linked into its session (checked, resolved, decided, fetched, unpacked, linked, taken back
//! whole on failure, one audit record), the hint for a module the image lacks, and
//! `packages.preinstall` for every new sandbox ([`Preinstall`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::decide::{Asker, Rules, Ruling};
use super::error::PackageError;
use super::resolve;
use super::session::{Installed, SessionState, remember_refusal, set_key};
use super::store::{self, Store};
use bridge_core::audit::{Audit, InstallRecord, ResolvedDist};
use bridge_core::config::policy::Fallback;
use bridge_core::config::{Config, PackagesConfig, Requirement};
use bridge_core::error::Hinted;
use bridge_core::identity::SessionKey;
use bridge_core::protocol::Interpreter;

/// The installer: one per bridge, shared by every session.
pub struct Packages {
    config: PackagesConfig,
    /// `[packages]`' allow and deny globs and its `ask_fallback`.
    rules: Rules,
    store: Store,
    audit: Audit,
    client: reqwest::Client,
    /// One install at a time per session directory.
    locks: Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>,
    /// `otel_content`: the requirements on the install's span as the code wrote them.
    otel_content: bool,
}

impl Packages {
    /// The installer of `config`'s `[packages]`, its cache under `<state_dir>/packages/cache`,
    /// recording every install in `audit`. Touches no file and reaches no network until an
    /// install.
    pub fn new(config: &Config, audit: Audit) -> Arc<Packages> {
        let p = &config.packages;
        Arc::new(Packages {
            config: p.clone(),
            rules: Rules::new(p, config.policy.ask_fallback),
            store: Store::new(config.state_dir.join("packages").join("cache")),
            audit,
            client: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(30))
                .user_agent(concat!("mcp-code-bridge/", env!("CARGO_PKG_VERSION")))
                .build()
                .unwrap_or_default(),
            locks: Mutex::new(HashMap::new()),
            otel_content: config.otel_content,
        })
    }

    /// The host's package cache.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The `[packages]` section it was made with.
    pub fn config(&self) -> &PackagesConfig {
        &self.config
    }

    /// What `[packages]` says of `name` (normalized): `deny`, `allow` or `ask`.
    pub fn rule_for(&self, name: &str) -> bridge_core::config::policy::Action {
        self.rules.rule_for(name)
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
    pub(crate) async fn install(
        &self,
        interpreter: &Interpreter,
        requirements: &[String],
        who: Asker<'_>,
    ) -> Result<Vec<Installed>, PackageError> {
        let t0 = Instant::now();
        let mut record = InstallRecord {
            session: who.key.name().to_string(),
            identity: who.key.owner().name().map(str::to_string),
            requested: requirements.to_vec(),
            decision: "none".into(),
            ..Default::default()
        };
        // A span of the call: what was asked for, how it ended. The code's text is on it only
        // as requirements that passed the grammar (bounded, a distribution's name and
        // versions), unless `otel_content`; the rest are counted.
        let span = bridge_core::trace::Guard::new(bridge_core::trace::internal(
            "packages.install",
            requested_attrs(requirements, self.otel_content),
        ));
        let result = {
            use bridge_core::trace::Within as _;
            self.install_inner(interpreter, requirements, &who, &mut record)
                .within(span.context().clone())
                .await
        };
        record.duration_ms = t0.elapsed().as_millis() as u64;
        match &result {
            Ok(installed) => {
                record.status = "ok".into();
                bridge_core::trace::set(
                    span.context(),
                    vec![bridge_core::trace::Attr::new(
                        "mcp_code_bridge.packages.installed",
                        installed.len() as i64,
                    )],
                );
                span.end(None);
            }
            Err(e) => {
                record.status = if e.is_refusal() { "denied" } else { "failed" }.into();
                record.error_type = Some(e.kind().into());
                span.end(Some(e.kind()));
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
        use bridge_core::config::packages::MAX_REQUIREMENTS;
        if requirements.is_empty() || requirements.len() > MAX_REQUIREMENTS {
            return Err(PackageError::BadRequirement(
                bridge_core::config::InvalidValue::RequirementCount {
                    count: requirements.len(),
                },
            ));
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
        if let Some((name, rule)) = reqs
            .iter()
            .find_map(|r| state.refused_names.get_key_value(&r.name))
        {
            record.decision = "deny".into();
            return Err(PackageError::RefusedBefore {
                what: bridge_core::policy::shown_name(name),
                rule: rule.clone(),
            });
        }
        if let Some(rule) = state.refused.get(&key) {
            record.decision = "deny".into();
            return Err(PackageError::RefusedBefore {
                what: reqs
                    .iter()
                    .map(|r| bridge_core::policy::shown_name(&r.name))
                    .collect::<Vec<_>>()
                    .join(", "),
                rule: rule.clone(),
            });
        }
        // What the code names is refused before anything is resolved when a deny rule says so.
        for r in &reqs {
            if self.rules.denies(&r.name) && !who.preinstall {
                let rule = format!(
                    "packages.deny (matches {})",
                    bridge_core::policy::shown_name(&r.name)
                );
                record.decision = "deny".into();
                record.rule = Some(rule.clone());
                remember_refusal(
                    &mut state,
                    &key,
                    [r.name.as_str()],
                    &rule,
                    dir,
                    self.store.root(),
                );
                return Err(PackageError::Denied {
                    what: bridge_core::policy::shown_name(&r.name),
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
            .map(|(n, _)| bridge_core::config::packages::normalize(n))
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
        // A distribution the user declined before, however it comes now (a dependency of
        // another name included), is not asked about again.
        if !who.preinstall
            && let Some((name, rule)) = new
                .iter()
                .find_map(|w| state.refused_names.get_key_value(&w.name))
        {
            record.decision = "deny".into();
            return Err(PackageError::RefusedBefore {
                what: bridge_core::policy::shown_name(name),
                rule: rule.clone(),
            });
        }
        let ruling = if who.preinstall {
            Ruling {
                decision: "preinstall".into(),
                rule: Some("packages.preinstall".into()),
                ask: None,
            }
        } else {
            let asked_before = state.asked;
            let decided = self
                .rules
                .decide(&new, &requested, who, &mut state.asked)
                .await;
            if state.asked != asked_before {
                let _ = state.write(dir, &self.store.root().join("tmp"));
            }
            match decided {
                Ok(r) => r,
                Err((r, e)) => {
                    record.decision = r.decision;
                    record.rule = r.rule.clone();
                    record.ask = r.ask;
                    // The names asked for, and those the user was asked about and declined.
                    let declined: Vec<&str> = if record.decision == "ask:denied" {
                        new.iter()
                            .filter(|w| {
                                self.rule_for(&w.name) != bridge_core::config::policy::Action::Allow
                            })
                            .map(|w| w.name.as_str())
                            .collect()
                    } else {
                        Vec::new()
                    };
                    remember_refusal(
                        &mut state,
                        &key,
                        requested.iter().copied().chain(declined),
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

        let budget = self.config.max_size.0.saturating_sub(state.charged());
        let mut done = Vec::new();
        let mut created = Vec::new();
        let outcome: Result<(), PackageError> = async {
            for mut w in new {
                let left = budget.saturating_sub(done.iter().map(Installed::charged).sum());
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
                let (tree, cost) = {
                    let store = self.store.clone();
                    let (name, sha) = (w.name.clone(), sha.clone());
                    tokio::task::spawn_blocking(move || store.tree(&name, &sha, left))
                        .await
                        .map_err(|e| PackageError::Unavailable(e.to_string()))??
                };
                if cost.charged() > left {
                    return Err(PackageError::TooLarge {
                        what: format!(
                            "{} {} unpacked ({} bytes in {} files and directories, each entry counted as {} bytes more)",
                            w.name,
                            w.version,
                            cost.bytes,
                            cost.entries,
                            store::ENTRY_COST
                        ),
                        size: cost.charged(),
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
                    size: cost.bytes,
                    entries: cost.entries,
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
        use bridge_core::config::policy::Action;
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
            || bridge_core::config::packages::normalize(module),
            |(_, d)| d.to_string(),
        );
        let how = match self.rule_for(&dist) {
            Action::Deny => return None,
            Action::Allow => "allowed by packages.allow",
            Action::Ask if can_ask => "the user is asked first",
            Action::Ask if self.rules.fallback() == Fallback::Allow => {
                "allowed by packages.ask_fallback"
            }
            Action::Ask => return None,
        };
        Some(format!(
            "{module} is not in the sandbox's image; `await runtime.install(\"{dist}\")` installs it into this session ({how}), then import it again."
        ))
    }
}

/// `packages.preinstall` for every new sandbox (`protocol::Provision`).
pub struct Preinstall(pub Arc<Packages>);

#[async_trait::async_trait]
impl bridge_core::protocol::Provision for Preinstall {
    async fn provision(&self, interpreter: &Interpreter) -> Vec<String> {
        let list = self.0.config.preinstall.0.clone();
        if list.is_empty() {
            return Vec::new();
        }
        let key = SessionKey::local("preinstall");
        let who = Asker {
            key: &key,
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

/// The install span's account of what the code asked for: the requirements that are valid
/// (`Requirement::parse`), at most 512 characters of them, and how many were not; with
/// `content` (`otel_content`), the code's text as it was, cut to 512 characters.
fn requested_attrs(requirements: &[String], content: bool) -> Vec<bridge_core::trace::Attr> {
    let cut = |s: String| -> String { s.chars().take(512).collect() };
    if content {
        return vec![bridge_core::trace::Attr::new(
            "mcp_code_bridge.packages.requested",
            cut(requirements.join(" ")),
        )];
    }
    let valid: Vec<String> = requirements
        .iter()
        .take(bridge_core::config::packages::MAX_REQUIREMENTS)
        .filter_map(|r| Requirement::parse(r).ok())
        .map(|r| r.text)
        .collect();
    let invalid = requirements.len() - valid.len();
    let mut attrs = vec![bridge_core::trace::Attr::new(
        "mcp_code_bridge.packages.requested",
        cut(valid.join(" ")),
    )];
    if invalid > 0 {
        attrs.push(bridge_core::trace::Attr::new(
            "mcp_code_bridge.packages.requested_invalid",
            invalid as i64,
        ));
    }
    attrs
}
