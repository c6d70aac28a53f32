//! The shape of the code, guarded: each rule ARCHITECTURE.md states that a machine can check
//! is checked here, on the tree as it is, and each guard is shown failing on a planted
//! violation. A failure names the offender and the rule.
//!
//! - no import cycle among the top-level modules of `src/`, nor among the files of one module
//!   directory (read from `use crate::…`, `super::…` and `crate::…` paths outside tests);
//! - no file of `src/` longer than [`MAX_LINES`] lines before its tests;
//! - every file path ARCHITECTURE.md names exists;
//! - no `Result<_, String>` in a `pub` signature: errors that cross a module are types;
//! - no crate both a dependency and a dev-dependency in `Cargo.toml`: a feature only the tests
//!   turn on builds that crate, and this one, twice (`cargo build`, then `cargo test`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Longest a file of `src/` may be before its `#[cfg(test)]`.
const MAX_LINES: usize = 700;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, relative to the repository, with its text.
fn sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("src")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root()).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The text before the file's tests.
fn before_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The module path of a file: `src/sandbox/mod.rs` is `sandbox`, `src/sandbox/park.rs` is
/// `sandbox::park`, `src/lib.rs` and `src/main.rs` the root.
fn module_of(file: &str) -> Vec<String> {
    let rel = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The module paths a file's code names (`crate::a::b`, `super::c`, and `{…}` lists after
/// them), resolved to absolute paths, comments left out.
fn references(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in code.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let mut rest = t;
        while let Some(i) = find_path_start(rest) {
            let tail = &rest[i..];
            let (path, used) = read_path(tail);
            rest = &tail[used.max(1)..];
            for p in expand(&path) {
                if let Some(abs) = resolve(module, &p) {
                    out.push(abs);
                }
            }
        }
    }
    out
}

/// Where the next `crate::` or `super::` path starts (not inside an identifier).
fn find_path_start(s: &str) -> Option<usize> {
    let mut best: Option<usize> = None;
    for key in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(j) = s[from..].find(key) {
            let at = from + j;
            let prev = s[..at].chars().next_back();
            if prev.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                best = Some(best.map_or(at, |b: usize| b.min(at)));
                break;
            }
            from = at + key.len();
        }
    }
    best
}

/// A path as written, braces included (`super::{a, b::c}`), and the bytes it took.
fn read_path(s: &str) -> (String, usize) {
    let mut depth = 0usize;
    let mut end = s.len();
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                end = i;
                break;
            }
            '}' => depth -= 1,
            c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    (s[..end].to_string(), end)
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.trim_end_matches(':').to_string()];
    };
    let prefix = &path[..open];
    let inner = path[open + 1..].trim_end_matches('}');
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// An absolute module path (without `crate`) from a path written in `module`.
fn resolve(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segs = path.split("::").filter(|s| !s.is_empty());
    let first = segs.next()?;
    let mut base: Vec<String> = match first {
        "crate" => Vec::new(),
        "super" => {
            // In `a/b.rs` and in `a/b/mod.rs` (both module a::b), `super` is `a`.
            let mut m = module.to_vec();
            m.pop()?;
            m
        }
        _ => return None,
    };
    for s in segs {
        match s {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            s => base.push(s.to_string()),
        }
    }
    Some(base)
}

/// The module graph of `files` at one level: for every file under `parent`, the child of
/// `parent` it belongs to, and the children of `parent` its code names; the parent's own file
/// is left out. Edges carry the file that makes them.
fn edges_under(
    files: &[(String, String)],
    modules: &BTreeSet<Vec<String>>,
    parent: &[String],
) -> BTreeMap<(String, String), String> {
    let mut edges = BTreeMap::new();
    for (file, text) in files {
        let m = module_of(file);
        if m.len() <= parent.len() || m[..parent.len()] != *parent {
            continue;
        }
        let from = m[parent.len()].clone();
        for r in references(&m, before_tests(text)) {
            if r.len() <= parent.len() || r[..parent.len()] != *parent {
                continue;
            }
            let to = r[parent.len()].clone();
            if to == from || !modules.contains(&r[..=parent.len()].to_vec()) {
                continue;
            }
            edges
                .entry((from.clone(), to))
                .or_insert_with(|| file.clone());
        }
    }
    edges
}

