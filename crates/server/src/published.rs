//! The saved skills served as MCP skills: the Skills extension (SEP-2640,
//! `io.modelcontextprotocol/skills`, declared in `initialize` and `server/discover`).
//!
//! A saved skill whose function name maps one to one onto an Agent Skills name ([`skill_name`]:
//! `clean_sales` is `clean-sales`) is a skill of one file, `skill://<name>/SKILL.md`, rendered
//! from its metadata and source ([`render`]): YAML frontmatter (`name`, `description`, and under
//! `metadata` the function's name, who saved it, when, and its source's sha256), then a body that
//! says how to call it and the source itself. `skills/list` and `skills/get` give its entry
//! (the frontmatter as JSON, and the one file with its digest and size), `resources/list` lists
//! it and `resources/read` reads it. What an identity sees is its own store only (the stdio user
//! the user's, a `serve` identity its `skills/users/<identity>/`): another identity's skill is as
//! absent as one never saved (`-32602`).
//!
//! A change to the store (a save from a session, `skills rm` in another process) is seen by
//! polling the store's directory every [`POLL`] (one `read_dir` and a `stat` per file, at most
//! [`fingerprint_cap`] files) and told as `notifications/resources/list_changed` (skill files are
//! resources; the extension defines no notification of its own): to a 2025-11-25 session from
//! its `initialized` on, to a 2026-07-28 client on a `subscriptions/listen` stream that asked for
//! `resourcesListChanged`.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CacheScope, ErrorData, GetSkillResult, ListSkillsResult, PaginatedRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, Skill, SkillFrontmatter,
    SkillResource, SkillResources, SubscriptionFilter,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext};
use serde_json::{Value, json};

use crate::replies::{is_2026_07_28, refused};
use bridge_core::config::Config;
use bridge_core::error::Hinted;
use bridge_core::identity::Identity;

/// The scheme of the skills' URIs.
pub const SCHEME: &str = "skill://";
/// The one file of each skill.
const SKILL_MD: &str = "SKILL.md";
/// How often a connection's store is looked at for changes.
pub const POLL: Duration = Duration::from_secs(1);
/// Skills per `skills/list` page.
const PAGE: usize = 100;
/// The Agent Skills limit on a description, in characters.
const MAX_DESCRIPTION: usize = 1024;
/// What `skills/get` and `resources/read` say when a skill is not served, beside the reason.
const UNKNOWN_HINT: &str = "skills/list lists the skills this identity has saved (runtime.save_skill in a session); one removed with `mcp-code-bridge skills rm` is gone, and a function whose name has capitals, a leading or trailing _ or a double __ is not served as an MCP skill";

/// The Agent Skills name of a saved function, when the two map one to one: lowercase letters,
/// digits and single `_` inside, each `_` a `-`. Other names (`CleanSales`, `_helper`, `a__b`)
/// have none, and those skills are defined in sessions but not served under the extension.
pub fn skill_name(function: &str) -> Option<String> {
    let fits = !function.is_empty()
        && function.len() <= bridge_skills::MAX_NAME
        && function
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !function.starts_with('_')
        && !function.ends_with('_')
        && !function.contains("__")
        && bridge_skills::valid_name(function);
    fits.then(|| function.replace('_', "-"))
}

/// The function a skill name stands for, when it is one [`skill_name`] gives.
pub fn function_name(skill: &str) -> Option<String> {
    let function = skill.replace('-', "_");
    (skill_name(&function).as_deref() == Some(skill)).then_some(function)
}

/// `skill://<name>/SKILL.md`.
pub fn skill_uri(name: &str) -> String {
    format!("{SCHEME}{name}/{SKILL_MD}")
}

/// The skill name of a `skill://<name>/SKILL.md` URI (one segment, as this server serves them).
fn uri_name(uri: &str) -> Option<&str> {
    let name = uri
        .strip_prefix(SCHEME)?
        .strip_suffix(SKILL_MD)?
        .strip_suffix('/')?;
    (!name.is_empty() && !name.contains(['/', '?', '#'])).then_some(name)
}

/// One saved skill as an MCP skill: its name, its frontmatter as JSON and its `SKILL.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Its Agent Skills name ([`skill_name`]).
    pub name: String,
    /// Its frontmatter: `name`, `description`, and `metadata` (the function's name, who saved
    /// it, when, its source's sha256).
    pub frontmatter: SkillFrontmatter,
    /// The whole `SKILL.md`: the frontmatter as YAML, then how to call it and its source.
    pub text: String,
}

