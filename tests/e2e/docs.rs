//! The reference pages against the binary they describe: every command-line flag clap knows is
//! in `docs/configuration.md`'s flag list for exactly the commands that take it (and the list
//! names no other), every configuration key is in its key table with its variable and default
//! (and the table names no other key), the README's set-up commands are the scripts' own, and
//! every relative link between the Markdown pages reaches a file and a heading that exist.
//! No engine is needed: these read files and run `--help`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::BIN;
use bridge_core::config::keys::KEYS;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The lines of the Markdown section under the heading `heading` (any level), up to the next
/// heading of the same or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = text.lines();
    let level = loop {
        let l = lines
            .next()
            .unwrap_or_else(|| panic!("no heading {heading:?}"));
        let hashes = l.len() - l.trim_start_matches('#').len();
        if hashes > 0 && l[hashes..].trim() == heading {
            break hashes;
        }
    };
    lines
        .take_while(|l| {
            let hashes = l.len() - l.trim_start_matches('#').len();
            !(hashes > 0 && hashes <= level && l[hashes..].starts_with(' '))
        })
        .collect()
}

/// `mcp-code-bridge <path> --help`.
fn help(path: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .args(path)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{path:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The entries of a `--help` section (`Commands:`, `Options:`): the text before the first double
/// space of each indented line.
fn help_entries<'a>(help: &'a str, header: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != header)
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .map(|l| l.trim_start().split("  ").next().unwrap())
        .collect()
}

/// The long flags named in `text` (`--name`).
fn long_flags(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let name: String = rest[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if !name.is_empty() {
            out.push(format!("--{name}"));
        }
        rest = &rest[i + 2 + name.len()..];
    }
    out
}

/// Every command path (`""` is the bare `mcp-code-bridge`, then `run`, `image load`, ...) with
/// the long flags its `--help` lists, `--help` and `--version` left out.
fn clap_flags() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        for cmd in help_entries(&text, "Commands:") {
            if cmd != "help" {
                let mut sub = path.clone();
                sub.push(cmd.to_string());
                todo.push(sub);
            }
        }
        let flags: BTreeSet<String> = help_entries(&text, "Options:")
            .into_iter()
            .flat_map(long_flags)
            .filter(|f| f != "--help" && f != "--version")
            .collect();
        out.insert(path.join(" "), flags);
    }
    out
}

#[test]
fn every_flag_is_in_the_flag_list_for_the_commands_that_take_it_and_no_other() {
    let clap = clap_flags();
    assert!(
        clap.contains_key("exec") && clap.contains_key("image load"),
        "{clap:?}"
    );
    let page = read("docs/configuration.md");
    let rows: Vec<Vec<&str>> = section(&page, "Command-line flags")
        .into_iter()
        .filter(|l| l.starts_with("| `-"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert!(!rows.is_empty(), "docs/configuration.md lists no flag");
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in &rows {
        let flags = long_flags(row[0]);
        assert_eq!(flags.len(), 1, "one long flag per row: {row:?}");
        let commands: Vec<String> = if row[1] == "every command" {
            clap.keys().cloned().collect()
        } else {
            row[1]
                .split(", ")
                .map(|c| c.trim_matches('`').to_string())
                .collect()
        };
        for c in commands {
            assert!(
                clap.contains_key(&c),
                "docs/configuration.md names a command {c:?} that does not exist: {row:?}"
            );
            let fresh = documented
                .entry(c.clone())
                .or_default()
                .insert(flags[0].clone());
            assert!(fresh, "{} is listed twice for {c:?}", flags[0]);
        }
    }
    for (command, flags) in &clap {
        let shown = if command.is_empty() {
            "mcp-code-bridge".to_string()
        } else {
            format!("mcp-code-bridge {command}")
        };
        let listed = documented.remove(command).unwrap_or_default();
        let missing: Vec<_> = flags.difference(&listed).collect();
        let unknown: Vec<_> = listed.difference(flags).collect();
        assert!(
            missing.is_empty(),
            "`{shown} --help` has {missing:?}, which docs/configuration.md's flag list lacks"
        );
        assert!(
            unknown.is_empty(),
            "docs/configuration.md's flag list gives `{shown}` {unknown:?}, which it does not take"
        );
    }
}

/// The rows of the key table: `| `key` | `MCP_BRIDGE_KEY` | default | meaning |`.
fn key_rows(page: &str) -> Vec<&str> {
    section(page, "Keys")
        .into_iter()
        .filter(|l| l.starts_with("| `"))
        .collect()
}

#[test]
fn every_key_is_in_the_key_table_with_its_variable_and_default_and_no_other() {
    let page = read("docs/configuration.md");
    let rows = key_rows(&page);
    for k in KEYS {
        let default = match k.default() {
            d if d.is_empty() => "—".to_string(),
            d => format!("`{d}`"),
        };
        let row = format!("| `{}` | `{}` | {default} |", k.name, k.env());
        assert!(
            rows.iter().any(|r| r.starts_with(&row)),
            "docs/configuration.md's key table lacks the row starting {row:?}"
        );
    }
    for r in &rows {
        let name = r[3..].split('`').next().unwrap();
        assert!(
            KEYS.iter().any(|k| k.name == name),
            "docs/configuration.md's key table has {name:?}, which is not a key"
        );
    }
    assert_eq!(rows.len(), KEYS.len(), "one row per key");
}

#[test]
fn the_readmes_set_up_commands_are_the_scripts_own() {
    let readme = read("README.md");
    let setup = read("scripts/setup-debian.sh");
    for (command, script) in [
        (
            "scripts/setup-debian.sh --configure && cargo run --release",
            "scripts/setup-debian.sh",
        ),
        ("scripts/test.sh", "scripts/test.sh"),
    ] {
        assert!(
            readme.contains(&format!("\n{command}\n")),
            "README.md does not give `{command}` on a line of its own"
        );
        let meta = std::fs::metadata(root().join(script)).unwrap();
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
            "{script} is not executable"
        );
    }
    assert!(
        setup.contains("--configure)"),
        "scripts/setup-debian.sh takes no --configure"
    );
}

/// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_` kept, spaces as `-`,
/// the rest dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (outside code blocks), a repeated one as `name-1`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut code = false;
    for l in text.lines() {
        if l.starts_with("```") {
            code = !code;
        }
        let hashes = l.len() - l.trim_start_matches('#').len();
        if code || hashes == 0 || !l[hashes..].starts_with(' ') {
            continue;
        }
        let a = anchor(&l[hashes..]);
        let n = seen.entry(a.clone()).or_default();
        out.insert(if *n == 0 {
            a.clone()
        } else {
            format!("{a}-{n}")
        });
        *n += 1;
    }
    out
}

/// The Markdown pages of the project: the top level's and `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [root().to_path_buf(), root().join("docs")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let pages = pages();
    assert!(pages.len() >= 8, "{pages:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let name = page.strip_prefix(root()).unwrap().display();
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
            } else if !frag.is_empty() {
                let body = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&body).contains(frag) {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