/// The cycles (strongly connected sets of two or more) of a graph.
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for ((a, b), _) in edges.iter() {
                if *a == n && seen.insert(b.clone()) {
                    stack.push(b.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        let mut scc: Vec<String> = nodes
            .iter()
            .filter(|m| reached[*n].contains(**m) && reached[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        scc.sort();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

/// Every import cycle, as `parent: a -> b (file) -> … `, at the top level and in every
/// module directory.
fn import_cycles(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_of(f)).collect();
    let mut parents: BTreeSet<Vec<String>> = BTreeSet::new();
    for m in &modules {
        for i in 0..m.len() {
            parents.insert(m[..i].to_vec());
        }
    }
    let mut out = Vec::new();
    for parent in &parents {
        let edges = edges_under(files, &modules, parent);
        for scc in cycles(&edges) {
            let shown: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|((a, b), f)| format!("{a} -> {b} ({f})"))
                .collect();
            let at = if parent.is_empty() {
                "src".to_string()
            } else {
                format!("src/{}", parent.join("/"))
            };
            out.push(format!("{at}: {}", shown.join(", ")));
        }
    }
    out
}

fn long_files(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter_map(|(f, text)| {
            let n = before_tests(text).lines().count();
            (n > MAX_LINES).then(|| format!("{f}: {n} lines before its tests"))
        })
        .collect()
}

/// `pub` signatures (`pub fn`, `pub async fn`, `pub(crate) …`) whose return type is a
/// `Result<_, String>`.
fn string_errors(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (f, text) in files {
        let code = before_tests(text);
        for (i, line) in code.lines().enumerate() {
            let t = line.trim_start();
            let public = [
                "pub fn ",
                "pub async fn ",
                "pub(crate) fn ",
                "pub(crate) async fn ",
            ]
            .iter()
            .any(|p| t.starts_with(p));
            if !public {
                continue;
            }
            // The signature, up to its body or its end.
            let rest: String = code.lines().skip(i).take(12).collect::<Vec<_>>().join(" ");
            let sig = rest.split(['{', ';']).next().unwrap_or("");
            let sig: String = sig.split_whitespace().collect::<Vec<_>>().join(" ");
            if let Some(ret) = sig.split(") -> ").nth(1)
                && ret.trim_start().starts_with("Result<")
                && ret.trim_end().ends_with(", String>")
            {
                out.push(format!("{f}:{}: {sig}", i + 1));
            }
        }
    }
    out
}

/// The file paths ARCHITECTURE.md names in backticks that exist nowhere in the tree. A name
/// is looked for as written, under each directory its section's heading names (`attach.rs`
/// under "### `src/sandbox/`"), then under the tree's usual roots. Placeholders (`<state_dir>/…`)
/// and absolute paths are not file names of the tree.
fn missing_paths(doc: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "",
        "src/",
        "image/",
        "image/runtime/",
        "tests/",
        "tests/e2e/",
        "docs/",
        "nix/",
        "benches/bridge/",
        "fuzz/",
    ];
    let mut out = BTreeSet::new();
    let mut section: Vec<String> = Vec::new();
    for line in doc.lines() {
        let names: Vec<&str> = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, p)| p.trim())
            .collect();
        if line.starts_with('#') {
            section = names
                .iter()
                .filter(|p| p.ends_with('/'))
                .map(|p| p.to_string())
                .collect();
        }
        for p in names {
            let p = p.trim_end_matches("'s");
            let plain = p.len() > 3
                && !p.starts_with('.')
                && !p.contains([' ', '<', '*', '$', '~', '{', '(', '='])
                && !p.contains("::")
                && !p.starts_with('/')
                && !p.starts_with('-');
            let file_like = [".rs", ".py", ".nix", ".sh", ".md", ".toml"]
                .iter()
                .any(|x| p.ends_with(x))
                || (p.ends_with('/') && p.len() > 1);
            if !plain || !file_like {
                continue;
            }
            let found = section
                .iter()
                .map(String::as_str)
                .chain(ROOTS.iter().copied())
                .any(|base| root().join(format!("{base}{p}")).exists());
            if !found {
                out.insert(p.to_string());
            }
        }
    }
    out.into_iter().collect()
}

/// The names of the crates listed in `table` (`[dependencies]`, `[dev-dependencies]`) of a
/// Cargo.toml, in order.
fn crates_in(manifest: &str, table: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{table}]");
        } else if inside && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

