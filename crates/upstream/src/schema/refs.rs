//! Local `$ref`s and `allOf`s of a schema: a `#/...` pointer resolved against the root, an
//! object type recognised through its `$ref`, an `allOf` of objects merged into one.

use serde_json::{Map, Value};

/// A local `$ref` resolved against the root: `#`, `#/a/b` (JSON pointer, `~0`/`~1` and
/// percent escapes). Anything else (another document, an anchor) is `None`.
pub fn resolve_ref<'v>(root: &'v Value, r: &str) -> Option<&'v Value> {
    let frag = r.strip_prefix('#')?;
    if frag.is_empty() {
        return Some(root);
    }
    let pointer = percent_decode(frag);
    if !pointer.starts_with('/') {
        return None;
    }
    root.pointer(&pointer)
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `schema` is (or refers to) an object type with fields, rendered as a type of its own.
pub(super) fn is_object_type(root: &Value, schema: &Value) -> bool {
    let s = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve_ref(root, r).unwrap_or(schema),
        None => schema,
    };
    s.get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty())
}

/// Whether an `allOf`'s schema says something of its own beyond the `allOf`.
pub(super) fn has_shape(o: &Map<String, Value>) -> bool {
    o.contains_key("properties") || o.contains_key("type") || o.contains_key("items")
}

/// An `allOf` whose members are objects (or refer to them), as one object: the members'
/// properties and required names together with the schema's own.
pub(super) fn merge_all_of(root: &Value, schema: &Value) -> Value {
    let mut out = schema.as_object().cloned().unwrap_or_default();
    let all = out
        .remove("allOf")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    let mut props = out
        .remove("properties")
        .and_then(|p| p.as_object().cloned())
        .unwrap_or_default();
    let mut required: Vec<Value> = out
        .remove("required")
        .and_then(|r| r.as_array().cloned())
        .unwrap_or_default();
    let mut other_types = Vec::new();
    for m in &all {
        let m = match m.get("$ref").and_then(Value::as_str) {
            Some(r) => resolve_ref(root, r).unwrap_or(m),
            None => m,
        };
        match m.get("properties").and_then(Value::as_object) {
            Some(p) => {
                for (k, v) in p {
                    props.entry(k.clone()).or_insert_with(|| v.clone());
                }
                for r in m
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if !required.contains(r) {
                        required.push(r.clone());
                    }
                }
            }
            None => {
                if let Some(o) = m.as_object() {
                    for (k, v) in o {
                        if k != "description" && k != "title" {
                            other_types.push((k.clone(), v.clone()));
                        }
                    }
                }
            }
        }
    }
    if !props.is_empty() {
        out.insert("properties".into(), Value::Object(props));
        out.insert("type".into(), Value::String("object".into()));
        if !required.is_empty() {
            out.insert("required".into(), Value::Array(required));
        }
    } else {
        for (k, v) in other_types {
            out.entry(k).or_insert(v);
        }
    }
    Value::Object(out)
}
