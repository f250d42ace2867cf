//! Checking engine parameters by name and type against a catalogue, the way every
//! engine plugin must before it writes them into a configuration file.

use crate::{Parameter, ParameterValue, Violation, helpers::parameter_field, helpers::violation};

/// The type of a settable parameter.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// An integer in an inclusive range.
    Int(i64, i64),
    /// A non-negative number optionally followed by one of these units (`64MB`, `1G`).
    WithUnit(&'static [&'static str], &'static str),
    /// A number in an inclusive range.
    Real(f64, f64),
    /// One of these words (compared case-insensitively).
    Enum(&'static [&'static str]),
    /// Free text up to this many bytes, without quotes or newlines.
    Text(usize),
}

/// The parameters an engine lets users set, and those it keeps for itself.
#[derive(Clone, Copy, Debug)]
pub struct Catalog {
    /// Settable parameters and their types, sorted by name.
    pub settable: &'static [(&'static str, Kind)],
    /// Parameters the plugin manages (replication, networking, paths).
    pub reserved: &'static [&'static str],
}

impl Kind {
    /// `Ok` when `value` has this type, else what it should look like.
    pub fn check(self, value: &ParameterValue) -> Result<(), String> {
        let (text, integer) = match value {
            ParameterValue::Text(t) => (t.trim().to_string(), t.trim().parse::<i64>().ok()),
            ParameterValue::Integer(n) => (n.to_string(), Some(*n)),
        };
        let fail = |what: String| Err(format!("{text:?} {what}"));
        match self {
            Kind::Int(lo, hi) => match integer {
                Some(n) if (lo..=hi).contains(&n) => Ok(()),
                _ => fail(format!("must be an integer between {lo} and {hi}")),
            },
            Kind::WithUnit(units, example) => {
                let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                let unit = &text[digits.len()..];
                if digits.parse::<u64>().is_ok() && (unit.is_empty() || units.contains(&unit)) {
                    Ok(())
                } else {
                    fail(format!("must be a number with an optional unit ({}), e.g. {example}", units.join(", ")))
                }
            }
            Kind::Real(lo, hi) => match text.parse::<f64>() {
                Ok(x) if (lo..=hi).contains(&x) => Ok(()),
                _ => fail(format!("must be a number between {lo} and {hi}")),
            },
            Kind::Enum(words) if words.iter().any(|w| w.eq_ignore_ascii_case(&text)) => Ok(()),
            Kind::Enum(words) => fail(format!("must be one of {}", words.join(", "))),
            Kind::Text(max) if text.len() <= max && !text.contains(['\'', '"', '\n', '\r', '\\']) => Ok(()),
            Kind::Text(max) => fail(format!("must be at most {max} characters without quotes, backslashes or newlines")),
        }
    }
}

impl Catalog {
    /// Violations of `parameters`: reserved names, unknown names, wrong types.
    pub fn check(&self, parameters: &[Parameter]) -> Vec<Violation> {
        let mut out = Vec::new();
        for p in parameters {
            let field = parameter_field(&p.name);
            if self.reserved.contains(&p.name.as_str()) {
                out.push(violation(field, "is managed by plugdb and cannot be set"));
            } else if let Some((_, kind)) = self.settable.iter().find(|(name, _)| *name == p.name) {
                if let Err(message) = kind.check(&p.value) {
                    out.push(violation(field, message));
                }
            } else {
                let known: Vec<&str> = self.settable.iter().map(|(n, _)| *n).collect();
                out.push(violation(field, format!("unknown parameter; settable: {}", known.join(", "))));
            }
        }
        out
    }
}
