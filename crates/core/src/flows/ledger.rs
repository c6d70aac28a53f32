//! What one identity's calls saw, and the check of a call's guarded arguments against it.
//!
//! Values live across the calls of a session (Python state persists) and move between sessions
//! (files, skills, forks), so the record is kept per identity, never per exec: over stdio the
//! one identity of the connection's bridge, under `serve` each authenticated identity. It is
//! bounded in bytes per identity and in identities; past a bound the check is conservative
//! (every guarded argument is suspect, and the suspect says why).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use super::labels::{FlowRules, Labels};
use super::text::{self, RUN};
use crate::identity::Identity;

/// Bytes of untrusted and private text one identity's record keeps; past it, the record is full
/// and every guarded argument is suspect.
pub const MAX_LEDGER_BYTES: usize = 2 << 20;
/// Bytes of a clean model's code kept as intent: past it the oldest is forgotten (fewer
/// literals count: conservative).
pub const MAX_INTENT_BYTES: usize = 1 << 20;
/// Trusted values and code numbers kept as intent: past it they are forgotten (conservative).
const MAX_EXEMPTIONS: usize = 65_536;
/// Identities with a record of their own; more share one full record.
pub const MAX_IDENTITIES: usize = 256;
/// A string shorter than this many letters and digits is matched only as a number.
pub const MIN_MATCH: usize = 4;
/// The shortest piece of untrusted text a value assembled from pieces is matched by.
pub const MIN_PIECE: usize = 6;
/// Values longer than this many letters and digits are matched whole and by fingerprints only.
const MAX_COVERED: usize = 128;
/// Longest trusted value remembered (a longer one is not an exemption).
const MAX_TRUSTED_VALUE: usize = 512;

/// Why a guarded argument is suspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuspectKind {
    /// Its value occurs in (or is assembled from) an untrusted result's text, and is neither
    /// a literal of code a clean model wrote nor a trusted result's value.
    Untrusted,
    /// An open tool's argument carries a run of a private result's text.
    Private,
    /// The identity's record is full: nothing can be told apart.
    Unknown,
}

impl SuspectKind {
    /// As the audit log and the question name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            SuspectKind::Untrusted => "untrusted",
            SuspectKind::Private => "private",
            SuspectKind::Unknown => "unknown",
        }
    }
}

/// One suspect argument: its name, its value (a leaf: a string or a number as JSON), why, and
/// the tool whose result it came from (`server.tool`), or what made it unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspect {
    /// The argument's name (a nested leaf is `name.key[0]`).
    pub argument: String,
    /// The leaf's value as JSON.
    pub value: String,
    /// Why it is suspect.
    pub kind: SuspectKind,
    /// The tool whose result carried it (`server.tool`), or why nothing could be told.
    pub source: String,
}

impl Suspect {
    /// The flow this is, as a session grant remembers it: tool, argument and source.
    pub fn grant_key(&self, server: &str, tool: &str) -> String {
        format!(
            "flow\u{0}{server}.{tool}\u{0}{}\u{0}{}\u{0}{}",
            self.argument,
            self.kind.as_str(),
            self.source
        )
    }

    /// `argument<-source (kind)`, for the audit log and the trace: no value.
    pub fn summary(&self) -> String {
        format!(
            "{}<-{} ({})",
            self.argument,
            self.source,
            self.kind.as_str()
        )
    }
}

/// The text of one kind of result (untrusted or private): skeletons joined by `|`, which no
/// skeleton holds, the tool each span came from, the numbers written, the fingerprints.
#[derive(Default)]
struct Corpus {
    text: String,
    /// The end of each tool's span of `text`, in order, with the tool.
    spans: Vec<(usize, Arc<str>)>,
    numbers: HashMap<String, Arc<str>>,
    prints: HashMap<u64, Arc<str>>,
    /// Digests of the leaves kept: a result read again costs nothing more.
    seen: HashSet<u64>,
}

