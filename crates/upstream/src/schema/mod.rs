//! What the bridge knows of each tool's input schema: its rendering ([`render`]), shown by
//! `help()`, the tool function's signature, `query_tool_docs` and the catalog's search, and its
//! check ([`check`]) of a proxied call's arguments.
//!
//! Both are made once per tool list a server gives ([`Schemas::of`]): a slot keeps the last
//! [`Schemas`] with the list it was made of, compared by pointer, so a warm call costs a pointer
//! comparison; a check is compiled on the first call of its tool.

pub mod check;
pub mod pytext;
pub mod refs;
pub mod render;

use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::Tool;
use serde_json::Value;

pub use check::{Check, InvalidArguments};
pub use render::{Rendering, render};

/// The renderings and checks of one tool list.
pub struct Schemas {
    /// The list these are of (kept, so its pointer is not reused while they are).
    tools: Arc<Vec<Tool>>,
    server: String,
    rendered: Vec<Arc<Rendering>>,
    /// Each rendering as the runtime gets it, serialized once (a call that loads servers sends
    /// every tool's metadata: it clones these, never serializes them again).
    rendered_json: Vec<Arc<Value>>,
    checks: Vec<OnceLock<Arc<Check>>>,
}

/// A slot's last [`Schemas`].
#[derive(Default)]
pub struct SchemaCache(Mutex<Option<Arc<Schemas>>>);

impl Schemas {
    /// The schemas of `tools` (a server's list as the pool holds it): the cached ones when they
    /// are of this very list, else made now and kept.
    pub fn of(cache: &SchemaCache, server: &str, tools: &Arc<Vec<Tool>>) -> Arc<Schemas> {
        let mut kept = cache.0.lock().unwrap();
        if let Some(s) = kept.as_ref()
            && Arc::ptr_eq(&s.tools, tools)
        {
            return s.clone();
        }
        let s = Arc::new(Schemas::new(server, tools.clone()));
        *kept = Some(s.clone());
        s
    }

    /// Made for a list no slot holds (tests, benches).
    pub fn new(server: &str, tools: Arc<Vec<Tool>>) -> Schemas {
        let rendered: Vec<Arc<Rendering>> = tools
            .iter()
            .map(|t| {
                Arc::new(render(
                    &Value::Object((*t.input_schema).clone()),
                    server,
                    &t.name,
                ))
            })
            .collect();
        let rendered_json = rendered.iter().map(|r| Arc::new(r.to_json())).collect();
        let checks = tools.iter().map(|_| OnceLock::new()).collect();
        Schemas {
            tools,
            server: server.to_string(),
            rendered,
            rendered_json,
            checks,
        }
    }

    /// The rendering of the tool at `index` of the list.
    pub fn rendering(&self, index: usize) -> Option<&Arc<Rendering>> {
        self.rendered.get(index)
    }

    /// The rendering of the tool at `index` as the runtime gets it.
    pub fn rendering_json(&self, index: usize) -> Option<&Arc<Value>> {
        self.rendered_json.get(index)
    }

    /// The rendering of the tool named `name`.
    pub fn rendering_of(&self, name: &str) -> Option<&Arc<Rendering>> {
        let i = self.tools.iter().position(|t| t.name == name)?;
        self.rendered.get(i)
    }

    /// The check of the tool named `name`, compiled on first use; `None` for a name the list
    /// does not have.
    pub fn check_of(&self, name: &str) -> Option<&Arc<Check>> {
        let i = self.tools.iter().position(|t| t.name == name)?;
        let t = &self.tools[i];
        Some(self.checks[i].get_or_init(|| {
            Arc::new(Check::compile(
                &self.server,
                &t.name,
                &Value::Object((*t.input_schema).clone()),
            ))
        }))
    }
}

