//! The token budget of one result (`output_budget`, in cl100k tokens): what a call's output may
//! put into the model's context. Within it a result carries everything; past it each part that
//! does not fit (stdout, stderr, the value, the traceback) carries a preview, its head and tail
//! within the part's share of the budget and a line saying how much was left out and where the
//! whole part is: the session kept it as a file (`sandbox::Fit`, asked before the interpreter
//! takes another call), readable with `resources/read` and by the next call's code.
//!
//! Counting is bounded by the budget, never by the output: text is counted in pieces of at most
//! [`PIECE`] bytes (a line, or a slice of a long one), from the head until the budget is spent
//! and from the tail likewise, so a 50 MiB line or a million short ones cost what 8,000 tokens
//! cost. A piece's count can differ from the whole text's by a token at its edges; the cut is
//! made on piece boundaries, and the budget keeps a reserve for the lines around the parts.

use bridge_sandbox::files::OUT_DIR;
use bridge_sandbox::{ExecOutcome, Fit, Kept, Part};

/// Bytes of the longest piece counted at once. The BPE merge is quadratic in a piece without
/// spaces; at this size it is microseconds.
const PIECE: usize = 256;

/// Load cl100k's ranks and patterns, which the first count would otherwise do on its call's
/// path (60-190 ms on a two-core host: section 8's first call went from 9 to 70 ms without
/// this); called by the warm-up.
pub fn prepare() {
    let _ = tiktoken_rs::cl100k_base_singleton();
}

fn tokens(piece: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(piece)
        .len()
}

/// The end of the piece of `t` that starts at `start`: through the next newline within
/// [`PIECE`] bytes, else [`PIECE`] bytes back to a character boundary.
fn piece_after(t: &str, start: usize) -> usize {
    let window = bridge_core::text::floor_char_boundary(t, (start + PIECE).min(t.len()));
    let window = if window <= start {
        // One character longer than a piece cannot be: PIECE is far more than 4 bytes.
        t.len()
    } else {
        window
    };
    match t.as_bytes()[start..window].iter().position(|&b| b == b'\n') {
        Some(i) => start + i + 1,
        None => window,
    }
}

/// The start of the piece of `t` that ends at `end`: after the last newline before `end - 1`
/// within [`PIECE`] bytes, else [`PIECE`] bytes back, forward to a character boundary.
fn piece_before(t: &str, end: usize) -> usize {
    let mut window = end.saturating_sub(PIECE);
    while !t.is_char_boundary(window) {
        window += 1;
    }
    let body = &t.as_bytes()[window..end.saturating_sub(1).max(window)];
    match body.iter().rposition(|&b| b == b'\n') {
        Some(i) => window + i + 1,
        None => window,
    }
}

/// The tokens of `t` when at most `limit`; `None` when more (counting stops there).
pub fn count_upto(t: &str, limit: usize) -> Option<usize> {
    let (mut at, mut n) = (0, 0);
    while at < t.len() {
        let end = piece_after(t, at);
        n += tokens(&t[at..end]);
        if n > limit {
            return None;
        }
        at = end;
    }
    Some(n)
}

/// The byte length of the longest head of `t` within `limit` tokens, and its tokens.
fn head(t: &str, limit: usize) -> (usize, usize) {
    let (mut at, mut n) = (0, 0);
    while at < t.len() {
        let end = piece_after(t, at);
        let k = tokens(&t[at..end]);
        if n + k > limit {
            break;
        }
        n += k;
        at = end;
    }
    (at, n)
}

/// The byte start of the longest tail of `t` within `limit` tokens, not before `floor`.
fn tail(t: &str, limit: usize, floor: usize) -> usize {
    let (mut at, mut n) = (t.len(), 0);
    while at > floor {
        let start = piece_before(t, at).max(floor);
        let k = tokens(&t[start..at]);
        if n + k > limit {
            break;
        }
        n += k;
        at = start;
    }
    at
}

/// `output_budget`, and how it is shared.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// The whole budget of a result's text, in cl100k tokens.
    pub tokens: usize,
}

impl Budget {
    /// A budget of `tokens` (the configuration's `output_budget`).
    pub fn new(tokens: u32) -> Self {
        Budget {
            tokens: tokens as usize,
        }
    }

    /// What the lines around the parts may take (labels, notices, the files' lines); the
    /// parts share the rest.
    pub fn reserve(&self) -> usize {
        (self.tokens / 8).min(1000)
    }

