//! The shape of the code, guarded: each rule ARCHITECTURE.md states that a machine can check
//! is checked here, on the tree as it is, and each guard is shown failing on a planted
//! violation. A failure names the offender and the rule.
//!
//! - the workspace's layers: each crate of `crates/` depends on no workspace crate but those
//!   [`LAYERS`] allows it (Cargo refuses a cycle between crates; this keeps siblings apart, so
//!   they build side by side and a change to one rebuilds neither);
//! - no import cycle among the modules of one crate, at its top level nor among the files of
//!   one module directory (read from `use crate::…`, `super::…` and `crate::…` paths outside
//!   tests);
//! - no source file longer than [`MAX_LINES`] lines before its tests;
//! - every file path ARCHITECTURE.md names exists;
//! - no `Result<_, String>` in a `pub` signature, and no error type that is a `String` in a
//!   wrapper (`struct X(pub String)` deriving or implementing `Error`): errors that cross a
//!   module are types whose variants say the cause;
//! - every advisory file lock through `core::flock` (std's `File::lock`), none by `libc::flock`;
//! - no crate both a dependency and a dev-dependency in any `Cargo.toml` of the workspace: a
//!   feature only the tests turn on builds that crate, and the ones above it, twice
//!   (`cargo build`, then `cargo test`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Longest a source file may be before its test module.
const MAX_LINES: usize = 700;

/// The workspace crates (`crates/<dir>`) each crate may depend on: the layering ARCHITECTURE.md
/// draws. `packages`, `skills`, `sandbox` and `upstream` know nothing of each other; only
/// `server` (and the top crate, `src/`) sees them all.
const LAYERS: &[(&str, &[&str])] = &[
    ("core", &[]),
    ("packages", &["core"]),
    ("skills", &["core"]),
    ("sandbox", &["core"]),
    ("upstream", &["core"]),
    (
        "server",
        &["core", "packages", "skills", "sandbox", "upstream"],
    ),
];

/// The source roots: the top crate's `src/` and each `crates/<dir>/src/`.
fn source_roots() -> Vec<String> {
    let mut roots = vec!["src".to_string()];
    let mut crates: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| format!("crates/{}/src", e.file_name().to_string_lossy()))
        .collect();
    crates.sort();
    roots.extend(crates);
    roots
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of every source root, relative to the repository, with its text.
fn sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = source_roots().iter().map(|r| root().join(r)).collect();
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

