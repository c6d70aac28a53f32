//! The catalog of upstream tools: Python-safe aliases, tool docs, and fuzzy ranked search.
//!
//! Aliases are made here and only here (the runtime uses them as given): lowercase, every run of
//! characters other than `[a-z0-9_]` becomes one `_`, a leading digit gets a `_` prefix, a Python
//! keyword gets a `_` suffix, an empty result becomes `server` / `tool`, and duplicates are
//! numbered `_2`, `_3`, ... in order.

use std::collections::HashSet;
use std::sync::Arc;

use nucleo_matcher::pattern::{AtomKind, CaseMatching, Normalization};
use nucleo_matcher::{Config, Matcher, Utf32Str};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::schema::{Rendering, Schemas, render};
use bridge_core::error::{Hint, Hinted};
use bridge_core::protocol::ToolMeta;

/// Python's hard keywords (3.14), lowercase ones only (aliases are lowercase).
pub const PYTHON_KEYWORDS: &[&str] = &[
    "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif",
    "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda",
    "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// One name made into a Python identifier (without de-duplication).
pub fn sanitize_identifier(name: &str, default: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut pending_sep = false;
    for c in name.trim().chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
            if pending_sep {
                out.push('_');
                pending_sep = false;
            }
            out.push(c);
        } else {
            pending_sep = true;
        }
    }
    if pending_sep {
        out.push('_');
    }
    if out.is_empty() {
        out.push_str(default);
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if PYTHON_KEYWORDS.contains(&out.as_str()) {
        out.push('_');
    }
    out
}

/// Aliases for a list of names, in order, unique within the list.
pub fn assign_aliases<'a>(names: impl IntoIterator<Item = &'a str>, default: &str) -> Vec<String> {
    let mut used = HashSet::new();
    names
        .into_iter()
        .map(|name| {
            let base = sanitize_identifier(name, default);
            let mut alias = base.clone();
            let mut n = 1;
            while !used.insert(alias.clone()) {
                n += 1;
                alias = format!("{base}_{n}");
            }
            alias
        })
        .collect()
}

/// One tool of one server, with its alias.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEntry {
    /// The tool's name as the server lists it (what a call sends).
    pub name: String,
    /// The name as a Python identifier, unique among the server's tools (see the module docs).
    pub alias: String,
    /// The tool's description, else its title, else its annotations' title; `None` without any.
    pub description: Option<String>,
    /// The tool's JSON Schema for its arguments, as the server gave it.
    pub input_schema: Value,
    /// The tool's JSON Schema for its structured result, when the server gives one.
    pub output_schema: Option<Value>,
    /// The input schema as the model reads it ([`crate::schema::render`]).
    pub rendering: Arc<Rendering>,
    /// The same, as the runtime gets it.
    pub rendering_json: Arc<Value>,
}

impl ToolEntry {
    fn rendering_json(&self) -> Option<Arc<Value>> {
        Some(self.rendering_json.clone())
    }
}

/// The tools of one server (hydrated), with the server's identity.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTools {
    /// The server's name.
    pub server: String,
    /// The server's alias (`mcp_<alias>` in the sandbox).
    pub server_alias: String,
    /// The description from the server's definition, if any.
    pub server_description: Option<String>,
    /// Its tools, in the order the server lists them.
    pub tools: Vec<ToolEntry>,
}

/// How much of a tool's docs to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Name, alias, description and the parameters as `help()` shows them.
    Summary,
    /// The summary and the tool's input and output JSON Schemas as the server gave them.
    Full,
}

impl Detail {
    /// `"summary"` (also the default for anything unknown) or `"full"`.
    pub fn parse(s: Option<&str>) -> Detail {
        match s.map(|s| s.trim().to_ascii_lowercase()) {
            Some(s) if s == "full" => Detail::Full,
            _ => Detail::Summary,
        }
    }
}

