//! Text as the flow checks compare it: a value's skeleton (its letters and digits, case-folded:
//! spacing, punctuation and case do not hide it), the numbers a text holds in canonical form
//! (`1,000.00`, `1000` and `1e3` are one number), and winnowed fingerprints of a skeleton
//! (runs of text shared by two texts, found without keeping either whole).

use std::collections::HashSet;

/// Letters and digits a fingerprint covers.
pub(super) const GRAM: usize = 16;
/// Fingerprints are chosen one per window of this many grams: two texts that share a run of
/// `GRAM + WINDOW - 1` letters and digits share a fingerprint.
pub(super) const WINDOW: usize = 8;
/// The run of letters and digits two texts must share for one to carry the other's text
/// (guaranteed from here; found from [`GRAM`] on in most cases).
pub const RUN: usize = GRAM + WINDOW - 1;

/// `s`'s letters and digits, case-folded, in order: spacing, punctuation, separators and case
/// do not change it (`"DE89 3704-0044"` is `de8937040044`).
pub fn skeleton(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// A number as the checks compare it: an integral value without a fraction (`1000`), others in
/// Rust's shortest form (`12.5`); `None` for a value that is not finite.
pub fn canonical_number(n: f64) -> Option<String> {
    if !n.is_finite() {
        return None;
    }
    let n = if n == 0.0 { 0.0 } else { n.abs() };
    Some(if n.fract() == 0.0 && n < 1e15 {
        format!("{}", n as u64)
    } else {
        format!("{n}")
    })
}

/// The numbers `s` writes, canonical ([`canonical_number`]), each in every reading its
/// separators allow: `1,000.50` is 1000.5; `1.000,50` is 1000.5 too (and 1 and 50 as written);
/// a sign is dropped (an amount is compared by its size).
pub fn numbers(s: &str, out: &mut HashSet<String>) {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i;
        while end < b.len()
            && (b[end].is_ascii_digit()
                || (matches!(b[end], b'.' | b',' | b'_' | b'\'')
                    && b.get(end + 1).is_some_and(u8::is_ascii_digit)))
        {
            end += 1;
        }
        // An exponent (`1e3`, `2.5E-2`) belongs to the number.
        let mut exp_end = end;
        if matches!(b.get(end), Some(b'e' | b'E')) {
            let mut j = end + 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if b.get(j).is_some_and(u8::is_ascii_digit) {
                while b.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
                exp_end = j;
            }
        }
        let token = &s[start..end];
        let exp = &s[end..exp_end];
        readings(token, exp, out);
        i = exp_end.max(start + 1);
    }
}

/// Every reading of one written number (see [`numbers`]).
fn readings(token: &str, exp: &str, out: &mut HashSet<String>) {
    let plain: String = token.chars().filter(|c| !matches!(c, '_' | '\'')).collect();
    let mut add = |t: String| {
        if let Ok(n) = format!("{t}{exp}").parse::<f64>()
            && let Some(c) = canonical_number(n)
        {
            out.insert(c);
        }
    };
    // Commas as thousands separators, a dot as the decimal point.
    add(plain.replace(',', ""));
    // Dots as thousands separators, a comma as the decimal point.
    add(plain.replace('.', "").replace(',', "."));
    // Each part as written (`12.05.2026` is also 12, 5, 2026).
    for part in plain.split([',', '.']) {
        add(part.to_string());
    }
}

/// A string that is one number as a whole (`" 1 000,50 "`, `"1e3"`): its canonical forms. A
/// sign inside is an exponent's (`1e-3`) or none: `2024-05-13` (a date) and `555-0123` (a phone
/// number) are not one number ([`numeric_parts`] reads their numbers).
pub fn as_number(s: &str) -> Option<HashSet<String>> {
    numbers_of(s, false)
}

/// The numbers of a string made of digits and number separators only, dashes included: one
/// number as [`as_number`] reads it, or the parts of a date or a phone number (`2024-05-13` is
/// 2024, 5 and 13). What a guarded argument of that form is checked as.
pub fn numeric_parts(s: &str) -> Option<HashSet<String>> {
    numbers_of(s, true)
}

