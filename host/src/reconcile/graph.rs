//! The module graph of a pass, checked: the decisions are pure. [`PURE`] — `decide` and
//! its parts, `members`, `status`, `owner` — neither read nor write (no `async`, no API
//! or agent client, no files, sockets or processes, not the caches or the pass's
//! context) and import, of the reconciler's own modules, only each other and the
//! observed facts of `cache` (values, not the caches). What they decide is carried out
//! by the modules that read and write around them; of those, only the act modules
//! ([`ACT`]) write: the stages decide what is written, and the end of the pass writes it.
//! And only the observe stage reads over the network ([`READS`]; its functions are
//! `observe`, `read_…` and `look_at_…`, with the modules it reads through, [`READERS`]),
//! besides the act modules, which read what a write is checked against.

use std::path::{Path, PathBuf};

/// The pure modules, as paths under `src/reconcile` (a module's own file, and the files of
/// its parts but its tests).
const PURE: &[&str] = &[
    "decide.rs",
    "decide/backups.rs",
    "decide/primary.rs",
    "decide/replication.rs",
    "decide/volumes.rs",
    "members.rs",
    "status.rs",
    "owner.rs",
];

/// The reconciler's modules a pure one may import from: the pure ones, and `cache` for the
/// facts it observed.
const PURE_MODULES: &[&str] = &["decide", "members", "status", "owner", "cache"];

/// What reads or writes, or reaches what does: none of it is in a pure module's code.
const IMPURE: &[&str] = &[
    "async ",
    ".await",
    "tokio::",
    "Api<",
    "Api::",
    "Client",
    "Context",
    "Caches",
    "CallPool",
    "calls::",
    "std::fs",
    "std::net",
    "std::process",
    "std::io",
    "hyper",
];

/// The modules that write (as paths under `src/reconcile`): the plan and the handover,
/// carried out at the end of a pass; the agent and API client calls they carry out with;
/// the pass's end and the reconciler's root (the status, the finalizer); and the pass over
/// a Database being deleted.
const ACT: &[&str] = &["plan.rs", "handover.rs", "converge/end.rs", "agent.rs", "apply.rs", "mod.rs", "delete.rs"];

/// What writes: to the API server, or to the members through their agents.
const WRITES: &[&str] = &[
    ".patch(",
    ".patch_status(",
    ".create(",
    ".delete(",
    ".replace(",
    "agent::fence(",
    "agent::stop(",
    "agent::promote(",
    "agent::follow(",
    "agent::synchronous(",
    "set_finalizer(",
    "write_status(",
    "create_once(",
    "apply::apply(",
];

/// What reads over the network: the API server (a Node, a Secret, cert-manager's
/// Certificate, a failed Job's pod), a bucket, the members' agents, the members.
const READS: &[&str] = &[
    ".get_opt(",
    ".list(",
    "bucket::open(",
    "bucket::to_remove(",
    "agent::statuses(",
    "ask::answers(",
    "nodes::read(",
    "certificate_authority(",
];

/// The modules that read for the others (what they read is asked of them): the bucket,
/// the Nodes, the members, their agents.
const READERS: &[&str] = &["bucket.rs", "nodes.rs", "ask.rs", "agent.rs"];

fn reconcile_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/reconcile")
}

/// The code of `text`: no comments, and nothing from its first `#[cfg(test)]` on (the
/// tests of a module may use what they like).
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") && !trimmed.contains("fn ") {
            // An item for tests only (a helper, `mod tests`): what follows is tests or the
            // item; a later non-test item is still checked past it.
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let line = line.split(" //").next().unwrap_or(line);
        out.push_str(line);
        out.push('\n');
    }
    cut_test_modules(&out)
}