impl ServerTools {
    /// Build from an upstream's `tools/list` (in the server's order; aliases are numbered in that
    /// order), with the renderings of `schemas` when they are of this list (else rendered now).
    pub fn from_tools(
        server: &str,
        server_alias: &str,
        server_description: Option<&str>,
        tools: &[rmcp::model::Tool],
        schemas: Option<&Schemas>,
    ) -> ServerTools {
        let aliases = assign_aliases(tools.iter().map(|t| t.name.as_ref()), "tool");
        let tools = tools
            .iter()
            .zip(aliases)
            .enumerate()
            .map(|(i, (t, alias))| {
                let (rendering, rendering_json) = match schemas
                    .and_then(|s| Some((s.rendering(i)?, s.rendering_json(i)?)))
                {
                    Some((r, j)) => (r.clone(), j.clone()),
                    None => {
                        let r = render(&Value::Object((*t.input_schema).clone()), server, &t.name);
                        let j = Arc::new(r.to_json());
                        (Arc::new(r), j)
                    }
                };
                ToolEntry {
                    rendering,
                    rendering_json,
                    name: t.name.to_string(),
                    alias,
                    description: t
                        .description
                        .as_ref()
                        .map(|d| d.to_string())
                        .or_else(|| t.title.clone())
                        .or_else(|| t.annotations.as_ref().and_then(|a| a.title.clone())),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    output_schema: t
                        .output_schema
                        .as_ref()
                        .map(|s| Value::Object((**s).clone())),
                }
            })
            .collect();
        ServerTools {
            server: server.to_string(),
            server_alias: server_alias.to_string(),
            server_description: server_description.map(str::to_string),
            tools,
        }
    }

    /// A tool by name or alias (case-insensitive; `-` and `_` interchangeable as a last resort).
    pub fn find(&self, tool: &str) -> Option<&ToolEntry> {
        self.tools
            .iter()
            .find(|t| t.name == tool)
            .or_else(|| self.tools.iter().find(|t| t.alias == tool))
            .or_else(|| {
                let lower = tool.to_lowercase();
                self.tools
                    .iter()
                    .find(|t| t.name.to_lowercase() == lower || t.alias == lower)
            })
            .or_else(|| {
                let want = sanitize_identifier(tool, "tool");
                self.tools
                    .iter()
                    .find(|t| sanitize_identifier(&t.name, "tool") == want)
            })
    }

    /// The metadata sent with an exec.
    pub fn tool_meta(&self) -> Vec<ToolMeta> {
        self.tools
            .iter()
            .map(|t| ToolMeta {
                name: t.name.clone(),
                alias: t.alias.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
                output_schema: t.output_schema.clone(),
                policy: None,
                flows: None,
                rendering: t.rendering_json(),
            })
            .collect()
    }

    /// The metadata sent with an exec, moved out rather than cloned: `bind` builds a catalog
    /// per loaded server per call only for this, and a second deep copy of every schema was a
    /// quarter of the bridge's CPU on calls that load servers (see BENCHMARKS.md).
    pub fn into_tool_meta(self) -> Vec<ToolMeta> {
        self.tools
            .into_iter()
            .map(|t| ToolMeta {
                rendering: t.rendering_json(),
                name: t.name,
                alias: t.alias,
                description: t.description,
                input_schema: t.input_schema,
                output_schema: t.output_schema,
                policy: None,
                flows: None,
            })
            .collect()
    }

    /// `{name, alias, description}` of every tool (the `list_tools` RPC).
    pub fn list(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("name".into(), json!(t.name));
                o.insert("alias".into(), json!(t.alias));
                if let Some(d) = &t.description {
                    o.insert("description".into(), json!(d));
                }
                Value::Object(o)
            })
            .collect()
    }

    /// The doc of one tool.
    pub fn doc(&self, t: &ToolEntry, detail: Detail) -> Value {
        let mut o = Map::new();
        o.insert("server".into(), json!(self.server));
        o.insert("serverAlias".into(), json!(self.server_alias));
        o.insert("tool".into(), json!(t.name));
        o.insert("toolAlias".into(), json!(t.alias));
        if let Some(d) = &t.description {
            o.insert("description".into(), json!(d));
        }
        // The parameters as help() shows them: types, allowed values, bounds, nested types.
        o.insert("parameters".into(), json!(t.rendering.text()));
        if detail == Detail::Full {
            o.insert("inputSchema".into(), t.input_schema.clone());
            if let Some(s) = &t.output_schema {
                o.insert("outputSchema".into(), s.clone());
            }
        }
        Value::Object(o)
    }

    /// Docs of every tool, or of the one named (error naming the known tools otherwise).
    pub fn docs(&self, tool: Option<&str>, detail: Detail) -> Result<Vec<Value>, UnknownTool> {
        match tool {
            None => Ok(self.tools.iter().map(|t| self.doc(t, detail)).collect()),
            Some(name) => match self.find(name) {
                Some(t) => Ok(vec![self.doc(t, detail)]),
                None => Err(UnknownTool {
                    tool: name.to_string(),
                    server: self.server.clone(),
                    known: self.tools.iter().map(|t| t.name.clone()).collect(),
                }),
            },
        }
    }
}

