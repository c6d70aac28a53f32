//! `"server.tool"` globs, as `[policy]` and `[policy.flows]` write them: a TOML list, or one
//! comma-separated string in the environment (split at the commas outside `{…}`).

use super::InvalidValue;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A list of `"server.tool"` globs: a TOML list, or one comma-separated string (environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patterns(pub Vec<String>);

impl Patterns {
    /// Split `s` at the commas outside `{…}` (globset's alternation uses commas too).
    pub(super) fn split(s: &str) -> Vec<String> {
        let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0usize);
        for c in s.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        out.push(cur);
        out
    }

    /// The globs compiled into one set, and those kept. Each was checked at load; one that
    /// still does not compile is left out with a warning naming `key` (what it was written
    /// for), rather than taking the bridge down.
    pub fn compile(&self, key: &str) -> (globset::GlobSet, Vec<String>) {
        let mut b = globset::GlobSetBuilder::new();
        let mut kept = Vec::new();
        for p in &self.0 {
            match Patterns::check(p) {
                Ok(g) => {
                    b.add(g);
                    kept.push(p.clone());
                }
                Err(why) => tracing::warn!("{key}: {why}; glob ignored"),
            }
        }
        (
            b.build().unwrap_or_else(|_| globset::GlobSet::empty()),
            kept,
        )
    }

    /// Why `pattern` is not a rule, if it is not one.
    pub fn check(pattern: &str) -> Result<globset::Glob, InvalidValue> {
        if !pattern.contains('.') {
            return Err(InvalidValue::Rule {
                pattern: pattern.into(),
            });
        }
        globset::Glob::new(pattern).map_err(|error| InvalidValue::Glob {
            pattern: pattern.into(),
            error,
        })
    }
}

impl Serialize for Patterns {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Patterns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        super::values::list_or_string(d, Patterns::split).map(Patterns)
    }
}
