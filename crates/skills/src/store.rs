//! The store of saved skills, `<state_dir>/skills/` (one directory per identity): the files of
//! one skill, their bounds, the names they may have, and why the store refuses or fails
//! ([`SkillError`]).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::check;
use bridge_core::config::Config;

/// Directory of the store under the state directory.
pub const DIR: &str = "skills";
/// Where the identities of `serve` keep theirs, inside [`DIR`].
pub const USERS_DIR: &str = "users";
/// Longest skill name: a function name, not a sentence.
pub const MAX_NAME: usize = 64;

/// Python's keywords: valid identifiers that no function can be named.
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Why the store refused or failed. The message says what happened; its
/// [`hint`](bridge_core::error::Hinted::hint) says what to do next. Both reach the model as the
/// exception `save_skill` raises.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// The name is not an ASCII Python identifier of at most [`MAX_NAME`] characters, or is a
    /// keyword (or, from an RPC, a parameter is missing or not a string).
    #[error("{name:?} is not a valid skill name")]
    InvalidName {
        /// The name as given, cut at twice [`MAX_NAME`] bytes.
        name: String,
    },
    /// The source and description together are larger than `skills.max_size`.
    #[error(
        "skill {name:?} is {size} bytes (source and description), above skills.max_size ({max} bytes)"
    )]
    TooLarge {
        /// The skill's name.
        name: String,
        /// Bytes of its source and description together.
        size: u64,
        /// `skills.max_size`, in bytes.
        max: u64,
    },
    /// The store already holds `skills.max_count` skills and the name is a new one.
    #[error(
        "{count} skills are saved, the most skills.max_count allows ({max}); {name:?} was not saved"
    )]
    TooMany {
        /// The skill that was not saved.
        name: String,
        /// Skills in the store.
        count: usize,
        /// `skills.max_count`.
        max: u32,
    },
    /// The source is not exactly one function definition that runs nothing when defined
    /// ([`check::check`](crate::check::check)).
    #[error("skill {name:?} was not saved: {reason}")]
    NotOneFunction {
        /// The skill's name.
        name: String,
        /// What the check found instead.
        reason: String,
    },
    /// No skill of that name is saved (to remove or read).
    #[error("no skill named {name:?} is saved")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// The skill's files are there but cannot be loaded: too large, not UTF-8, not a regular
    /// file, or not one function.
    #[error("skill {name:?} cannot be read: {reason}")]
    Broken {
        /// The skill's name.
        name: String,
        /// Why it cannot be loaded.
        reason: String,
    },
    /// A file or directory of the store could not be created, read, written, locked or
    /// removed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done (`cannot write`).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl bridge_core::error::Hinted for SkillError {
    /// What to do next.
    fn hint(&self) -> Option<bridge_core::error::Hint> {
        Some(bridge_core::error::Hint::sentence(match self {
            SkillError::InvalidName { .. } => format!(
                "a skill is saved under its function's name: ASCII letters, digits and _, not starting with a digit, at most {MAX_NAME} characters, not a Python keyword"
            ),
            SkillError::TooLarge { .. } => {
                "save a smaller function (helpers as skills of their own), or raise skills.max_size in the bridge's configuration".into()
            }
            SkillError::TooMany { .. } => {
                "remove skills no longer needed (runtime.delete_skill(name), or `mcp-code-bridge skills rm NAME`), or raise skills.max_count".into()
            }
            SkillError::NotOneFunction { .. } => {
                "a skill is one function defined with def, alone in its cell or file, with no decorator and only literal default values; it imports what it needs inside its body".into()
            }
            SkillError::NotFound { .. } => {
                "runtime.list_skills() or `mcp-code-bridge skills list` shows the saved ones".into()
            }
            SkillError::Broken { .. } => {
                "save it again from a session, or remove it with `mcp-code-bridge skills rm NAME`".into()
            }
            SkillError::Io { .. } => {
                "check that the bridge's state_dir exists and is writable by this user".into()
            }
        }))
    }
}

