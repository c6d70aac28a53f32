//! `skills list|show|rm`: the functions the model saved (`runtime.save_skill`) for later
//! sessions, read from and removed in the same store the bridge uses (`bridge_skills`), so a
//! person can see what every new session will have defined and take out what should not be.
//!
//! Names, descriptions and sources are the code's choice, so what is printed for a person goes
//! through `bridge_core::text::visible` (one-line fields) and `visible_lines` (a source, a
//! description shown whole): a character a terminal would act on (an escape sequence that
//! moves up and erases a line, a carriage return, a bidi override) is printed as an escape,
//! so the review `skills show` is for sees every line that would run. `--json` is exact.

use std::process::ExitCode;

use bridge_core::config::Config;
use bridge_core::text::{visible, visible_lines};
use bridge_skills::{Listing, Store};

/// One line of a description in the table: its first line, cut to this many characters.
const DESCRIPTION_WIDTH: usize = 60;

/// The store `skills` works on: an identity's of `serve` (`--identity`), or the stdio user's.
pub(super) fn store(config: &Config, identity: Option<&str>) -> Store {
    match identity {
        Some(id) => Store::for_identity(config, id),
        None => Store::from_config(config),
    }
}

pub(super) fn list(store: &Store, json: bool) -> ExitCode {
    let listing = match store.list() {
        Ok(l) => l,
        Err(e) => {
            report(&e);
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string(&listing_json(&listing)).expect("a listing serializes")
        );
        return ExitCode::SUCCESS;
    }
    if listing.skills.is_empty() && listing.broken.is_empty() {
        println!(
            "no skills saved in {} (a session saves one with runtime.save_skill(func))",
            store.dir().display()
        );
        return ExitCode::SUCCESS;
    }
    let width = listing
        .skills
        .iter()
        .map(|s| visible(&s.name).chars().count())
        .chain(
            listing
                .broken
                .iter()
                .map(|b| visible(&b.name).chars().count()),
        )
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:width$}  {:20}  {:12}  {:32}  DESCRIPTION",
        "NAME", "SAVED", "SHA256", "BY"
    );
    for s in &listing.skills {
        let first = s.description.split('\n').next().unwrap_or("").trim();
        let first: String = visible(first).chars().take(DESCRIPTION_WIDTH).collect();
        let saved = if s.saved_at.is_empty() {
            "-".into()
        } else {
            visible(&s.saved_at)
        };
        let by: String = visible(if s.saved_by.is_empty() {
            "-"
        } else {
            &s.saved_by
        })
        .chars()
        .take(32)
        .collect();
        println!(
            "{:width$}  {saved:20}  {:12}  {by:32}  {first}",
            visible(&s.name),
            s.sha256.get(..12).unwrap_or("")
        );
    }
    for b in &listing.broken {
        println!(
            "{:width$}  {:20}  BROKEN: {}",
            visible(&b.name),
            "-",
            visible(&b.reason)
        );
    }
    println!(
        "{} skill(s) in {}{}",
        listing.skills.len(),
        store.dir().display(),
        if listing.broken.is_empty() {
            String::new()
        } else {
            format!(
                "; {} broken, not defined in sessions (`skills rm NAME` removes one)",
                listing.broken.len()
            )
        }
    );
    ExitCode::SUCCESS
}

/// The listing without sources, as `--json` prints it (one object).
fn listing_json(listing: &Listing) -> serde_json::Value {
    let skills: Vec<_> = listing
        .skills
        .iter()
        .map(|s| serde_json::json!({"name": s.name, "description": s.description, "saved_at": s.saved_at, "saved_by": s.saved_by, "sha256": s.sha256}))
        .collect();
    serde_json::json!({"skills": skills, "broken": listing.broken})
}

/// The skill's source as saved, after its description and save time as `#` comment lines, so
/// the output is itself Python; every character a terminal would act on shown as an escape.
pub(super) fn show(store: &Store, name: &str) -> ExitCode {
    match store.get(name) {
        Ok(s) => {
            let saved = if s.saved_at.is_empty() {
                "unknown".into()
            } else {
                visible(&s.saved_at)
            };
            println!("# skill {}, saved {saved}", visible(&s.name));
            if !s.description.is_empty() {
                for line in s.description.trim_end_matches('\n').split('\n') {
                    println!("# {}", visible(line));
                }
            }
            print!("{}", visible_lines(&s.source));
            if !s.source.ends_with('\n') {
                println!();
            }
            // Shown for review all the same; said apart, so the output stays the source.
            if let Err(reason) = bridge_skills::check::check(&s.name, &s.source) {
                eprintln!(
                    "warning: sessions do not define this skill: {}",
                    visible(&reason.to_string())
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Remove each named skill; every name is tried, and the exit is 1 if any was not removed.
pub(super) fn rm(store: &Store, names: &[String]) -> ExitCode {
    let mut failed = false;
    for name in names {
        match store.remove(name) {
            Ok(()) => println!("removed {name}"),
            Err(e) => {
                report(&e);
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The error, and on its own line what to do next.
fn report(e: &bridge_skills::SkillError) {
    let _ = super::term::fail(e, 1);
}
