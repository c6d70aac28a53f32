//! The arguments of a proxied call checked against the tool's input schema before the call is
//! sent: a call the schema forbids is refused here, with what each wrong argument got and what
//! the schema allows (`permission: 'write' is not one of 'r', 'rw'`). The upstream's own answer
//! stays authoritative for everything else; a schema the validator cannot read (a remote
//! `$ref`, a keyword it does not know how to compile) checks nothing and never blocks a call.
//!
//! Done in the bridge, on the call's way to the server (every call passes here: no extra round
//! trip), with the `jsonschema` crate; `format` is an annotation only, as JSON Schema 2020-12
//! says by default, so a server's own format names never refuse a value.

use std::sync::Arc;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde_json::{Map, Value};

use super::pytext::py_repr;
use bridge_core::error::{Hint, Hinted};

/// The most problems one refusal lists.
const MAX_PROBLEMS: usize = 4;
/// The most characters of a value echoed back in a problem.
const MAX_ECHOED: usize = 80;

/// A tool's compiled input schema; `None` inside when the validator could not read it.
pub struct Check(Option<Validator>);

impl Check {
    /// Compile `schema` (once per tool list, by the list's `Schemas`, on the tool's first call).
    pub fn compile(server: &str, tool: &str, schema: &Value) -> Check {
        match jsonschema::options().build(schema) {
            Ok(v) => Check(Some(v)),
            Err(e) => {
                tracing::debug!(
                    server,
                    tool,
                    "the input schema cannot be compiled ({e}); its calls go unchecked"
                );
                Check(None)
            }
        }
    }

    /// Whether the schema could be read (calls are checked).
    pub fn is_active(&self) -> bool {
        self.0.is_some()
    }

    /// The problems of `arguments` (empty: nothing to refuse).
    pub fn problems(&self, arguments: Option<&Map<String, Value>>) -> Vec<String> {
        match arguments {
            Some(a) => self.problems_of(&Value::Object(a.clone())),
            None => self.problems_of(&Value::Object(Map::new())),
        }
    }

    /// The problems of `arguments` as the call's parameters hold them (never copied: they can
    /// be megabytes); `null` is no arguments.
    pub fn problems_of(&self, arguments: &Value) -> Vec<String> {
        let Some(v) = &self.0 else {
            return Vec::new();
        };
        if arguments.is_null() {
            return self.problems_of(&Value::Object(Map::new()));
        }
        if v.is_valid(arguments) {
            return Vec::new();
        }
        let mut out: Vec<String> = Vec::new();
        for e in v.iter_errors(arguments) {
            let p = problem(&e);
            if !out.contains(&p) {
                out.push(p);
            }
            if out.len() >= MAX_PROBLEMS {
                break;
            }
        }
        out
    }
}

/// A call refused because its arguments do not fit the tool's input schema; never sent.
#[derive(Debug, thiserror::Error)]
#[error(
    "The arguments of {server}.{tool} do not fit its input schema: {}; the call was not sent",
    problems.join("; ")
)]
pub struct InvalidArguments {
    /// The server's name.
    pub server: String,
    /// The tool's name as the server lists it.
    pub tool: String,
    /// What is wrong, one line per argument, each naming where in the arguments and what the
    /// schema allows (at most `MAX_PROBLEMS`, no repeats).
    pub problems: Vec<String>,
    /// The server's alias (for the hint's `help(mcp_<server>.<tool>)`).
    pub server_alias: String,
    /// The tool's alias (the hint's `<tool>`).
    pub tool_alias: String,
}

impl Hinted for InvalidArguments {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(format!(
            "pass what the schema allows: help(mcp_{}.{}) shows every parameter's type, allowed values and bounds",
            self.server_alias, self.tool_alias
        )))
    }
}

/// Where in the arguments: `permission`, `filter['kind']`, `emails[0]`; `arguments` for the
/// whole object.
fn place(e: &ValidationError<'_>) -> String {
    let mut out = String::new();
    for (i, seg) in e.instance_path().iter().enumerate() {
        match seg {
            LocationSegment::Property(p) if i == 0 => out.push_str(&p),
            LocationSegment::Property(p) => {
                out.push('[');
                out.push_str(&py_repr(&Value::String(p.to_string())));
                out.push(']');
            }
            LocationSegment::Index(n) if i == 0 => out.push_str(&n.to_string()),
            LocationSegment::Index(n) => out.push_str(&format!("[{n}]")),
        }
    }
    if out.is_empty() {
        "arguments".into()
    } else {
        out
    }
}

