//! `sessions list|rm|prune`: the sessions keepers hold for the next bridge on this state dir
//! (`session_linger`), read and ended the way bridges do (`sandbox::parked`), and the sessions'
//! snapshots on disk (`sandbox::snapshots`), so a person sees what is still running and in
//! memory, and what is kept on disk, after every client has gone, and ends what should not wait
//! out its time.
//!
//! Session names are the model's choice and identities a token's, so what is printed for a
//! person goes through `bridge_core::text::visible`; `--json` is exact.

use std::process::ExitCode;

use bridge_core::config::{Config, Secs};
use bridge_core::text::visible;
use bridge_sandbox::parked::{self, Parked};
use bridge_sandbox::snapshots::{self, Listing, Store};

pub(super) fn list(config: &Config, json: bool) -> ExitCode {
    let sessions = parked::list(&config.state_dir);
    let store = snapshots::scan(&config.state_dir, config.snapshot_ttl.0);
    let stored: Vec<Listing> = store.listings.iter().map(|s| s.listing.clone()).collect();
    if json {
        let now = bridge_core::clock::now_secs();
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
        let snaps: Vec<_> = stored
            .iter()
            .map(|l| {
                serde_json::json!({
                    "identity": l.identity,
                    "session": l.session,
                    "size": l.size,
                    "written_at": l.written_at,
                    "expires": l.expires,
                    "why": l.why,
                    "names": l.info.names,
                    "modules": l.info.modules,
                    "lost": l.info.lost,
                    "more": l.info.more,
                    "cells": l.info.cells,
                    "set_aside": l.set_aside,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "parked": rows,
                "snapshots": snaps,
                "unreadable": store.unreadable,
                "temporary": store.temporary,
                "store_bytes": store.bytes(),
                "store_size": config.snapshot_store_size.0,
            })
        );
        return ExitCode::SUCCESS;
    }
    list_snapshots(config, &stored);
    list_other_files(config, &store);
    if sessions.is_empty() {
        println!(
            "no sessions parked in {} (a bridge parks its sessions as it exits, with session_linger = {})",
            config.state_dir.display(),
            config.session_linger
        );
        return ExitCode::SUCCESS;
    }
    let now = bridge_core::clock::now_secs();
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

/// The snapshots kept on disk, as a table (nothing when there are none).
fn list_snapshots(config: &Config, stored: &[Listing]) {
    if stored.is_empty() {
        println!(
            "no session snapshots in {} (written when a session is closed without a caller, with snapshot_max_size = {})",
            config.state_dir.display(),
            config.snapshot_max_size
        );
        return;
    }
    let now = bridge_core::clock::now_secs();
    let who = |l: &Listing| {
        l.identity
            .as_deref()
            .map_or_else(|| "-".to_string(), |i| visible(i).into_owned())
    };
    let width = stored
        .iter()
        .map(|l| who(l).chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    println!(
        "{:width$}  {:24}  {:>10}  {:>10}  {:>10}  {:12}  HOLDS",
        "IDENTITY", "SESSION", "SIZE", "WRITTEN", "ENDS IN", "WHY"
    );
    for l in stored {
        let session: String = visible(&l.session).chars().take(24).collect();
        let mut holds = format!("{} name(s)", l.info.names.len() + l.info.modules.len());
        if !l.info.lost.is_empty() {
            holds.push_str(&format!(", {} lost", l.info.lost.len()));
        }
        if l.info.more > 0 {
            holds.push_str(&format!(", {} more", l.info.more));
        }
        if let Some(why) = &l.set_aside {
            holds.push_str(&format!(
                "; SET ASIDE (not restored again): {}",
                visible(why)
            ));
        }
        println!(
            "{:width$}  {session:24}  {:>10}  {:>10}  {:>10}  {:12}  {holds}",
            who(l),
            bridge_core::config::Size(l.size).to_string(),
            ago(now.saturating_sub(l.written_at)),
            ago(l.expires.saturating_sub(now)),
            visible(&l.why),
        );
    }
    println!(
        "{} snapshot(s), {} bytes, in {}; `sessions rm NAME` removes one",
        stored.len(),
        stored.iter().map(|l| l.size).sum::<u64>(),
        snapshots::dir(&config.state_dir).display()
    );
}

/// The store's other files (unreadable, and being written), as lines (nothing when there are
/// none): counted toward `snapshot_store_size` as snapshots are, removed by `sessions rm FILE`
/// and `sessions prune`.
fn list_other_files(config: &Config, store: &Store) {
    let now = bridge_core::clock::now_secs();
    for (what, files) in [
        ("unreadable", &store.unreadable),
        ("being written", &store.temporary),
    ] {
        for u in files.iter() {
            println!(
                "{what} file {} ({}, written {} ago): {}",
                visible(&u.file),
                bridge_core::config::Size(u.bytes),
                ago(now.saturating_sub(u.modified)),
                u.why
            );
        }
    }
    if !store.unreadable.is_empty() || !store.temporary.is_empty() {
        println!(
            "the store holds {} bytes of snapshot_store_size = {}; `sessions rm FILE` removes an unreadable file, `sessions prune` all",
            store.bytes(),
            config.snapshot_store_size
        );
    }
}

/// Remove the snapshot of the session named `name` (`NAME`, or `IDENTITY/NAME` under `serve`);
/// whether there was one. Recorded in the audit log (`session_end`).
fn remove_snapshot(config: &Config, audit: &bridge_core::audit::Audit, name: &str) -> bool {
    let Some(l) = snapshots::list(&config.state_dir)
        .into_iter()
        .find(|l| l.key().to_string() == name)
    else {
        return false;
    };
    if !snapshots::remove(&config.state_dir, &l.key()) {
        return false;
    }
    audit.session_state(
        bridge_core::audit::StateEvent::SessionEnd,
        bridge_core::audit::SessionStateRecord {
            session: l.session.clone(),
            identity: l.identity.clone(),
            why: "sessions rm".into(),
            size: l.size,
            status: "ok".into(),
            ..Default::default()
        },
    );
    println!(
        "removed the snapshot of session {} ({} bytes)",
        visible(name),
        l.size
    );
    true
}

/// End each named parked session and remove its snapshot; a name that is neither is an error
/// (the others are still ended).
pub(super) fn rm(config: &Config, names: &[String]) -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    let audit = bridge_core::audit::Audit::open(config);
    for name in names {
        let removed = remove_snapshot(config, &audit, name) || remove_other_file(config, name);
        match parked::end(&config.state_dir, name) {
            Some(p) => println!(
                "ended parked session {} (container {})",
                visible(&p.key()),
                p.container.get(..12).unwrap_or(&p.container)
            ),
            None if removed => {}
            None => {
                status = super::term::fail(
                    &NotParked {
                        name: visible(name).into_owned(),
                        state_dir: config.state_dir.clone(),
                    },
                    1,
                );
            }
        }
    }
    audit.flush(std::time::Duration::from_secs(5));
    status
}

/// `sessions rm` named a session no keeper holds and no snapshot keeps.
#[derive(Debug, thiserror::Error)]
#[error("no session {name} is parked or kept as a snapshot in {}", state_dir.display())]
struct NotParked {
    name: String,
    state_dir: std::path::PathBuf,
}

impl bridge_core::error::Hinted for NotParked {
    fn hint(&self) -> Option<bridge_core::error::Hint> {
        Some(bridge_core::error::Hint::line(
            "`mcp-code-bridge sessions list` shows them; a session of `serve` is named IDENTITY/NAME",
        ))
    }
}

/// Remove the store's file `name` that is no snapshot (an unreadable one, as `sessions list`
/// names it); whether there was one.
fn remove_other_file(config: &Config, name: &str) -> bool {
    let store = snapshots::scan(&config.state_dir, config.snapshot_ttl.0);
    let Some(u) = store
        .unreadable
        .iter()
        .chain(&store.temporary)
        .find(|u| u.file == name)
    else {
        return false;
    };
    let removed = snapshots::remove_file(&config.state_dir, &u.file);
    if removed {
        println!(
            "removed the file {} of the snapshot store ({} bytes)",
            visible(&u.file),
            u.bytes
        );
    }
    removed
}

/// End every parked session and remove every snapshot, and every other file of the store
/// (unreadable ones, and files being written: a snapshot being written now is not kept).
pub(super) fn prune(config: &Config) -> ExitCode {
    let audit = bridge_core::audit::Audit::open(config);
    let store = snapshots::scan(&config.state_dir, config.snapshot_ttl.0);
    let removed = store
        .listings
        .iter()
        .filter(|s| remove_snapshot(config, &audit, &s.listing.key().to_string()))
        .count();
    audit.flush(std::time::Duration::from_secs(5));
    let others: Vec<&snapshots::Unreadable> =
        store.unreadable.iter().chain(&store.temporary).collect();
    let (files, bytes) = others
        .iter()
        .filter(|u| snapshots::remove_file(&config.state_dir, &u.file))
        .fold((0, 0), |(n, b), u| (n + 1, b + u.bytes));
    println!("removed {removed} session snapshot(s)");
    if files > 0 {
        println!(
            "removed {files} other file(s) of the snapshot store ({bytes} bytes: unreadable, or being written)"
        );
    }
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
