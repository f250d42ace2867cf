//! The plugin registry: engine plugins loaded from ConfigMaps while the operator runs.
//!
//! Only ConfigMaps in the operator's namespace labelled `plugdb.io/engine-plugin`
//! count; the label's value, when not empty, names the engine the ConfigMap is meant
//! to provide. The component sits in `binaryData` under a key ending in `.wasm`, or
//! `.wasm.gz` when gzip-compressed; an optional `plugdb.io/sha256` annotation pins the
//! digest of the (decompressed) component. A load decodes, verifies, compiles (off
//! the async executor, cached by digest), self-tests and only then swaps the plugin
//! in: a bad new version never replaces a good running one.
//!
//! Each ConfigMap has a lane of its own: its events are handled in order (a newer
//! version superseding one not yet started), while other ConfigMaps load beside it, so a
//! slow compile holds up no other plugin. At most [`COMPILES_AT_ONCE`] compiles run at
//! a time, quick and optimised together.
//!
//! One file though about 600 lines: loading, the builds kept, the lanes and the reports
//! share one state under one lock, and read best side by side.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crate::events::Recorder;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Semaphore, broadcast, watch};

use super::memo::Memo;
use super::runtime::{LoadError, Plugin, Runtime, hex_digest};
use crate::metrics::Metrics;

/// Label that marks a ConfigMap as an engine plugin; its value names the engine.
pub const PLUGIN_LABEL: &str = "plugdb.io/engine-plugin";
/// Annotation pinning the SHA-256 of the component.
pub const DIGEST_ANNOTATION: &str = "plugdb.io/sha256";
/// The source name of a bundled plugin (`~bundled/<file>`): it sorts after every
/// ConfigMap name (those start with a letter or digit), so a ConfigMap for the same
/// engine serves and the bundled plugin stands by, taking over if that ConfigMap goes.
pub const BUNDLED: &str = "~bundled/";
/// Compiles that may run at once (each bounded by the runtime's shape limits).
pub const COMPILES_AT_ONCE: usize = 2;

mod decode;
pub use decode::{DecodeError, MAX_COMPONENT_BYTES, decode};

/// A plugin serving an engine, and where it came from.
#[derive(Debug, Clone)]
struct Loaded {
    plugin: Plugin,
    config_map: String,
}

/// The last load problem of a ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadProblem {
    /// The ConfigMap.
    pub config_map: String,
    /// Engine it is labelled for, when it says.
    pub engine: Option<String>,
    /// What went wrong.
    pub reason: String,
}

/// A valid plugin standing by for an engine another ConfigMap serves: only its bytes are
/// kept (a compiled plugin holds megabytes), compiled again if it takes over.
#[derive(Debug, Clone)]
struct Rival {
    engine: String,
    bytes: Arc<[u8]>,
}

impl Rival {
    fn of(plugin: &Plugin) -> Self {
        Self { engine: plugin.info().engine.clone(), bytes: plugin.bytes() }
    }
}

#[derive(Debug, Default)]
struct State {
    engines: BTreeMap<String, Loaded>,
    /// Valid plugins of ConfigMaps whose engine another ConfigMap serves, by ConfigMap
    /// name: the first of them by name takes over when the serving one goes.
    rivals: BTreeMap<String, Rival>,
    /// Last problem per ConfigMap; cleared by a successful load or a delete.
    problems: BTreeMap<String, LoadProblem>,
}

/// The engines the operator can serve right now. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    runtime: Runtime,
    optimizer: Option<Runtime>,
    state: Arc<RwLock<State>>,
    compiled: Arc<RwLock<HashMap<String, Plugin>>>,
    changes: broadcast::Sender<String>,
    metrics: Arc<Metrics>,
    /// True once the watch has loaded every plugin ConfigMap that existed when it started.
    synced: Arc<tokio::sync::watch::Sender<bool>>,
    /// Answers of every loaded plugin's calls, shared by both compile tiers.
    memo: Arc<Memo>,
    /// Permits to compile.
    compiles: Arc<Semaphore>,
    /// ConfigMaps whose plugin is being compiled right now.
    compiling: Arc<RwLock<Vec<String>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("engines", &self.engines()).finish()
    }
}

/// What a ConfigMap's lane is asked to do.
#[derive(Clone)]
enum Job {
    Apply(Box<ConfigMap>),
    Remove(String),
}

