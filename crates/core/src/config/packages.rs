//! The `[packages]` section: which Python distributions the code may install into its session
//! (`runtime.install`), from where, and how much. The installing is `crate::packages`'; this is
//! its settings and the one grammar of a requirement, which the sandbox's requests and
//! `preinstall` are both held to.

use super::{InvalidValue, RequirementFault};
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::policy::Fallback;
use super::values::{Secs, Size, empty_as_none, flexible_bool, list_or_string};

/// Distribution-name globs (`scikit-*`), matched on normalized names: a TOML list, or one
/// comma-separated string (environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameGlobs(pub Vec<String>);

impl NameGlobs {
    /// The glob `pattern` compiles to, on the normalized form of its letters (`Scikit_*` is
    /// `scikit-*`); why not, if it is not one.
    pub fn compile(pattern: &str) -> Result<globset::Glob, InvalidValue> {
        let normalized = normalize(pattern);
        if normalized.is_empty()
            || !normalized
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-*?[]{},!".contains(c))
        {
            return Err(InvalidValue::NameGlob {
                pattern: pattern.into(),
            });
        }
        globset::Glob::new(&normalized).map_err(|error| InvalidValue::Glob {
            pattern: pattern.into(),
            error,
        })
    }
}

impl Serialize for NameGlobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for NameGlobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        list_or_string(d, super::globs::Patterns::split).map(NameGlobs)
    }
}

/// Requirements installed into every new session: a TOML list, or comma-separated in the
/// environment (a requirement holds a comma only between version clauses, so the
/// environment's form cannot carry `a>=1,<2`: write such a list in TOML).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements(pub Vec<String>);

impl Serialize for Requirements {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Requirements {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        list_or_string(d, |s| s.split(',').map(str::to_string).collect()).map(Requirements)
    }
}

/// `[packages]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PackagesConfig {
    /// Installed without asking.
    pub allow: NameGlobs,
    /// Refused. Of all matching lists the most restrictive wins (deny > allow); what none
    /// matches asks the user.
    pub deny: NameGlobs,
    /// What `ask` means when the client cannot be asked; unset follows `policy.ask_fallback`.
    #[serde(default, deserialize_with = "empty_as_none_fallback")]
    pub ask_fallback: Option<Fallback>,
    /// The simple index (PEP 503/691) resolved against.
    pub index_url: String,
    /// A directory of wheels searched besides the index (or alone, with `offline`).
    #[serde(default, deserialize_with = "empty_as_none")]
    pub find_links: Option<PathBuf>,
    /// Reach no index: only `find_links` and what is cached.
    #[serde(deserialize_with = "flexible_bool")]
    pub offline: bool,
    /// Installed into every new session (pooled ones too) before its first call.
    pub preinstall: Requirements,
    /// Most bytes one session may have installed (unpacked).
    pub max_size: Size,
    /// Most bytes the host's cache keeps (`<state_dir>/packages`); the least recently used
    /// wheels go first.
    pub cache_max_size: Size,
    /// The resolver: `uv`, found on PATH unless a path is given.
    pub uv: PathBuf,
    /// Time limit of one install: resolving, downloading and unpacking.
    pub timeout: Secs,
}

fn empty_as_none_fallback<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Fallback>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => serde_json::from_value(serde_json::Value::String(v.to_ascii_lowercase()))
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{v:?} is not allow or deny"))),
    }
}

impl Default for PackagesConfig {
    fn default() -> Self {
        PackagesConfig {
            allow: NameGlobs::default(),
            deny: NameGlobs::default(),
            ask_fallback: None,
            index_url: "https://pypi.org/simple".into(),
            find_links: None,
            offline: false,
            preinstall: Requirements::default(),
            max_size: Size(1 << 30),
            cache_max_size: Size(4 << 30),
            uv: PathBuf::from("uv"),
            timeout: Secs(std::time::Duration::from_secs(300)),
        }
    }
}

impl PackagesConfig {
    /// Range and syntax checks, as `Config::validate` reports them: the key at fault and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        for (key, list) in [
            ("packages.allow", &self.allow),
            ("packages.deny", &self.deny),
        ] {
            for p in &list.0 {
                NameGlobs::compile(p).map_err(|why| (key, why.to_string()))?;
            }
        }
        for r in &self.preinstall.0 {
            Requirement::parse(r).map_err(|why| ("packages.preinstall", why.to_string()))?;
        }
        if self.preinstall.0.len() > MAX_REQUIREMENTS {
            return Err((
                "packages.preinstall",
                format!(
                    "{} requirements; at most {MAX_REQUIREMENTS}",
                    self.preinstall.0.len()
                ),
            ));
        }
        let url = url::Url::parse(&self.index_url).map_err(|e| {
            (
                "packages.index_url",
                format!("{:?} is not a URL: {e}", self.index_url),
            )
        })?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err((
                "packages.index_url",
                format!(
                    "{:?} is not an http(s) URL of a simple index",
                    self.index_url
                ),
            ));
        }
        if let Some(dir) = &self.find_links
            && !dir.is_absolute()
        {
            return Err((
                "packages.find_links",
                format!(
                    "{} is not an absolute path of a directory of wheels",
                    dir.display()
                ),
            ));
        }
        if self.max_size.0 < 1 << 20 {
            return Err((
                "packages.max_size",
                format!("{} is too small; use at least 1m", self.max_size),
            ));
        }
        if self.cache_max_size.0 < self.max_size.0 {
            return Err((
                "packages.cache_max_size",
                format!(
                    "{} is below packages.max_size ({}): one session's install must fit in the cache",
                    self.cache_max_size, self.max_size
                ),
            ));
        }
        if self.timeout.0.is_zero() {
            return Err(("packages.timeout", "must be more than 0s".into()));
        }
        Ok(())
    }
}