    /// The parts of `o` that do not fit, each with its share of the budget. The parts that fit
    /// whole are given what they need, smallest first; the others split what is left evenly.
    /// A pure function of the parts' text, so the session's decision (which parts to keep) and
    /// the rendering (which to preview) agree.
    pub fn plan(&self, o: &ExecOutcome) -> Vec<(Part, usize)> {
        let mut left = self.tokens - self.reserve();
        // A cl100k token is at least one byte: parts of no more bytes than the budget fit
        // without a count, so most replies never wait for the tokenizer (a first call sent
        // while the warm-up still loads it, 60-190 ms on two cores).
        if Part::ALL.iter().map(|p| p.of(o).len()).sum::<usize>() <= left {
            return Vec::new();
        }
        let mut sized: Vec<(Part, Option<usize>)> = Part::ALL
            .iter()
            .filter(|p| !p.of(o).is_empty())
            .map(|&p| (p, count_upto(p.of(o), left)))
            .collect();
        if sized.iter().all(|(_, n)| n.is_some())
            && sized.iter().map(|(_, n)| n.unwrap_or(0)).sum::<usize>() <= left
        {
            return Vec::new();
        }
        // Smallest first; a part too long to count comes last.
        sized.sort_by_key(|(_, n)| n.unwrap_or(usize::MAX));
        let mut over = Vec::new();
        let total = sized.len();
        for (i, (part, n)) in sized.into_iter().enumerate() {
            let share = left / (total - i);
            match n {
                Some(n) if n <= share => left -= n,
                _ => {
                    left -= share;
                    over.push((part, share));
                }
            }
        }
        over
    }
}

impl Fit for Budget {
    fn over(&self, o: &ExecOutcome) -> Vec<Part> {
        self.plan(o).into_iter().map(|(p, _)| p).collect()
    }
}

/// Replace each part of `o` that is over `budget` by its preview, saying where the whole part
/// is (`o.kept`, from the session) or that it could not be kept.
pub fn fit(o: &mut ExecOutcome, budget: &Budget) {
    for (part, share) in budget.plan(o) {
        let kept = o.kept.iter().find(|k| k.part == part).cloned();
        let Some(text) = part.of_mut(o) else {
            continue;
        };
        *text = preview(text, share, part, kept.as_ref());
    }
}

/// How many of `o`'s files get a line of the text: as many as the reserve holds with the
/// notices (the rest are named by count; each still has its link).
pub fn files_listed(o: &ExecOutcome, budget: &Budget) -> usize {
    let mut left = budget.reserve();
    for n in &o.notices {
        left = left.saturating_sub(count_upto(n, left).unwrap_or(left) + 3);
    }
    for (i, f) in o.files.iter().enumerate().skip(o.bridge_named_files) {
        // The line "[file] /workspace/out/NAME (MIME, SIZE bytes): URI" and the file's link
        // (name, title, URI, MIME type): the name shown three times, the URI twice, each the
        // code's words. Counted in pieces, never past what is left.
        let name = shown_file_name(&f.name);
        let mut cost = 30;
        for (text, times) in [
            (name.as_str(), 3),
            (f.uri.as_str(), 2),
            (f.mime.as_str(), 2),
        ] {
            match count_upto(text, left) {
                Some(n) => cost += n * times,
                None => return i,
            }
        }
        if cost > left {
            return i;
        }
        left -= cost;
    }
    o.files.len()
}

/// Most characters of a file's name shown to the model; the rest is said as a count.
pub const SHOWN_NAME: usize = 96;

/// A file name the code chose, as the model is shown it: escaped (`text::visible`), and past
/// [`SHOWN_NAME`] characters cut with the count of what was cut. Its URI stays exact.
pub fn shown_file_name(name: &str) -> String {
    let shown = bridge_core::text::visible(name);
    let n = shown.chars().count();
    if n <= SHOWN_NAME {
        return shown.into_owned();
    }
    let head: String = shown.chars().take(SHOWN_NAME).collect();
    format!("{head}…(cut: {} characters)", n - SHOWN_NAME)
}

/// The line in place of what a preview leaves out.
fn marker(omitted: usize, total: usize, part: Part, kept: Option<&Kept>) -> String {
    let what = part.name();
    let whole = match kept {
        Some(Kept {
            file,
            in_sandbox: Ok(()),
            ..
        }) => format!("the whole {what} is {OUT_DIR}/{} ({})", file.name, file.uri),
        Some(Kept {
            file,
            in_sandbox: Err(why),
            ..
        }) => format!(
            "the whole {what} is at {} (resources/read); it could not be written to {OUT_DIR}/{}: {why}",
            file.uri, file.name
        ),
        None => format!("the whole {what} could not be kept"),
    };
    format!("… [{omitted} of {total} bytes left out; {whole}] …")
}

