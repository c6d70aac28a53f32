//! `sessions list|rm|prune`: the sessions keepers hold for the next bridge on this state dir
//! (`session_linger`), read and ended the way bridges do (`sandbox::parked`), so a person sees
//! what is still running and in memory after every client has gone, and ends what should not
//! wait out its time.
//!
//! Session names are the model's choice and identities a token's, so what is printed for a
//! person goes through `crate::text::visible`; `--json` is exact.

use std::process::ExitCode;

use crate::config::{Config, Secs};
use crate::sandbox::parked::{self, Parked};
use crate::text::visible;

pub(super) fn list(config: &Config, json: bool) -> ExitCode {
    let sessions = parked::list(&config.state_dir);
    if json {
        let now = crate::clock::now_secs();
        let rows: Vec<_> = sessions
            .iter()
            .map(|p| {
                serde_json::json!({
                    "identity": p.identity,
                    "session": p.session,
                    "container": p.container,
                    "parked_at": p.parked_at,
                    "expires": p.expires,
                    "expires_in_secs": p.expires.saturating_sub(now),
                    "last_call_ms": p.used_at_ms,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "parked": rows }));
        return ExitCode::SUCCESS;
    }
    if sessions.is_empty() {
        println!(
            "no sessions parked in {} (a bridge parks its sessions as it exits, with session_linger = {})",
            config.state_dir.display(),
            config.session_linger
        );
        return ExitCode::SUCCESS;
    }
    let now = crate::clock::now_secs();
    let shown = |p: &Parked| -> String {
        p.identity
            .as_deref()
            .map_or_else(|| "-".to_string(), |i| visible(i).into_owned())
    };
    let width = sessions
        .iter()
        .map(|p| shown(p).chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    println!(
        "{:width$}  {:24}  {:>10}  {:>10}  CONTAINER",
        "IDENTITY", "SESSION", "PARKED", "ENDS IN"
    );
    for p in &sessions {
        let session: String = visible(&p.session).chars().take(24).collect();
        println!(
            "{:width$}  {session:24}  {:>10}  {:>10}  {}",
            shown(p),
            ago(now.saturating_sub(p.parked_at)),
            ago(p.expires.saturating_sub(now)),
            p.container.get(..12).unwrap_or(&p.container)
        );
    }
    println!(
        "{} session(s) parked in {}; `sessions rm NAME` ends one",
        sessions.len(),
        config.state_dir.display()
    );
    ExitCode::SUCCESS
}

/// End each named parked session; an unknown name is an error (the others are still ended).
pub(super) fn rm(config: &Config, names: &[String]) -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for name in names {
        match parked::end(&config.state_dir, name) {
            Some(p) => println!(
                "ended parked session {} (container {})",
                visible(&p.key()),
                p.container.get(..12).unwrap_or(&p.container)
            ),
            None => {
                status = super::fail(
                    &NotParked {
                        name: visible(name).into_owned(),
                        state_dir: config.state_dir.clone(),
                    },
                    1,
                );
            }
        }
    }
    status
}

/// `sessions rm` named a session no keeper holds.
#[derive(Debug, thiserror::Error)]
#[error("no session {name} is parked in {}", state_dir.display())]
struct NotParked {
    name: String,
    state_dir: std::path::PathBuf,
}

impl crate::error::Hinted for NotParked {
    fn hint(&self) -> Option<crate::error::Hint> {
        Some(crate::error::Hint::line(
            "`mcp-code-bridge sessions list` shows them; a session of `serve` is named IDENTITY/NAME",
        ))
    }
}

/// End every parked session.
pub(super) fn prune(config: &Config) -> ExitCode {
    let sessions = parked::list(&config.state_dir);
    let ended = sessions
        .iter()
        .filter(|p| parked::end(&config.state_dir, &p.key()).is_some())
        .count();
    println!(
        "ended {ended} parked session(s){}",
        if ended < sessions.len() {
            format!(
                "; {} had ended or been resumed meanwhile",
                sessions.len() - ended
            )
        } else {
            String::new()
        }
    );
    ExitCode::SUCCESS
}

/// Seconds as the config writes a duration.
fn ago(secs: u64) -> String {
    Secs(std::time::Duration::from_secs(secs)).to_string()
}