fn numbers_of(s: &str, dashes: bool) -> Option<HashSet<String>> {
    let t = s.trim();
    let t: String = t.chars().filter(|c| !c.is_whitespace()).collect();
    let t = t.trim_start_matches(['+', '-']);
    let signed_exponent = |i: usize| i > 0 && matches!(t.as_bytes()[i - 1], b'e' | b'E');
    if t.is_empty()
        || !t.char_indices().all(|(i, c)| {
            c.is_ascii_digit()
                || matches!(c, '.' | ',' | '_' | '\'' | 'e' | 'E')
                || (matches!(c, '-' | '+') && (dashes || signed_exponent(i)))
        })
        || !t.starts_with(|c: char| c.is_ascii_digit())
    {
        return None;
    }
    let mut out = HashSet::new();
    numbers(t, &mut out);
    if let Ok(n) = t.replace(['_', '\''], "").parse::<f64>()
        && let Some(c) = canonical_number(n)
    {
        out.insert(c);
    }
    (!out.is_empty()).then_some(out)
}

/// The numbers Python code `code` writes as literals: a number token (`1250`, `12.5`, `1_000`,
/// `1e3`; not the digits of a name such as `r13`), and a string literal that is one number as
/// a whole (`'1,250.00'`, as [`as_number`] reads it). Digits inside a longer string (`'13:00'`,
/// `'2024-05-13'`) and in comments are not literals of a number: a value a script slices out of
/// an untrusted text is not the user's because the code mentions the same digits elsewhere.
pub fn literal_numbers(code: &str, out: &mut HashSet<String>) {
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'\'' || c == b'"' {
            // A string's prefix letters (r, b, f, u) were passed over as a name.
            let triple = b.get(i..i + 3) == Some(&[c, c, c][..]);
            let q = if triple { 3 } else { 1 };
            let start = i + q;
            let mut j = start;
            let end = loop {
                if j >= b.len() {
                    break b.len();
                }
                // A backslash keeps the next character in the string, a raw string's too.
                if b[j] == b'\\' {
                    j += 2;
                    continue;
                }
                if b[j] == c && (!triple || b.get(j..j + 3) == Some(&[c, c, c][..])) {
                    break j;
                }
                if b[j] == b'\n' && !triple {
                    break j;
                }
                j += 1;
            };
            if let Some(nums) = code.get(start..end).and_then(as_number) {
                out.extend(nums);
            }
            i = (end + q).min(b.len());
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() {
            // A name (its digits are not a number), or a string's prefix.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || !b[i].is_ascii())
            {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || matches!(b[i], b'_' | b'.')
                    || (matches!(b[i], b'+' | b'-') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            let token = code[start..i].replace('_', "");
            if let Ok(n) = token.parse::<f64>()
                && let Some(c) = canonical_number(n)
            {
                out.insert(c);
            } else if let Some(v) = token
                .strip_prefix("0x")
                .or_else(|| token.strip_prefix("0X"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                out.insert(v.to_string());
            }
            continue;
        }
        i += 1;
    }
}

/// FNV-1a of one gram.
fn hash(gram: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in gram {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Every gram's hash of skeleton `s` (empty when `s` is shorter than a gram).
pub(super) fn grams(s: &str) -> Vec<u64> {
    s.as_bytes().windows(GRAM).map(hash).collect()
}

/// The winnowed fingerprints of skeleton `s`: in every window of [`WINDOW`] grams, the
/// smallest hash (the rightmost of equal ones). Any run of [`RUN`] letters and digits of `s`
/// contains one of them.
pub(super) fn fingerprints(s: &str, out: &mut Vec<u64>) {
    let hs = grams(s);
    if hs.is_empty() {
        return;
    }
    if hs.len() <= WINDOW {
        if let Some(&m) = hs.iter().min() {
            out.push(m);
        }
        return;
    }
    let mut last = usize::MAX;
    for w in 0..=hs.len() - WINDOW {
        let window = &hs[w..w + WINDOW];
        let (mut at, mut min) = (0, u64::MAX);
        for (i, &h) in window.iter().enumerate() {
            if h <= min {
                min = h;
                at = i;
            }
        }
        if w + at != last {
            last = w + at;
            out.push(min);
        }
    }
}
