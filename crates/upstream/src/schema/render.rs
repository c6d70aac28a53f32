//! A tool's input schema as the model reads it: each parameter's Python type (`Literal[...]`
//! for an enum, `list[T]`, `A | None`, the name of an object type), whether it is required, its
//! default, format, bounds and description; and the object types the parameters use, each with
//! its fields the same way. Local `$ref`s (`#/$defs/...`, any `#/...` pointer) are resolved; a
//! recursive one is named, never expanded again. Bounded by [`MAX_RENDERED_CHARS`]: what does
//! not fit is counted in [`Rendering::more`], which says where the whole schema is.
//!
//! This is the one rendering of a schema: `help()` and the signature of each tool function in
//! the sandbox (the runtime puts these lines together with its parameter names), the summary of
//! `query_tool_docs` and the text the catalog's search matches all come from it.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value};

use super::pytext::{literal, py_repr, short, union};
use super::refs::{has_shape, is_object_type, merge_all_of, resolve_ref};

/// The most characters the parameter lines and type blocks of one tool take together (about
/// 2,000 cl100k tokens); the tool's own description comes on top, as the server wrote it.
pub const MAX_RENDERED_CHARS: usize = 8_000;
/// A description of a parameter or field is cut at this many characters when the whole
/// rendering would not fit otherwise.
const SHORT_DESCRIPTION_CHARS: usize = 160;
/// How deep types nest before the rest is shown as `Any` (a schema is data from the server).
const MAX_DEPTH: usize = 24;

/// One tool's schema, rendered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rendering {
    /// The top-level parameters, in the schema's order.
    pub params: Vec<Param>,
    /// The object types the parameters use, as lines (`Name (dict): ...` and its indented
    /// fields); empty when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// What was left out to keep within [`MAX_RENDERED_CHARS`], and where the rest is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<String>,
}

/// One top-level parameter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    /// The name in the schema (what is sent).
    pub name: String,
    /// Its Python type as text: `str`, `Literal['r', 'rw']`, `list[Email] | None`, ...
    pub annotation: String,
    /// Whether the schema lists it in `required` (the function takes it without a default).
    pub required: bool,
    /// Everything after the name on its line: `(type, required, default 5, >= 1): description`.
    pub line: String,
}

impl Rendering {
    /// As the runtime gets it (`ToolMeta::rendering`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The `Args:` and `Types:` blocks with the schema's parameter names (the runtime writes
    /// the same lines with its Python names), and the note on what was left out.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if !self.params.is_empty() {
            out.push_str("Args:\n");
            for p in &self.params {
                let _ = writeln!(out, "    {} {}", p.name, p.line);
            }
        }
        if !self.types.is_empty() {
            out.push_str("Types:\n");
            for l in &self.types {
                let _ = writeln!(out, "    {l}");
            }
        }
        if let Some(m) = &self.more {
            out.push_str(m);
            out.push('\n');
        }
        out
    }
}