/// One saved skill, as the runtime defines it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Skill {
    /// Its name: the function's, and the stem of its files.
    pub name: String,
    /// What it does, as the model wrote it when saving; empty when its metadata is missing.
    pub description: String,
    /// The function's source, as the runtime sent it.
    pub source: String,
    /// When it was saved (RFC 3339), empty when its metadata is missing.
    pub saved_at: String,
    /// Who saved it: the session (`identity/session` under `serve`) and how the save was
    /// decided (`skills.save`); empty for a skill saved before this was kept.
    pub saved_by: String,
    /// SHA-256 of its source, as the audit record of its save names it.
    pub sha256: String,
}

/// A file of the store that is not loaded, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BrokenSkill {
    /// The file's stem (names that are not UTF-8 shown lossily).
    pub name: String,
    /// Why it is not loaded.
    pub reason: String,
}

/// Everything the store holds: the skills that can be loaded, by name, and the broken files.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Listing {
    /// The skills that can be loaded, sorted by name.
    pub skills: Vec<Skill>,
    /// The `.py` files that cannot be loaded, sorted by name.
    pub broken: Vec<BrokenSkill>,
}

/// What `save` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// A skill of that name was there and is replaced.
    pub replaced: bool,
    /// Skills in the store after saving.
    pub count: usize,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Meta {
    #[serde(default)]
    description: String,
    #[serde(default)]
    saved_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    saved_by: String,
}

/// The skills of one identity: one directory and its bounds. Opening touches no file.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    max_size: u64,
    max_count: u32,
}

/// Is `name` an ASCII Python identifier a function can have (and so a safe file name)?
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b == b'_' || b.is_ascii_alphabetic())
        && bytes.all(|b| b == b'_' || b.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME
        && !KEYWORDS.contains(&name)
}

impl Store {
    /// The store in `dir` (created at the first save), holding at most `max_count` skills of
    /// at most `max_size` bytes each (source and description together).
    pub fn new(dir: PathBuf, max_size: u64, max_count: u32) -> Store {
        Store {
            dir,
            max_size,
            max_count,
        }
    }

    /// The user's store: `<state_dir>/skills` with the `[skills]` bounds.
    pub fn from_config(config: &Config) -> Store {
        Store::new(
            config.state_dir.join(DIR),
            config.skills.max_size.0,
            config.skills.max_count,
        )
    }