/// One ConfigMap's jobs, handled in order by a task of its own; a job not yet started
/// is superseded by a newer one.
struct Lane {
    jobs: watch::Sender<(u64, Job)>,
    /// The number of the last job handled.
    done: watch::Receiver<u64>,
    /// The number of the last job sent.
    sent: u64,
    /// Whether the last job sent removes the ConfigMap.
    removing: bool,
}

impl Lane {
    /// The ConfigMap is gone and its removal handled: nothing more will come.
    fn finished(&self) -> bool {
        self.removing && *self.done.borrow() >= self.sent
    }
}

/// What happened to one ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The plugin now serves `engine`.
    Loaded {
        /// Engine name.
        engine: String,
        /// `name@version` of the plugin.
        id: String,
        /// Whether it replaced another version.
        replaced: Option<String>,
    },
    /// The same bytes already serve; nothing changed.
    Unchanged,
    /// The ConfigMap was refused; any running version keeps serving.
    Rejected(LoadProblem),
    /// The engine was unloaded because its ConfigMap is gone.
    Unloaded {
        /// Engine name.
        engine: String,
    },
}

fn lock_poisoned<T>(e: std::sync::PoisonError<T>) -> T {
    // A panic while holding the lock cannot leave the maps half-written: every
    // write is a single insert or remove. Keep serving.
    e.into_inner()
}

impl Registry {
    /// An empty registry running plugins in `runtime`.
    pub fn new(runtime: Runtime, metrics: Arc<Metrics>) -> Self {
        let (changes, _) = broadcast::channel(64);
        let synced = Arc::new(tokio::sync::watch::Sender::new(false));
        let memo = Arc::new(Memo::default());
        let runtime = runtime.with_memo(memo.clone());
        Self {
            runtime,
            optimizer: None,
            state: Arc::default(),
            compiled: Arc::default(),
            changes,
            metrics,
            synced,
            memo,
            compiles: Arc::new(Semaphore::new(COMPILES_AT_ONCE)),
            compiling: Arc::default(),
        }
    }

    /// Tiered loading: plugins load with the registry's (quick) runtime and serve at
    /// once; `optimizer` recompiles each in the background and swaps the optimised
    /// build in when it is ready, if the same bytes still serve.
    pub fn with_optimizer(mut self, optimizer: Runtime) -> Self {
        self.optimizer = Some(optimizer.with_memo(self.memo.clone()));
        self
    }

    /// The plugin serving `engine`, if one is loaded.
    pub fn get(&self, engine: &str) -> Option<Plugin> {
        self.state.read().unwrap_or_else(lock_poisoned).engines.get(engine).map(|l| l.plugin.clone())
    }

    /// Names of the loaded engines with their plugin ids, sorted.
    pub fn engines(&self) -> Vec<(String, String)> {
        self.state.read().unwrap_or_else(lock_poisoned).engines.iter().map(|(e, l)| (e.clone(), l.plugin.id())).collect()
    }

    /// The last load problem that concerns `engine` (a ConfigMap labelled for it that failed).
    pub fn problem(&self, engine: &str) -> Option<LoadProblem> {
        self.state.read().unwrap_or_else(lock_poisoned).problems.values().find(|p| p.engine.as_deref() == Some(engine)).cloned()
    }

    /// Compiled builds the registry holds: those serving, and the cache of builds by
    /// digest. A plugin standing by, replaced or removed holds none.
    pub fn builds_held(&self) -> usize {
        let mut digests: Vec<String> =
            self.state.read().unwrap_or_else(lock_poisoned).engines.values().map(|l| l.plugin.digest().to_string()).collect();
        digests.extend(self.compiled.read().unwrap_or_else(lock_poisoned).keys().cloned());
        digests.sort();
        digests.dedup();
        digests.len()
    }

    /// ConfigMaps whose plugin is being compiled right now.
    pub fn compiling(&self) -> Vec<String> {
        self.compiling.read().unwrap_or_else(lock_poisoned).clone()
    }

    /// Waits until [`Registry::watch`] has loaded (or rejected) every plugin ConfigMap
    /// that existed when it started, so that nothing is judged against a half-loaded
    /// registry.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// Engine names whose plugin changed (loaded, replaced, unloaded), as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }

