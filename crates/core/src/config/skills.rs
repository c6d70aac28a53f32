//! The `[skills]` section: the bounds of the functions the model saves for later sessions
//! (`runtime.save_skill`). The store itself is `crate::skills`; this is only its settings.

use serde::{Deserialize, Serialize};

use super::policy::Action;
use super::values::{Size, flexible_u32};

/// `[skills]`: how large one saved skill may be and how many are kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SkillsConfig {
    /// Most bytes of one skill: its source and description together.
    pub max_size: Size,
    /// Most skills kept; saving one more is refused until one is removed.
    #[serde(deserialize_with = "flexible_u32")]
    pub max_count: u32,
    /// Whether a save is stored (`allow`), refused (`deny`), or shown to the user first
    /// (`ask`): a saved skill runs in every later session, so a prompt injection could persist
    /// through one.
    pub save: Action,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        SkillsConfig {
            max_size: Size(64 << 10),
            max_count: 200,
            save: Action::Ask,
        }
    }
}

/// Smallest `max_size`: room for a short function and its docstring.
pub const MIN_MAX_SIZE: u64 = 256;
/// Largest `max_size`: every skill is sent into each new session, so one stays a source file,
/// not a data set.
pub const MAX_MAX_SIZE: u64 = 1 << 20;
/// Most skills one store may be set to keep: each new session reads and defines all of them.
pub const MAX_MAX_COUNT: u32 = 1000;

impl SkillsConfig {
    /// Range checks, as `Config::validate` reports them: the key at fault and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if !(MIN_MAX_SIZE..=MAX_MAX_SIZE).contains(&self.max_size.0) {
            return Err((
                "skills.max_size",
                format!(
                    "{} is outside 256..=1m; a skill is one function's source",
                    self.max_size
                ),
            ));
        }
        if self.max_count == 0 || self.max_count > MAX_MAX_COUNT {
            return Err((
                "skills.max_count",
                format!(
                    "{} is outside 1..={MAX_MAX_COUNT}; every new session defines them all",
                    self.max_count
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let mut s = SkillsConfig::default();
        assert!(s.check().is_ok());
        s.max_size = Size(10);
        assert_eq!(s.check().unwrap_err().0, "skills.max_size");
        s.max_size = Size(2 << 20);
        assert_eq!(s.check().unwrap_err().0, "skills.max_size");
        s.max_size = Size(64 << 10);
        s.max_count = 0;
        assert_eq!(s.check().unwrap_err().0, "skills.max_count");
        s.max_count = MAX_MAX_COUNT + 1;
        assert_eq!(s.check().unwrap_err().0, "skills.max_count");
    }
}