impl Rendered {
    /// Its `skill://<name>/SKILL.md`.
    pub fn uri(&self) -> String {
        skill_uri(&self.name)
    }

    /// Its `skills/list` and `skills/get` entry: the one file, with its digest and size.
    pub fn entry(&self) -> Skill {
        let uri = self.uri();
        let file = SkillResource::from_bytes(uri.clone(), self.text.as_bytes());
        Skill::new(
            uri,
            self.frontmatter.clone(),
            SkillResources::Files(vec![file]),
        )
    }

    /// Its `resources/list` entry: name and description from the frontmatter.
    pub fn resource(&self) -> Resource {
        Resource::new(self.uri(), self.name.clone())
            .with_description(self.frontmatter.description.clone())
            .with_mime_type("text/markdown")
            .with_size(self.text.len() as u64)
    }
}

/// A description as the frontmatter carries it: trimmed, at most [`MAX_DESCRIPTION`]
/// characters, never empty.
fn short_description(skill: &bridge_skills::Skill) -> String {
    let d = skill.description.trim();
    if d.is_empty() {
        return format!(
            "The saved Python function {}(), defined in every run_python session",
            skill.name
        );
    }
    if d.chars().count() <= MAX_DESCRIPTION {
        return d.to_string();
    }
    let mut cut: String = d.chars().take(MAX_DESCRIPTION - 3).collect();
    cut.push_str("...");
    cut
}

/// `s` as a YAML double-quoted scalar of printable ASCII only: every other character escaped,
/// so no byte of a saved description can end the frontmatter or change its meaning.
fn yaml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// A code fence longer than any run of backticks in `source`.
fn fence(source: &str) -> String {
    let longest = source.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

/// The MCP skill of a saved one, or `None` when its function name has no Agent Skills name.
pub fn render(skill: &bridge_skills::Skill) -> Option<Rendered> {
    let name = skill_name(&skill.name)?;
    let description = short_description(skill);
    let mut metadata = vec![("function", skill.name.as_str())];
    for (key, value) in [
        ("saved-at", &skill.saved_at),
        ("saved-by", &skill.saved_by),
        ("sha256", &skill.sha256),
    ] {
        if !value.is_empty() {
            metadata.push((key, value.as_str()));
        }
    }
    let mut text = format!(
        "---\nname: {name}\ndescription: {}\nmetadata:\n",
        yaml_string(&description)
    );
    for (key, value) in &metadata {
        text.push_str(&format!("  {key}: {}\n", yaml_string(value)));
    }
    text.push_str("---\n\n");
    text.push_str(&format!("# {name}\n\n"));
    text.push_str(&format!(
        "`{f}` is a Python function saved with `runtime.save_skill`. Every `run_python` session of this server has it defined before the code runs: call `{f}(...)` from the code you pass to `run_python`, without defining it again.\n",
        f = skill.name
    ));
    let by = match (skill.saved_by.is_empty(), skill.saved_at.is_empty()) {
        (false, false) => format!("\nSaved by {} at {}.\n", skill.saved_by, skill.saved_at),
        (false, true) => format!("\nSaved by {}.\n", skill.saved_by),
        (true, false) => format!("\nSaved at {}.\n", skill.saved_at),
        (true, true) => String::new(),
    };
    text.push_str(&by);
    if !skill.description.trim().is_empty() {
        text.push_str(&format!(
            "\n## Description\n\n{}\n",
            skill.description.trim()
        ));
    }
    let fence = fence(&skill.source);
    text.push_str(&format!(
        "\n## Source\n\n{fence}python\n{}{}{fence}\n",
        skill.source,
        if skill.source.ends_with('\n') {
            ""
        } else {
            "\n"
        }
    ));
    let metadata: serde_json::Map<String, Value> = metadata
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    Some(Rendered {
        frontmatter: SkillFrontmatter::new(name.clone(), description)
            .with_field("metadata", Value::Object(metadata)),
        name,
        text,
    })
}

/// A summary of the store's files (name, inode, size, modification time of each `.py` and
/// `.json`, at most `cap` of them) that changes whenever a skill is saved, replaced or
/// removed; 0 when there is no store.
pub fn fingerprint(dir: &Path, cap: usize) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut files: Vec<(String, u64, u64, i64, i64)> = read
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !(name.ends_with(".py") || name.ends_with(".json")) {
                return None;
            }
            let m = e.metadata().ok()?;
            Some((name, m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        })
        .take(cap)
        .collect();
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut h);
    h.finish() | 1
}