fn echoed(v: &Value) -> String {
    let s = py_repr(v);
    if s.chars().count() <= MAX_ECHOED {
        s
    } else {
        let mut t: String = s.chars().take(MAX_ECHOED - 1).collect();
        t.push('\u{2026}');
        t
    }
}

fn py_type(t: &str) -> &str {
    match t {
        "string" => "str",
        "integer" => "int",
        "number" => "float",
        "boolean" => "bool",
        "null" => "None",
        "array" => "list",
        "object" => "dict",
        other => other,
    }
}

/// One problem, as `place: what it got and what is allowed`.
fn problem(e: &ValidationError<'_>) -> String {
    let at = place(e);
    match e.kind() {
        ValidationErrorKind::Required { property } if at == "arguments" => {
            format!("the required argument {} is missing", py_repr(property))
        }
        ValidationErrorKind::AdditionalProperties { unexpected } if at == "arguments" => format!(
            "unexpected argument{} {} (the tool takes no other)",
            if unexpected.len() == 1 { "" } else { "s" },
            quoted(unexpected)
        ),
        _ => format!("{at}: {}", what(e)),
    }
}

/// Names as Python writes them, joined: `'a', 'b'`.
fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| py_repr(&Value::String(n.clone())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is wrong with the value at an error's place, without the place.
fn what(e: &ValidationError<'_>) -> String {
    let got = echoed(e.instance());
    match e.kind() {
        ValidationErrorKind::Enum { options } => {
            let allowed = match options.as_ref() {
                Value::Array(a) => a.iter().map(echoed).collect::<Vec<_>>().join(", "),
                other => echoed(other),
            };
            format!("{got} is not one of {allowed}")
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("{got} is not {}", echoed(expected_value))
        }
        ValidationErrorKind::Type { kind } => {
            let names: Vec<String> = match kind {
                TypeKind::Single(t) => vec![py_type(&t.to_string()).to_string()],
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| py_type(&t.to_string()).to_string())
                    .collect(),
            };
            format!("{got} is not of type {}", names.join(" | "))
        }
        ValidationErrorKind::Required { property } => {
            format!("the required key {} is missing", py_repr(property))
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => format!(
            "unexpected key{} {}",
            if unexpected.len() == 1 { "" } else { "s" },
            quoted(unexpected)
        ),
        ValidationErrorKind::Minimum { limit } => format!("{got} is less than the minimum {limit}"),
        ValidationErrorKind::Maximum { limit } => {
            format!("{got} is greater than the maximum {limit}")
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("{got} must be greater than {limit}")
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("{got} must be less than {limit}")
        }
        ValidationErrorKind::MinLength { limit } => {
            format!("{got} is shorter than {limit} characters")
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!("{got} is longer than {limit} characters")
        }
        ValidationErrorKind::MinItems { limit } => format!("{got} has fewer than {limit} items"),
        ValidationErrorKind::MaxItems { limit } => format!("{got} has more than {limit} items"),
        ValidationErrorKind::Pattern { pattern } => format!(
            "{got} does not match the pattern {}",
            py_repr(&Value::String(pattern.clone()))
        ),
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            // Each branch's own words at this place (`'write' is not one of 'r', 'rw'`, `... is
            // not of type None`), so the allowed values are named.
            let mut alts: Vec<String> = Vec::new();
            for branch in context {
                let here: Vec<String> = branch
                    .iter()
                    .map(|b| {
                        let inner = place(b);
                        let w = what(b);
                        if inner == place(e) {
                            w
                        } else {
                            format!("{inner}: {w}")
                        }
                    })
                    .collect();
                let one = here.join(" and ");
                if !one.is_empty() && !alts.contains(&one) {
                    alts.push(one);
                }
            }
            if alts.is_empty() {
                format!("{got} fits none of the allowed forms")
            } else {
                format!(
                    "{got} fits none of the allowed forms: {}",
                    alts.join("; or ")
                )
            }
        }
        _ => e.to_string(),
    }
}

/// Shared, so a tool list's checks are compiled once whoever asks.
pub type SharedCheck = Arc<Check>;