// The bounds of a requirement live beside the faults that name them (`error.rs`).
pub use super::error::{MAX_REQUIREMENT_LEN, MAX_REQUIREMENTS};

/// One requirement as the bridge accepts it: a distribution name, optional extras, and
/// optional version clauses (`pandas-stubs[x]>=2,<3`). Only this subset of PEP 508: no URL,
/// no path, no marker, no option (`-e`, `--index-url`), so what the code asks for can only
/// name a distribution of the configured index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// As written (trimmed).
    pub text: String,
    /// PEP 503's normalized name: lower case, runs of `-_.` as one `-`.
    pub name: String,
}

impl Requirement {
    /// Read one requirement as the code wrote it. Fails, saying which rule it broke, on an
    /// empty one, one longer than [`MAX_REQUIREMENT_LEN`] bytes, an option, a URL or path, a
    /// marker, a bad name, extra or version clause.
    pub fn parse(text: &str) -> Result<Requirement, InvalidValue> {
        let t = text.trim();
        let shown = crate::text::visible(&t.chars().take(80).collect::<String>()).into_owned();
        let bad = |why: RequirementFault| {
            Err(InvalidValue::Requirement {
                shown: shown.clone(),
                why,
            })
        };
        if t.is_empty() {
            return bad(RequirementFault::Empty);
        }
        if t.len() > MAX_REQUIREMENT_LEN {
            return bad(RequirementFault::TooLong);
        }
        if t.starts_with('-') {
            return bad(RequirementFault::Option);
        }
        if t.contains("://") || t.contains('@') || t.contains('/') || t.contains('\\') {
            return bad(RequirementFault::UrlOrPath);
        }
        if t.contains(';') {
            return bad(RequirementFault::Marker);
        }
        let name_end = t
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or(t.len());
        let name = &t[..name_end];
        let ok_name = !name.is_empty()
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
            && name
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok_name {
            return bad(RequirementFault::Name);
        }
        let mut rest = t[name_end..].trim_start();
        if let Some(r) = rest.strip_prefix('[') {
            let Some(close) = r.find(']') else {
                return bad(RequirementFault::UnclosedExtra);
            };
            for extra in r[..close].split(',') {
                let e = extra.trim();
                if e.is_empty()
                    || !e
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                {
                    return bad(RequirementFault::Extra);
                }
            }
            rest = r[close + 1..].trim_start();
        }
        if !rest.is_empty() {
            for clause in rest.split(',') {
                let c = clause.trim();
                let op_len = ["===", "==", "!=", "<=", ">=", "~=", "<", ">"]
                    .iter()
                    .find(|op| c.starts_with(**op))
                    .map(|op| op.len());
                let Some(op_len) = op_len else {
                    return bad(RequirementFault::Operator);
                };
                let v = c[op_len..].trim();
                if v.is_empty()
                    || !v
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ".*+!_-".contains(ch))
                {
                    return bad(RequirementFault::Version);
                }
            }
        }
        Ok(Requirement {
            text: t.to_string(),
            name: normalize(name),
        })
    }
}

/// PEP 503's normalized name: lower case, every run of `-`, `_` and `.` one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if "-_.".contains(c) {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_of_names_and_versions_are_accepted() {
        for (t, name) in [
            ("tabulate", "tabulate"),
            ("Python_Slugify==8.0.4", "python-slugify"),
            ("pandas-stubs[x, y]>=2,<3", "pandas-stubs"),
            ("zope.interface ~= 7.0", "zope-interface"),
            ("numpy==2.*", "numpy"),
        ] {
            let r = Requirement::parse(t).unwrap();
            assert_eq!(r.name, name, "{t}");
        }
    }

    #[test]
    fn urls_paths_options_and_markers_are_refused() {
        for t in [
            "",
            "-e .",
            "--index-url=http://evil/simple",
            "pkg @ https://evil/pkg.whl",
            "https://evil/pkg.whl",
            "./pkg",
            "/tmp/pkg.whl",
            "pkg; python_version>'3'",
            "pkg==1.0 --hash=sha256:00",
            "pkg[",
            "pkg extra",
            "-",
            "pkg==",
            "\u{202e}pkg",
        ] {
            assert!(Requirement::parse(t).is_err(), "{t:?} was accepted");
        }
        assert!(Requirement::parse(&"a".repeat(201)).is_err());
    }

    #[test]
    fn names_and_globs_are_normalized() {
        assert_eq!(normalize("Foo.Bar__baz"), "foo-bar-baz");
        let g = NameGlobs::compile("Scikit_*").unwrap().compile_matcher();
        assert!(g.is_match("scikit-learn"));
        assert!(NameGlobs::compile("a/b").is_err());
        assert!(NameGlobs::compile("").is_err());
    }

    #[test]
    fn checks_name_the_key() {
        let mut c = PackagesConfig::default();
        assert!(c.check().is_ok());
        c.preinstall = Requirements(vec!["x @ http://e/x.whl".into()]);
        assert_eq!(c.check().unwrap_err().0, "packages.preinstall");
        c.preinstall = Requirements::default();
        c.index_url = "file:///srv".into();
        assert_eq!(c.check().unwrap_err().0, "packages.index_url");
        c.index_url = PackagesConfig::default().index_url;
        c.cache_max_size = Size(1 << 20);
        assert_eq!(c.check().unwrap_err().0, "packages.cache_max_size");
    }
}
