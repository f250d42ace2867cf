//! What a plugin, a member, a bucket or a tenant says, made fit for the operator's own
//! records: a log line, a condition or an Event. Every control character (a newline, a
//! carriage return, an escape sequence) and Unicode line or paragraph separator is written
//! as an escape, so that it prints as one line that cannot pass for another record or
//! repaint a terminal, and it is cut to a bound, saying how much was left out.

/// `text` with every control character and Unicode line or paragraph separator written
/// as an escape.
pub fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The room [`bounded`] keeps for saying how much it left out.
const NOTE_ROOM: usize = 32;

/// `text`, [`escaped`], in at most `max` bytes: when longer, cut, with a note of how many
/// more bytes there were (within the `max`).
pub fn bounded(text: &str, max: usize) -> String {
    let text = escaped(text);
    if text.len() <= max {
        return text;
    }
    let kept = cut(&text, max.saturating_sub(NOTE_ROOM));
    format!("{kept}… ({} more bytes)", text.len() - kept.len())
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The last `max` bytes of `text` at most, starting on a character boundary: the end of
/// what was said (a log's last lines).
pub fn last(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_whole_characters() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(last("héllo", 4), "llo");
        assert_eq!(last("héllo", 5), "éllo");
        assert_eq!(last("abc", 10), "abc");
    }

    #[test]
    fn what_is_said_is_one_bounded_line() {
        assert_eq!(escaped("a\nb\r\u{1b}[2J\u{2028}c"), "a\\nb\\r\\u{1b}[2J\\u{2028}c");
        assert_eq!(bounded("plain", 40), "plain");
        assert_eq!(bounded(&"0123456789".repeat(5), 42), "0123456789… (40 more bytes)");
        assert_eq!(bounded(&"é".repeat(20), 35), "é… (38 more bytes)", "cut on a character boundary");
        let forged = format!("{}\n2026-12-02T00:00:00Z  INFO plugdb: promoted orders-1", "x".repeat(400_000));
        let said = bounded(&forged, 1000);
        assert!(said.len() <= 1000 && !said.contains('\n'), "one line within the bound: {}", said.len());
    }
}