impl Corpus {
    fn add(&mut self, tool: &Arc<str>, leaves: &[Leaf]) -> usize {
        let before = self.text.len();
        // The result's new leaves in order, joined: fingerprinted as one text, so a run across
        // short leaves (words of a list, fields of a record) is found too.
        let mut joined = String::new();
        for leaf in leaves {
            let (skel, nums) = match leaf {
                Leaf::Str(s) => {
                    let mut nums = HashSet::new();
                    text::numbers(s, &mut nums);
                    (text::skeleton(s), nums)
                }
                Leaf::Num(n) => (
                    n.clone(),
                    std::iter::once(n.clone()).collect::<HashSet<_>>(),
                ),
            };
            for n in nums {
                self.numbers.entry(n).or_insert_with(|| tool.clone());
            }
            if skel.is_empty() || !self.seen.insert(digest(&skel)) {
                continue;
            }
            joined.push_str(&skel);
            self.text.push_str(&skel);
            self.text.push('|');
        }
        let mut prints = Vec::new();
        text::fingerprints(&joined, &mut prints);
        for p in prints {
            self.prints.entry(p).or_insert_with(|| tool.clone());
        }
        if self.text.len() > before {
            self.spans.push((self.text.len(), tool.clone()));
        }
        self.text.len() - before
    }

    /// The tool whose span holds byte `at` of the text.
    fn tool_at(&self, at: usize) -> Option<&Arc<str>> {
        let i = self.spans.partition_point(|(end, _)| *end <= at);
        self.spans.get(i).map(|(_, t)| t)
    }

    /// The tool whose text holds skeleton `v` whole.
    fn holding(&self, v: &str) -> Option<&Arc<str>> {
        let at = self.text.find(v)?;
        self.tool_at(at)
    }

    /// The tool whose text `v` is assembled from: every letter and digit of `v` within a piece
    /// of at least [`MIN_PIECE`] that occurs in the text (pieces from several results, case and
    /// spacing changed, count).
    fn covering(&self, v: &str) -> Option<&Arc<str>> {
        let bounds: Vec<usize> = v
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(v.len()))
            .collect();
        let chars = bounds.len() - 1;
        if !(MIN_PIECE..=MAX_COVERED).contains(&chars) {
            return None;
        }
        let mut covered_to = 0; // in chars
        let mut first = None;
        for start in 0..chars {
            if start > covered_to {
                return None;
            }
            // The longest piece from `start` the text holds (pieces are prefix-closed).
            let (mut lo, mut hi) = (0, chars - start);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if self.text.contains(&v[bounds[start]..bounds[start + mid]]) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            if lo >= MIN_PIECE {
                if first.is_none() {
                    first = self.text.find(&v[bounds[start]..bounds[start + lo]]);
                }
                covered_to = covered_to.max(start + lo);
            }
            if covered_to >= chars {
                break;
            }
        }
        (covered_to >= chars)
            .then_some(first)
            .flatten()
            .and_then(|at| self.tool_at(at))
    }

    /// The tool whose text shares a run of [`RUN`] letters and digits with skeleton `v`.
    fn sharing_run(&self, v: &str) -> Option<&Arc<str>> {
        if self.prints.is_empty() {
            return None;
        }
        text::grams(v).iter().find_map(|h| self.prints.get(h))
    }
}

/// A leaf's digest, for [`Corpus::seen`].
fn digest(skel: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    skel.hash(&mut h);
    h.finish()
}

/// A string or number leaf of a value, as the checks read it (a number canonical).
enum Leaf {
    Str(String),
    Num(String),
}

