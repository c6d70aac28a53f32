//! Configuration, the ground floor of the bridge: built-in defaults < TOML files <
//! `MCP_BRIDGE_*` environment < command-line flags, layered with figment.
//!
//! - [`keys`]: the one list of keys ([`KEYS`]) with their docs;
//! - [`load`](mod@load): the layering, where each value came from, the system file, unknown
//!   variables;
//! - [`values`]: value types and their lenient spellings ([`Secs`], [`Size`], [`Runtime`], ...);
//! - [`servers`]: the `[servers.<name>]` schema ([`ServerEntry`]);
//! - [`flows`]: the `[policy.flows]` section ([`FlowsConfig`]); [`globs`]: the
//!   `"server.tool"` glob lists both sections write;
//! - [`audit`]: the `[audit]` section ([`AuditConfig`]);
//! - [`skills`]: the `[skills]` section ([`SkillsConfig`]);
//! - [`oauth`]: the `[oauth]` section ([`OAuthConfig`]), the issuer `serve` accepts tokens of;
//! - [`http`]: `listen`, `token_file` and the `[http]` section ([`HttpConfig`]) of `serve`;
//! - [`error`]: why a configuration was refused;
//! - [`effective`]: the [`Config`] struct, its defaults and checks, and the command-line
//!   [`Overrides`].
//!
//! This file only declares the modules and re-exports their main items: no module here names
//! anything of this file, so none of them sits in a cycle through it.
//!
//! This module imports nothing from `sandbox` or `upstream`: both read their settings from here.
//!
//! Adding a section (`[policy]`): a struct in its own file here, a field of [`Config`] holding it,
//! and one row in [`KEYS`] per key, named `section.key` (the variable is derived, see
//! [`Key::env`]).
//!
//! Adding a key: a field of [`Config`] with its default in `Config::default` (`effective.rs`, the
//! only place the default is written), a row in [`KEYS`] (name and doc), a check in
//! `Config::validate` if its range is limited, a row in docs/configuration.md's key table
//! (tests/e2e/docs.rs names any missing row), and a field of [`Overrides`] only if it should also
//! be a flag (then a row in that page's flag list: tests/e2e/docs.rs holds it to `--help`).

pub mod audit;
pub mod effective;
pub mod error;
pub mod flows;
pub mod globs;
pub mod http;
pub mod inputs;
pub mod keys;
pub mod load;
pub mod oauth;
pub mod packages;
pub mod policy;
pub mod servers;
pub mod skills;
mod source;
pub mod values;

pub use audit::{AuditConfig, CodeKept};
pub use effective::{
    Config, DEFAULT_IMAGE, GVISOR_HOST_PIDS_BASE, GVISOR_HOST_PIDS_PER_TASK, MIN_OUTPUT_BUDGET,
    Overrides,
};
pub use error::{ConfigError, InvalidValue, Problem, RequirementFault};
pub use flows::{FlowsConfig, OnSuspect};
pub use http::HttpConfig;
pub use inputs::InputEntry;
pub use keys::{ENV_PREFIX, KEYS, Key, closest_key, env_name};
pub use load::{
    Loaded, SETUP_MARKER, SYSTEM_CONFIG, SYSTEM_CONFIG_ENV, Source, SystemConfig, config_files,
    load,
};
pub use oauth::OAuthConfig;
pub use packages::{PackagesConfig, Requirement};
pub use policy::PolicyConfig;
pub use servers::ServerEntry;
pub use skills::SkillsConfig;
pub use values::{Isolation, LogLevel, ModuleList, OutputMode, Runtime, Secs, Size};
