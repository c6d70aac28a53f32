//! The rendering measured on real schemas: the corpus in `tests/fixtures/tool-schemas/` (the
//! reference servers, `mcp-server-time`, `mcp-server-git`, AgentDojo's four suites and the
//! pydantic fixture server; `collect.py` there made it). For each tool, every enum value, field
//! (with required or optional), default, bound, format, pattern and field description the
//! schema holds, found by walking the schema itself (through its `$ref`s), must be in the text
//! `help()` shows; the per-server figures and the rendering's size in cl100k tokens are printed
//! (`cargo test -p mcp-code-bridge-upstream --lib schema::corpus -- --nocapture`; BENCHMARKS.md,
//! "Tool schemas as the model sees them").

use std::collections::HashSet;
use std::path::PathBuf;

use serde_json::Value;

use super::pytext::py_repr;
use super::render::render;

/// One fact of a schema: what must be in the rendering (on one line, with `also` when set).
struct Fact {
    kind: &'static str,
    needle: String,
    also: Option<&'static str>,
}

const SHOWN_VALUE_CHARS: usize = 119;

fn shown(s: String) -> String {
    if s.chars().count() <= SHOWN_VALUE_CHARS + 1 {
        s
    } else {
        s.chars().take(SHOWN_VALUE_CHARS).collect()
    }
}

fn facts(
    root: &Value,
    schema: &Value,
    out: &mut Vec<Fact>,
    refs: &mut HashSet<String>,
    depth: usize,
) {
    let Some(o) = schema.as_object() else { return };
    if depth > 20 {
        return;
    }
    if let Some(r) = o.get("$ref").and_then(Value::as_str)
        && refs.insert(r.to_string())
        && let Some(t) = super::refs::resolve_ref(root, r)
    {
        facts(root, t, out, refs, depth + 1);
    }
    for v in o
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(Fact {
            kind: "enum",
            needle: shown(py_repr(v)),
            also: None,
        });
    }
    if let Some(v) = o.get("const") {
        out.push(Fact {
            kind: "enum",
            needle: shown(py_repr(v)),
            also: None,
        });
    }
    if let Some(v) = o.get("default") {
        out.push(Fact {
            kind: "default",
            needle: shown(format!("default {}", py_repr(v))),
            also: None,
        });
    }
    for k in [
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    ] {
        if let Some(n) = o.get(k).filter(|n| n.is_number()) {
            out.push(Fact {
                kind: "bound",
                needle: n.to_string(),
                also: None,
            });
        }
    }
    if let Some(p) = o.get("pattern").and_then(Value::as_str) {
        out.push(Fact {
            kind: "bound",
            needle: shown(py_repr(&Value::String(p.into()))),
            also: None,
        });
    }
    if let Some(f) = o.get("format").and_then(Value::as_str) {
        out.push(Fact {
            kind: "format",
            needle: format!("format {f}"),
            also: None,
        });
    }
    let required: Vec<&str> = o
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let req = required.contains(&k.as_str());
            out.push(Fact {
                kind: if req { "required" } else { "field" },
                needle: format!("{k} ("),
                also: Some(if req { "required" } else { "optional" }),
            });
            if let Some(d) = v.get("description").and_then(Value::as_str) {
                let d: String = d.split_whitespace().collect::<Vec<_>>().join(" ");
                let d: String = d.chars().take(60).collect();
                if !d.is_empty() {
                    out.push(Fact {
                        kind: "description",
                        needle: d,
                        also: None,
                    });
                }
            }
            facts(root, v, out, refs, depth + 1);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        for alt in o.get(key).and_then(Value::as_array).into_iter().flatten() {
            facts(root, alt, out, refs, depth + 1);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = o.get(key) {
            facts(root, v, out, refs, depth + 1);
        }
    }
}

fn found(text: &str, f: &Fact) -> bool {
    match f.also {
        None => text.contains(&f.needle),
        Some(also) => text
            .lines()
            .any(|l| l.trim_start().starts_with(&f.needle) && l.contains(also)),
    }
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tool-schemas")
}

#[test]
fn every_fact_of_every_corpus_schema_is_in_the_rendering() {
    let bpe = tiktoken_rs::cl100k_base_singleton();
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the corpus directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "the corpus is incomplete: {files:?}");
    println!(
        "| server | tools | facts (enum, required, field, default, bound, format, description) | found | rendering tokens: mean / max |"
    );
    println!("|---|---:|---|---:|---:|");
    let mut missing = Vec::new();
    let (mut all_facts, mut all_found) = (0usize, 0usize);
    for path in files {
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let server = doc["server"].as_str().unwrap().to_string();
        let tools = doc["tools"].as_array().unwrap();
        let kinds = [
            "enum",
            "required",
            "field",
            "default",
            "bound",
            "format",
            "description",
        ];
        let mut by_kind = [0usize; 7];
        let (mut n, mut ok) = (0usize, 0usize);
        let mut tokens = Vec::new();
        for t in tools {
            let name = t["name"].as_str().unwrap();
            let schema = &t["inputSchema"];
            let r = render(schema, &server, name);
            let text = r.text();
            tokens.push(bpe.encode_ordinary(&text).len());
            let mut fs = Vec::new();
            facts(schema, schema, &mut fs, &mut HashSet::new(), 0);
            for f in &fs {
                by_kind[kinds.iter().position(|k| *k == f.kind).unwrap()] += 1;
                n += 1;
                if found(&text, f) {
                    ok += 1;
                } else {
                    missing.push(format!("{server}.{name}: {} {:?}", f.kind, f.needle));
                }
            }
        }
        all_facts += n;
        all_found += ok;
        let mean = tokens.iter().sum::<usize>() as f64 / tokens.len().max(1) as f64;
        println!(
            "| {server} | {} | {n} ({}) | {:.1} % | {mean:.0} / {} |",
            tools.len(),
            by_kind
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            100.0 * ok as f64 / n.max(1) as f64,
            tokens.iter().max().unwrap_or(&0),
        );
    }
    println!("all: {all_found} of {all_facts} facts found");
    assert!(
        missing.is_empty(),
        "facts missing from the rendering:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_fact_left_out_is_found_missing() {
    // The measure can fail: an enum value the rendering does not show is counted missing.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"p": {"enum": ["r", "rw"]}},
        "required": ["p"],
    });
    let mut fs = Vec::new();
    facts(&schema, &schema, &mut fs, &mut HashSet::new(), 0);
    let text = render(&schema, "s", "t").text();
    assert!(fs.iter().all(|f| found(&text, f)), "{text}");
    let planted = text.replace("'rw'", "'xx'");
    assert!(fs.iter().any(|f| !found(&planted, f)));
    let planted = text.replace("required", "optional");
    assert!(fs.iter().any(|f| !found(&planted, f)));
}