/// The string and number leaves of `v` (object values, not keys), each with its path under
/// `name`.
fn leaves_of(name: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::String(_) | Value::Number(_) => out.push((name.to_string(), v.clone())),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves_of(&format!("{name}[{i}]"), x, out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                leaves_of(&format!("{name}.{k}"), x, out);
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

/// A call's argument values as trusted values are kept (skeletons, numbers as `#n`): what a
/// trusted result merely echoes is not its own.
fn argument_values(arguments: Option<&Map<String, Value>>) -> HashSet<String> {
    let mut raw = Vec::new();
    for (k, v) in arguments.into_iter().flatten() {
        leaves_of(k, v, &mut raw);
    }
    let mut out = HashSet::new();
    for (_, v) in raw {
        match v {
            Value::String(s) => {
                for c in text::as_number(&s).into_iter().flatten() {
                    out.insert(format!("#{c}"));
                }
                out.insert(text::skeleton(&s));
            }
            Value::Number(n) => {
                if let Some(c) = n.as_f64().and_then(text::canonical_number) {
                    out.insert(format!("#{c}"));
                }
            }
            _ => {}
        }
    }
    out
}

/// The leaves of a tool result as the sandbox gets it: `structuredContent`, and the text of
/// each content block (a JSON text read as its leaves).
fn result_leaves(result: &Value) -> Vec<Leaf> {
    let mut raw = Vec::new();
    if let Some(s) = result.get("structuredContent") {
        leaves_of("", s, &mut raw);
    }
    for block in result["content"].as_array().into_iter().flatten() {
        let Some(t) = block.get("text").and_then(Value::as_str) else {
            continue;
        };
        match serde_json::from_str::<Value>(t) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => leaves_of("", &v, &mut raw),
            _ => raw.push((String::new(), Value::String(t.to_string()))),
        }
    }
    raw.into_iter()
        .filter_map(|(_, v)| match v {
            Value::String(s) => Some(Leaf::Str(s)),
            Value::Number(n) => n.as_f64().and_then(text::canonical_number).map(Leaf::Num),
            _ => None,
        })
        .collect()
}

/// One identity's record.
#[derive(Default)]
struct Ledger {
    untrusted: Corpus,
    private: Corpus,
    /// Skeletons of code written by a clean model, joined by `|`, and the numbers it wrote.
    intent: String,
    intent_numbers: HashSet<String>,
    /// Values (skeletons and numbers) trusted tools returned.
    trusted: HashSet<String>,
    bytes: usize,
    /// Why the record is full, once it is.
    full: Option<&'static str>,
    /// The untrusted tool whose text a reply showed the client, once one did.
    steered: Option<Arc<str>>,
}

impl Ledger {
    fn charge(&mut self, n: usize) {
        self.bytes += n;
        if self.bytes > MAX_LEDGER_BYTES && self.full.is_none() {
            self.full = Some("this identity's flow record is full");
            tracing::warn!(
                "the flow record of an identity passed {MAX_LEDGER_BYTES} bytes: every guarded argument is suspect until the bridge restarts"
            );
        }
    }
}

/// The flow records of every identity, and the rules they are checked by.
pub struct Flows {
    rules: FlowRules,
    by_identity: Mutex<HashMap<Identity, Arc<Mutex<Ledger>>>>,
    /// Shared by identities beyond [`MAX_IDENTITIES`]: full from the start.
    overflow: Arc<Mutex<Ledger>>,
}

impl Default for Flows {
    fn default() -> Self {
        Flows::new(FlowRules::default())
    }
}

impl Flows {
    /// No record yet, checked by `rules`.
    pub fn new(rules: FlowRules) -> Flows {
        Flows {
            rules,
            by_identity: Mutex::new(HashMap::new()),
            overflow: Arc::new(Mutex::new(Ledger {
                full: Some("the bridge keeps flow records of no more identities"),
                ..Ledger::default()
            })),
        }
    }

    /// The rules.
    pub fn rules(&self) -> &FlowRules {
        &self.rules
    }

    /// Whether flows are checked at all.
    pub fn is_on(&self) -> bool {
        self.rules.is_on()
    }

    fn ledger(&self, who: &Identity) -> Arc<Mutex<Ledger>> {
        let mut m = self.by_identity.lock().unwrap();
        if let Some(l) = m.get(who) {
            return l.clone();
        }
        if m.len() >= MAX_IDENTITIES {
            return self.overflow.clone();
        }
        m.entry(who.clone()).or_default().clone()
    }

    /// A `run_python` call's code, sent by `who`'s model: its literals are the user's intent
    /// while that model has not been shown untrusted text.
    pub fn begin_exec(&self, who: &Identity, code: &str) {
        if !self.is_on() {
            return;
        }
        let l = self.ledger(who);
        let mut l = l.lock().unwrap();
        if l.steered.is_some() || l.full.is_some() {
            return;
        }
        let mut skel = text::skeleton(code);
        if skel.len() >= MAX_INTENT_BYTES {
            let mut cut = skel.len() - MAX_INTENT_BYTES / 2;
            while !skel.is_char_boundary(cut) {
                cut += 1;
            }
            skel.drain(..cut);
        }
        let mut nums = HashSet::new();
        text::literal_numbers(code, &mut nums);
        if l.intent.len() + skel.len() + 1 > MAX_INTENT_BYTES {
            // The oldest code is forgotten: its literals no longer count (conservative).
            let mut cut = l.intent.len() + skel.len() + 1 - MAX_INTENT_BYTES;
            cut = l.intent[cut..]
                .find('|')
                .map_or(l.intent.len(), |i| cut + i + 1);
            l.intent.drain(..cut);
        }
        l.intent.push_str(&skel);
        l.intent.push('|');
        if l.intent_numbers.len() + nums.len() > MAX_EXEMPTIONS {
            l.intent_numbers.clear();
        }
        l.intent_numbers.extend(nums);
    }

    /// A proxied call's result (as the sandbox gets it) of `server.tool`, labelled `labels`:
    /// an untrusted or private result's text is kept; a trusted one's values are exemptions.
    /// [`Flows::record_call`] with the call's arguments unknown.
    pub fn record_result(
        &self,
        who: &Identity,
        server: &str,
        tool: &str,
        labels: &Labels,
        result: &Value,
    ) {
        self.record_call(who, server, tool, labels, None, result);
    }

    /// A proxied call of `server.tool` (labelled `labels`) with `arguments`, and its result:
    /// as [`Flows::record_result`], except that a trusted result's value that is one of the
    /// call's arguments is no exemption (a tool that echoes what it was given, an IBAN check,
    /// would otherwise make any value the user's).
    pub fn record_call(
        &self,
        who: &Identity,
        server: &str,
        tool: &str,
        labels: &Labels,
        arguments: Option<&Map<String, Value>>,
        result: &Value,
    ) {
        if !self.is_on() {
            return;
        }
        let leaves = result_leaves(result);
        if leaves.is_empty() {
            return;
        }
        let l = self.ledger(who);
        let mut l = l.lock().unwrap();
        if l.full.is_some() {
            return;
        }
        let name: Arc<str> = format!("{server}.{tool}").into();
        let mut n = 0;
        if labels.untrusted.is_some() {
            n += l.untrusted.add(&name, &leaves);
        }
        if labels.private.is_some() {
            n += l.private.add(&name, &leaves);
        }
        if !labels.recorded() {
            let given = argument_values(arguments);
            let mut values = Vec::new();
            for leaf in &leaves {
                match leaf {
                    // A string that is a number (`"26"`, an id) is kept as that number as well:
                    // the check compares such a string by its numbers.
                    Leaf::Str(s) => {
                        for c in text::as_number(s).into_iter().flatten() {
                            values.push(format!("#{c}"));
                        }
                        values.push(text::skeleton(s));
                    }
                    Leaf::Num(c) => values.push(format!("#{c}")),
                }
            }
            values.retain(|v| !v.is_empty() && v.len() <= MAX_TRUSTED_VALUE && !given.contains(v));
            if l.trusted.len() + values.len() > MAX_EXEMPTIONS {
                // Forgotten exemptions make the check stricter, never looser.
                l.trusted.clear();
            }
            l.trusted.extend(values);
        }
        l.charge(n);
    }

    /// The guarded arguments of a call of `server.tool` (labelled `labels`) that are suspect;
    /// empty when none is, or the tool is neither acting nor open.
    pub fn check(
        &self,
        who: &Identity,
        labels: &Labels,
        arguments: Option<&Map<String, Value>>,
    ) -> Vec<Suspect> {
        if !self.is_on() || !labels.checked() {
            return Vec::new();
        }
        let mut leaves = Vec::new();
        for (k, v) in arguments.into_iter().flatten() {
            if labels.guards(k) {
                leaves_of(k, v, &mut leaves);
            }
        }
        if leaves.is_empty() {
            return Vec::new();
        }
        let l = self.ledger(who);
        let l = l.lock().unwrap();
        let mut out = Vec::new();
        for (argument, v) in leaves {
            let value = v.to_string();
            if let Some(why) = l.full {
                out.push(Suspect {
                    argument,
                    value,
                    kind: SuspectKind::Unknown,
                    source: why.to_string(),
                });
                continue;
            }
            if let Some((kind, source)) = l.suspect(&v, labels.open.is_some()) {
                out.push(Suspect {
                    argument,
                    value,
                    kind,
                    source: source.to_string(),
                });
            }
        }
        out
    }

    /// What a `run_python` reply showed `who`'s client (output, value, a file's text): when it
    /// carries a run of [`RUN`] letters and digits of an untrusted result's text, the model is
    /// steered from now on; the tool whose text it was is returned the first time.
    pub fn reply_shown(&self, who: &Identity, texts: &[&str]) -> Option<String> {
        if !self.is_on() {
            return None;
        }
        let l = self.ledger(who);
        let mut l = l.lock().unwrap();
        if l.steered.is_some() || (l.untrusted.prints.is_empty() && l.full.is_none()) {
            return None;
        }
        let found = texts.iter().find_map(|t| {
            let skel = text::skeleton(t);
            if l.full.is_some() {
                return (skel.len() >= RUN).then(|| Arc::<str>::from("an unknown tool"));
            }
            l.untrusted.sharing_run(&skel).cloned()
        })?;
        l.steered = Some(found.clone());
        Some(found.to_string())
    }

    /// The untrusted tool whose text a reply showed `who`'s client, once one did.
    #[cfg(test)]
    pub(crate) fn steered(&self, who: &Identity) -> Option<String> {
        let l = self.ledger(who);
        let l = l.lock().unwrap();
        l.steered.as_deref().map(str::to_string)
    }
}

impl Ledger {
    /// Why leaf `v` of a guarded argument is suspect, and its source; `None` when it is not.
    fn suspect(&self, v: &Value, open: bool) -> Option<(SuspectKind, &str)> {
        let clean = self.steered.is_none();
        // The user's intent (a clean model's literal, a trusted tool's own value) is neither
        // steered nor a leak: the user's own IBAN, given in the prompt, may be sent even when a
        // private result holds it too.
        let users_own =
            |skel: &str| (clean && self.intent.contains(skel)) || self.trusted.contains(skel);
        let (skel, numbers) = match v {
            Value::Number(n) => (
                String::new(),
                n.as_f64()
                    .and_then(text::canonical_number)
                    .map(|c| std::iter::once(c).collect()),
            ),
            Value::String(s) => {
                let skel = text::skeleton(s);
                if text::as_number(s).is_none()
                    && skel.chars().count() >= MIN_MATCH
                    && users_own(&skel)
                {
                    // A text the user gave whole (a date a clean model wrote, one a trusted tool
                    // returned) is the user's, whatever numbers it holds.
                    return None;
                }
                (skel, text::numeric_parts(s))
            }
            _ => return None,
        };
        // Numbers: compared as numbers, however written (a date by its parts).
        if let Some(nums) = &numbers {
            let intent = |c: &String| {
                (clean && self.intent_numbers.contains(c))
                    || self.trusted.contains(&format!("#{c}"))
            };
            if let Some(tool) = nums.iter().find_map(|c| {
                (!intent(c))
                    .then(|| self.untrusted.numbers.get(c))
                    .flatten()
            }) {
                return Some((SuspectKind::Untrusted, tool));
            }
        }
        if skel.chars().count() < MIN_MATCH {
            return None;
        }
        if users_own(&skel) {
            return None;
        }
        if let Some(tool) = self
            .untrusted
            .holding(&skel)
            .or_else(|| self.untrusted.covering(&skel))
            .or_else(|| self.untrusted.sharing_run(&skel))
        {
            return Some((SuspectKind::Untrusted, tool));
        }
        if open && let Some(tool) = self.private.sharing_run(&skel) {
            return Some((SuspectKind::Private, tool));
        }
        None
    }
}