/// Where the block opened at `open` (a `{`) in `text` ends: just past its `}`, or the end
/// of `text`.
fn block_end(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// `text` without its `mod tests { … }` blocks and `mod tests;` declarations.
fn cut_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("mod tests") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        match (after.find(';'), after.find('{')) {
            (Some(semi), Some(open)) if semi < open => rest = &after[semi + 1..],
            (_, Some(open)) => {
                let end = block_end(after, open);
                rest = &after[end..];
            }
            (Some(semi), None) => rest = &after[semi + 1..],
            (None, None) => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// The reconciler's modules (and items of its root) that `code`, in the file at `path`
/// under `src/reconcile`, names through `super::` or `crate::reconcile::`: the first
/// segment after the reconciler, each name of a `{…}` group included.
fn reconcile_imports(path: &str, code: &str) -> Vec<String> {
    // How deep the file's module sits below the reconciler: `decide.rs` 1, `decide/x.rs` 2.
    let depth = path.matches('/').count() + 1;
    let mut found = Vec::new();
    let mut take = |after: &str| {
        if let Some(group) = after.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            found.extend(group.split(',').map(|s| s.trim().split("::").next().unwrap_or("").to_string()).filter(|s| !s.is_empty()));
        } else {
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            found.push(name);
        }
    };
    for (at, _) in code.match_indices("crate::reconcile::") {
        take(&code[at + "crate::reconcile::".len()..]);
    }
    let mut i = 0;
    while let Some(at) = code[i..].find("super::") {
        let start = i + at;
        // A whole run of `super::` counts once, from its first.
        let preceded = code[..start].ends_with("super::");
        let mut supers = 0;
        let mut rest = &code[start..];
        while let Some(r) = rest.strip_prefix("super::") {
            supers += 1;
            rest = r;
        }
        i = start + supers * "super::".len();
        if !preceded && supers == depth {
            take(rest);
        }
    }
    found
}

fn pure_files() -> Vec<(&'static str, String)> {
    PURE.iter()
        .map(|path| {
            let text = std::fs::read_to_string(reconcile_dir().join(path)).unwrap_or_else(|e| panic!("src/reconcile/{path}: {e}"));
            (*path, code(&text))
        })
        .collect()
}

#[test]
fn the_decisions_neither_read_nor_write() {
    let mut found = Vec::new();
    for (path, code) in pure_files() {
        for line in code.lines() {
            if let Some(what) = IMPURE.iter().find(|what| line.contains(*what)) {
                found.push(format!("src/reconcile/{path}: `{what}` in `{}`", line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "a pure module reads or writes:\n{}", found.join("\n"));
}

#[test]
fn the_decisions_import_only_each_other_and_the_observed_facts() {
    let mut found = Vec::new();
    for (path, code) in pure_files() {
        for name in reconcile_imports(path, &code) {
            let module = name.starts_with(|c: char| c.is_lowercase());
            if (module && !PURE_MODULES.contains(&name.as_str())) || name == "Context" {
                found.push(format!("src/reconcile/{path} imports reconcile::{name}"));
            }
        }
    }
    assert!(found.is_empty(), "a pure module imports one that reads or writes:\n{}", found.join("\n"));
}

/// Every file of the reconciler but its tests, as a path under `src/reconcile`.
fn reconcile_files() -> Vec<String> {
    fn walk(dir: &Path, under: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("src/reconcile").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if under.is_empty() { name.clone() } else { format!("{under}/{name}") };
            if entry.path().is_dir() {
                walk(&entry.path(), &path, out);
            } else if name.ends_with(".rs") && name != "tests.rs" && path != "graph.rs" {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&reconcile_dir(), "", &mut out);
    out.sort();
    out
}

#[test]
fn only_the_end_of_a_pass_writes() {
    let mut found = Vec::new();
    for path in reconcile_files().into_iter().filter(|p| !ACT.contains(&p.as_str())) {
        let text = std::fs::read_to_string(reconcile_dir().join(&path)).expect("a source file");
        for line in code(&text).lines() {
            if let Some(what) = WRITES.iter().find(|what| line.contains(*what)) {
                found.push(format!("src/reconcile/{path}: `{what}` in `{}`", line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "a stage writes (the plan, or the handover, should):\n{}", found.join("\n"));
    let files = reconcile_files();
    assert!(files.iter().any(|f| f == "converge/leads.rs") && files.iter().any(|f| f == "replication.rs"), "{files:?}");
    for act in ACT {
        assert!(files.iter().any(|f| f == act), "src/reconcile/{act} is gone");
    }
}

/// The functions of `code`, each as its name and its text (signature and body).
fn functions(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(open) = code[at..].find('{').map(|i| at + i) else { continue };
        if code[at..open].contains(';') {
            continue;
        }
        let end = block_end(code, open);
        out.push((name, code[at..end].to_string()));
    }
    out
}

/// Whether a function named `name` is of the observe stage: `observe`, and what it reads
/// with (`read_…`, `look_at_…`).
fn observes(name: &str) -> bool {
    name == "observe" || name.starts_with("read_") || name.starts_with("look_at_")
}

#[test]
fn only_the_observe_stage_and_the_end_of_a_pass_read_over_the_network() {
    let mut found = Vec::new();
    let exempt = |path: &str| ACT.contains(&path) || READERS.contains(&path);
    for path in reconcile_files().into_iter().filter(|p| !exempt(p)) {
        let text = std::fs::read_to_string(reconcile_dir().join(&path)).expect("a source file");
        for (name, body) in functions(&code(&text)).into_iter().filter(|(name, _)| !observes(name)) {
            for line in body.lines() {
                if let Some(what) = READS.iter().find(|what| line.contains(*what)) {
                    found.push(format!("src/reconcile/{path}: `{what}` in fn {name}: `{}`", line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "a stage reads over the network (the observe stage should):\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_what_it_forbids() {
    // Each way in: a path, a group, the reconciler named from the crate, a run of supers.
    let shown = |path: &str, code: &str| reconcile_imports(path, code);
    assert_eq!(shown("decide.rs", "use super::agent::Fenced;"), ["agent"]);
    assert_eq!(shown("members.rs", "use super::{Context, apply, members::Observed};"), ["Context", "apply", "members"]);
    assert_eq!(shown("decide/x.rs", "use super::*; let a = super::super::plan::Plan::new();"), ["plan"]);
    assert_eq!(shown("status.rs", "crate::reconcile::ask::replies()"), ["ask"]);
    // Comments and tests are not code.
    let text = "/// calls `.await`\nfn a() {} // Api::all\n#[cfg(test)]\nmod tests {\n  async fn b() { c().await }\n}\nfn d() {}\n";
    let lines: Vec<String> = code(text).lines().filter(|l| !l.trim().is_empty()).map(String::from).collect();
    assert_eq!(lines, ["fn a() {}", "fn d() {}"]);
    // Functions, and the observe stage's among them.
    let text = "fn observe(a: u8) -> u8 { if a { b.get_opt(x) } else { 0 } }\nfn decide() { c.list(y); }\nfn declared();";
    let found: Vec<(String, bool)> =
        functions(text).into_iter().map(|(n, b)| (n.clone(), observes(&n) && b.contains(".get_opt("))).collect();
    assert_eq!(found, [("observe".to_string(), true), ("decide".to_string(), false)]);
    // Every pure module exists and says something.
    for (path, code) in pure_files() {
        assert!(code.contains("fn "), "src/reconcile/{path} has no code");
    }
}