/// A tool asked for by a name no tool of the server has.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("Tool '{tool}' not found on server '{server}'")]
pub struct UnknownTool {
    /// The name asked for.
    pub tool: String,
    /// The server it was asked of.
    pub server: String,
    /// The server's tools, by name.
    pub known: Vec<String>,
}

impl Hinted for UnknownTool {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(format!(
            "its tools are: {}",
            self.known.join(", ")
        )))
    }
}

/// A proxied call of a name the server's current tool list does not have (nor as an alias, in
/// another case, or spelled as a Python identifier). It is refused rather than passed on: a
/// server that matches names leniently (Unicode normalization, invisible characters, case,
/// `-`/`_`) could run a tool the policy never judged.
#[derive(Debug, thiserror::Error)]
#[error(
    "Tool {tool:?} is not in the tool list of server '{server}' (listed just now); only the tools it lists are called, by their listed names"
)]
pub struct Unlisted {
    /// The server's name.
    pub server: String,
    /// The name as the code gave it, cut at [`MAX_ECHOED_NAME`] characters.
    pub tool: String,
    /// The listed names nearest to it, nearest first.
    pub closest: Vec<String>,
    /// How many tools the server lists.
    pub listed: usize,
}

/// The most characters of a made-up tool name echoed back in an error.
const MAX_ECHOED_NAME: usize = 200;
/// Listed names suggested for an unlisted one.
const CLOSEST: usize = 3;
/// Characters of each name compared for the suggestion: it costs names × this², whatever
/// length of name the code sends.
const COMPARED_CHARS: usize = 32;

impl Unlisted {
    /// The refusal of `tool`, a name not among `tools`, the list of `server`.
    pub(crate) fn new(server: &str, tool: &str, tools: &[rmcp::model::Tool]) -> Unlisted {
        Unlisted {
            server: server.to_string(),
            tool: tool.chars().take(MAX_ECHOED_NAME).collect(),
            closest: closest_names(tool, tools.iter().map(|t| t.name.as_ref())),
            listed: tools.len(),
        }
    }
}

/// The listed names most like `wanted` (at most [`CLOSEST`]), for the hint only: names are
/// compared folded (fullwidth forms as ASCII, lower case, letters and digits only); the call
/// itself never goes by this.
fn closest_names<'a>(wanted: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    fn fold(s: &str) -> String {
        s.chars()
            .map(|c| match c {
                // The fullwidth forms of ASCII '!'..'~'.
                '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
                c => c,
            })
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .take(COMPARED_CHARS)
            .collect()
    }
    let wanted = fold(wanted);
    let mut scored: Vec<(f64, &str)> = names
        .map(|n| (strsim::normalized_levenshtein(&wanted, &fold(n)), n))
        .filter(|(score, _)| *score > 0.0)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
        .into_iter()
        .take(CLOSEST)
        .map(|(_, n)| n.to_string())
        .collect()
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchHit {
    /// The server's name.
    pub server: String,
    /// The server's alias (`mcp_<alias>` in the sandbox).
    pub server_alias: String,
    /// The tool's name as the server lists it.
    pub tool: String,
    /// The tool's alias, its function's name under the server's module.
    pub tool_alias: String,
    /// The tool's description, if it has one (left out of the JSON otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Relevance, higher is better (about 0..1: the weighted share of the query's words matched).
    pub score: f64,
}

/// Words that carry no meaning in a query ("current time in a timezone").
const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "in", "on", "of", "for", "to", "at", "by", "with", "from", "into", "and",
    "or", "is", "are", "be", "it", "its", "this", "that", "my", "me", "i", "some", "any", "all",
    "how", "what", "which", "do", "does", "can", "get", "via", "using", "use",
];

