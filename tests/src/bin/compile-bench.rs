//! What compiling the biggest code the shape limits let through costs: generated
//! components whose functions are each at the per-function limit and together at the
//! total limit, in the code patterns that make the compiler work hardest per byte.
//! Each case runs in a child process of its own so its peak memory is its own.
//!
//!   compile-bench [OUT.md]      a table: each case in one process, and through the
//!                               operator's child compiler (plugdb beside this binary)

use std::time::Instant;

use plugdb::plugin::{Limits, Tier};
use plugdb_tests::bomb::{PATTERNS, component};

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    kib / 1024.0
}

/// Child mode: compile one case in this process (`here`) or through the operator's
/// child compiler (`apart`), and print `seconds|peak MiB of this process|code bytes|largest function|outcome`.
fn case(place: &str, tier: &str, pattern: &str) -> anyhow::Result<()> {
    let limits = Limits::default();
    let bytes = component(pattern, &limits.shape);
    let shape = plugdb::plugin::Shape::of(&bytes).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(shape.excess(&limits.shape).is_empty(), "the generated case is past the limits: {:?}", shape.excess(&limits.shape));
    let tier = if tier == "quick" { Tier::Quick } else { Tier::Optimized };
    let mut runtime = plugdb::plugin::Runtime::with_tier(limits, tier)?;
    if place == "apart" {
        runtime = runtime.with_compiler(&std::env::current_exe()?.with_file_name("plugdb"));
    }
    let before = peak_rss_mib();
    let started = Instant::now();
    let loaded = runtime.load(&bytes);
    let seconds = started.elapsed().as_secs_f64();
    // A core module alone does not speak the contract: refused once compiled.
    let outcome = match loaded {
        Err(plugdb::plugin::LoadError::Contract(_)) => "compiled".to_string(),
        Err(e) => format!("refused: {e}"),
        Ok(_) => anyhow::bail!("a bare core module loaded as a plugin"),
    };
    println!("{seconds:.2}|{:.0}|{}|{}|{outcome}", peak_rss_mib() - before, shape.code_bytes, shape.largest_function);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, place, tier, pattern] = args.as_slice()
        && mode == "case"
    {
        return case(place, tier, pattern);
    }
    let out = args.first().cloned().unwrap_or_else(|| "target/compile-bench.md".into());
    let limits = Limits::default();
    let mut table = format!(
        "Compiling the most code the shape limits let through ({} KiB in all, {} KiB per function, {} locals): \
         in one process (what it costs), and as the operator does, in a child process limited to {} MiB of data \
         and {:?} (what the operator spends)\n\n\
         | tier | pattern | code (KiB) | largest function (KiB) | in one process: s | in one process: peak RSS (MiB) \
         | operator: s | operator: its own peak RSS (MiB) | operator: outcome |\n|---|---|---|---|---|---|---|---|---|\n",
        limits.shape.code_bytes >> 10,
        limits.shape.function_bytes >> 10,
        limits.shape.locals,
        limits.compile_memory >> 20,
        limits.compile_timeout,
    );
    let exe = std::env::current_exe()?;
    for tier in ["quick", "optimized"] {
        for pattern in PATTERNS {
            let mut cells: Vec<String> = Vec::new();
            for place in ["here", "apart"] {
                let output = std::process::Command::new(&exe).args(["case", place, tier, pattern]).output()?;
                anyhow::ensure!(output.status.success(), "{place} {tier} {pattern}: {}", String::from_utf8_lossy(&output.stderr));
                let line = String::from_utf8_lossy(&output.stdout).trim().to_string();
                let fields: Vec<&str> = line.splitn(5, '|').collect();
                anyhow::ensure!(fields.len() == 5, "{tier} {pattern}: unexpected output {line:?}");
                let kib = |s: &str| s.parse::<usize>().map(|b| b >> 10).unwrap_or(0);
                if place == "here" {
                    cells.extend([kib(fields[2]).to_string(), kib(fields[3]).to_string(), fields[0].into(), fields[1].into()]);
                } else {
                    cells.extend([fields[0].into(), fields[1].into(), fields[4].into()]);
                }
            }
            let row = format!("| {tier} | {pattern} | {} |\n", cells.join(" | "));
            print!("{row}");
            table.push_str(&row);
        }
    }
    std::fs::write(&out, table)?;
    println!("written to {out}");
    Ok(())
}
