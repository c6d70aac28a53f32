//! The shape of the code, guarded: each rule ARCHITECTURE.md states that a machine can check
//! is checked here, on the tree as it is, and each guard is shown failing on a planted
//! violation. A failure names the offender and the rule.
//!
//! - the workspace's layers: each crate of `crates/` depends on no workspace crate but those
//!   [`LAYERS`] allows it (Cargo refuses a cycle between crates; this keeps siblings apart, so
//!   they build side by side and a change to one rebuilds neither);
//! - no import cycle among the modules of one crate, at its top level nor among the files of
//!   one module directory, the parent's own file (`lib.rs`, `mod.rs`) a node among them: a
//!   child that names an item defined there (`crate::Thing`, `super::shown`, `use super::*`)
//!   depends on it, and it on the children whose items it names (`use table::Busy`, `pub use
//!   error::X`, `table::Start`); a name it only re-exports leads to the child it comes from
//!   (read from the tokens of the code outside its `#[cfg(test)]` modules);
//! - no source file longer than [`MAX_LINES`] lines before its tests;
//! - every file path ARCHITECTURE.md names exists;
//! - no `pub async fn` in a library crate of `crates/`, and every `pub fn` returning `Boxed`
//!   `#[inline(never)]`: an async entry point another crate awaits is compiled once, in its own
//!   crate (core/boxed.rs);
//! - no string (`String`, `&str`, `Box<str>`) as the error of a `Result` in the signature of a
//!   fn that is not private or of a trait's method, in a field, or in a type alias, and no
//!   error type that is a string in a wrapper (`struct X(pub String)` deriving or implementing
//!   `Error` in its crate): errors that cross a module are types whose variants say the cause
//!   (read as Rust, by `syn`);
//! - every advisory file lock through `core::flock` (std's `File::lock`), none by `libc::flock`;
//! - no crate both a dependency and a dev-dependency in any `Cargo.toml` of the workspace: a
//!   feature only the tests turn on builds that crate, and the ones above it, twice
//!   (`cargo build`, then `cargo test`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use proc_macro2::{Delimiter, Spacing, TokenTree};
use syn::visit::Visit;

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

/// What a file's code names, read from its tokens (comments and string literals are not
/// code; macro bodies are): the paths that start `crate::`, `super::`, `self::` or with the
/// name of one of the module's own child modules (`table::Start`), `{…}` lists expanded, each
/// resolved to an absolute path and marked when it is a glob (`::*`). Modules under
/// `#[cfg(test)]` are left out: an inline one is skipped, one with a file of its own is listed
/// in `test_modules`. A bare `mod x;` is structure, not a path.
#[derive(Default)]
struct Named {
    paths: Vec<(Vec<String>, bool)>,
    test_modules: Vec<Vec<String>>,
}

fn punct(t: &TokenTree, c: char) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == c)
}

fn keyword(t: Option<&TokenTree>, word: &str) -> bool {
    matches!(t, Some(TokenTree::Ident(i)) if *i == word)
}

