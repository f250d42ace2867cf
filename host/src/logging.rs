//! The operator's own log: text for people (the default), JSON for log collectors;
//! one record per line, also for what plugins log (see [`crate::plugin::logs`]).

pub use tracing_subscriber::EnvFilter as Filter;
use tracing_subscriber::fmt::MakeWriter;

/// The variable that says how the operator logs, and how it has its members' agents log.
pub const FORMAT_ENV: &str = "PLUGDB_LOG_FORMAT";

/// How log records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per record.
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter when `RUST_LOG` does not say: informational records, kube's warnings.
pub fn default_filter() -> Filter {
    Filter::try_from_default_env().unwrap_or_else(|_| filter("info,kube=warn"))
}

/// A filter from `RUST_LOG`-style directives, e.g. `info,kube=warn`.
pub fn filter(directives: &str) -> Filter {
    Filter::new(directives)
}

/// The subscriber the operator logs through: `format` to `writer`, colours only when
/// `ansi`.
pub fn subscriber<W>(format: LogFormat, filter: Filter, writer: W, ansi: bool) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Json => Box::new(fmt.json().finish()),
        LogFormat::Text => Box::new(fmt.with_ansi(ansi).finish()),
    }
}
