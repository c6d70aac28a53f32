//! Skills: functions the model saved (`runtime.save_skill`) so that later sessions have them
//! defined. This crate is the store on the host, `<state_dir>/skills/` ([`Store`], `store.rs`),
//! and the RPC methods the runtime calls to save, list, remove and load them ([`rpc`]);
//! `server.rs` puts those in front of each exec's upstream handler. It knows `config` (its
//! bounds) and `protocol` (the `RpcHandler` seam) only.
//!
//! One skill is two files: `<name>.py`, the function's source as the runtime sent it, and
//! `<name>.json`, its metadata (description, when it was saved). Both are written atomically
//! (a temporary file in the same directory, fsynced, renamed over) with mode 0600, the
//! metadata first, so a `.py` that is present always has its metadata. The `.py` files are
//! the list: a `.json` without one is ignored. Names are ASCII Python identifiers, so a name is
//! a file name and can never be a path.
//!
//! The store is bounded: a skill's source and description together at most
//! `skills.max_size`, at most `skills.max_count` skills (a replaced skill does not count
//! twice); the count is checked under a lock on `.lock`, so two bridges saving at once cannot
//! pass it. What is read back is bounded the same way: a file larger than the cap, not UTF-8,
//! not a regular file, or badly named is reported as broken, never loaded, never fatal.
//!
//! A skill is exactly one function definition that runs nothing when defined ([`check`]):
//! checked before it is stored and every time the store is listed (so before it is loaded).
//!
//! The store is one directory, so it is keyed: a bridge serving several identities over HTTP
//! would open one [`Store`] per identity (`skills/<identity>/`); today there is one, the user's.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.

pub mod check;
pub mod rpc;
mod store;

pub use store::{
    BrokenSkill, DIR, Listing, MAX_NAME, Saved, Skill, SkillError, Store, USERS_DIR, valid_name,
};

#[cfg(test)]
mod tests;