/// Files of a store looked at for changes: both files of every skill it may hold, and a few.
pub fn fingerprint_cap(max_count: u32) -> usize {
    2 * max_count as usize + 16
}

/// Wait until the store at `dir` looks different from `last` (updated), looking every [`POLL`];
/// never returns while `closed` says the connection is gone (the caller's select ends it).
async fn changed(dir: &Path, cap: usize, last: &mut u64) {
    loop {
        tokio::time::sleep(POLL).await;
        let d = dir.to_path_buf();
        let Ok(now) = tokio::task::spawn_blocking(move || fingerprint(&d, cap)).await else {
            continue;
        };
        if now != *last {
            *last = now;
            return;
        }
    }
}

/// `-32602` for a skill this identity is not served, with what to do.
fn not_served(method: &str, uri: &str, why: String) -> ErrorData {
    refused(
        method,
        ErrorData::invalid_params(
            format!("No skill is served at {uri}: {why}"),
            Some(json!({"uri": uri, "hint": UNKNOWN_HINT})),
        ),
    )
}

/// The saved skills as this server serves them: the stdio user's store and each `serve`
/// identity's own. Shared by every connection of a bridge, and by the call path, which binds
/// the caller's store into each exec.
#[derive(Clone)]
pub(crate) struct Skills {
    /// The stdio user's store.
    local: Arc<bridge_skills::Store>,
    /// Where each identity's store is (`state_dir`) and the `[skills]` bounds.
    config: Arc<Config>,
}

impl Skills {
    /// The stores `config` places.
    pub(crate) fn new(config: Arc<Config>) -> Skills {
        Skills {
            local: Arc::new(bridge_skills::Store::from_config(&config)),
            config,
        }
    }

    /// The store of `identity`: the user's over stdio, its own under `serve`.
    pub(crate) fn store_of(&self, identity: &Identity) -> Arc<bridge_skills::Store> {
        match identity {
            Identity::Local => self.local.clone(),
            Identity::Named(id) => Arc::new(bridge_skills::Store::for_identity(&self.config, id)),
        }
    }

