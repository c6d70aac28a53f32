//! Information flow for proxied calls (`[policy.flows]`): which tools' results carry someone
//! else's words or private data, which tools act or send to others, and whether the value of a
//! guarded argument of an acting or open call is the user's intent.
//!
//! - [`labels`]: the labels of a tool ([`Labels`], from the globs and, where a server sets
//!   them, its annotations; each says where it came from) and the rules compiled once
//!   ([`FlowRules`]);
//! - [`ledger`]: what one identity's calls saw ([`Flows`]): the text of untrusted and private
//!   results, the literals of code a clean model wrote, the values trusted results returned,
//!   whether the model was shown untrusted text (steered); and the check of a call's arguments;
//! - [`text`]: how values are compared (skeletons, numbers, fingerprints).
//!
//! Pure logic: nothing here starts, asks or writes anything. `upstream::rpc` records results
//! and checks calls; `server` records each call's code and what its reply showed the client.

pub mod labels;
pub mod ledger;
pub mod text;

#[cfg(test)]
mod tests;

pub use labels::{FlowRules, Label, Labels};
pub use ledger::{Flows, Suspect, SuspectKind};