/// Field weights: names rank above descriptions.
const W_TOOL_NAME: f64 = 1.0;
const W_SERVER_NAME: f64 = 0.7;
const W_PARAM_NAME: f64 = 0.75;
const W_DESCRIPTION: f64 = 0.55;
const W_PARAM_DESCRIPTION: f64 = 0.35;
const W_SERVER_DESCRIPTION: f64 = 0.3;
/// A token matching below this share of its perfect score is noise (letters scattered over a
/// long description).
const MIN_QUALITY: f64 = 0.45;
/// Hits scoring below this share of the best hit are dropped.
const RELATIVE_CUTOFF: f64 = 0.4;

fn tokenize(query: &str) -> Vec<String> {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect();
    let meaningful: Vec<String> = words
        .iter()
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .cloned()
        .collect();
    let mut out = if meaningful.is_empty() {
        words
    } else {
        meaningful
    };
    for w in &mut out {
        // A light stemmer: plural `s` (not `ss`), so "files" finds "file".
        if w.len() > 4 && w.ends_with('s') && !w.ends_with("ss") {
            w.pop();
        }
    }
    let mut seen = HashSet::new();
    out.retain(|w| seen.insert(w.clone()));
    out
}

/// `getCurrentTime` / `get-current_time` -> `get current time` (word boundaries for the matcher).
fn words_of(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev_lower = false;
    for c in name.chars() {
        if c == '_' || c == '-' || c == '.' || c == '/' {
            out.push(' ');
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            out.push(' ');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        out.extend(c.to_lowercase());
    }
    out
}

struct Scorer {
    matcher: Matcher,
    buf: Vec<char>,
}

impl Scorer {
    fn new() -> Self {
        Scorer {
            matcher: Matcher::new(Config::DEFAULT),
            buf: Vec::new(),
        }
    }

    fn raw(&mut self, token: &str, haystack: &str) -> Option<u16> {
        let atom = nucleo_matcher::pattern::Atom::new(
            token,
            CaseMatching::Ignore,
            Normalization::Smart,
            AtomKind::Fuzzy,
            false,
        );
        atom.score(Utf32Str::new(haystack, &mut self.buf), &mut self.matcher)
    }

    /// 0..1: how well `token` matches `haystack`, relative to a perfect match.
    fn quality(&mut self, token: &str, perfect: f64, haystack: &str) -> f64 {
        if haystack.is_empty() {
            return 0.0;
        }
        let q = self
            .raw(token, haystack)
            .map(|s| s as f64 / perfect)
            .unwrap_or(0.0)
            .min(1.0);
        if q < MIN_QUALITY { 0.0 } else { q }
    }
}

/// The searchable text of one tool.
struct Doc<'a> {
    server: &'a ServerTools,
    tool: &'a ToolEntry,
    fields: Vec<(String, f64)>,
}

fn doc_fields(server: &ServerTools, tool: &ToolEntry) -> Vec<(String, f64)> {
    let mut fields = vec![
        (words_of(&tool.name), W_TOOL_NAME),
        (
            format!(
                "{} {}",
                words_of(&server.server),
                words_of(&server.server_alias)
            ),
            W_SERVER_NAME,
        ),
    ];
    let props = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    if let Some(props) = props {
        let names: Vec<String> = props.keys().map(|k| words_of(k)).collect();
        fields.push((names.join(" "), W_PARAM_NAME));
    }
    // The rendering help() shows, without the top-level names matched above: allowed values,
    // nested fields and types, descriptions.
    let text: Vec<String> = tool
        .rendering
        .params
        .iter()
        .map(|p| p.line.to_lowercase())
        .chain(tool.rendering.types.iter().map(|l| l.to_lowercase()))
        .collect();
    if !text.is_empty() {
        fields.push((text.join(" ; "), W_PARAM_DESCRIPTION));
    }
    if let Some(d) = &tool.description {
        fields.push((d.to_lowercase(), W_DESCRIPTION));
    }
    if let Some(d) = &server.server_description {
        fields.push((d.to_lowercase(), W_SERVER_DESCRIPTION));
    }
    fields
}