/// The text before the file's test module: the first `#[cfg(test)]` whose item is a `mod`
/// (its other attributes and blank lines between). A test-only helper or import elsewhere in
/// the file is counted with the code, so it cannot hide what follows it.
fn before_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let item = text[at + "#[cfg(test)]".len()..]
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("#["));
        if item.is_some_and(|l| {
            let l = l
                .strip_prefix("pub(crate) ")
                .or(l.strip_prefix("pub "))
                .unwrap_or(l);
            l.starts_with("mod ")
        }) {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// The module path of a file, its source root first (each crate is a tree of its own):
/// `crates/sandbox/src/park.rs` is `[crates/sandbox/src, park]`, `src/http/mod.rs` is
/// `[src, http]`, a crate's `lib.rs` and `main.rs` its root.
fn module_of(file: &str) -> Vec<String> {
    let (src, rel) = match file.split_once("/src/") {
        Some((krate, rel)) => (format!("{krate}/src"), rel),
        None => ("src".to_string(), file.trim_start_matches("src/")),
    };
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = std::iter::once(src)
        .chain(rel.split('/').map(str::to_string))
        .collect();
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
        "crate" => module[..1].to_vec(),
        "super" => {
            // In `a/b.rs` and in `a/b/mod.rs` (both module a::b), `super` is `a`.
            let mut m = module.to_vec();
            m.pop()?;
            if m.is_empty() {
                return None;
            }
            m
        }
        _ => return None,
    };
    for s in segs {
        match s {
            "super" => {
                base.pop()?;
                if base.is_empty() {
                    return None;
                }
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

/// Every import cycle, as `parent: a -> b (file) -> … `, at the top level of each crate and in
/// every module directory. (Between crates Cargo refuses a cycle itself.)
fn import_cycles(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_of(f)).collect();
    let mut parents: BTreeSet<Vec<String>> = BTreeSet::new();
    for m in &modules {
        for i in 1..m.len() {
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
            let at = parent.join("/");
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

/// Error types that are a `String` in a wrapper: a tuple struct whose one field is a `String`
/// and that derives `Error` (in the attributes above it) or implements it anywhere in the file.
fn string_newtype_errors(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (f, text) in files {
        let code = before_tests(text);
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some((_, rest)) = line.split_once("struct ") else {
                continue;
            };
            let Some((name, field)) = rest.split_once('(') else {
                continue;
            };
            let field = field.trim_end().trim_end_matches(';').trim_end_matches(')');
            let field = field
                .trim()
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if field.trim() != "String" || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let derives = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    l.trim_start().starts_with("#[") || l.trim_start().starts_with("///")
                })
                .any(|l| l.contains("derive(") && l.contains("Error"));
            let implements = [format!("Error for {name} "), format!("Error for {name}{{")]
                .iter()
                .any(|p| code.contains(p.as_str()));
            if derives || implements {
                out.push(format!("{f}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

/// The crate roots' imports of another workspace crate or one of its modules: such an import
/// makes `crate::name` in every file of the crate mean another crate (each crate is called by
/// its own library name instead, `bridge_core::config::Config`). Items (types, traits, `_`
/// imports) a root imports for its own code are not re-rooted modules.
fn reroots(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (f, text) in files {
        let is_root = f == "src/lib.rs"
            || f == "src/main.rs"
            || (f.starts_with("crates/") && f.ends_with("/src/lib.rs"));
        if !is_root {
            continue;
        }
        let code = before_tests(text);
        let mut lines = code.lines();
        while let Some(line) = lines.next() {
            let Some(rest) = ["use ", "pub use ", "pub(crate) use "]
                .iter()
                .find_map(|p| line.strip_prefix(p))
            else {
                continue;
            };
            let mut stmt = rest.to_string();
            while !stmt.contains(';') {
                let Some(next) = lines.next() else { break };
                stmt.push_str(next.trim());
            }
            let stmt = stmt.split(';').next().unwrap_or("");
            let stmt = stmt
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(":: ", "::")
                .replace("{ ", "{")
                .replace(" }", "}");
            if !(stmt.starts_with("bridge_") || stmt.starts_with("mcp_code_bridge")) {
                continue;
            }
            for path in expand(&stmt) {
                let (path, bound) = match path.split_once(" as ") {
                    Some((p, alias)) => (p.to_string(), alias.to_string()),
                    None => {
                        let last = path.rsplit("::").next().unwrap_or(&path).to_string();
                        (path.clone(), last)
                    }
                };
                let bound = if bound == "self" {
                    path.trim_end_matches("::self")
                        .rsplit("::")
                        .next()
                        .unwrap_or("")
                        .to_string()
                } else {
                    bound
                };
                if bound.starts_with(|c: char| c.is_ascii_lowercase()) {
                    out.push(format!(
                        "{f}: imports {path} at the crate root as `crate::{bound}`: name it `{path}` where it is used"
                    ));
                }
            }
        }
    }
    out
}

/// Files that take an advisory lock other than through `core::flock`.
fn raw_flocks(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(f, text)| f != "crates/core/src/flock.rs" && text.contains("libc::flock"))
        .map(|(f, _)| format!("{f}: calls libc::flock (use bridge_core::flock)"))
        .collect()
}

/// The file paths ARCHITECTURE.md names in backticks that do not exist where they are named. A
/// name is looked for as written from the repository's root and under each directory its
/// section's heading names (`park.rs` under "### `crates/sandbox/`" is that crate's
/// `src/park.rs`), and only there: deleting the file it names fails the guard even when a file
/// of that name is left elsewhere. Under a heading that names no directory, the tree's usual
/// roots are searched. Placeholders (`<state_dir>/…`) and absolute paths are not file names of
/// the tree.
fn missing_paths(doc: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "",
        "src/",
        "crates/",
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
            // Under a heading that names directories, a name is one of theirs (or written from the
            // repository's root); elsewhere, under the tree's usual roots or a crate's `src/`.
            let crate_roots: Vec<String> = source_roots().iter().map(|r| format!("{r}/")).collect();
            let bases: Vec<&str> = if section.is_empty() {
                ROOTS
                    .iter()
                    .copied()
                    .chain(crate_roots.iter().map(String::as_str))
                    .collect()
            } else {
                section.iter().map(String::as_str).chain([""]).collect()
            };
            let found = bases
                .iter()
                .any(|base| root().join(format!("{base}{p}")).exists())
                // Under "### `crates/sandbox/`", `park.rs` is the crate's `src/park.rs`.
                || section
                    .iter()
                    .any(|base| root().join(format!("{base}src/{p}")).exists())
                // `sandbox/park.rs` is a crate's file as its module path reads.
                || p.split_once('/').is_some_and(|(krate, rest)| {
                    root().join(format!("crates/{krate}/src/{rest}")).exists()
                });
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
        } else if inside
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            out.push(name.trim().to_string());
        }
    }
    out
}

/// A crate's name as a manifest lists it (`serde`, `serde.workspace`, `serde = { … }`).
fn crate_name(entry: &str) -> &str {
    entry.split('.').next().unwrap_or(entry).trim()
}

fn dev_dependencies_also_built_for_the_binary(path: &str, manifest: &str) -> Vec<String> {
    let normal: Vec<String> = crates_in(manifest, "dependencies")
        .iter()
        .map(|c| crate_name(c).to_string())
        .collect();
    crates_in(manifest, "dev-dependencies")
        .iter()
        .map(|c| crate_name(c))
        .filter(|c| normal.iter().any(|n| n == c))
        .map(|c| format!("{path}: {c} is in [dependencies] and [dev-dependencies]"))
        .collect()
}

/// The workspace's manifests: the top crate's and each of `crates/`, with their text.
fn manifests() -> Vec<(String, String)> {
    source_roots()
        .iter()
        .map(|r| {
            // `src` is the top crate's (`Cargo.toml`), `crates/x/src` crate x's.
            let path = r.trim_end_matches("src").to_string() + "Cargo.toml";
            let text = std::fs::read_to_string(root().join(&path)).unwrap();
            (path, text)
        })
        .collect()
}

/// The workspace crates a crate's manifest depends on that [`LAYERS`] does not allow it (or
/// the crate itself, when `LAYERS` does not know it).
fn layer_breaches(dir: &str, manifest: &str) -> Vec<String> {
    let Some((_, allowed)) = LAYERS.iter().find(|(d, _)| *d == dir) else {
        return vec![format!(
            "crates/{dir}: a crate LAYERS (tests/shape.rs) does not place: add it there and to ARCHITECTURE.md"
        )];
    };
    crates_in(manifest, "dependencies")
        .iter()
        .chain(crates_in(manifest, "dev-dependencies").iter())
        .filter_map(|c| crate_name(c).strip_prefix("mcp-code-bridge-"))
        .filter(|dep| !allowed.contains(dep))
        .map(|dep| format!("crates/{dir}/Cargo.toml: depends on mcp-code-bridge-{dep}, which LAYERS does not allow it"))
        .collect()
}

/// The e2e tests `doc` names (`` `module::test_name` ``, module a file of tests/e2e/) that
/// `files` (path, text) do not define; a name ending in `_` names a group by its prefix, which
/// must match one test at least.
fn missing_tests(doc: &str, files: &[(String, String)]) -> Vec<String> {
    let mut missing = Vec::new();
    for (i, _) in doc.match_indices('`') {
        let rest = &doc[i + 1..];
        let Some(end) = rest.find('`') else { break };
        let cited = &rest[..end];
        let Some((module, name)) = cited.split_once("::") else {
            continue;
        };
        let plain = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !plain(module) || !plain(name) {
            continue;
        }
        let path = format!("tests/e2e/{module}.rs");
        let Some((_, text)) = files.iter().find(|(p, _)| *p == path) else {
            continue;
        };
        let defined = text.match_indices(&format!("fn {name}")).any(|(j, _)| {
            let after = text[j + 3 + name.len()..].chars().next();
            name.ends_with('_') || !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if !defined && !missing.contains(&cited.to_string()) {
            missing.push(cited.to_string());
        }
    }
    missing
}

fn report(rule: &str, offenders: &[String]) {
    assert!(
        offenders.is_empty(),
        "{rule}:\n  {}",
        offenders.join("\n  ")
    );
}

#[test]
fn each_crate_depends_only_on_the_layers_below_it() {
    let manifests = manifests();
    let mut breaches = Vec::new();
    for (path, text) in manifests.iter().skip(1) {
        let dir = path
            .trim_start_matches("crates/")
            .trim_end_matches("/Cargo.toml");
        breaches.extend(layer_breaches(dir, text));
    }
    assert_eq!(
        manifests.len(),
        LAYERS.len() + 1,
        "LAYERS names exactly the crates of crates/"
    );
    report(
        "rule: a workspace crate depends only on the crates LAYERS puts below it",
        &breaches,
    );
}

#[test]
fn no_import_cycle_among_modules() {
    report(
        "rule: no import cycle among the top-level modules of a crate, nor among the files of one directory",
        &import_cycles(&sources()),
    );
}

#[test]
fn no_source_file_is_longer_than_700_lines_before_its_tests() {
    report(
        "rule: no source file over 700 lines before its tests (split it by concern)",
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
fn every_test_security_md_names_exists() {
    let doc = std::fs::read_to_string(root().join("SECURITY.md")).unwrap();
    let dir = root().join("tests/e2e");
    let files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (
                format!("tests/e2e/{name}"),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect();
    report(
        "rule: every test SECURITY.md names as the one that attacks a claim exists (rename the test and the claim together)",
        &missing_tests(&doc, &files),
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
fn no_error_type_is_a_string_in_a_wrapper() {
    report(
        "rule: an error type says its causes as variants with their data, not as a String in a wrapper",
        &string_newtype_errors(&sources()),
    );
}

#[test]
fn every_file_lock_goes_through_core_flock() {
    report(
        "rule: one way to lock a shared file (core::flock, std's File::lock, EINTR retried)",
        &raw_flocks(&sources()),
    );
}

#[test]
fn no_crate_root_imports_a_module_of_another_crate() {
    report(
        "rule: each crate is called by its own name; no crate root imports another crate or one of its modules (`crate::` is the file's own crate)",
        &reroots(&sources()),
    );
}

#[test]
fn no_crate_is_both_a_dependency_and_a_dev_dependency() {
    let found: Vec<String> = manifests()
        .iter()
        .flat_map(|(path, text)| dev_dependencies_also_built_for_the_binary(path, text))
        .collect();
    report(
        "rule: a crate the tests need with other features gets them in [dependencies] (else `cargo test` builds it and the crates above it again after `cargo build`)",
        &found,
    );
}

/// Which files may name which OpenTelemetry crate: its API `core/trace.rs` and `src/otel.rs`
/// (which installs the provider), its SDK and exporter only `src/otel.rs`.
const OTEL_NAMERS: &[(&str, &[&str])] = &[
    ("opentelemetry_sdk", &["src/otel.rs"]),
    ("opentelemetry_otlp", &["src/otel.rs"]),
    (
        "opentelemetry",
        &["crates/core/src/trace.rs", "src/otel.rs"],
    ),
];

/// The files that name an OpenTelemetry crate other than the one allowed to.
fn otel_namers(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let code = before_tests(text);
        for (krate, allowed) in OTEL_NAMERS {
            // `opentelemetry::` and `opentelemetry_sdk::`, not `core::trace`'s own names.
            let named = code.match_indices(krate).any(|(i, _)| {
                let before = code[..i].chars().next_back();
                let after = &code[i + krate.len()..];
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && (after.starts_with("::") || after.starts_with(" as "))
            });
            if named && !allowed.contains(&path.as_str()) {
                found.push(format!(
                    "{path}: names {krate} (only {} may)",
                    allowed.join(" and ")
                ));
            }
        }
    }
    found
}

#[test]
fn opentelemetry_is_named_only_by_trace_and_otel() {
    report(
        "rule: spans are made through core::trace, the exporter set up in src/otel.rs (one place each to change OpenTelemetry's version)",
        &otel_namers(&sources()),
    );
}

/// Each guard fails on a planted violation, naming it.
#[test]
fn each_guard_fails_on_a_planted_violation() {
    let planted = vec![
        (
            "crates/sandbox/src/engine/container.rs".to_string(),
            "use super::park::now_secs;\n".to_string(),
        ),
        (
            "crates/sandbox/src/engine/park.rs".to_string(),
            "use super::container::{self, Role};\n".to_string(),
        ),
        (
            "crates/core/src/config/mod.rs".to_string(),
            "fn f() { crate::audit::x(); }\n".to_string(),
        ),
        (
            "crates/core/src/audit/mod.rs".to_string(),
            "use crate::config::Config;\n".to_string(),
        ),
        // The same names in two crates are two modules: no cycle.
        (
            "crates/server/src/lib.rs".to_string(),
            "use crate::config::Config;\n".to_string(),
        ),
        (
            "crates/server/src/config.rs".to_string(),
            "use crate::audit;\n".to_string(),
        ),
    ];
    let found = import_cycles(&planted);
    assert!(
        found.iter().any(|c| c.starts_with(
            "crates/sandbox/src/engine: container -> park (crates/sandbox/src/engine/container.rs)"
        )),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|c| c.contains("crates/core/src: audit -> config (crates/core/src/audit/mod.rs), config -> audit (crates/core/src/config/mod.rs)")),
        "{found:?}"
    );
    assert_eq!(found.len(), 2, "{found:?}");
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
        "fn x() {}\n".repeat(700)
            + "#[cfg(test)]\n#[allow(unused)]\n\nmod tests {\n"
            + &"fn t() {}\n".repeat(900)
            + "}\n",
    )];
    assert!(long_files(&short).is_empty());
    // A test-only helper early in the file hides nothing after it.
    let hiding = vec![(
        "src/hides.rs".to_string(),
        "#[cfg(test)]\nfn helper() {}\n".to_string()
            + &"fn x() {}\n".repeat(700)
            + "#[cfg(test)]\nmod tests {}\n",
    )];
    assert_eq!(
        long_files(&hiding),
        ["src/hides.rs: 702 lines before its tests"]
    );
    let sigs = vec![(
        "src/a.rs".to_string(),
        "pub async fn rename(\n    docker: &Docker,\n    id: &str,\n) -> Result<(), String> {\n}\nfn private() -> Result<(), String> {}\npub fn typed() -> Result<(), Error> {}\n".to_string(),
    )];
    let found = string_errors(&sigs);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        string_newtype_errors(&[(
            "src/e.rs".to_string(),
            "/// Why.\n#[derive(Debug, thiserror::Error)]\n#[error(\"{0}\")]\npub struct Refused(pub String);\npub struct Name(String);\nstruct ByHand(String);\nimpl std::error::Error for ByHand {}\npub struct Typed(pub Kind);\n".to_string(),
        )]),
        [
            "src/e.rs:4: pub struct Refused(pub String);",
            "src/e.rs:6: struct ByHand(String);"
        ]
    );
    assert_eq!(
        reroots(&[
            (
                "crates/server/src/lib.rs".to_string(),
                "use bridge_core::boxed::Boxed;\nuse bridge_core::trace::Within as _;\nuse bridge_core::{\n    audit,\n    config::Config,\n};\nuse bridge_sandbox as sandbox;\nmod x {\n    use bridge_core::text;\n}\n".to_string(),
            ),
            (
                "crates/server/src/run.rs".to_string(),
                "use bridge_core::config;\n".to_string(),
            ),
        ]),
        [
            "crates/server/src/lib.rs: imports bridge_core::audit at the crate root as `crate::audit`: name it `bridge_core::audit` where it is used",
            "crates/server/src/lib.rs: imports bridge_sandbox at the crate root as `crate::sandbox`: name it `bridge_sandbox` where it is used",
        ]
    );
    assert_eq!(
        raw_flocks(&[
            (
                "crates/core/src/flock.rs".to_string(),
                "libc::flock(fd, 2)".to_string()
            ),
            (
                "crates/sandbox/src/park.rs".to_string(),
                "unsafe { libc::flock(fd, 6) }".to_string()
            ),
        ]),
        ["crates/sandbox/src/park.rs: calls libc::flock (use bridge_core::flock)"]
    );
    assert!(
        found[0].starts_with("src/a.rs:1: pub async fn rename("),
        "{found:?}"
    );
    assert_eq!(
        missing_tests(
            "`hostile::a_real_one`, `hostile::gone`, `hostile::a_real`, `grp::pre_`, `grp::none_`, `unit::x`, `sandbox/park.rs`, `a::B`",
            &[
                (
                    "tests/e2e/hostile.rs".to_string(),
                    "async fn a_real_one() {}".to_string()
                ),
                (
                    "tests/e2e/grp.rs".to_string(),
                    "fn pre_one() {}".to_string()
                ),
            ]
        ),
        ["hostile::gone", "hostile::a_real", "grp::none_"]
    );
    assert_eq!(
        missing_paths(
            "### `crates/sandbox/`\n`park.rs` and `engine.rs`, `src/server.rs`, `image/runtime.py`, `Cargo.toml`, `crates/server/src/run.rs`, `server/run.rs`, `sandbox/mod.rs`, `http/mod.rs`, `crate::x`, `<state_dir>/x/`"
        ),
        [
            "engine.rs",
            // The top crate's `src/http/mod.rs` exists, but not under the section's crate.
            "http/mod.rs",
            "image/runtime.py",
            "sandbox/mod.rs",
            "src/server.rs"
        ]
    );
    assert_eq!(
        dev_dependencies_also_built_for_the_binary(
            "Cargo.toml",
            "[dependencies]\nfigment = { version = \"0.10\" }\n# x = 1\nserde.workspace = true\n\n[dev-dependencies]\nfigment = { version = \"0.10\", features = [\"test\"] }\ninsta = \"1\"\nserde = { workspace = true, features = [\"rc\"] }\n"
        ),
        [
            "Cargo.toml: figment is in [dependencies] and [dev-dependencies]",
            "Cargo.toml: serde is in [dependencies] and [dev-dependencies]"
        ]
    );
    assert_eq!(
        layer_breaches(
            "sandbox",
            "[dependencies]\nmcp-code-bridge-core.workspace = true\nmcp-code-bridge-upstream = { path = \"../upstream\" }\n"
        ),
        [
            "crates/sandbox/Cargo.toml: depends on mcp-code-bridge-upstream, which LAYERS does not allow it"
        ]
    );
    assert_eq!(layer_breaches("new", "").len(), 1);
    assert_eq!(
        otel_namers(&[
            (
                "crates/upstream/src/rpc.rs".to_string(),
                "use opentelemetry::trace::Tracer;\nuse crate::trace;\n".to_string()
            ),
            (
                "crates/core/src/trace.rs".to_string(),
                "use opentelemetry::Context;\nuse opentelemetry_sdk::Resource;\n".to_string()
            ),
            (
                "src/otel.rs".to_string(),
                "use opentelemetry_sdk::Resource;\nlet x = opentelemetry_otlp::SpanExporter::builder();\n".to_string()
            ),
        ]),
        [
            "crates/upstream/src/rpc.rs: names opentelemetry (only crates/core/src/trace.rs and src/otel.rs may)",
            "crates/core/src/trace.rs: names opentelemetry_sdk (only src/otel.rs may)"
        ]
    );
}
