//! What a member says of its engine's health besides its role and position, from which
//! the operator names trouble before it is an outage: the plugin's status command may
//! print a second line `signals <key>=<value> …` (how many clients are connected of how
//! many it lets in, how long the oldest open transaction has run, how old the oldest
//! transaction ID not yet frozen is, how much log the engine keeps for replicas or the
//! archive), and the agent adds how fast a replica's lag grows (`lagging <seconds an
//! hour>`), from its own looks at what the status command said.

use std::time::{Duration, Instant};

/// What the member said of its engine's health; each `None` when it did not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// Clients connected, and the most the engine lets in (`connections=<n>/<max>`).
    pub connections: Option<(u64, u64)>,
    /// How long the oldest open transaction has run, in seconds (`transaction=<s>`).
    pub transaction: Option<u64>,
    /// The age of the oldest transaction ID not yet frozen (`xid-age=<n>`, postgres).
    pub xid_age: Option<u64>,
    /// The bytes of log the engine keeps on its volume for a replica or the archive
    /// (`held=<bytes>`: a replication slot's, or the binary logs).
    pub held: Option<u64>,
    /// How many seconds a replica's lag grew by in an hour, over the agent's looks
    /// (`lagging <s>`, once they span [`LAG_TREND_AT_LEAST`]; 0 while it does not grow).
    pub lag_growth: Option<u64>,
}

/// The longest signals line read.
pub const MAX_LINE: usize = 256;

/// Reads `signals <key>=<value> …`, as coming from anyone: at most [`MAX_LINE`]
/// characters and 8 words, each value digits (at most 19), `connections` two of them
/// split by `/`, the count no more than 100 times the most. A key this host does not know
/// is passed over (a newer plugin may say more), a known key said wrong is refused.
pub fn parse(line: &str) -> Result<Signals, String> {
    let refuse = |why: &str| format!("{:?} is not `signals <key>=<value> …`: {why}", crate::said::cut(line, 64));
    let rest = line.strip_prefix("signals ").ok_or_else(|| refuse("no `signals `"))?;
    if line.len() > MAX_LINE || rest.split(' ').count() > 8 {
        return Err(refuse("too long"));
    }
    let number =
        |s: &str| (!s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
    let mut signals = Signals::default();
    for word in rest.split(' ') {
        let (key, value) = word.split_once('=').ok_or_else(|| refuse("a word is not <key>=<value>"))?;
        let wrong = || refuse(&format!("{key} is not a number"));
        match key {
            "connections" => {
                let (n, max) = value.split_once('/').ok_or_else(wrong)?;
                let (n, max) = (number(n).ok_or_else(wrong)?, number(max).ok_or_else(wrong)?);
                if max == 0 || n > max.saturating_mul(100) {
                    return Err(refuse("connections are not <n>/<max>"));
                }
                signals.connections = Some((n, max));
            }
            "transaction" => signals.transaction = Some(number(value).ok_or_else(wrong)?),
            "xid-age" => signals.xid_age = Some(number(value).ok_or_else(wrong)?),
            "held" => signals.held = Some(number(value).ok_or_else(wrong)?),
            _ => {}
        }
    }
    Ok(signals)
}

/// `lagging <seconds an hour>`, the agent's own line.
pub fn parse_lagging(line: &str) -> Result<u64, String> {
    let value = line.strip_prefix("lagging ").filter(|v| !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()));
    value.and_then(|v| v.parse().ok()).ok_or_else(|| format!("{:?} is not `lagging <seconds an hour>`", crate::said::cut(line, 64)))
}

/// The span of the looks a lag's growth is read over.
pub const LAG_TREND_OVER: Duration = Duration::from_secs(30 * 60);
/// The least span a lag's growth is read over: a spike is not a trend.
pub const LAG_TREND_AT_LEAST: Duration = Duration::from_secs(15 * 60);

/// A replica's lag at each status asked (one look a minute at most kept) over the last
/// [`LAG_TREND_OVER`]: how much it grew an hour between the first look kept and now,
/// once they are [`LAG_TREND_AT_LEAST`] apart (0 when it fell). A member that says no lag
/// (a primary, a replica that does not stream) forgets what it saw.
#[derive(Debug, Default)]
pub struct LagTrend(super::metrics::Trend);

impl LagTrend {
    /// Notes the `first` line of a status answer at `now`; the growth an hour, in seconds.
    pub fn look(&self, now: Instant, first: &str) -> Option<u64> {
        let lag = match first.split(' ').collect::<Vec<_>>()[..] {
            ["replica", _, lag] => lag.parse::<f64>().ok().filter(|l| l.is_finite() && *l >= 0.0).map(Duration::from_secs_f64),
            _ => None,
        };
        let Some(lag) = lag else {
            self.0.forget();
            return None;
        };
        let millis = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        self.0.look(now, millis, LAG_TREND_OVER, LAG_TREND_AT_LEAST).map(|growth| growth / 1000)
    }
}