#[cfg(test)]
mod corpus;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `share_file` as AgentDojo's workspace suite and pydantic publish it.
    fn share_file() -> Value {
        json!({
            "$defs": {"SharingPermission": {"enum": ["r", "rw"], "title": "SharingPermission", "type": "string"}},
            "properties": {
                "email": {"description": "The email of the user to share the file with.", "type": "string"},
                "file_id": {"description": "The ID of the file to share.", "type": "string"},
                "permission": {"$ref": "#/$defs/SharingPermission", "description": "The permission level to grant the user."}
            },
            "required": ["file_id", "email", "permission"],
            "type": "object"
        })
    }

    /// Parameters and fields in the schema's order, not sorted: the signature reads as the
    /// server wrote it (`serde_json`'s `preserve_order`, declared by the workspace).
    #[test]
    fn parameters_and_fields_keep_the_schemas_order() {
        let schema: Value = serde_json::from_str(
            r#"{"type": "object", "properties": {
                "zeta": {"type": "string"}, "alpha": {"type": "integer"},
                "opts": {"type": "object", "properties": {"y": {"type": "string"}, "b": {"type": "string"}}}
            }}"#,
        )
        .unwrap();
        let r = render(&schema, "s", "t");
        let names: Vec<&str> = r.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["zeta", "alpha", "opts"]);
        let text = r.text();
        let (y, b) = (text.find("y (").unwrap(), text.find("b (").unwrap());
        assert!(y < b, "{text}");
    }

    #[test]
    fn a_refd_enum_is_a_literal_with_its_description() {
        let r = render(&share_file(), "workspace", "share_file");
        let p = r.params.iter().find(|p| p.name == "permission").unwrap();
        assert_eq!(p.annotation, "Literal['r', 'rw']");
        assert_eq!(
            p.line,
            "(Literal['r', 'rw'], required): The permission level to grant the user."
        );
        assert!(r.types.is_empty() && r.more.is_none());
    }

    #[test]
    fn nested_models_unions_bounds_and_recursion() {
        let schema = json!({
            "$defs": {
                "Node": {"type": "object", "title": "Node", "description": "A tree node.",
                         "properties": {"name": {"type": "string"},
                                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                         "required": ["name"]},
                "Json": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/Json"}}]}
            },
            "type": "object",
            "properties": {
                "root": {"$ref": "#/$defs/Node"},
                "limit": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 100}, {"type": "null"}], "default": null},
                "when": {"type": "string", "format": "date-time", "pattern": "^\\d{4}"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1},
                "value": {"$ref": "#/$defs/Json"},
                "opts": {"type": "object", "properties": {"deep": {"type": "boolean", "default": false}}}
            },
            "required": ["root"]
        });
        let r = render(&schema, "s", "t");
        let by = |n: &str| r.params.iter().find(|p| p.name == n).unwrap().clone();
        assert_eq!(by("root").annotation, "Node");
        assert_eq!(by("limit").annotation, "int | None");
        assert_eq!(
            by("limit").line,
            "(int | None, optional, default None, 1 <= value <= 100)"
        );
        assert_eq!(
            by("when").line,
            "(str, optional, format date-time, pattern '^\\\\d{4}')"
        );
        assert_eq!(by("tags").annotation, "list[str]");
        assert!(
            by("tags").line.contains("items 1..") || by("tags").line.contains("items >= 1"),
            "{}",
            by("tags").line
        );
        assert!(
            by("tags").line.contains("items: length <= 20"),
            "{}",
            by("tags").line
        );
        assert_eq!(by("value").annotation, "Json");
        assert_eq!(by("opts").annotation, "Opts");
        let text = r.text();
        assert!(text.contains("Node (dict): A tree node.\n        name (str, required)\n        children (list[Node], optional)"), "{text}");
        assert!(text.contains("Json = str | list[Json]"), "{text}");
        assert!(
            text.contains("Opts (dict)\n        deep (bool, optional, default False)"),
            "{text}"
        );
    }

    #[test]
    fn a_huge_schema_is_cut_saying_where_the_rest_is() {
        let mut props = serde_json::Map::new();
        for i in 0..400 {
            props.insert(
                format!("field_{i}"),
                json!({"type": "string", "description": "word ".repeat(60)}),
            );
        }
        let schema = json!({"type": "object", "properties": {"big": {"type": "object", "properties": props}}});
        let r = render(&schema, "srv", "tool");
        let text = r.text();
        assert!(
            text.len() < render::MAX_RENDERED_CHARS + 600,
            "{}",
            text.len()
        );
        let more = r.more.as_deref().unwrap();
        assert!(
            more.contains("runtime.query_tool_docs('srv', 'tool', detail=\"full\")"),
            "{more}"
        );
        assert!(more.contains("lines of types"), "{more}");
    }

    #[test]
    fn python_reprs() {
        use pytext::py_repr;
        assert_eq!(py_repr(&json!("it's")), "\"it's\"");
        assert_eq!(py_repr(&json!("a'b\"c\n")), "'a\\'b\"c\\n'");
        assert_eq!(
            py_repr(&json!([null, true, 1.5, {"k": "v"}])),
            "[None, True, 1.5, {'k': 'v'}]"
        );
    }

    fn tools(schema: Value) -> Arc<Vec<Tool>> {
        let map: serde_json::Map<String, Value> = serde_json::from_value(schema).unwrap();
        Arc::new(vec![Tool::new("share_file", "Share.", map)])
    }

    #[test]
    fn arguments_outside_the_schema_are_named_with_what_is_allowed() {
        let s = Schemas::new("workspace", tools(share_file()));
        let check = s.check_of("share_file").unwrap();
        assert!(check.is_active());
        let args = |v: Value| v.as_object().cloned().unwrap();
        assert!(
            check
                .problems(Some(&args(
                    json!({"file_id": "1", "email": "a@b", "permission": "rw"})
                )))
                .is_empty()
        );
        assert_eq!(
            check.problems(Some(&args(
                json!({"file_id": "1", "email": "a@b", "permission": "write"})
            ))),
            vec!["permission: 'write' is not one of 'r', 'rw'"]
        );
        assert_eq!(
            check.problems(Some(&args(json!({"file_id": 1, "email": "a@b"})))),
            vec![
                "the required argument 'permission' is missing",
                "file_id: 1 is not of type str"
            ]
        );
        // Nested places are written as Python indexes them.
        let s = Schemas::new(
            "s",
            tools(
                json!({"type": "object", "properties": {"opts": {"type": "object",
            "properties": {"mode": {"anyOf": [{"enum": ["a", "b"]}, {"type": "null"}]}}}}}),
            ),
        );
        let p = s
            .check_of("share_file")
            .unwrap()
            .problems(Some(&args(json!({"opts": {"mode": "c"}}))));
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("opts['mode']: 'c' fits none of the allowed forms: 'c' is not one of 'a', 'b'; or 'c' is not of type None"), "{p:?}");
    }

    #[test]
    fn a_schema_the_validator_cannot_read_checks_nothing() {
        // A remote reference: never fetched, so the schema is not compiled, and calls pass.
        let s = Schemas::new(
            "s",
            tools(json!({"type": "object", "properties": {
            "x": {"$ref": "https://example.invalid/schema.json"}}})),
        );
        let check = s.check_of("share_file").unwrap();
        assert!(!check.is_active());
        let args = json!({"x": 1}).as_object().cloned().unwrap();
        assert!(check.problems(Some(&args)).is_empty());
        assert!(s.check_of("nope").is_none());
    }

    #[test]
    fn schemas_are_made_once_per_tool_list() {
        let cache = SchemaCache::default();
        let list = tools(share_file());
        let a = Schemas::of(&cache, "s", &list);
        let b = Schemas::of(&cache, "s", &list);
        assert!(Arc::ptr_eq(&a, &b));
        let c = Schemas::of(&cache, "s", &tools(share_file()));
        assert!(!Arc::ptr_eq(&a, &c), "a new list gets new schemas");
        let first = c.check_of("share_file").unwrap().clone();
        assert!(
            Arc::ptr_eq(&first, c.check_of("share_file").unwrap()),
            "compiled once"
        );
    }
}