/// Rank the tools of `catalogs` against `query`; at most `limit` hits, best first. A tool
/// matching no word of the query is not a hit.
pub fn search(catalogs: &[&ServerTools], query: &str, limit: usize) -> Vec<SearchHit> {
    let tokens = tokenize(query);
    if tokens.is_empty() || limit == 0 {
        return Vec::new();
    }
    let mut scorer = Scorer::new();
    let perfect: Vec<f64> = tokens
        .iter()
        .map(|t| scorer.raw(t, t).map(f64::from).unwrap_or(1.0).max(1.0))
        .collect();
    let whole = tokens.join(" ");
    let whole_perfect = scorer
        .raw(&whole.replace(' ', ""), &whole.replace(' ', ""))
        .map(f64::from)
        .unwrap_or(1.0);

    let docs: Vec<Doc> = catalogs
        .iter()
        .flat_map(|s| {
            s.tools.iter().map(move |t| Doc {
                server: s,
                tool: t,
                fields: doc_fields(s, t),
            })
        })
        .collect();

    let mut hits: Vec<SearchHit> = Vec::new();
    for doc in &docs {
        let mut total = 0.0;
        for (token, perfect) in tokens.iter().zip(&perfect) {
            let mut best: f64 = 0.0;
            for (text, weight) in &doc.fields {
                let q = scorer.quality(token, *perfect, text);
                best = best.max(q * weight);
            }
            total += best;
        }
        if total <= 0.0 {
            continue;
        }
        let mut score = total / tokens.len() as f64;
        // A query that spells the tool's name (`currenttime`, `get current time`) gets a bonus.
        if tokens.len() > 1 || whole.len() > 3 {
            let compact_name = words_of(&doc.tool.name).replace(' ', "");
            let q = scorer.quality(&whole.replace(' ', ""), whole_perfect, &compact_name);
            score += 0.15 * q;
        }
        hits.push(SearchHit {
            server: doc.server.server.clone(),
            server_alias: doc.server.server_alias.clone(),
            tool: doc.tool.name.clone(),
            tool_alias: doc.tool.alias.clone(),
            description: doc.tool.description.clone(),
            score: (score * 1000.0).round() / 1000.0,
        });
    }
    hits.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.server.cmp(&b.server))
            .then_with(|| a.tool.cmp(&b.tool))
    });
    // Weak matches far behind the best are noise (letters scattered over long descriptions).
    if let Some(best) = hits.first().map(|h| h.score) {
        hits.retain(|h| h.score >= best * RELATIVE_CUTOFF);
    }
    hits.truncate(limit);
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_python_identifiers() {
        assert_eq!(sanitize_identifier("read-file", "tool"), "read_file");
        assert_eq!(
            sanitize_identifier("Get Current Time", "tool"),
            "get_current_time"
        );
        assert_eq!(sanitize_identifier("a--b..c", "tool"), "a_b_c");
        assert_eq!(sanitize_identifier("1password", "server"), "_1password");
        assert_eq!(sanitize_identifier("class", "tool"), "class_");
        assert_eq!(sanitize_identifier("IMPORT", "tool"), "import_");
        assert_eq!(sanitize_identifier("None", "tool"), "none");
        assert_eq!(sanitize_identifier("", "server"), "server");
        assert_eq!(sanitize_identifier("---", "tool"), "_");
        assert_eq!(sanitize_identifier("  spaced  ", "tool"), "spaced");
        assert_eq!(sanitize_identifier("ünïcode", "tool"), "_n_code");
        assert_eq!(
            sanitize_identifier("github.com/x", "server"),
            "github_com_x"
        );
        assert_eq!(sanitize_identifier("trailing!", "tool"), "trailing_");
    }

    #[test]
    fn duplicate_aliases_are_numbered() {
        let a = assign_aliases(
            ["read-file", "read_file", "Read File", "read_file_2", "x"],
            "tool",
        );
        assert_eq!(
            a,
            vec![
                "read_file",
                "read_file_2",
                "read_file_3",
                "read_file_2_2",
                "x"
            ]
        );
        let unique: HashSet<_> = a.iter().collect();
        assert_eq!(unique.len(), a.len());
    }

    fn tool(name: &str, description: &str, params: &[(&str, &str)]) -> ToolEntry {
        let props: Map<String, Value> = params
            .iter()
            .map(|(p, d)| (p.to_string(), json!({"type": "string", "description": d})))
            .collect();
        let rendering = render(&json!({"type": "object", "properties": props}), "s", name);
        ToolEntry {
            name: name.into(),
            alias: sanitize_identifier(name, "tool"),
            description: Some(description.into()),
            input_schema: json!({"type": "object", "properties": props}),
            output_schema: None,
            rendering: Arc::new(rendering.clone()),
            rendering_json: Arc::new(rendering.to_json()),
        }
    }

    fn catalogs() -> Vec<ServerTools> {
        // Names and descriptions as the real servers publish them.
        vec![
            ServerTools {
                server: "time".into(),
                server_alias: "time".into(),
                server_description: None,
                tools: vec![
                    tool(
                        "get_current_time",
                        "Get current time in a specific timezones",
                        &[(
                            "timezone",
                            "IANA timezone name (e.g., 'America/New_York', 'Europe/London'). Use 'UTC' as local timezone if no timezone provided by the user.",
                        )],
                    ),
                    tool(
                        "convert_time",
                        "Convert time between timezones",
                        &[
                            ("source_timezone", "Source IANA timezone name"),
                            ("time", "Time to convert in 24-hour format (HH:MM)"),
                            ("target_timezone", "Target IANA timezone name"),
                        ],
                    ),
                ],
            },
            ServerTools {
                server: "filesystem".into(),
                server_alias: "filesystem".into(),
                server_description: None,
                tools: vec![
                    tool(
                        "read_text_file",
                        "Read the complete contents of a file from the file system as text. Handles various text encodings and provides detailed error messages if the file cannot be read.",
                        &[
                            ("path", ""),
                            (
                                "tail",
                                "If provided, returns only the last N lines of the file",
                            ),
                            (
                                "head",
                                "If provided, returns only the first N lines of the file",
                            ),
                        ],
                    ),
                    tool(
                        "write_file",
                        "Create a new file or completely overwrite an existing file with new content.",
                        &[("path", ""), ("content", "")],
                    ),
                    tool(
                        "list_directory",
                        "Get a detailed listing of all files and directories in a specified path.",
                        &[("path", "")],
                    ),
                    tool(
                        "search_files",
                        "Recursively search for files and directories matching a pattern.",
                        &[("path", ""), ("pattern", "")],
                    ),
                    tool(
                        "get_file_info",
                        "Retrieve detailed metadata about a file or directory, including size, creation time, last modified time, permissions, and type.",
                        &[("path", "")],
                    ),
                    tool(
                        "move_file",
                        "Move or rename files and directories.",
                        &[("source", ""), ("destination", "")],
                    ),
                ],
            },
            ServerTools {
                server: "git".into(),
                server_alias: "git".into(),
                server_description: None,
                tools: vec![
                    tool(
                        "git_status",
                        "Shows the working tree status",
                        &[("repo_path", "")],
                    ),
                    tool(
                        "git_log",
                        "Shows the commit logs",
                        &[
                            ("repo_path", ""),
                            ("max_count", ""),
                            ("start_timestamp", "Start timestamp for filtering commits"),
                            ("end_timestamp", ""),
                        ],
                    ),
                    tool(
                        "git_commit",
                        "Records changes to the repository",
                        &[("repo_path", ""), ("message", "")],
                    ),
                    tool(
                        "git_diff_unstaged",
                        "Shows changes in the working directory that are not yet staged",
                        &[("repo_path", ""), ("context_lines", "")],
                    ),
                ],
            },
            ServerTools {
                server: "everything".into(),
                server_alias: "everything".into(),
                server_description: Some("Exercises all the features of the MCP protocol".into()),
                tools: vec![
                    tool(
                        "echo",
                        "Echoes back the input string",
                        &[("message", "Message to echo")],
                    ),
                    tool(
                        "get-sum",
                        "Returns the sum of two numbers",
                        &[("a", "First number"), ("b", "Second number")],
                    ),
                    tool("get-tiny-image", "Returns a tiny MCP logo image.", &[]),
                    tool(
                        "trigger-long-running-operation",
                        "Demonstrates a long running operation with progress updates.",
                        &[
                            ("duration", "Duration of the operation in seconds"),
                            ("steps", "Number of steps in the operation"),
                        ],
                    ),
                    tool(
                        "get-structured-content",
                        "Returns structured content along with an output schema for client data validation",
                        &[("location", "Choose city")],
                    ),
                ],
            },
        ]
    }

    fn top(query: &str, n: usize) -> Vec<String> {
        let c = catalogs();
        let refs: Vec<&ServerTools> = c.iter().collect();
        search(&refs, query, n)
            .into_iter()
            .map(|h| format!("{}.{}", h.server, h.tool))
            .collect()
    }

    #[test]
    fn vague_queries_rank_the_right_tools_first() {
        let t = top("current time in a timezone", 5);
        assert_eq!(
            &t[..2],
            &["time.get_current_time", "time.convert_time"],
            "{t:?}"
        );
        assert_eq!(
            top("what is the current time in Tokyo", 1),
            vec!["time.get_current_time"]
        );
        assert_eq!(top("convert timezones", 1), vec!["time.convert_time"]);
        assert_eq!(top("read a file", 1), vec!["filesystem.read_text_file"]);
        assert_eq!(
            top("list files in a directory", 1),
            vec!["filesystem.list_directory"]
        );
        assert_eq!(top("rename file", 1), vec!["filesystem.move_file"]);
        assert_eq!(top("show the commit log", 1), vec!["git.git_log"]);
        assert_eq!(top("working tree status", 1), vec!["git.git_status"]);
        assert_eq!(top("add two numbers", 1), vec!["everything.get-sum"]);
        assert_eq!(
            top("image", 5),
            vec!["everything.get-tiny-image"],
            "weak matches are cut"
        );
        assert_eq!(
            top("progress", 1),
            vec!["everything.trigger-long-running-operation"]
        );
        assert_eq!(top("echo", 1), vec!["everything.echo"]);
        // Typos still find it.
        assert_eq!(top("curent tme", 1), vec!["time.get_current_time"]);
    }

    #[test]
    fn names_weigh_more_than_descriptions() {
        let c = [ServerTools {
            server: "s".into(),
            server_alias: "s".into(),
            server_description: None,
            tools: vec![
                tool("weather", "Forecast for a city", &[]),
                tool("forecast_helper", "Shows the weather", &[]),
            ],
        }];
        let refs: Vec<&ServerTools> = c.iter().collect();
        let hits = search(&refs, "weather", 5);
        assert_eq!(hits[0].tool, "weather");
        assert_eq!(hits[1].tool, "forecast_helper");
        assert!(hits[0].score > hits[1].score);
        // Parameter names count too.
        let c = [ServerTools {
            server: "s".into(),
            server_alias: "s".into(),
            server_description: None,
            tools: vec![
                tool("lookup", "Looks things up", &[("zipcode", "")]),
                tool("other", "Other", &[]),
            ],
        }];
        let refs: Vec<&ServerTools> = c.iter().collect();
        let hits = search(&refs, "zipcode", 5);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].tool, "lookup");
    }

    #[test]
    fn search_hits_have_the_protocol_shape() {
        let c = catalogs();
        let refs: Vec<&ServerTools> = c.iter().collect();
        let hits = search(&refs, "tiny image", 2);
        assert!(hits.len() <= 2);
        let v = serde_json::to_value(&hits[0]).unwrap();
        assert_eq!(v["server"], "everything");
        assert_eq!(v["serverAlias"], "everything");
        assert_eq!(v["tool"], "get-tiny-image");
        assert_eq!(v["toolAlias"], "get_tiny_image");
        assert!(v["score"].as_f64().unwrap() > 0.0);
        assert!(v["description"].is_string());
        assert!(search(&refs, "   ", 5).is_empty());
        assert!(search(&refs, "zzzzqqqq", 5).is_empty());
    }

    #[test]
    fn docs_and_lookup() {
        let c = catalogs();
        let ev = &c[3];
        let d = ev.docs(Some("get_tiny_image"), Detail::Summary).unwrap();
        assert_eq!(d[0]["tool"], "get-tiny-image");
        assert!(d[0].get("inputSchema").is_none());
        let d = ev.docs(Some("GET-TINY-IMAGE"), Detail::Full).unwrap();
        assert!(d[0]["inputSchema"].is_object());
        assert_eq!(ev.docs(None, Detail::Summary).unwrap().len(), 5);
        let e = ev.docs(Some("nope"), Detail::Summary).unwrap_err();
        assert_eq!(e.tool, "nope");
        assert!(e.known.iter().any(|t| t == "echo"), "{e}");
        assert!(e.message().starts_with("Tool 'nope' not found on server"));
        assert_eq!(Detail::parse(Some("FULL")), Detail::Full);
        assert_eq!(Detail::parse(Some("whatever")), Detail::Summary);
        assert_eq!(
            ev.list()[1],
            json!({"name": "get-sum", "alias": "get_sum", "description": "Returns the sum of two numbers"})
        );
    }

    #[test]
    fn from_rmcp_tools_numbers_duplicates() {
        let schema: Map<String, Value> = serde_json::from_value(json!({"type": "object"})).unwrap();
        let tools: Vec<rmcp::model::Tool> = ["a-b", "a_b", "def"]
            .iter()
            .map(|n| rmcp::model::Tool::new(n.to_string(), "d", schema.clone()))
            .collect();
        let st = ServerTools::from_tools("srv", "srv", None, &tools, None);
        let aliases: Vec<_> = st.tools.iter().map(|t| t.alias.as_str()).collect();
        assert_eq!(aliases, vec!["a_b", "a_b_2", "def_"]);
        assert_eq!(st.find("a_b").unwrap().name, "a_b");
        assert_eq!(st.find("a_b_2").unwrap().name, "a_b");
        assert_eq!(st.find("a-b").unwrap().name, "a-b");
        let meta = st.tool_meta();
        assert_eq!(meta[2].alias, "def_");
    }

    /// What the renderings add to a call that loads servers: the bridge builds every loaded tool's
    /// metadata and serializes it to compare with the last sent (`sandbox/session/exec.rs`). Timed
    /// for the reference servers of the corpus (everything, filesystem twice, time, git: 54 tools,
    /// as the proxy bench loads them), with and without the renderings. Run on its own, release:
    /// `cargo test --profile dev-release -p mcp-code-bridge-upstream --lib catalog::tests::metadata_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, run on its own"]
    fn metadata_cost_of_the_renderings() {
        use std::sync::Arc;
        use std::time::Instant;
        let mut lists = Vec::new();
        for s in ["everything", "filesystem", "filesystem", "time", "git"] {
            let doc: Value = serde_json::from_slice(
                &std::fs::read(
                    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("../../tests/fixtures/tool-schemas")
                        .join(format!("{s}.json")),
                )
                .unwrap(),
            )
            .unwrap();
            let tools: Vec<rmcp::model::Tool> = doc["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    rmcp::model::Tool::new(
                        t["name"].as_str().unwrap().to_string(),
                        t["description"].as_str().unwrap_or("").to_string(),
                        t["inputSchema"].as_object().unwrap().clone(),
                    )
                })
                .collect();
            let tools = Arc::new(tools);
            let schemas = Schemas::new(s, tools.clone());
            lists.push((s, tools, schemas));
        }
        let n = 2000;
        // Every loaded tool's metadata built and serialized, as a call that loads these servers
        // does; with the renderings, and with them taken out (sharing them costs a pointer copy).
        let run = |keep: bool| {
            let started = Instant::now();
            let mut bytes = 0;
            for _ in 0..n {
                let metas: Vec<_> = lists
                    .iter()
                    .map(|(s, tools, schemas)| {
                        let mut m = ServerTools::from_tools(s, s, None, tools, Some(schemas))
                            .into_tool_meta();
                        if !keep {
                            m.iter_mut().for_each(|t| t.rendering = None);
                        }
                        m
                    })
                    .collect();
                bytes = serde_json::to_vec(&metas).unwrap().len();
            }
            (started.elapsed() / n, bytes)
        };
        let (without, b0) = run(false);
        let (with, b1) = run(true);
        println!(
            "54 tools' metadata per call: {without:?} ({b0} bytes) without the renderings, {with:?} ({b1} bytes) with them"
        );
    }
}
