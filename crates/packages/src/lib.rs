//! Packages on demand: `runtime.install(...)` in the sandbox, done by the host with the
//! sandbox's network still off.
//!
//! An install is: the requirements checked ([`bridge_core::config::Requirement`]: names, extras and
//! version clauses only); resolved for the interpreter the sandbox said it is at boot
//! (`resolve`, uv on the host, wheels only, the image's distributions as constraints), or taken
//! from a resolution already made (`store` plans: no index reached); decided under
//! `[packages]` (deny > allow > ask, over every distribution that would come, dependencies
//! included; asking names each with its version and size); each wheel downloaded once into the
//! host's cache and checked against the index's sha256, unpacked once with bounds; then
//! hard-linked into the session's package directory, which the sandbox sees read-only at
//! `protocol::PACKAGES_DIR`. A failure anywhere takes back what the install linked: nothing is
//! left half-installed. Every install is one audit record.
//!
//! **Knows** `config`, `policy` (the `Approver` it asks through and the question's form),
//! `audit`, `protocol` and the ground-floor helpers; nothing of `sandbox/`, `upstream/` or
//! `server`.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.

mod decide;
mod error;
mod installer;
mod link;
pub mod resolve;
pub mod rpc;
mod session;
pub mod store;
mod unpack;

pub use decide::{Asker, MAX_QUESTIONS};
pub use error::PackageError;
pub use installer::{Packages, Preinstall};
pub use session::Installed;