/// Render `schema` (a tool's `inputSchema`); `server` and `tool` name where the whole schema is
/// when the rendering is cut.
pub fn render(schema: &Value, server: &str, tool: &str) -> Rendering {
    let full = render_with(schema, None);
    if size(&full) <= MAX_RENDERED_CHARS {
        return full;
    }
    let mut r = render_with(schema, Some(SHORT_DESCRIPTION_CHARS));
    let mut budget = MAX_RENDERED_CHARS;
    let mut dropped_params = 0usize;
    for p in &mut r.params {
        let cost = p.name.len() + p.line.len() + 5;
        if cost <= budget {
            budget -= cost;
        } else {
            // The parameter keeps its type (the signature needs it); its line loses the rest.
            p.line = format!("({}, {})", p.annotation, required_word(p.required));
            budget = budget.saturating_sub(p.name.len() + p.line.len() + 5);
            dropped_params += 1;
        }
    }
    let mut kept = Vec::new();
    let mut dropped_lines = 0usize;
    for l in r.types.drain(..) {
        let cost = l.len() + 5;
        if dropped_lines == 0 && cost <= budget {
            budget -= cost;
            kept.push(l);
        } else {
            dropped_lines += 1;
        }
    }
    r.types = kept;
    let mut left = Vec::new();
    if dropped_params > 0 {
        left.push(format!("the details of {dropped_params} parameters"));
    }
    if dropped_lines > 0 {
        left.push(format!("{dropped_lines} lines of types"));
    }
    r.more = Some(format!(
        "(Schema shortened: descriptions cut at {SHORT_DESCRIPTION_CHARS} characters{}. The whole schema: runtime.query_tool_docs({}, {}, detail=\"full\").)",
        if left.is_empty() {
            String::new()
        } else {
            format!("; left out: {}", left.join(", "))
        },
        py_repr(&Value::String(server.to_string())),
        py_repr(&Value::String(tool.to_string())),
    ));
    r
}

fn size(r: &Rendering) -> usize {
    r.params
        .iter()
        .map(|p| p.name.len() + p.line.len() + 5)
        .sum::<usize>()
        + r.types.iter().map(|l| l.len() + 5).sum::<usize>()
}

fn required_word(required: bool) -> &'static str {
    if required { "required" } else { "optional" }
}

fn render_with(schema: &Value, cut: Option<usize>) -> Rendering {
    let mut cx = Ctx {
        root: schema,
        cut,
        blocks: Vec::new(),
        named: HashMap::new(),
        used: HashSet::new(),
        depth: 0,
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let required = required_of(schema);
    let mut params = Vec::new();
    if let Some(props) = props {
        for (name, s) in props {
            let is_req = required.contains(&name.as_str());
            let annotation = cx.type_of(s, name);
            let line = cx.field_line(s, &annotation, is_req);
            params.push(Param {
                name: name.clone(),
                annotation,
                required: is_req,
                line,
            });
        }
    }
    // Required names the properties do not describe are parameters too.
    for name in required
        .iter()
        .filter(|n| props.is_none_or(|p| !p.contains_key(**n)))
    {
        params.push(Param {
            name: (*name).to_string(),
            annotation: "Any".into(),
            required: true,
            line: "(Any, required)".into(),
        });
    }
    let types = cx.blocks.into_iter().flat_map(|(_, lines)| lines).collect();
    Rendering {
        params,
        types,
        more: None,
    }
}

fn required_of(schema: &Value) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

struct Ctx<'a> {
    root: &'a Value,
    cut: Option<usize>,
    /// The named types, in the order they were first met: (name, lines).
    blocks: Vec<(String, Vec<String>)>,
    /// A `$ref` (or an inline object's address) -> its type's name; set before the type is
    /// rendered, so a recursive reference finds the name.
    named: HashMap<String, String>,
    used: HashSet<String>,
    depth: usize,
}

/// `my_model-name` -> `MyModelName`: a type name from a title, a `$defs` key or a field name.
fn type_name(raw: &str) -> String {
    let mut out = String::new();
    let mut up = true;
    for c in raw.chars() {
        if c.is_alphanumeric() {
            if up {
                out.extend(c.to_uppercase());
            } else {
                out.push(c);
            }
            up = false;
        } else {
            up = true;
        }
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "Object");
    }
    out
}