    /// The skills `identity` is served, by name (broken and unmappable ones left out).
    async fn served(&self, identity: &Identity) -> Result<Vec<Rendered>, ErrorData> {
        let store = self.store_of(identity);
        let listing = tokio::task::spawn_blocking(move || store.list())
            .await
            .map_err(|e| ErrorData::internal_error(format!("listing skills: {e}"), None))?
            .map_err(|e| ErrorData::internal_error(e.message(), None))?;
        let mut all: Vec<Rendered> = listing.skills.iter().filter_map(render).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// The skill `uri` names, if `identity` is served one there.
    async fn served_one(
        &self,
        method: &str,
        uri: &str,
        identity: &Identity,
    ) -> Result<Rendered, ErrorData> {
        let Some(function) = uri_name(uri).and_then(function_name) else {
            return Err(not_served(
                method,
                uri,
                "this server serves skills at skill://<name>/SKILL.md, <name> lowercase letters, digits and single hyphens".into(),
            ));
        };
        let store = self.store_of(identity);
        let f = function.clone();
        let got = tokio::task::spawn_blocking(move || {
            let skill = store.get(&f)?;
            bridge_skills::check::check(&skill.name, &skill.source).map_err(|reason| {
                bridge_skills::SkillError::Broken {
                    name: f.clone(),
                    reason: reason.to_string(),
                }
            })?;
            Ok::<_, bridge_skills::SkillError>(skill)
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("reading a skill: {e}"), None))?;
        match got {
            Ok(skill) => render(&skill)
                .ok_or_else(|| not_served(method, uri, format!("{function:?} has no skill name"))),
            Err(e @ bridge_skills::SkillError::Io { .. }) => Err(refused(
                method,
                ErrorData::internal_error(e.message(), None),
            )),
            Err(e) => Err(not_served(method, uri, e.to_string())),
        }
    }

    /// `skills/list`: the asker's skills, [`PAGE`] at a time (the cursor is the index of the
    /// next one).
    pub(crate) async fn list(
        &self,
        request: Option<PaginatedRequestParams>,
        context: &RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, ErrorData> {
        let all = self
            .served(&Identity::of_request(&context.extensions))
            .await?;
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(c) => c
                .parse::<usize>()
                .ok()
                .filter(|&i| i <= all.len())
                .ok_or_else(|| {
                    refused(
                        "skills/list",
                        ErrorData::invalid_params(
                            format!("cursor {c:?} is not one this server gave; list again without a cursor"),
                            None,
                        ),
                    )
                })?,
        };
        let end = (start + PAGE).min(all.len());
        let mut result =
            ListSkillsResult::with_all_items(all[start..end].iter().map(Rendered::entry).collect());
        if end < all.len() {
            result.next_cursor = Some(end.to_string());
        }
        // An identity's own, changed by any save or `skills rm`: never shared, never fresh.
        Ok(if is_2026_07_28(context) {
            result.with_ttl_ms(0).with_cache_scope(CacheScope::Private)
        } else {
            result
        })
    }

    /// `skills/get`: the entry of one of the asker's skills, `-32602` for any other URI.
    pub(crate) async fn get(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, ErrorData> {
        let identity = Identity::of_request(&context.extensions);
        let skill = self.served_one("skills/get", uri, &identity).await?;
        let result = GetSkillResult::new(skill.entry());
        Ok(if is_2026_07_28(context) {
            result.with_ttl_ms(0).with_cache_scope(CacheScope::Private)
        } else {
            result
        })
    }

    /// The asker's skills as `resources/list` lists them (none when the store cannot be read:
    /// the listing's other resources are still given).
    pub(crate) async fn resources(&self, identity: &Identity) -> Vec<Resource> {
        match self.served(identity).await {
            Ok(all) => all.iter().map(Rendered::resource).collect(),
            Err(e) => {
                tracing::warn!("resources/list: skills left out: {}", e.message);
                Vec::new()
            }
        }
    }

    /// `resources/read` of a `skill://` URI: the `SKILL.md` of one of the asker's skills;
    /// `None` for a URI of another scheme.
    pub(crate) async fn read(
        &self,
        uri: &str,
        identity: &Identity,
    ) -> Option<Result<ReadResourceResponse, ErrorData>> {
        if !uri.starts_with(SCHEME) {
            return None;
        }
        Some(
            self.served_one("resources/read", uri, identity)
                .await
                .map(|skill| {
                    let c = ResourceContents::text(skill.text, uri).with_mime_type("text/markdown");
                    ReadResourceResult::new(vec![c]).into()
                }),
        )
    }

    /// The directory of `identity`'s store, and how many of its files a look at it reads.
    fn watched(&self, identity: &Identity) -> (PathBuf, usize) {
        (
            self.store_of(identity).dir().to_path_buf(),
            fingerprint_cap(self.config.skills.max_count),
        )
    }

    /// A 2025-11-25 session's: `notifications/resources/list_changed` on every change of its
    /// identity's store, until the session is gone.
    pub(crate) fn watch(&self, peer: Peer<RoleServer>, identity: &Identity) {
        let (dir, cap) = self.watched(identity);
        tokio::spawn(async move {
            let d = dir.clone();
            let mut last = tokio::task::spawn_blocking(move || fingerprint(&d, cap))
                .await
                .unwrap_or(0);
            let closed = async {
                while !peer.is_transport_closed() {
                    tokio::time::sleep(POLL).await;
                }
            };
            tokio::pin!(closed);
            loop {
                tokio::select! {
                    () = &mut closed => return,
                    () = changed(&dir, cap, &mut last) => {}
                }
                if peer.notify_resource_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// A 2026-07-28 `subscriptions/listen` stream: `notifications/resources/list_changed` on
    /// every change of the asker's store, if the stream asked for them, until it is cancelled.
    pub(crate) async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        if subscription.accepted().resources_list_changed != Some(true) {
            subscription.cancelled().await;
            return Ok(());
        }
        let identity = Identity::of_request(&subscription.request_context().extensions);
        let (dir, cap) = self.watched(&identity);
        let d = dir.clone();
        let mut last = tokio::task::spawn_blocking(move || fingerprint(&d, cap))
            .await
            .unwrap_or(0);
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                () = changed(&dir, cap, &mut last) => {}
            }
            if subscription
                .sink()
                .notify_resource_list_changed()
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    }
}

/// What `subscriptions/listen` is accepted for: resource-list changes (the skills'), nothing
/// else (the one tool never changes; there are no prompts).
pub fn subscription_filter() -> SubscriptionFilter {
    let mut f = SubscriptionFilter::default();
    f.resources_list_changed = Some(true);
    f
}

#[cfg(test)]
mod tests;