/// The head and tail of `t` within `share` tokens, with the marker between them.
fn preview(t: &str, share: usize, part: Part, kept: Option<&Kept>) -> String {
    let m = tokens(&marker(t.len(), t.len(), part, kept)) + 2;
    let room = share.saturating_sub(m);
    let (h, used) = head(t, room * 3 / 5);
    let s = tail(t, room.saturating_sub(used), h);
    let mut out = String::with_capacity(h + (t.len() - s) + 256);
    out.push_str(&t[..h]);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&marker(s - h, t.len(), part, kept));
    out.push('\n');
    out.push_str(&t[s..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_sandbox::ExecOutcome;
    use bridge_sandbox::files::OutFile;
    use std::time::Duration;

    fn outcome(stdout: String) -> ExecOutcome {
        ExecOutcome::printed(&stdout)
    }

    fn exact(t: &str) -> usize {
        tiktoken_rs::cl100k_base_singleton()
            .encode_ordinary(t)
            .len()
    }

    #[test]
    fn pieces_cover_the_text_at_character_boundaries() {
        let t = "é".repeat(1000) + "\nabc\n" + &"x".repeat(700);
        let (mut at, mut n) = (0, 0);
        while at < t.len() {
            let end = piece_after(&t, at);
            assert!(end > at && end - at <= PIECE && t.is_char_boundary(end));
            n += 1;
            at = end;
        }
        assert!(n >= t.len() / PIECE);
        let mut end = t.len();
        while end > 0 {
            let start = piece_before(&t, end);
            assert!(start < end && end - start <= PIECE && t.is_char_boundary(start));
            end = start;
        }
    }

    /// Counting in pieces stays within a few percent of counting the whole text, for prose,
    /// numbers and a table; it never undercounts by much, which is what the budget relies on.
    #[test]
    fn counts_in_pieces_are_close_to_the_whole() {
        let mut table = String::new();
        for i in 0..2000 {
            table.push_str(&format!("{i:>6}  {:.4}  row-{i}\n", i as f64 / 7.0));
        }
        for t in [
            "The quick brown fox jumps over the lazy dog. ".repeat(500),
            table,
        ] {
            let whole = exact(&t);
            let pieces = count_upto(&t, usize::MAX).unwrap();
            assert!(
                pieces * 100 >= whole * 97 && pieces * 100 <= whole * 110,
                "{pieces} vs {whole}"
            );
        }
        assert_eq!(count_upto(&"word ".repeat(10_000), 100), None);
    }

    /// A 150,000-character print: the preview is within the budget, keeps its first and last
    /// lines, and says how much was left out and where the whole is.
    #[test]
    fn a_long_print_becomes_a_preview_within_the_budget() {
        let text: String = (0..15_000).map(|i| format!("line {i:>5}\n")).collect();
        let mut o = outcome(text.clone());
        let b = Budget::new(8000);
        assert_eq!(b.over(&o), vec![Part::Stdout]);
        o.kept = vec![Kept {
            part: Part::Stdout,
            file: OutFile {
                name: ".outputs/1.stdout.txt".into(),
                mime: "text/plain".into(),
                size: text.len() as u64,
                uri: "resource://mcp-code-bridge/files/default/.outputs/1.stdout.txt".into(),
            },
            in_sandbox: Ok(()),
        }];
        fit(&mut o, &b);
        let n = exact(&o.stdout);
        assert!(n <= 8000 - b.reserve(), "{n} tokens");
        assert!(n >= 6000, "the preview uses its budget: {n}");
        assert!(o.stdout.starts_with("line     0\nline     1\n"));
        assert!(o.stdout.ends_with("line 14999\n"));
        assert!(o.stdout.contains("bytes left out; the whole stdout is /workspace/out/.outputs/1.stdout.txt (resource://mcp-code-bridge/files/default/.outputs/1.stdout.txt)"), "{}", &o.stdout[..200]);
        // What fits is left alone.
        let mut small = outcome("2\n".into());
        assert!(b.over(&small).is_empty());
        fit(&mut small, &b);
        assert_eq!(small.stdout, "2\n");
    }

    /// One 50 MiB line without a newline, and a million short lines: previews within the
    /// budget, their work bounded by it (the test would take minutes otherwise).
    #[test]
    fn huge_and_many_lined_outputs_cost_what_the_budget_costs() {
        let b = Budget::new(2000);
        for text in ["y".repeat(50 << 20), "a\n".repeat(1_000_000)] {
            let mut o = outcome(text);
            let started = std::time::Instant::now();
            fit(&mut o, &b);
            assert!(exact(&o.stdout) <= 2000, "{}", exact(&o.stdout));
            assert!(o.stdout.contains("could not be kept"));
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }

    /// Several parts over the budget share it; a small one next to them stays whole.
    #[test]
    fn parts_share_the_budget_and_small_ones_stay_whole() {
        let mut o = outcome("out ".repeat(20_000));
        o.stderr = "err ".repeat(20_000);
        o.value = Some("42".into());
        let b = Budget::new(4000);
        let plan = b.plan(&o);
        assert_eq!(plan.iter().map(|(p, _)| *p).collect::<Vec<_>>().len(), 2);
        assert!(plan.iter().all(|(_, s)| *s >= 1700));
        fit(&mut o, &b);
        assert_eq!(o.value.as_deref(), Some("42"));
        let (a, e) = (exact(&o.stdout), exact(&o.stderr));
        assert!(a + e <= 4000 - b.reserve(), "{a} + {e}");
    }
}