    /// Loads a plugin from component bytes under a source name (no ConfigMap involved;
    /// for tools and tests). Replaces any plugin of the same engine.
    pub async fn load_bytes(&self, source: &str, bytes: Vec<u8>) -> Outcome {
        self.apply_bytes(source, None, Ok(bytes)).await
    }

    /// Loads the plugins bundled with the operator, the `*.wasm` files in `dir` (in
    /// name order), through the same checks as a ConfigMap's; each under the source
    /// [`BUNDLED`]`<file name>`. What happened to each, by file name.
    pub async fn load_bundled(&self, dir: &std::path::Path) -> std::io::Result<Vec<(String, Outcome)>> {
        let mut files: Vec<std::path::PathBuf> =
            std::fs::read_dir(dir)?.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "wasm")).collect();
        files.sort();
        let mut outcomes = Vec::new();
        for path in files {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()));
            let source = format!("{BUNDLED}{name}");
            let outcome = self.apply_bytes(&source, None, bytes).await;
            self.report(&source, &outcome);
            outcomes.push((name, outcome));
        }
        Ok(outcomes)
    }

    /// Applies one ConfigMap: load or keep, and report.
    pub async fn apply(&self, cm: &ConfigMap) -> Outcome {
        let name = cm.name_any();
        let labelled = cm.labels().get(PLUGIN_LABEL).filter(|v| !v.is_empty() && v.as_str() != "true").cloned();
        self.apply_bytes(&name, labelled, decode(cm).map_err(|e| e.to_string())).await
    }

    async fn apply_bytes(&self, source: &str, labelled: Option<String>, bytes: Result<Vec<u8>, String>) -> Outcome {
        let plugin = match bytes {
            Ok(bytes) => self.compile(source, bytes).await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let mut state = self.state.write().unwrap_or_else(lock_poisoned);
        state.rivals.remove(source);
        let reject = |state: &mut State, reason: String| {
            let problem = LoadProblem { config_map: source.to_string(), engine: labelled.clone(), reason };
            state.problems.insert(source.to_string(), problem.clone());
            // Databases of the engine report the rejection too.
            let _ = self.changes.send(labelled.clone().unwrap_or_default());
            Outcome::Rejected(problem)
        };
        let plugin = match plugin {
            Ok(p) => p,
            Err(reason) => return reject(&mut state, reason),
        };
        let engine = plugin.info().engine.clone();
        if let Some(expected) = &labelled
            && *expected != engine
        {
            return reject(&mut state, format!("labelled {PLUGIN_LABEL}={expected} but the plugin serves engine {engine:?}"));
        }
        // Two ConfigMaps claiming one engine: the one whose name sorts first serves,
        // whatever the order they arrived in; the other stands by.
        let standing_by = |serving: &str| {
            format!("engine {engine:?} is served by ConfigMap {serving:?}, whose name sorts first; this one takes over if that one goes")
        };
        let mut displaced = None;
        if let Some(other) = state.engines.get(&engine)
            && other.config_map != source
        {
            if other.config_map.as_str() < source {
                let reason = standing_by(&other.config_map);
                state.rivals.insert(source.to_string(), Rival::of(&plugin));
                let outcome = reject(&mut state, reason);
                drop(state);
                self.forget_unused_builds();
                return outcome;
            }
            if let Some(other) = state.engines.remove(&engine) {
                let problem =
                    LoadProblem { config_map: other.config_map.clone(), engine: Some(engine.clone()), reason: standing_by(source) };
                state.problems.insert(other.config_map.clone(), problem);
                displaced = Some(other.plugin.id());
                self.memo.forget(other.plugin.digest());
                state.rivals.insert(other.config_map.clone(), Rival::of(&other.plugin));
            }
        }
        // This source may have served another engine before (its plugin changed engine).
        state.engines.retain(|e, l| l.config_map != source || *e == engine);
        state.problems.remove(source);
        let previous = state.engines.get(&engine).map(|l| (l.plugin.digest().to_string(), l.plugin.id()));
        if previous.as_ref().is_some_and(|(digest, _)| digest == plugin.digest()) {
            return Outcome::Unchanged;
        }
        let id = plugin.id();
        let digest = plugin.digest().to_string();
        state.engines.insert(engine.clone(), Loaded { plugin, config_map: source.to_string() });
        if let Some((old, _)) = &previous {
            self.memo.forget(old);
        }
        self.count(&state);
        drop(state);
        self.forget_unused_builds();
        self.optimize(&engine, source, &digest);
        let _ = self.changes.send(engine.clone());
        Outcome::Loaded { engine, id, replaced: previous.map(|(_, id)| id).or(displaced) }
    }

    /// Recompiles the plugin serving `engine` at the optimised tier in the background.
    fn optimize(&self, engine: &str, source: &str, digest: &str) {
        let Some(optimizer) = self.optimizer.clone() else { return };
        let Some(bytes) = self.state.read().unwrap_or_else(lock_poisoned).engines.get(engine).map(|l| l.plugin.bytes()) else { return };
        let (registry, engine, source, digest) = (self.clone(), engine.to_string(), source.to_string(), digest.to_string());
        tokio::spawn(async move {
            let Ok(permit) = registry.compiles.clone().acquire_owned().await else { return };
            let optimized = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                optimizer.load(&bytes)
            })
            .await;
            let optimized = match optimized {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => return tracing::warn!(engine, error = %e, "optimised compile failed; the quick build keeps serving"),
                Err(e) => return tracing::warn!(engine, error = %e, "optimised compile task failed; the quick build keeps serving"),
            };
            let mut state = registry.state.write().unwrap_or_else(lock_poisoned);
            if let Some(loaded) = state.engines.get_mut(&engine)
                && loaded.config_map == source
                && loaded.plugin.digest() == digest
            {
                // The optimised build ran the self-test again; it must say what the quick one said.
                if optimized.info() != loaded.plugin.info() {
                    return tracing::warn!(
                        engine,
                        "the optimised build's self-test differs from the quick build's; the quick build keeps serving"
                    );
                }
                loaded.plugin = optimized;
                registry.count(&state);
                tracing::debug!(engine, "optimised build now serves");
            }
        });
    }

    /// Sets the gauges of loaded engines and of those served by their optimised build.
    fn count(&self, state: &State) {
        self.metrics.plugins_loaded.set(state.engines.len() as i64);
        self.metrics.plugin_serving.clear();
        for (engine, l) in &state.engines {
            let source = match l.config_map.strip_prefix(BUNDLED) {
                Some(file) => format!("bundled/{file}"),
                None => format!("configmap/{}", l.config_map),
            };
            let labels = crate::metrics::ServingLabels {
                engine: engine.clone(),
                plugin: l.plugin.id(),
                sha256: l.plugin.digest().to_string(),
                source,
            };
            self.metrics.plugin_serving.get_or_create(&labels).set(1);
        }
        self.metrics.plugins_optimized.set(state.engines.values().filter(|l| l.plugin.optimized()).count() as i64);
    }

    /// Waits until every loaded plugin runs its optimised build (for tests and benchmarks).
    pub async fn wait_optimized(&self) {
        while self.state.read().unwrap_or_else(lock_poisoned).engines.values().any(|l| !l.plugin.optimized()) && self.optimizer.is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Compiles and self-tests `bytes` on a blocking thread, reusing an earlier compile of the same digest.
    async fn compile(&self, source: &str, bytes: Vec<u8>) -> Result<Plugin, LoadError> {
        let digest = hex_digest(&bytes);
        if let Some(plugin) = self.compiled.read().unwrap_or_else(lock_poisoned).get(&digest) {
            return Ok(plugin.clone());
        }
        let runtime = self.runtime.clone();
        let permit = self.compiles.clone().acquire_owned().await.map_err(|e| LoadError::SelfTest(format!("no compile permit: {e}")))?;
        self.compiling.write().unwrap_or_else(lock_poisoned).push(source.to_string());
        let loaded = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            runtime.load(&bytes)
        })
        .await;
        self.compiling.write().unwrap_or_else(lock_poisoned).retain(|s| s != source);
        let plugin = loaded.map_err(|e| LoadError::SelfTest(format!("the load task failed: {e}")))??;
        let mut compiled = self.compiled.write().unwrap_or_else(lock_poisoned);
        // Keep the cache to plugins still in use plus this one.
        let in_use: Vec<String> =
            self.state.read().unwrap_or_else(lock_poisoned).engines.values().map(|l| l.plugin.digest().to_string()).collect();
        compiled.retain(|d, _| in_use.contains(d));
        compiled.insert(digest, plugin.clone());
        Ok(plugin)
    }

    /// Drops compiled builds no engine serves any more: what a replaced, removed or
    /// standing-by plugin held is freed.
    fn forget_unused_builds(&self) {
        let in_use: Vec<String> =
            self.state.read().unwrap_or_else(lock_poisoned).engines.values().map(|l| l.plugin.digest().to_string()).collect();
        self.compiled.write().unwrap_or_else(lock_poisoned).retain(|d, _| in_use.contains(d));
    }

    /// Forgets a ConfigMap: unloads the engine it served (a standing-by rival, the
    /// first by name, is compiled again and takes over), clears its problems.
    pub async fn remove(&self, config_map: &str) -> Option<Outcome> {
        let (engine, gone, rival) = {
            let mut state = self.state.write().unwrap_or_else(lock_poisoned);
            state.problems.remove(config_map);
            state.rivals.remove(config_map);
            let engine = state.engines.iter().find(|(_, l)| l.config_map == config_map).map(|(e, _)| e.clone())?;
            let gone = state.engines.remove(&engine)?;
            self.memo.forget(gone.plugin.digest());
            let rival = state.rivals.iter().find(|(_, r)| r.engine == engine).map(|(name, _)| name.clone());
            let rival = rival.and_then(|name| state.rivals.remove(&name).map(|r| (name, r)));
            self.count(&state);
            (engine, gone, rival)
        };
        self.forget_unused_builds();
        let outcome = match rival {
            Some((source, rival)) => match self.apply_bytes(&source, Some(engine.clone()), Ok(rival.bytes.to_vec())).await {
                Outcome::Loaded { engine, id, .. } => Outcome::Loaded { engine, id, replaced: Some(gone.plugin.id()) },
                other => other,
            },
            None => Outcome::Unloaded { engine: engine.clone() },
        };
        let _ = self.changes.send(engine);
        Some(outcome)
    }

    fn sources(&self) -> Vec<String> {
        let state = self.state.read().unwrap_or_else(lock_poisoned);
        state.engines.values().map(|l| l.config_map.clone()).chain(state.problems.keys().cloned()).collect()
    }

    /// Watches plugin ConfigMaps in `namespace` and keeps the registry in step, until the
    /// stream ends. Every outcome is logged, counted and recorded as an Event on the ConfigMap.
    pub async fn watch(self, client: Client, namespace: String) {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let recorder = Arc::new(Recorder::new(client, "plugdb", "Load"));
        let config = watcher::Config::default().labels(PLUGIN_LABEL);
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut seen_in_relist: Vec<String> = Vec::new();
        let mut lanes: HashMap<String, Lane> = HashMap::new();
        while let Some(event) = events.next().await {
            // Lanes of ConfigMaps that are gone and whose removal is done end here.
            lanes.retain(|_, lane| !lane.finished());
            match event {
                Ok(watcher::Event::Init) => seen_in_relist.clear(),
                Ok(watcher::Event::InitApply(cm)) => {
                    seen_in_relist.push(cm.name_any());
                    self.send(&mut lanes, &recorder, Job::Apply(Box::new(cm)));
                }
                Ok(watcher::Event::Apply(cm)) => self.send(&mut lanes, &recorder, Job::Apply(Box::new(cm))),
                Ok(watcher::Event::InitDone) => {
                    let gone = self.sources().into_iter().filter(|s| !s.starts_with(BUNDLED) && !seen_in_relist.contains(s));
                    for gone in gone.collect::<Vec<_>>() {
                        self.send(&mut lanes, &recorder, Job::Remove(gone));
                    }
                    // Synced once every ConfigMap listed has been loaded or refused.
                    for lane in lanes.values_mut() {
                        let sent = lane.sent;
                        let _ = lane.done.wait_for(|done| *done >= sent).await;
                    }
                    self.synced.send_replace(true);
                }
                Ok(watcher::Event::Delete(cm)) => self.send(&mut lanes, &recorder, Job::Remove(cm.name_any())),
                Err(e) => tracing::warn!(error = %e, "plugin ConfigMap watch failed; retrying"),
            }
        }
    }

    /// Hands `job` to its ConfigMap's lane, starting the lane if it has none.
    fn send(&self, lanes: &mut HashMap<String, Lane>, recorder: &Arc<Recorder>, job: Job) {
        let name = match &job {
            Job::Apply(cm) => cm.name_any(),
            Job::Remove(name) => name.clone(),
        };
        let removing = matches!(job, Job::Remove(_));
        if let Some(lane) = lanes.get_mut(&name) {
            lane.sent += 1;
            lane.removing = removing;
            lane.jobs.send_replace((lane.sent, job));
            return;
        }
        let (jobs, mut next) = watch::channel((1, job));
        let (finished, done) = watch::channel(0);
        let (registry, recorder) = (self.clone(), recorder.clone());
        tokio::spawn(async move {
            // Versions replaced by newer ones before they were tried, since the last one
            // that loaded: any of them may have been good.
            let (mut last, mut superseded) = (0u64, 0u64);
            loop {
                let (number, job): (u64, Job) = next.borrow_and_update().clone();
                superseded += number.saturating_sub(last + 1);
                last = number;
                match job {
                    Job::Apply(cm) => {
                        if registry.handle(&recorder, &cm, superseded).await {
                            superseded = 0;
                        }
                    }
                    Job::Remove(name) => {
                        superseded = 0;
                        if let Some(outcome) = registry.remove(&name).await {
                            registry.report(&name, &outcome);
                        }
                    }
                }
                finished.send_replace(number);
                if next.changed().await.is_err() {
                    break;
                }
            }
        });
        lanes.insert(name, Lane { jobs, done, sent: 1, removing });
    }

    /// Applies `cm` and says so; `superseded`: versions of it replaced before they were
    /// tried since the last that loaded, which a refusal mentions (the build serving may
    /// then not be the newest good one). Whether the ConfigMap's plugin now serves.
    async fn handle(&self, recorder: &Recorder, cm: &ConfigMap, superseded: u64) -> bool {
        let mut outcome = self.apply(cm).await;
        if let (Outcome::Rejected(problem), 1..) = (&mut outcome, superseded) {
            problem.reason.push_str(&format!(
                "; {superseded} earlier version(s) of this ConfigMap were replaced by newer ones before they were tried, so the \
                 build serving may not be the newest good one: apply the one wanted again"
            ));
            self.state.write().unwrap_or_else(lock_poisoned).problems.insert(cm.name_any(), problem.clone());
        }
        self.report(&cm.name_any(), &outcome);
        let serving = matches!(outcome, Outcome::Loaded { .. } | Outcome::Unchanged);
        let (warning, reason, note) = match &outcome {
            Outcome::Loaded { engine, id, replaced: Some(old) } => {
                (false, "PluginLoaded", format!("{id} now serves engine {engine}, replacing {old}"))
            }
            Outcome::Loaded { engine, id, replaced: None } => (false, "PluginLoaded", format!("{id} now serves engine {engine}")),
            Outcome::Rejected(problem) => (true, "PluginRejected", problem.reason.clone()),
            Outcome::Unchanged | Outcome::Unloaded { .. } => return serving,
        };
        let regarding = cm.object_ref(&());
        if let Outcome::Loaded { replaced: None, .. } = &outcome {
            // A plugin first loaded by this process may be one an earlier run (or another
            // replica) already announced, first or as a replacement: an operator that
            // starts again says nothing new.
            match recorder.newest_note(&regarding, reason).await {
                Ok(Some(newest)) if newest.starts_with(&note) => return serving,
                Ok(_) => {}
                Err(e) => tracing::debug!(config_map = %cm.name_any(), error = %e, "could not read earlier plugin events"),
            }
        }
        if let Err(e) = recorder.publish(&regarding, None, warning, reason, &note).await {
            tracing::warn!(config_map = %cm.name_any(), error = %e, "could not record plugin event");
        }
        serving
    }

    fn report(&self, source: &str, outcome: &Outcome) {
        match outcome {
            Outcome::Loaded { engine, id, replaced } => {
                tracing::info!(config_map = source, engine, plugin = id, replaced = replaced.as_deref(), "plugin loaded");
                self.metrics.plugin_load(engine, "loaded");
            }
            Outcome::Unchanged => {}
            Outcome::Rejected(p) => {
                tracing::error!(config_map = source, engine = p.engine.as_deref(), reason = %p.reason, "plugin rejected; any running version keeps serving");
                self.metrics.plugin_load(p.engine.as_deref().unwrap_or(source), "rejected");
            }
            Outcome::Unloaded { engine } => {
                tracing::info!(config_map = source, engine, "plugin unloaded");
                self.metrics.plugin_load(engine, "unloaded");
            }
        }
    }
}
