//! Cutting text to a size in bytes without splitting a character: logs, records and
//! notifications are bounded in bytes, and the text they bound is anyone's UTF-8.
//! (`str::floor_char_boundary` is newer than the crate's MSRV.)

/// The largest index `<= at` that is a character boundary of `s` (`s.len()` when `at` is past
/// the end).
pub fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// `s` cut to at most `max` bytes at a character boundary, with `marker` appended when it was
/// cut.
pub fn truncate_with(s: &mut String, max: usize, marker: &str) {
    if s.len() > max {
        s.truncate(floor_char_boundary(s, max));
        s.push_str(marker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_between_characters() {
        let s = "aé€😀";
        assert_eq!(floor_char_boundary(s, 0), 0);
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(floor_char_boundary(s, 5), 3);
        assert_eq!(floor_char_boundary(s, 99), s.len());
        let mut t = "é".repeat(10);
        truncate_with(&mut t, 5, "…");
        assert_eq!(t, "éé…");
        let mut short = "ok".to_string();
        truncate_with(&mut short, 5, "…");
        assert_eq!(short, "ok");
    }
}