fn dev_dependencies_also_built_for_the_binary(manifest: &str) -> Vec<String> {
    let normal = crates_in(manifest, "dependencies");
    crates_in(manifest, "dev-dependencies")
        .into_iter()
        .filter(|c| normal.contains(c))
        .map(|c| format!("Cargo.toml: {c} is in [dependencies] and [dev-dependencies]"))
        .collect()
}

fn report(rule: &str, offenders: &[String]) {
    assert!(
        offenders.is_empty(),
        "{rule}:\n  {}",
        offenders.join("\n  ")
    );
}

#[test]
fn no_import_cycle_among_modules() {
    report(
        "rule: no import cycle among the top-level modules of src/, nor among the files of one directory",
        &import_cycles(&sources()),
    );
}

#[test]
fn no_source_file_is_longer_than_700_lines_before_its_tests() {
    report(
        "rule: no file of src/ over 700 lines before its tests (split it by concern)",
        &long_files(&sources()),
    );
}

#[test]
fn every_path_architecture_md_names_exists() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    report(
        "rule: every path ARCHITECTURE.md names exists",
        &missing_paths(&doc),
    );
}

#[test]
fn no_pub_signature_returns_a_string_error() {
    report(
        "rule: no Result<_, String> in a pub signature (an error that crosses a module is a type)",
        &string_errors(&sources()),
    );
}

#[test]
fn no_crate_is_both_a_dependency_and_a_dev_dependency() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    report(
        "rule: a crate the tests need with other features gets them in [dependencies] (else `cargo test` builds it and this crate again after `cargo build`)",
        &dev_dependencies_also_built_for_the_binary(&manifest),
    );
}

/// Each guard fails on a planted violation, naming it.
#[test]
fn each_guard_fails_on_a_planted_violation() {
    let planted = vec![
        (
            "src/sandbox/container.rs".to_string(),
            "use super::park::now_secs;\n".to_string(),
        ),
        (
            "src/sandbox/park.rs".to_string(),
            "use super::container::{self, Role};\n".to_string(),
        ),
        (
            "src/config/mod.rs".to_string(),
            "fn f() { crate::server::x(); }\n".to_string(),
        ),
        (
            "src/server/mod.rs".to_string(),
            "use crate::config::Config;\n".to_string(),
        ),
    ];
    let found = import_cycles(&planted);
    assert!(
        found
            .iter()
            .any(|c| c.starts_with("src/sandbox: container -> park (src/sandbox/container.rs)")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|c| c.contains("config -> server (src/config/mod.rs)")),
        "{found:?}"
    );
    let long = vec![(
        "src/big.rs".to_string(),
        "fn x() {}\n".repeat(701) + "#[cfg(test)]\nmod tests {}\n" + &"\n".repeat(5000),
    )];
    assert_eq!(
        long_files(&long),
        ["src/big.rs: 701 lines before its tests"]
    );
    let short = vec![(
        "src/ok.rs".to_string(),
        "fn x() {}\n".repeat(700) + "#[cfg(test)]\n" + &"fn t() {}\n".repeat(900),
    )];
    assert!(long_files(&short).is_empty());
    let sigs = vec![(
        "src/a.rs".to_string(),
        "pub async fn rename(\n    docker: &Docker,\n    id: &str,\n) -> Result<(), String> {\n}\nfn private() -> Result<(), String> {}\npub fn typed() -> Result<(), Error> {}\n".to_string(),
    )];
    let found = string_errors(&sigs);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/a.rs:1: pub async fn rename("),
        "{found:?}"
    );
    assert_eq!(
        missing_paths(
            "### `src/sandbox/`\n`park.rs` and `engine.rs`, `src/server.rs`, `image/runtime.py`, `Cargo.toml`, `server/run.rs`, `crate::x`, `<state_dir>/x/`"
        ),
        ["engine.rs", "image/runtime.py", "src/server.rs"]
    );
    assert_eq!(
        dev_dependencies_also_built_for_the_binary(
            "[dependencies]\nfigment = { version = \"0.10\" }\n# x = 1\nserde = \"1\"\n\n[dev-dependencies]\nfigment = { version = \"0.10\", features = [\"test\"] }\ninsta = \"1\"\n"
        ),
        ["Cargo.toml: figment is in [dependencies] and [dev-dependencies]"]
    );
}