/// `::` at `at`.
fn path_sep(tts: &[TokenTree], at: usize) -> bool {
    matches!(tts.get(at), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
        && tts.get(at + 1).is_some_and(|t| punct(t, ':'))
}

fn group(tts: &[TokenTree], at: usize, d: Delimiter) -> Option<Vec<TokenTree>> {
    match tts.get(at) {
        Some(TokenTree::Group(g)) if g.delimiter() == d => Some(g.stream().into_iter().collect()),
        _ => None,
    }
}

fn is_cfg_test(attr: &[TokenTree]) -> bool {
    let s: String = attr.iter().map(ToString::to_string).collect();
    s.split_whitespace().collect::<String>() == "cfg(test)"
}

/// Fills `out` with what `tts`, code of `module`, names.
fn scan(tts: &[TokenTree], module: &[String], modules: &BTreeSet<Vec<String>>, out: &mut Named) {
    let mut i = 0;
    // The attributes just read hold `#[cfg(test)]`.
    let mut test = false;
    while i < tts.len() {
        if punct(&tts[i], '#') {
            let at = i + 1 + usize::from(tts.get(i + 1).is_some_and(|t| punct(t, '!')));
            if let Some(attr) = group(tts, at, Delimiter::Bracket) {
                test |= is_cfg_test(&attr);
                scan(&attr, module, modules, out);
                i = at + 1;
                continue;
            }
        }
        // `[pub[(…)]] mod name { … }` or `… mod name;`
        let mut k = i;
        if keyword(tts.get(k), "pub") {
            k += 1;
            if group(tts, k, Delimiter::Parenthesis).is_some() {
                k += 1;
            }
        }
        if keyword(tts.get(k), "mod")
            && let Some(TokenTree::Ident(name)) = tts.get(k + 1)
        {
            let child = [module, &[name.to_string()]].concat();
            if let Some(body) = group(tts, k + 2, Delimiter::Brace) {
                if !test {
                    scan(&body, &child, modules, out);
                }
                (i, test) = (k + 3, false);
                continue;
            }
            if tts.get(k + 2).is_some_and(|t| punct(t, ';')) {
                if test {
                    out.test_modules.push(child);
                }
                (i, test) = (k + 3, false);
                continue;
            }
        }
        test = false;
        match &tts[i] {
            TokenTree::Group(g) => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                scan(&inner, module, modules, out);
            }
            TokenTree::Ident(id) if path_sep(tts, i + 1) => {
                // Not the tail of a longer path (`bridge_core::table::x`) nor a method
                // (`x.table::<T>()`).
                let inside = i >= 2 && path_sep(tts, i - 2) || i >= 1 && punct(&tts[i - 1], '.');
                let first = id.to_string();
                let ours = matches!(first.as_str(), "crate" | "super" | "self")
                    || modules.contains(&[module, &[first]].concat());
                if !inside && ours {
                    let (paths, next) = read_path(tts, i);
                    for (segs, glob) in paths {
                        if let Some(abs) = resolve(module, &segs) {
                            out.paths.push((abs, glob));
                        }
                    }
                    i = next;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The path starting at `start` (`a::b`, `a::{b, c::*}`) as its segments, each marked when it
/// is a glob, and where it ends.
fn read_path(tts: &[TokenTree], start: usize) -> (Vec<(Vec<String>, bool)>, usize) {
    let mut segs = vec![tts[start].to_string()];
    let mut k = start + 1;
    while path_sep(tts, k) {
        match tts.get(k + 2) {
            Some(TokenTree::Ident(id)) => {
                segs.push(id.to_string());
                k += 3;
            }
            Some(t) if punct(t, '*') => return (vec![(segs, true)], k + 3),
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                let mut out = Vec::new();
                for part in inner.split(|t| punct(t, ',')) {
                    match part.first() {
                        Some(t) if punct(t, '*') => out.push((segs.clone(), true)),
                        Some(TokenTree::Ident(_)) => {
                            for (sub, glob) in read_path(part, 0).0 {
                                out.push(([segs.clone(), sub].concat(), glob));
                            }
                        }
                        _ => {}
                    }
                }
                return (out, k + 3);
            }
            _ => break,
        }
    }
    (vec![(segs, false)], k)
}

/// An absolute path (source root first) from `segs` written in `module`: `crate::…`,
/// `super::…`, `self::…`, or a child module's name first.
fn resolve(module: &[String], segs: &[String]) -> Option<Vec<String>> {
    let (first, rest) = segs.split_first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => module[..1].to_vec(),
        "self" => module.to_vec(),
        // In `a/b.rs` and in `a/b/mod.rs` (both module a::b), `super` is `a`.
        "super" => module[..module.len().checked_sub(1).filter(|n| *n > 0)?].to_vec(),
        child => [module, &[child.to_string()]].concat(),
    };
    for s in rest {
        match s.as_str() {
            "super" => {
                base.pop();
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

/// Whether an item's attributes hold `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// The names a module's own file binds at its top level: those it defines (items, inline
/// modules, macros), those it imports with the path each resolves to (`None`: another crate),
/// and its glob imports. A bare `mod x;` binds a child module, a node of its own.
#[derive(Default)]
struct Binds {
    defined: BTreeSet<String>,
    imported: BTreeMap<String, Option<Vec<String>>>,
    globs: Vec<Vec<String>>,
}

fn binds_of(module: &[String], modules: &BTreeSet<Vec<String>>, file: &syn::File) -> Binds {
    let mut b = Binds::default();
    for item in &file.items {
        let name = match item {
            syn::Item::Use(u) => {
                let external = u.leading_colon.is_some();
                use_binds(module, modules, &u.tree, external, &mut Vec::new(), &mut b);
                continue;
            }
            syn::Item::Mod(m) if m.content.is_none() || is_test(&m.attrs) => continue,
            syn::Item::Mod(m) => &m.ident,
            syn::Item::Fn(f) => &f.sig.ident,
            syn::Item::Struct(s) => &s.ident,
            syn::Item::Enum(e) => &e.ident,
            syn::Item::Union(u) => &u.ident,
            syn::Item::Type(t) => &t.ident,
            syn::Item::Const(c) => &c.ident,
            syn::Item::Static(s) => &s.ident,
            syn::Item::Trait(t) => &t.ident,
            syn::Item::TraitAlias(t) => &t.ident,
            syn::Item::Macro(m) => match &m.ident {
                Some(i) => i,
                None => continue,
            },
            syn::Item::ExternCrate(e) => {
                let bound = e.rename.as_ref().map_or(&e.ident, |(_, r)| r);
                b.imported.insert(bound.to_string(), None);
                continue;
            }
            _ => continue,
        };
        b.defined.insert(name.to_string());
    }
    b
}

fn use_binds(
    module: &[String],
    modules: &BTreeSet<Vec<String>>,
    tree: &syn::UseTree,
    external: bool,
    prefix: &mut Vec<String>,
    b: &mut Binds,
) {
    let target = |path: Vec<String>| -> Option<Vec<String>> {
        let first = path.first()?.as_str();
        let ours = matches!(first, "crate" | "super" | "self")
            || modules.contains(&[module, &[first.to_string()]].concat());
        if external || !ours {
            return None;
        }
        resolve(module, &path)
    };
    let leaf = |name: &syn::Ident| -> Vec<String> {
        if name == "self" {
            prefix.clone()
        } else {
            [prefix.as_slice(), &[name.to_string()]].concat()
        }
    };
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_binds(module, modules, &p.tree, external, prefix, b);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let path = leaf(&n.ident);
            if let Some(bound) = path.last().cloned() {
                b.imported.insert(bound, target(path));
            }
        }
        syn::UseTree::Rename(r) => {
            if r.rename != "_" {
                b.imported
                    .insert(r.rename.to_string(), target(leaf(&r.ident)));
            }
        }
        syn::UseTree::Glob(_) => {
            if let Some(t) = target(prefix.clone()) {
                b.globs.push(t);
            }
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_binds(module, modules, t, external, prefix, b);
            }
        }
    }
}

/// The modules of a crate's files, what each file names, and what each module's own file
/// binds: read once, asked at every level.
struct Graph {
    /// Each file, its module and what its code names.
    files: Vec<(String, Vec<String>, Named)>,
    /// Every module: those with a file and the directories above them.
    modules: BTreeSet<Vec<String>>,
    /// Each module's own file (`lib.rs`, `mod.rs`, `a.rs` beside `a/`) and what it binds.
    own: BTreeMap<Vec<String>, (String, Binds)>,
}

/// The graph of `files`, and the files that do not read as Rust. A `main.rs` beside a `lib.rs`
/// is a crate of its own. Files of modules declared `#[cfg(test)]` are left out.
fn graph(files: &[(String, String)]) -> (Graph, Vec<String>) {
    let mut broken = Vec::new();
    let module = |f: &str| -> Vec<String> {
        let beside_lib = f
            .strip_suffix("main.rs")
            .is_some_and(|dir| files.iter().any(|(g, _)| *g == format!("{dir}lib.rs")));
        if beside_lib {
            vec![f.to_string()]
        } else {
            module_of(f)
        }
    };
    let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
    for (f, _) in files {
        let m = module(f);
        for i in 1..=m.len() {
            modules.insert(m[..i].to_vec());
        }
    }
    let mut read = Vec::new();
    for (f, text) in files {
        let m = module(f);
        let tokens = match text.parse::<proc_macro2::TokenStream>() {
            Ok(t) => t,
            Err(e) => {
                broken.push(format!("{f}: does not read as Rust: {e}"));
                continue;
            }
        };
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut named = Named::default();
        scan(&tts, &m, &modules, &mut named);
        read.push((f.clone(), m, named));
    }
    let tests: Vec<Vec<String>> = read
        .iter()
        .flat_map(|(_, _, n)| n.test_modules.clone())
        .collect();
    let is_test_module = |m: &[String]| tests.iter().any(|t| m.starts_with(t));
    read.retain(|(_, m, _)| !is_test_module(m));
    modules.retain(|m| !is_test_module(m));
    let mut own = BTreeMap::new();
    for (f, text) in files {
        let m = module(f);
        if is_test_module(&m) || !read.iter().any(|(g, _, _)| g == f) {
            continue;
        }
        match syn::parse_file(text) {
            Ok(parsed) => {
                let name = f.rsplit('/').next().unwrap_or(f).to_string();
                own.insert(m.clone(), (name, binds_of(&m, &modules, &parsed)));
            }
            Err(e) => broken.push(format!(
                "{f}:{}: does not parse as Rust: {e}",
                e.span().start().line
            )),
        }
    }
    let graph = Graph {
        files: read,
        modules,
        own,
    };
    (graph, broken)
}

/// The module graph at one level: its nodes are the children of `parent` and the parent's own
/// file (named as its file is, `lib.rs`, `mod.rs`). A child's edges go to the children its
/// code names, and to the parent's file when it names an item defined there (`crate::Thing`,
/// `super::shown`, a glob `use super::*`) — to the child a name comes from when the parent's
/// file only imports or re-exports it (`pub use error::SandboxError;`). The parent's file's
/// edges go to the children whose items it names (`use table::Busy;`, `table::Start`, `pub use
/// error::X;`), not to those it only declares (`mod table;`). Edges carry the file that makes
/// them.
fn edges_under(g: &Graph, parent: &[String]) -> BTreeMap<(String, String), String> {
    let (home, binds) = match g.own.get(parent) {
        Some((name, binds)) => (name.clone(), Some(binds)),
        None => ("(parent)".to_string(), None),
    };
    let depth = parent.len();
    // The child of `parent` a path under it lands in, or the parent's own file.
    let node_of = |p: &[String]| -> String {
        if p.len() > depth && g.modules.contains(&p[..=depth]) {
            p[depth].clone()
        } else {
            home.clone()
        }
    };
    let mut edges = BTreeMap::new();
    for (file, m, named) in &g.files {
        if !m.starts_with(parent) {
            continue;
        }
        let from = if m.len() == depth {
            home.clone()
        } else {
            m[depth].clone()
        };
        for (r, glob) in &named.paths {
            if !r.starts_with(parent) {
                continue;
            }
            let to: Vec<String> = if r.len() == depth {
                // `use super::*` from a child.
                if *glob { vec![home.clone()] } else { vec![] }
            } else if g.modules.contains(&r[..=depth]) {
                vec![r[depth].clone()]
            } else if from == home {
                // The parent's file naming its own items.
                vec![]
            } else {
                // An item of the parent's file, or a name it imports.
                let name = &r[depth];
                match binds {
                    None => vec![],
                    Some(b) if b.defined.contains(name) => vec![home.clone()],
                    Some(b) => match b.imported.get(name) {
                        Some(Some(t)) if t.starts_with(parent) => vec![node_of(t)],
                        Some(_) => vec![],
                        None => b
                            .globs
                            .iter()
                            .filter(|t| t.starts_with(parent) && t.len() > depth)
                            .map(|t| node_of(t))
                            .collect(),
                    },
                }
            };
            for to in to {
                if to != from {
                    edges
                        .entry((from.clone(), to))
                        .or_insert_with(|| file.clone());
                }
            }
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

/// Every import cycle, as `parent: a -> b (file), …`, at the top level of each crate and in
/// every module directory, the parent's own file a node among its children. (Between crates
/// Cargo refuses a cycle itself.) A file that does not read as Rust is reported too.
fn import_cycles(files: &[(String, String)]) -> Vec<String> {
    let (g, mut out) = graph(files);
    let parents: BTreeSet<Vec<String>> = g
        .modules
        .iter()
        .filter(|m| {
            g.modules
                .iter()
                .any(|c| c.len() > m.len() && c.starts_with(m))
        })
        .cloned()
        .collect();
    for parent in &parents {
        let edges = edges_under(&g, parent);
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

/// A file's items as Rust, or why not (an offender of the guard that reads it).
fn parsed(f: &str, text: &str) -> Result<syn::File, String> {
    syn::parse_file(text)
        .map_err(|e| format!("{f}:{}: does not parse as Rust: {e}", e.span().start().line))
}

/// The source text a node spans (from `from`'s start to `to`'s end), on one line.
fn source_of(text: &str, from: proc_macro2::Span, to: proc_macro2::Span) -> String {
    let (a, b) = (from.start(), to.end());
    let mut out = String::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .skip(a.line - 1)
        .take(b.line + 1 - a.line)
    {
        let chars: Vec<char> = line.chars().collect();
        let lo = if n + 1 == a.line { a.column } else { 0 };
        let hi = if n + 1 == b.line {
            b.column
        } else {
            chars.len()
        };
        out.extend(&chars[lo.min(chars.len())..hi.min(chars.len())]);
        out.push(' ');
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where an item with `vis` and `sig` starts (its visibility, else its signature).
fn fn_start(vis: &syn::Visibility, sig: &syn::Signature) -> proc_macro2::Span {
    use syn::spanned::Spanned;
    match vis {
        syn::Visibility::Inherited => sig.span(),
        v => v.span(),
    }
}

/// The crate a source file belongs to: its source root.
fn crate_of(f: &str) -> String {
    module_of(f).swap_remove(0)
}

/// The library crates' `pub async fn`s (fully `pub`: `unreachable_pub` makes that an item
/// another crate reaches), and their `pub fn`s returning `Boxed` that are not
/// `#[inline(never)]`: an async entry point another crate awaits returns
/// `bridge_core::boxed::Boxed` from a plain, never-inlined fn, so that its body is compiled
/// once, in its own crate (core/boxed.rs). The top crate (`src/`) has nobody above it.
fn unboxed_entry_points(files: &[(String, String)]) -> Vec<String> {
    struct Sites<'a> {
        file: &'a str,
        text: &'a str,
        out: Vec<String>,
    }
    impl Sites<'_> {
        fn check(&mut self, attrs: &[syn::Attribute], vis: &syn::Visibility, sig: &syn::Signature) {
            use syn::spanned::Spanned;
            if !matches!(vis, syn::Visibility::Public(_)) {
                return;
            }
            let start = fn_start(vis, sig);
            let shown = source_of(self.text, start, sig.span());
            let line = start.start().line;
            let boxed = matches!(&sig.output, syn::ReturnType::Type(_, ty)
                if matches!(&**ty, syn::Type::Path(p)
                    if p.path.segments.last().is_some_and(|s| s.ident == "Boxed")));
            let never = attrs.iter().any(|a| {
                a.path().is_ident("inline")
                    && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "never")
            });
            if sig.asyncness.is_some() {
                self.out.push(format!(
                    "{}:{line}: {shown}: a pub async fn (return Boxed from a plain #[inline(never)] fn)",
                    self.file
                ));
            } else if boxed && !never {
                self.out.push(format!(
                    "{}:{line}: {shown}: returns Boxed but is not #[inline(never)]",
                    self.file
                ));
            }
        }
    }
    impl<'ast> Visit<'ast> for Sites<'_> {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.check(&f.attrs, &f.vis, &f.sig);
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.check(&f.attrs, &f.vis, &f.sig);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    let mut out = Vec::new();
    for (f, text) in files {
        if !f.starts_with("crates/") {
            continue;
        }
        match parsed(f, text) {
            Ok(file) => {
                let mut sites = Sites {
                    file: f,
                    text,
                    out: Vec::new(),
                };
                sites.visit_file(&file);
                out.extend(sites.out);
            }
            Err(e) => out.push(e),
        }
    }
    out
}

/// Whether a type is a string: `String` (by any path), `&str`, `Box<str>` and the like.
fn is_string(ty: &syn::Type) -> bool {
    let is_str = |t: &syn::Type| matches!(t, syn::Type::Path(p) if p.qself.is_none() && p.path.is_ident("str"));
    match ty {
        syn::Type::Paren(p) => is_string(&p.elem),
        syn::Type::Group(g) => is_string(&g.elem),
        syn::Type::Reference(r) => is_str(&r.elem),
        syn::Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            match &last.arguments {
                syn::PathArguments::None => last.ident == "String",
                syn::PathArguments::AngleBracketed(a)
                    if ["Box", "Arc", "Rc", "Cow"].iter().any(|w| last.ident == w) =>
                {
                    let tys = type_args(a);
                    tys.len() == 1 && is_str(tys[0])
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// The types among a path segment's generic arguments (lifetimes and constants left out).
fn type_args(a: &syn::AngleBracketedGenericArguments) -> Vec<&syn::Type> {
    a.args
        .iter()
        .filter_map(|g| match g {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// Whether a `Result<_, E>` whose `E` is a string appears anywhere in a node (nested in
/// `Option`, a `Box<dyn Future<Output = …>>`, `Boxed<'_, …>`, a closure's bound).
#[derive(Default)]
struct StringResult(bool);

impl<'ast> Visit<'ast> for StringResult {
    fn visit_path_segment(&mut self, s: &'ast syn::PathSegment) {
        if s.ident == "Result"
            && let syn::PathArguments::AngleBracketed(a) = &s.arguments
        {
            let tys = type_args(a);
            self.0 |= tys.len() == 2 && is_string(tys[1]);
        }
        syn::visit::visit_path_segment(self, s);
    }
}

/// Where a string is the error of a `Result`: in the signature (inputs and output) of a fn or
/// method that is not private, of a trait's method whatever its visibility, in a field of any
/// struct, union or enum variant, and in a type alias. Code under `#[cfg(test)]` modules is
/// left out.
fn string_errors(files: &[(String, String)]) -> Vec<String> {
    struct Sites<'a> {
        file: &'a str,
        text: &'a str,
        owner: String,
        out: Vec<String>,
    }
    impl Sites<'_> {
        fn sig(&mut self, vis: &syn::Visibility, sig: &syn::Signature) {
            use syn::spanned::Spanned;
            let mut found = StringResult::default();
            found.visit_signature(sig);
            if found.0 {
                let start = fn_start(vis, sig);
                let shown = source_of(self.text, start, sig.span());
                self.out
                    .push(format!("{}:{}: {shown}", self.file, start.start().line));
            }
        }
    }
    impl<'ast> Visit<'ast> for Sites<'_> {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if !matches!(f.vis, syn::Visibility::Inherited) {
                self.sig(&f.vis, &f.sig);
            }
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if !matches!(f.vis, syn::Visibility::Inherited) {
                self.sig(&f.vis, &f.sig);
            }
            syn::visit::visit_impl_item_fn(self, f);
        }
        fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
            self.sig(&syn::Visibility::Inherited, &f.sig);
            syn::visit::visit_trait_item_fn(self, f);
        }
        fn visit_item_type(&mut self, t: &'ast syn::ItemType) {
            use syn::spanned::Spanned;
            let mut found = StringResult::default();
            found.visit_type(&t.ty);
            if found.0 {
                let start = match &t.vis {
                    syn::Visibility::Inherited => t.type_token.span,
                    v => v.span(),
                };
                let shown = source_of(self.text, start, t.semi_token.span);
                self.out
                    .push(format!("{}:{}: {shown}", self.file, start.start().line));
            }
            syn::visit::visit_item_type(self, t);
        }
        fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
            let outer = std::mem::replace(&mut self.owner, s.ident.to_string());
            syn::visit::visit_item_struct(self, s);
            self.owner = outer;
        }
        fn visit_item_union(&mut self, u: &'ast syn::ItemUnion) {
            let outer = std::mem::replace(&mut self.owner, u.ident.to_string());
            syn::visit::visit_item_union(self, u);
            self.owner = outer;
        }
        fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
            let outer = std::mem::replace(&mut self.owner, e.ident.to_string());
            syn::visit::visit_item_enum(self, e);
            self.owner = outer;
        }
        fn visit_variant(&mut self, v: &'ast syn::Variant) {
            let outer = self.owner.clone();
            self.owner = format!("{outer}::{}", v.ident);
            syn::visit::visit_variant(self, v);
            self.owner = outer;
        }
        fn visit_field(&mut self, f: &'ast syn::Field) {
            use syn::spanned::Spanned;
            let mut found = StringResult::default();
            found.visit_type(&f.ty);
            if found.0 {
                let start = match (&f.vis, &f.ident) {
                    (syn::Visibility::Inherited, Some(i)) => i.span(),
                    (syn::Visibility::Inherited, None) => f.ty.span(),
                    (v, _) => v.span(),
                };
                let shown = source_of(self.text, start, f.ty.span());
                self.out.push(format!(
                    "{}:{}: field of {}: {shown}",
                    self.file,
                    start.start().line,
                    self.owner
                ));
            }
            syn::visit::visit_field(self, f);
        }
    }
    let mut out = Vec::new();
    for (f, text) in files {
        match parsed(f, text) {
            Ok(file) => {
                let mut sites = Sites {
                    file: f,
                    text,
                    owner: String::new(),
                    out: Vec::new(),
                };
                sites.visit_file(&file);
                out.extend(sites.out);
            }
            Err(e) => out.push(e),
        }
    }
    out
}

/// Error types that are a string in a wrapper: a struct whose one field is a string and that
/// derives `Error` or implements it (`impl Error for X`, `impl std::error::Error for X`)
/// anywhere in its crate. Code under `#[cfg(test)]` modules is left out.
fn string_newtype_errors(files: &[(String, String)]) -> Vec<String> {
    #[derive(Default)]
    struct Items<'ast> {
        structs: Vec<&'ast syn::ItemStruct>,
        errors: BTreeSet<String>,
    }
    impl<'ast> Visit<'ast> for Items<'ast> {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
            self.structs.push(s);
            syn::visit::visit_item_struct(self, s);
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            let error_trait = i.trait_.as_ref().is_some_and(|(_, path, _)| {
                let names: Vec<String> =
                    path.segments.iter().map(|s| s.ident.to_string()).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                matches!(
                    names.as_slice(),
                    ["Error"] | ["error", "Error"] | ["std" | "core", "error", "Error"]
                )
            });
            if error_trait
                && let syn::Type::Path(p) = &*i.self_ty
                && let Some(last) = p.path.segments.last()
            {
                self.errors.insert(last.ident.to_string());
            }
            syn::visit::visit_item_impl(self, i);
        }
    }
    let mut out = Vec::new();
    let mut read: Vec<(&str, &str, syn::File)> = Vec::new();
    for (f, text) in files {
        match parsed(f, text) {
            Ok(file) => read.push((f, text, file)),
            Err(e) => out.push(e),
        }
    }
    let items: Vec<(&str, &str, Items)> = read
        .iter()
        .map(|(f, text, file)| {
            let mut items = Items::default();
            items.visit_file(file);
            (*f, *text, items)
        })
        .collect();
    for (f, text, found) in &items {
        let implemented: BTreeSet<&String> = items
            .iter()
            .filter(|(g, _, _)| crate_of(g) == crate_of(f))
            .flat_map(|(_, _, i)| &i.errors)
            .collect();
        for s in &found.structs {
            let mut fields = s.fields.iter();
            let one_string =
                fields.next().is_some_and(|field| is_string(&field.ty)) && fields.next().is_none();
            let derives = s.attrs.iter().any(|a| {
                a.path().is_ident("derive")
                    && a.parse_args_with(
                        syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated,
                    )
                    .is_ok_and(|paths| {
                        paths
                            .iter()
                            .any(|p| p.segments.last().is_some_and(|l| l.ident == "Error"))
                    })
            });
            if one_string && (derives || implemented.contains(&s.ident.to_string())) {
                let line = s.struct_token.span.start().line;
                let shown = text.lines().nth(line - 1).unwrap_or("").trim();
                out.push(format!("{f}:{line}: {shown}"));
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
        "rule: no string as a Result's error in a signature that is not private, a trait's method, a field or a type alias (an error that crosses a module is a type)",
        &string_errors(&sources()),
    );
}

#[test]
fn every_async_entry_point_of_a_lower_crate_is_boxed() {
    report(
        "rule: a library crate's async entry point returns bridge_core::boxed::Boxed from a plain #[inline(never)] fn, not as a pub async fn (whose body every crate that awaits it compiles again)",
        &unboxed_entry_points(&sources()),
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
    // Through a crate's root or a module's own file: its items, not its re-exports.
    let planted = [
        // `crate::Thing` is lib.rs's own; lib.rs names `child::X`.
        (
            "crates/skills/src/lib.rs",
            "mod child;\nmod table;\nuse child::X;\npub struct Thing;\npub(crate) fn helper() {}\n",
        ),
        (
            "crates/skills/src/child.rs",
            "pub struct X;\nfn f() -> crate::Thing {\n    crate::Thing\n}\n",
        ),
        // lib.rs only declares `mod table;`: no edge back.
        ("crates/skills/src/table.rs", "fn f() {\n    crate::helper()\n}\n"),
        // `crate::PackageError` is error's, re-exported: session -> error, not -> lib.rs.
        (
            "crates/packages/src/lib.rs",
            "mod error;\nmod session;\npub use error::PackageError;\npub use self::session::Installed;\n",
        ),
        (
            "crates/packages/src/session.rs",
            "pub struct Installed;\nfn f() -> crate::PackageError {\n    todo!()\n}\n",
        ),
        ("crates/packages/src/error.rs", "pub struct PackageError;\n"),
        // A glob `use super::*` outside the tests; the ones in tests, and a test module's
        // file, are not edges.
        (
            "crates/upstream/src/pool/mod.rs",
            "mod quiet;\nmod slot;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nuse tests::Fixture;\nuse quiet::Q;\nuse slot::Slot;\npub struct Pool;\n",
        ),
        ("crates/upstream/src/pool/slot.rs", "use super::*;\npub struct Slot;\n"),
        (
            "crates/upstream/src/pool/quiet.rs",
            "pub struct Q;\n#[cfg(test)]\nmod tests {\n    use super::super::*;\n}\n",
        ),
        ("crates/upstream/src/pool/tests.rs", "use super::*;\npub struct Fixture;\n"),
        // `super::shown` from a child whose item mod.rs re-exports.
        (
            "crates/upstream/src/schema/mod.rs",
            "mod render;\npub use render::Rendered;\npub(crate) fn shown() {}\n",
        ),
        (
            "crates/upstream/src/schema/render.rs",
            "pub struct Rendered;\nfn f() {\n    super::shown()\n}\n",
        ),
        // `self::table::Start` in a macro's arguments; `crate::{Engine, …}` in a list; a
        // comment and a string are not code.
        (
            "crates/sandbox/src/lib.rs",
            "mod table;\npub(crate) struct Engine;\nfn f() {\n    // table::Gone\n    let _ = format!(\"{:?} table::Said\", self::table::Start);\n}\n",
        ),
        (
            "crates/sandbox/src/table.rs",
            "use crate::{Engine, other::Y};\npub struct Start;\n",
        ),
    ]
    .map(|(f, t)| (f.to_string(), t.to_string()));
    assert_eq!(
        import_cycles(&planted),
        [
            "crates/sandbox/src: lib.rs -> table (crates/sandbox/src/lib.rs), table -> lib.rs (crates/sandbox/src/table.rs)",
            "crates/skills/src: child -> lib.rs (crates/skills/src/child.rs), lib.rs -> child (crates/skills/src/lib.rs)",
            "crates/upstream/src/pool: mod.rs -> slot (crates/upstream/src/pool/mod.rs), slot -> mod.rs (crates/upstream/src/pool/slot.rs)",
            "crates/upstream/src/schema: mod.rs -> render (crates/upstream/src/schema/mod.rs), render -> mod.rs (crates/upstream/src/schema/render.rs)",
        ]
    );
    let sigs = vec![(
        "src/a.rs".to_string(),
        r#"pub async fn rename(
    docker: &Docker,
    id: &str,
) -> Result<(), String> {
}
fn private() -> Result<(), String> {}
pub fn typed() -> Result<(), Error> {}
pub(crate) fn nested(f: impl Fn() -> Option<Result<u8, std::string::String>>) {}
pub struct S;
impl S {
    pub(crate) fn boxed(&self) -> Boxed<'_, Result<(), Box<str>>> { todo!() }
    fn private(&self) -> Result<(), String> { todo!() }
}
pub fn future() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> { todo!() }
pub struct Reply {
    pub done: Result<(), String>,
}
enum Event {
    Ended(oneshot::Sender<Result<u32, String>>),
}
trait Elicit {
    fn ask(&self) -> Result<Answer, String>;
}
/// Documented.
pub(crate) type R = Result<u8, &'static str>;
impl Elicit for S {
    fn ask(&self) -> Result<Answer, String> { todo!() }
}
#[cfg(test)]
mod tests {
    pub fn helper() -> Result<(), String> { Ok(()) }
}
"#
        .to_string(),
    )];
    assert_eq!(
        string_errors(&sigs),
        [
            "src/a.rs:1: pub async fn rename( docker: &Docker, id: &str, ) -> Result<(), String>",
            "src/a.rs:8: pub(crate) fn nested(f: impl Fn() -> Option<Result<u8, std::string::String>>)",
            "src/a.rs:11: pub(crate) fn boxed(&self) -> Boxed<'_, Result<(), Box<str>>>",
            "src/a.rs:14: pub fn future() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>",
            "src/a.rs:16: field of Reply: pub done: Result<(), String>",
            "src/a.rs:19: field of Event::Ended: oneshot::Sender<Result<u32, String>>",
            "src/a.rs:22: fn ask(&self) -> Result<Answer, String>",
            "src/a.rs:25: pub(crate) type R = Result<u8, &'static str>;",
        ]
    );
    assert_eq!(
        string_newtype_errors(&[
            (
                "src/e.rs".to_string(),
                "/// Why.\n#[derive(Debug, thiserror::Error)]\n#[error(\"{0}\")]\npub struct Refused(pub String);\npub struct Name(String);\nstruct ByHand(String);\nimpl std::error::Error for ByHand {}\npub struct Typed(pub Kind);\npub struct Elsewhere {\n    reason: Box<str>,\n}\n".to_string(),
            ),
            // Implemented in another file of the crate; `Name` in another crate is another type.
            ("src/f.rs".to_string(), "impl Error for Elsewhere {}\n".to_string()),
            ("crates/core/src/g.rs".to_string(), "impl Error for Name {}\n".to_string()),
        ]),
        [
            "src/e.rs:4: pub struct Refused(pub String);",
            "src/e.rs:6: struct ByHand(String);",
            "src/e.rs:9: pub struct Elsewhere {",
        ]
    );
    assert_eq!(
        unboxed_entry_points(&[
            (
                "crates/sandbox/src/lib.rs".to_string(),
                "pub async fn run() {}\npub(crate) async fn inner() {}\npub struct S;\nimpl S {\n    pub async fn method(&self) {}\n    /// Boxed.\n    #[inline(never)]\n    pub fn boxed(&self) -> Boxed<'_, ()> {\n        todo!()\n    }\n    pub fn unmarked(&self) -> bridge_core::boxed::Boxed<'_, ()> {\n        todo!()\n    }\n    async fn private(&self) {}\n}\n#[cfg(test)]\nmod tests {\n    pub async fn helper() {}\n}\n".to_string(),
            ),
            // Nothing is above the top crate.
            ("src/lib.rs".to_string(), "pub async fn top() {}\n".to_string()),
        ]),
        [
            "crates/sandbox/src/lib.rs:1: pub async fn run(): a pub async fn (return Boxed from a plain #[inline(never)] fn)",
            "crates/sandbox/src/lib.rs:5: pub async fn method(&self): a pub async fn (return Boxed from a plain #[inline(never)] fn)",
            "crates/sandbox/src/lib.rs:11: pub fn unmarked(&self) -> bridge_core::boxed::Boxed<'_, ()>: returns Boxed but is not #[inline(never)]",
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
