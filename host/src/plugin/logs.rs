//! What a plugin logs reaches the operator's log as one record it cannot forge: control
//! characters escaped, tagged with its engine, and bounded per engine over time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Bytes of plugin log each engine may write a second, on average.
pub const BYTES_PER_SECOND: f64 = 4096.0;
/// Bytes of plugin log an engine may write at once after a quiet spell.
pub const BURST_BYTES: f64 = 65536.0;

/// Each engine's allowance of log bytes: earned at [`BYTES_PER_SECOND`], banked up to
/// [`BURST_BYTES`]; a line beyond it is dropped and counted.
#[derive(Debug)]
pub struct LogRate {
    per_second: f64,
    burst: f64,
    engines: Mutex<HashMap<String, Allowance>>,
}

#[derive(Debug, Clone, Copy)]
struct Allowance {
    bytes: f64,
    at: Instant,
    /// Lines dropped since the last one let through.
    dropped: u64,
}

/// What became of a line offered to [`LogRate::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Written; this many lines before it were dropped since the last one written.
    Yes {
        /// Lines dropped before it.
        after_dropping: u64,
    },
    /// Dropped: the engine is over its allowance.
    No,
}

impl Default for LogRate {
    fn default() -> Self {
        Self::new(BYTES_PER_SECOND, BURST_BYTES)
    }
}

impl LogRate {
    /// An allowance of `per_second` bytes a second, banked up to `burst`.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self { per_second, burst, engines: Mutex::default() }
    }

    /// Whether `engine` may write a line of `bytes` now (and spends them if so).
    pub fn admit(&self, engine: &str, bytes: usize, now: Instant) -> Admitted {
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        let a = engines.entry(engine.to_string()).or_insert(Allowance { bytes: self.burst, at: now, dropped: 0 });
        a.bytes = (a.bytes + now.saturating_duration_since(a.at).as_secs_f64() * self.per_second).min(self.burst);
        a.at = a.at.max(now);
        let cost = bytes.max(1) as f64;
        if a.bytes < cost {
            a.dropped += 1;
            return Admitted::No;
        }
        a.bytes -= cost;
        Admitted::Yes { after_dropping: std::mem::take(&mut a.dropped) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::said::escaped;

    #[test]
    fn control_characters_and_line_separators_are_escaped() {
        let forged = "ok\n2026-11-27T08:00:00Z  INFO plugdb::reconcile: promoted\r\0\x1b[2J\u{2028}end";
        let one = escaped(forged);
        assert!(!one.chars().any(|c| c.is_control() || c == '\u{2028}'), "{one:?}");
        assert_eq!(one, "ok\\n2026-11-27T08:00:00Z  INFO plugdb::reconcile: promoted\\r\\u{0}\\u{1b}[2J\\u{2028}end");
        assert_eq!(escaped("plain text, ünïcode"), "plain text, ünïcode");
    }

    #[test]
    fn an_engine_past_its_allowance_is_dropped_and_the_others_are_not() {
        let rate = LogRate::new(100.0, 1000.0);
        let t0 = Instant::now();
        let written = (0..20).filter(|_| matches!(rate.admit("chatty", 100, t0), Admitted::Yes { .. })).count();
        assert_eq!(written, 10, "the burst lets ten 100-byte lines through, then none");
        assert_eq!(rate.admit("quiet", 100, t0), Admitted::Yes { after_dropping: 0 }, "another engine has its own allowance");
        assert_eq!(rate.admit("chatty", 100, t0 + Duration::from_millis(500)), Admitted::No, "50 bytes earned in half a second");
        assert_eq!(
            rate.admit("chatty", 100, t0 + Duration::from_secs(1)),
            Admitted::Yes { after_dropping: 11 },
            "earned back, and says how many went"
        );
    }
}