impl Ctx<'_> {
    fn unique_name(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut n = 2;
        while !self.used.insert(name.clone()) {
            name = format!("{base}{n}");
            n += 1;
        }
        name
    }

    fn describe(&self, s: &str) -> String {
        let text = s.split_whitespace().collect::<Vec<_>>().join(" ");
        match self.cut {
            Some(n) if text.chars().count() > n => {
                let mut t: String = text.chars().take(n).collect();
                t.push('\u{2026}');
                t
            }
            _ => text,
        }
    }

    /// The Python type of `schema`; `hint` names an inline object type (a field's name).
    fn type_of(&mut self, schema: &Value, hint: &str) -> String {
        if self.depth >= MAX_DEPTH {
            return "Any".into();
        }
        self.depth += 1;
        let t = self.type_of_inner(schema, hint);
        self.depth -= 1;
        t
    }

    fn type_of_inner(&mut self, schema: &Value, hint: &str) -> String {
        let o = match schema {
            Value::Bool(false) => return "Never".into(),
            Value::Object(o) => o,
            _ => return "Any".into(),
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.ref_type(r);
        }
        if let Some(values) = o.get("enum").and_then(Value::as_array) {
            return literal(values);
        }
        if let Some(c) = o.get("const") {
            return literal(std::slice::from_ref(c));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key).and_then(Value::as_array)
                && !alts.is_empty()
            {
                let types: Vec<String> = alts.iter().map(|a| self.type_of(a, hint)).collect();
                return union(types);
            }
        }
        if let Some(all) = o.get("allOf").and_then(Value::as_array)
            && !all.is_empty()
        {
            if all.len() == 1 && !has_shape(o) {
                return self.type_of(&all[0], hint);
            }
            let merged = merge_all_of(self.root, schema);
            return self.type_of(&merged, hint);
        }
        match o.get("type") {
            Some(Value::Array(ts)) => {
                let types: Vec<String> = ts
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|t| {
                        let mut one = o.clone();
                        one.insert("type".into(), Value::String(t.to_string()));
                        self.type_of(&Value::Object(one), hint)
                    })
                    .collect();
                if types.is_empty() {
                    "Any".into()
                } else {
                    union(types)
                }
            }
            Some(Value::String(t)) => match t.as_str() {
                "string" => "str".into(),
                "integer" => "int".into(),
                "number" => "float".into(),
                "boolean" => "bool".into(),
                "null" => "None".into(),
                "array" => self.array_type(o, hint),
                "object" => self.object_type(schema, o, hint),
                _ => "Any".into(),
            },
            _ => {
                if o.contains_key("properties") || o.contains_key("additionalProperties") {
                    self.object_type(schema, o, hint)
                } else if o.contains_key("items") || o.contains_key("prefixItems") {
                    self.array_type(o, hint)
                } else {
                    "Any".into()
                }
            }
        }
    }

    fn ref_type(&mut self, r: &str) -> String {
        if let Some(name) = self.named.get(r) {
            return name.clone();
        }
        let Some(target) = resolve_ref(self.root, r) else {
            return "Any".into();
        };
        let last = r.rsplit('/').next().unwrap_or("");
        let objectish = target
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty());
        if objectish {
            return self.named_object(Some(r.to_string()), target, last);
        }
        // An enum, a scalar or a union: shown inline, unless it refers to itself (then named,
        // its definition a `Name = ...` line).
        if self.named.contains_key(&format!("@{r}")) {
            let name = self.named[&format!("@{r}")].clone();
            self.named.insert(r.to_string(), name.clone());
            return name;
        }
        let base = type_name(target.get("title").and_then(Value::as_str).unwrap_or(last));
        let name = self.unique_name(base);
        self.named.insert(format!("@{r}"), name.clone());
        let t = self.type_of(target, last);
        self.named.remove(&format!("@{r}"));
        if self.named.get(r) == Some(&name) {
            // Recursive: it is referred to by name, so it gets a line of its own.
            let mut line = format!("{name} = {t}");
            if let Some(d) = target.get("description").and_then(Value::as_str) {
                let _ = write!(line, "  # {}", self.describe(d));
            }
            self.blocks.push((name.clone(), vec![line]));
            name
        } else {
            self.used.remove(&name);
            t
        }
    }

    fn array_type(&mut self, o: &Map<String, Value>, hint: &str) -> String {
        if let Some(prefix) = o.get("prefixItems").and_then(Value::as_array) {
            let mut ts: Vec<String> = prefix.iter().map(|s| self.type_of(s, hint)).collect();
            if o.get("items").is_some_and(|i| i != &Value::Bool(false)) {
                ts.push("...".into());
            }
            return format!("tuple[{}]", ts.join(", "));
        }
        match o.get("items") {
            Some(Value::Array(items)) => {
                // Draft 4-7 tuple form.
                let ts: Vec<String> = items.iter().map(|s| self.type_of(s, hint)).collect();
                format!("tuple[{}]", ts.join(", "))
            }
            Some(items @ Value::Object(m)) if !m.is_empty() => {
                let item_hint = format!("{hint}_item");
                format!("list[{}]", self.type_of(items, &item_hint))
            }
            _ => "list".into(),
        }
    }

    fn object_type(&mut self, schema: &Value, o: &Map<String, Value>, hint: &str) -> String {
        let has_props = o
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty());
        if has_props {
            // An inline object: named by its title or the field it is the type of (it cannot
            // refer to itself without a `$ref`, so it is not looked up).
            let base = o.get("title").and_then(Value::as_str).unwrap_or(hint);
            return self.named_object(None, schema, base);
        }
        match o.get("additionalProperties") {
            Some(v @ Value::Object(m)) if !m.is_empty() => {
                let item_hint = format!("{hint}_value");
                format!("dict[str, {}]", self.type_of(v, &item_hint))
            }
            _ => "dict".into(),
        }
    }

    /// An object type with fields: its name, its block rendered once (fields after the name is
    /// known, so a field of its own type refers to it).
    fn named_object(&mut self, key: Option<String>, target: &Value, base: &str) -> String {
        if let Some(name) = key.as_ref().and_then(|k| self.named.get(k)) {
            return name.clone();
        }
        let base = target.get("title").and_then(Value::as_str).unwrap_or(base);
        let name = self.unique_name(type_name(base));
        if let Some(key) = key {
            self.named.insert(key, name.clone());
        }
        let at = self.blocks.len();
        self.blocks.push((name.clone(), Vec::new()));
        let mut head = format!("{name} (dict)");
        if let Some(d) = target.get("description").and_then(Value::as_str) {
            let d = self.describe(d);
            if !d.is_empty() {
                let _ = write!(head, ": {d}");
            }
        }
        let mut lines = vec![head];
        let required = required_of(target);
        if let Some(props) = target.get("properties").and_then(Value::as_object) {
            // Required fields first, as the signature puts required parameters first.
            let mut fields: Vec<(&String, &Value)> = props.iter().collect();
            fields.sort_by_key(|(f, _)| !required.contains(&f.as_str()));
            for (field, s) in fields {
                let is_req = required.contains(&field.as_str());
                let t = self.type_of(s, field);
                let line = self.field_line(s, &t, is_req);
                lines.push(format!("    {field} {line}"));
            }
        }
        match target.get("additionalProperties") {
            Some(Value::Bool(false)) => lines.push("    (no other keys)".into()),
            Some(v @ Value::Object(m)) if !m.is_empty() => {
                let t = self.type_of(v, "value");
                lines.push(format!("    (other keys: {t})"));
            }
            _ => {}
        }
        self.blocks[at].1 = lines;
        name
    }

    /// `(type, required, facts...): description` of a parameter or field.
    fn field_line(&mut self, schema: &Value, annotation: &str, required: bool) -> String {
        let mut bits = vec![annotation.to_string(), required_word(required).to_string()];
        let mut facts = Vec::new();
        let mut desc = None;
        self.collect_facts(schema, &mut facts, &mut desc, 0, "");
        for f in facts {
            if !bits.contains(&f) {
                bits.push(f);
            }
        }
        let mut line = format!("({})", bits.join(", "));
        if let Some(d) = desc {
            let d = self.describe(&d);
            if !d.is_empty() {
                let _ = write!(line, ": {d}");
            }
        }
        line
    }

    /// The facts of a schema that its type does not show: default, format, bounds, pattern,
    /// examples; looked for through local `$ref`s to non-object types, single-branch `allOf`,
    /// the branches of a union and the items of an array (`items: ...`). The first
    /// description found is the field's.
    fn collect_facts(
        &self,
        schema: &Value,
        facts: &mut Vec<String>,
        desc: &mut Option<String>,
        depth: usize,
        prefix: &str,
    ) {
        let Some(o) = schema.as_object() else { return };
        if depth > 6 {
            return;
        }
        if desc.is_none()
            && prefix.is_empty()
            && let Some(d) = o.get("description").and_then(Value::as_str)
        {
            *desc = Some(d.to_string());
        }
        if let Some(v) = o.get("default") {
            facts.push(format!("{prefix}default {}", short(&py_repr(v))));
        }
        if let Some(f) = o.get("format").and_then(Value::as_str) {
            facts.push(format!("{prefix}format {f}"));
        }
        let num = |k: &str| o.get(k).filter(|v| v.is_number()).map(|v| v.to_string());
        match (num("minimum"), num("maximum")) {
            (Some(a), Some(b)) => facts.push(format!("{prefix}{a} <= value <= {b}")),
            (Some(a), None) => facts.push(format!("{prefix}>= {a}")),
            (None, Some(b)) => facts.push(format!("{prefix}<= {b}")),
            _ => {}
        }
        if let Some(a) = num("exclusiveMinimum") {
            facts.push(format!("{prefix}> {a}"));
        }
        if let Some(b) = num("exclusiveMaximum") {
            facts.push(format!("{prefix}< {b}"));
        }
        if let Some(m) = num("multipleOf") {
            facts.push(format!("{prefix}multiple of {m}"));
        }
        let range =
            |lo: &str, hi: &str, what: &str, facts: &mut Vec<String>| match (num(lo), num(hi)) {
                (Some(a), Some(b)) => facts.push(format!("{prefix}{what} {a}..{b}")),
                (Some(a), None) => facts.push(format!("{prefix}{what} >= {a}")),
                (None, Some(b)) => facts.push(format!("{prefix}{what} <= {b}")),
                _ => {}
            };
        range("minLength", "maxLength", "length", facts);
        range("minItems", "maxItems", "items", facts);
        range("minProperties", "maxProperties", "keys", facts);
        if let Some(p) = o.get("pattern").and_then(Value::as_str) {
            facts.push(format!(
                "{prefix}pattern {}",
                short(&py_repr(&Value::String(p.into())))
            ));
        }
        if o.get("uniqueItems") == Some(&Value::Bool(true)) {
            facts.push(format!("{prefix}unique items"));
        }
        if o.get("deprecated") == Some(&Value::Bool(true)) {
            facts.push(format!("{prefix}deprecated"));
        }
        if let Some(ex) = o
            .get("examples")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            facts.push(format!("{prefix}e.g. {}", short(&py_repr(ex))));
        }
        if let Some(r) = o.get("$ref").and_then(Value::as_str)
            && let Some(t) = resolve_ref(self.root, r)
            && !is_object_type(self.root, t)
        {
            self.collect_facts(t, facts, desc, depth + 1, prefix);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            for alt in o.get(key).and_then(Value::as_array).into_iter().flatten() {
                // An object branch is a type of its own, with its fields' facts.
                if is_object_type(self.root, alt) {
                    continue;
                }
                self.collect_facts(alt, facts, desc, depth + 1, prefix);
            }
        }
        if let Some(items) = o.get("items").filter(|i| i.is_object())
            && !is_object_type(self.root, items)
        {
            let p = format!("{prefix}items: ");
            let mut item_desc = None;
            self.collect_facts(items, facts, &mut item_desc, depth + 1, &p);
        }
    }
}