    /// An identity's own store under `serve`: `<state_dir>/skills/users/<identity>` (see
    /// `bridge_core::identity::dir_name`), so one user's skills are never defined in another's
    /// sessions. The directory has no `.py` name, so the stdio user's store never lists it.
    pub fn for_identity(config: &Config, identity: &str) -> Store {
        Store::new(
            config
                .state_dir
                .join(DIR)
                .join(USERS_DIR)
                .join(bridge_core::identity::dir_name(identity)),
            config.skills.max_size.0,
            config.skills.max_count,
        )
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SkillError {
        let path = path.to_path_buf();
        move |source| SkillError::Io { what, path, source }
    }

    fn check_name(name: &str) -> Result<(), SkillError> {
        if valid_name(name) {
            Ok(())
        } else {
            Err(SkillError::InvalidName {
                name: name[..bridge_core::text::floor_char_boundary(name, 2 * MAX_NAME)]
                    .to_string(),
            })
        }
    }

    /// Save (or replace) skill `name`. Refused, with nothing written, when the name is not an
    /// identifier, the skill is larger than `max_size`, its source is not exactly one function
    /// that runs nothing when defined ([`check::check`]) or the store is full.
    pub fn save(&self, name: &str, source: &str, description: &str) -> Result<Saved, SkillError> {
        self.save_by(name, source, description, "")
    }

    /// [`Store::save`], noting who saved it (`saved_by`).
    pub fn save_by(
        &self,
        name: &str,
        source: &str,
        description: &str,
        by: &str,
    ) -> Result<Saved, SkillError> {
        self.check_save(name, source, description)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(Self::io("cannot create the skills directory", &self.dir))?;
        let _lock = self.lock()?;
        let names = self.names()?;
        let replaced = names.iter().any(|n| n == name);
        if !replaced && names.len() >= self.max_count as usize {
            return Err(SkillError::TooMany {
                name: name.into(),
                count: names.len(),
                max: self.max_count,
            });
        }
        let meta = Meta {
            description: description.into(),
            saved_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            saved_by: by.chars().take(256).collect(),
        };
        let meta = serde_json::to_vec_pretty(&meta).expect("metadata serializes");
        self.write_atomically(&self.meta_path(name), &meta)?;
        self.write_atomically(&self.source_path(name), source.as_bytes())?;
        Ok(Saved {
            replaced,
            count: names.len() + usize::from(!replaced),
        })
    }

    /// Whether `name`, `source` and `description` could be saved (name, size, one function),
    /// before anyone is asked about it.
    pub fn check_save(
        &self,
        name: &str,
        source: &str,
        description: &str,
    ) -> Result<(), SkillError> {
        Self::check_name(name)?;
        let size = (source.len() + description.len()) as u64;
        if size > self.max_size {
            return Err(SkillError::TooLarge {
                name: name.into(),
                size,
                max: self.max_size,
            });
        }
        check::check(name, source).map_err(|reason| SkillError::NotOneFunction {
            name: name.into(),
            reason: reason.to_string(),
        })
    }

    /// Remove skill `name` (its source first: without it the metadata is ignored).
    pub fn remove(&self, name: &str) -> Result<(), SkillError> {
        Self::check_name(name)?;
        if !self.dir.exists() {
            return Err(SkillError::NotFound { name: name.into() });
        }
        let _lock = self.lock()?;
        let path = self.source_path(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SkillError::NotFound { name: name.into() });
            }
            Err(e) => return Err(Self::io("cannot remove", &path)(e)),
        }
        let _ = fs::remove_file(self.meta_path(name));
        Ok(())
    }

    /// One skill, read as [`Store::list`] reads it.
    pub fn get(&self, name: &str) -> Result<Skill, SkillError> {
        Self::check_name(name)?;
        match self.read_one(name) {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(SkillError::NotFound { name: name.into() }),
            Err(reason) => Err(SkillError::Broken {
                name: name.into(),
                reason,
            }),
        }
    }

    /// Whether the store holds any skill file (broken ones too): one directory read, cheap
    /// enough for every exec, which says so to the runtime so that an empty store costs an
    /// interpreter's first call no `load_skills` round trip.
    pub fn any(&self) -> bool {
        fs::read_dir(&self.dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".py") && !name.starts_with('.')
            })
        })
    }

    /// Every skill, by name, and every `.py` file that cannot be one. An absent directory is
    /// an empty store. At most `max_count` skills are read; any more (put there by hand) are
    /// reported as broken.
    pub fn list(&self) -> Result<Listing, SkillError> {
        let mut listing = Listing::default();
        if !self.dir.exists() {
            return Ok(listing);
        }
        for stem in self.stems()? {
            if !valid_name(&stem) {
                listing.broken.push(BrokenSkill {
                    reason: "its file name is not a Python identifier".into(),
                    name: stem,
                });
                continue;
            }
            if listing.skills.len() >= self.max_count as usize {
                listing.broken.push(BrokenSkill {
                    reason: format!("more than skills.max_count ({}) are saved", self.max_count),
                    name: stem,
                });
                continue;
            }
            match self.read_one(&stem) {
                // Checked again as read: a file stored before the check, or by hand, whose
                // source is more than one function is never sent to be defined.
                Ok(Some(s)) => match check::check(&s.name, &s.source) {
                    Ok(()) => listing.skills.push(s),
                    Err(reason) => listing.broken.push(BrokenSkill {
                        name: stem,
                        reason: reason.to_string(),
                    }),
                },
                Ok(None) => {} // removed since the directory was read
                Err(reason) => listing.broken.push(BrokenSkill { name: stem, reason }),
            }
        }
        Ok(listing)
    }

    fn source_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.py"))
    }

    fn meta_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// The valid names of the store, sorted.
    fn names(&self) -> Result<Vec<String>, SkillError> {
        Ok(self
            .stems()?
            .into_iter()
            .filter(|s| valid_name(s))
            .collect())
    }

    /// The stems of every `*.py` entry, sorted (names that are not UTF-8 shown lossily).
    fn stems(&self) -> Result<Vec<String>, SkillError> {
        let read = fs::read_dir(&self.dir).map_err(Self::io("cannot read", &self.dir))?;
        let mut stems = Vec::new();
        for entry in read {
            let entry = entry.map_err(Self::io("cannot read", &self.dir))?;
            let file = entry.file_name();
            let file = file.to_string_lossy();
            if let Some(stem) = file.strip_suffix(".py")
                && !file.starts_with('.')
            {
                stems.push(stem.to_string());
            }
        }
        stems.sort();
        Ok(stems)
    }

    /// `Ok(None)`: no such skill; `Err`: why its file cannot be loaded.
    fn read_one(&self, name: &str) -> Result<Option<Skill>, String> {
        let path = self.source_path(name);
        let Some(source) = self.read_bounded(&path)? else {
            return Ok(None);
        };
        let source =
            String::from_utf8(source).map_err(|_| "its source is not UTF-8".to_string())?;
        // Metadata is a description: missing or unreadable, the skill still loads without one.
        let meta: Meta = self
            .read_bounded(&self.meta_path(name))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if (source.len() + meta.description.len()) as u64 > self.max_size {
            return Err(format!(
                "it is larger than skills.max_size ({} bytes)",
                self.max_size
            ));
        }
        Ok(Some(Skill {
            name: name.into(),
            description: meta.description,
            sha256: bridge_core::audit::code_sha256(&source),
            source,
            saved_at: meta.saved_at,
            saved_by: meta.saved_by,
        }))
    }

    /// A regular file's bytes (`bridge_core::statefile::open_read`: no symlink followed, no FIFO
    /// waited on), reading at most `max_size + 1`.
    fn read_bounded(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
        let file = match bridge_core::statefile::open_read(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return Err(e.to_string()),
            Err(e) => return Err(format!("cannot open it: {e}")),
        };
        let mut bytes = Vec::new();
        file.take(self.max_size + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read it: {e}"))?;
        if bytes.len() as u64 > self.max_size {
            return Err(format!(
                "it is larger than skills.max_size ({} bytes)",
                self.max_size
            ));
        }
        Ok(Some(bytes))
    }

    /// The store's lock, held while the count is checked and the files written.
    fn lock(&self) -> Result<File, SkillError> {
        let path = self.dir.join(".lock");
        let f = bridge_core::statefile::open_lock(&path)
            .map_err(Self::io("cannot open the lock", &path))?;
        bridge_core::flock::lock_exclusive(&f).map_err(Self::io("cannot lock", &path))?;
        Ok(f)
    }

    /// `bytes` to a temporary file beside `path` (0600, fsynced), renamed over `path`.
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), SkillError> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".skill-")
            .suffix(".tmp")
            .permissions(fs::Permissions::from_mode(0o600))
            .tempfile_in(&self.dir)
            .map_err(Self::io("cannot create a temporary file in", &self.dir))?;
        tmp.write_all(bytes)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(Self::io("cannot write", tmp.path()))?;
        tmp.persist(path)
            .map_err(|e| Self::io("cannot write", path)(e.error))?;
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}
