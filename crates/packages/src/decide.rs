//! Deciding an install: who asks ([`Asker`]), `[packages]`' rules (`Rules`), deny > allow > ask
//! over every distribution that would come, the question put in the bridge's words, and the
//! bound on how often one session asks.

use std::collections::HashSet;
use std::sync::Arc;

use globset::GlobSet;

use super::error::PackageError;
use super::resolve::Wheel;
use bridge_core::config::PackagesConfig;
use bridge_core::config::packages::NameGlobs;
use bridge_core::config::policy::{Action, Fallback};
use bridge_core::identity::SessionKey;
use bridge_core::policy::{Approval, ApprovalRequest, Approver};

/// Questions about installs one session may put to the user; past it an install that would
/// ask is refused unasked.
pub const MAX_QUESTIONS: u32 = 8;

/// Who asks for an install, for the audit and the question.
pub struct Asker<'a> {
    /// The session the install is for (its owner is the audit's identity).
    pub key: &'a SessionKey,
    /// The client to ask; `None` for `preinstall` (the user's own list: never asked).
    pub approver: Option<&'a Arc<dyn Approver>>,
    /// Whether the install is the user's own `preinstall`.
    pub preinstall: bool,
}

/// What `[packages]` says of a distribution: its `allow` and `deny` globs, compiled once, and
/// what `ask` becomes when the client cannot be asked.
pub(super) struct Rules {
    allow: GlobSet,
    deny: GlobSet,
    /// `packages.ask_fallback`, or `policy.ask_fallback` when that is unset.
    fallback: Fallback,
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

impl Rules {
    /// The rules of `config`; `policy_fallback` is `policy.ask_fallback`, what
    /// `packages.ask_fallback` follows when unset.
    pub(super) fn new(config: &PackagesConfig, policy_fallback: Fallback) -> Rules {
        Rules {
            allow: globset(&config.allow),
            deny: globset(&config.deny),
            fallback: config.ask_fallback.unwrap_or(policy_fallback),
        }
    }

    /// Whether a `packages.deny` glob matches `name` (normalized).
    pub(super) fn denies(&self, name: &str) -> bool {
        self.deny.is_match(name)
    }

    /// What `[packages]` says of `name` (normalized): `deny`, `allow` or `ask`.
    pub(super) fn rule_for(&self, name: &str) -> Action {
        if self.deny.is_match(name) {
            Action::Deny
        } else if self.allow.is_match(name) {
            Action::Allow
        } else {
            Action::Ask
        }
    }

    /// What `ask` becomes when the client cannot be asked.
    pub(super) fn fallback(&self) -> Fallback {
        self.fallback
    }
}

/// How the decision went, for the audit.
pub(super) struct Ruling {
    pub(super) decision: String,
    pub(super) rule: Option<String>,
    pub(super) ask: Option<String>,
}

impl Rules {
    /// deny > allow > ask over every distribution that would come. The refusal carries the
    /// ruling for the audit beside the error (once per install: its size is no cost).
    #[allow(clippy::result_large_err)]
    pub(super) async fn decide(
        &self,
        new: &[Wheel],
        requested: &HashSet<&str>,
        who: &Asker<'_>,
        asked: &mut u32,
    ) -> Result<Ruling, (Ruling, PackageError)> {
        if let Some(w) = new.iter().find(|w| self.denies(&w.name)) {
            let rule = format!(
                "packages.deny (matches {})",
                bridge_core::policy::shown_name(&w.name)
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
                        bridge_core::policy::shown_name(&w.name)
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
        if *asked >= MAX_QUESTIONS {
            let rule = format!(
                "the bridge: this session has asked the user about installs {MAX_QUESTIONS} times, the most one session may"
            );
            return Err((
                Ruling {
                    decision: "deny".into(),
                    rule: Some(rule.clone()),
                    ask: None,
                },
                PackageError::Denied {
                    what: listing_names(&unallowed),
                    rule,
                },
            ));
        }
        *asked += 1;
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
}

/// The question: every distribution that would come, each a line of its own with its version
/// and size, in a counted block the code cannot end early (names and versions are the
/// index's and the code's words, so each is quoted and escaped).
fn question(new: &[Wheel], requested: &HashSet<&str>) -> String {
    let total: u64 = new.iter().filter_map(|w| w.size).sum();
    let mut s = format!(
        "Code running in run_python wants to install Python packages into its session (the host downloads them; the sandbox stays offline).\n{} distribution(s), {} to download:\n",
        new.len(),
        human(total)
    );
    for w in new.iter().take(64) {
        s.push_str(&format!(
            "  {} {} ({}){}\n",
            bridge_core::policy::shown_name(&w.name),
            bridge_core::policy::shown_name(&w.version),
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
        .map(|w| bridge_core::policy::shown_name(&w.name))
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
