//! Tier 4: the plugin registry against a real API server. Engines come and go with
//! ConfigMaps while the registry runs; a bad new version never replaces a good one.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use plugdb::metrics::Metrics;
use plugdb::plugin::registry::{DIGEST_ANNOTATION, PLUGIN_LABEL};
use plugdb::plugin::{Limits, Registry, Runtime, Tier, hex_digest};
use plugdb_tests::control_plane::{ControlPlane, Options};

const NS: &str = "plugdb-system";

fn plugin_config_map(name: &str, engine: &str, component: &[u8], gzip: bool, pin: Option<String>) -> ConfigMap {
    let (key, data) = if gzip {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(component).expect("gzip");
        ("plugin.wasm.gz", enc.finish().expect("gzip"))
    } else {
        ("plugin.wasm", component.to_vec())
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([(PLUGIN_LABEL.into(), engine.into())])),
            annotations: pin.map(|d| BTreeMap::from([(DIGEST_ANNOTATION.into(), d)])),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(key.into(), ByteString(data))])),
        ..Default::default()
    }
}

/// Waits until `check` holds. The bound is generous: a compile of a component on a
/// machine busy with the other tiers can take many seconds, and the test is of what
/// ends up serving, not of how fast.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An API server (no controller manager) with the plugin namespace.
async fn control_plane() -> ControlPlane {
    let cp = ControlPlane::start_with(Options { controller_manager: false, ..Default::default() }).await.expect("control plane");
    let namespaces: Api<Namespace> = Api::all(cp.client.clone());
    let ns = Namespace { metadata: ObjectMeta { name: Some(NS.into()), ..Default::default() }, ..Default::default() };
    namespaces.create(&PostParams::default(), &ns).await.expect("namespace");
    cp
}

#[tokio::test]
async fn engines_follow_their_config_maps_while_the_registry_runs() {
    let cp = control_plane().await;

    let metrics = Arc::new(Metrics::default());
    let quick = Runtime::with_tier(Limits::default(), Tier::Quick).expect("runtime");
    let registry = Registry::new(quick, metrics.clone()).with_optimizer(Runtime::new(Limits::default()).expect("runtime"));
    let watch = tokio::spawn(registry.clone().watch(cp.client.clone(), NS.into()));
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);
    let events: Api<Event> = Api::namespaced(cp.client.clone(), NS);

    // A ConfigMap elsewhere, even labelled, is not an engine.
    let other: Api<ConfigMap> = Api::namespaced(cp.client.clone(), "default");
    let mut stray = plugin_config_map("stray", "minimal", &plugdb_tests::component("minimal"), false, None);
    stray.metadata.namespace = Some("default".into());
    other.create(&PostParams::default(), &stray).await.expect("stray ConfigMap");

    // Create: gzip-compressed with a pinned digest → the engine serves.
    let v1 = plugdb_tests::component("minimal");
    cms.create(&PostParams::default(), &plugin_config_map("engine-minimal", "minimal", &v1, true, Some(hex_digest(&v1))))
        .await
        .expect("plugin ConfigMap");
    eventually("minimal@1.0.0 serves", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@1.0.0")).await;
    // Tiered: it serves from the quick build at once, then the optimised build takes over.
    tokio::time::timeout(Duration::from_secs(60), registry.wait_optimized()).await.expect("optimised in time");
    assert!(registry.get("minimal").is_some_and(|p| p.optimized() && p.id() == "minimal@1.0.0"));

    // Update with a new version → it serves, without restarting anything.
    let v2 = plugdb_tests::component("minimal-v2");
    let patch = plugin_config_map("engine-minimal", "minimal", &v2, false, None);
    cms.replace(
        "engine-minimal",
        &PostParams::default(),
        &ConfigMap { metadata: ObjectMeta { resource_version: None, ..patch.metadata.clone() }, ..patch },
    )
    .await
    .expect("update to v2");
    eventually("minimal@2.0.0 serves", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@2.0.0")).await;

    // Update with garbage → v2 keeps serving; the error is visible as a problem, an Event and a metric.
    let garbage = plugin_config_map("engine-minimal", "minimal", b"this is not a component", false, None);
    cms.patch("engine-minimal", &PatchParams::apply("test").force(), &Patch::Apply(&garbage)).await.expect("garbage update");
    eventually("the garbage is reported", || registry.problem("minimal").is_some()).await;
    assert_eq!(registry.get("minimal").map(|p| p.id()).as_deref(), Some("minimal@2.0.0"), "the good version keeps serving");
    let problem = registry.problem("minimal").expect("problem");
    assert!(problem.reason.contains("not a WebAssembly component"), "{problem:?}");
    let mut rejected_event = None;
    for _ in 0..100 {
        let list = events.list(&ListParams::default()).await.expect("events");
        rejected_event = list.items.into_iter().find(|e| e.reason.as_deref() == Some("PluginRejected"));
        if rejected_event.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let event = rejected_event.expect("a PluginRejected Event");
    assert_eq!(event.regarding.and_then(|r| r.name).as_deref(), Some("engine-minimal"));
    assert!(event.note.unwrap_or_default().contains("not a WebAssembly component"));
    let text = metrics.encode();
    assert!(text.contains(r#"plugdb_plugin_loads_total{engine="minimal",outcome="rejected"} 1"#), "{text}");
    assert!(text.contains(r#"plugdb_plugin_loads_total{engine="minimal",outcome="loaded"} 2"#), "{text}");

    // A wrong pinned digest is refused the same way.
    let mut pinned = plugin_config_map("engine-minimal", "minimal", &v1, false, Some("00".repeat(32)));
    pinned.metadata.resource_version = None;
    cms.patch("engine-minimal", &PatchParams::apply("test").force(), &Patch::Apply(&pinned)).await.expect("mis-pinned update");
    eventually("the digest mismatch is reported", || registry.problem("minimal").is_some_and(|p| p.reason.contains("pins"))).await;
    assert_eq!(registry.get("minimal").map(|p| p.id()).as_deref(), Some("minimal@2.0.0"));

    // Delete → the engine is gone.
    cms.delete("engine-minimal", &DeleteParams::default()).await.expect("delete");
    eventually("minimal is unloaded", || registry.get("minimal").is_none()).await;
    assert!(registry.problem("minimal").is_none(), "problems of a deleted ConfigMap are forgotten");
    assert_eq!(registry.engines(), Vec::<(String, String)>::new(), "the stray ConfigMap in another namespace was never loaded");
    watch.abort();
}

/// Two ConfigMaps claiming one engine: the one whose name sorts first serves, whatever
/// the order they came in and across a restart; when it goes, the other takes over
/// with no restart.
#[tokio::test]
async fn of_two_config_maps_for_one_engine_the_first_by_name_serves_and_the_other_takes_over() {
    let cp = control_plane().await;
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);
    let start = || {
        let registry = Registry::new(Runtime::with_tier(Limits::default(), Tier::Quick).expect("runtime"), Arc::new(Metrics::default()));
        (registry.clone(), tokio::spawn(registry.watch(cp.client.clone(), NS.into())))
    };
    let (registry, watch) = start();

    // The later name arrives first and serves until the earlier name arrives.
    let (v1, v2) = (plugdb_tests::component("minimal"), plugdb_tests::component("minimal-v2"));
    cms.create(&PostParams::default(), &plugin_config_map("minimal-b", "minimal", &v2, false, None)).await.expect("b");
    eventually("minimal-b serves", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@2.0.0")).await;
    cms.create(&PostParams::default(), &plugin_config_map("minimal-a", "minimal", &v1, false, None)).await.expect("a");
    eventually("minimal-a, first by name, serves", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@1.0.0")).await;
    let problem = registry.problem("minimal").expect("minimal-b stands by");
    assert_eq!(problem.config_map, "minimal-b");
    assert!(problem.reason.contains("\"minimal-a\", whose name sorts first"), "{problem:?}");
    eventually("a plugin standing by keeps its bytes, not a compiled build", || registry.builds_held() == 1).await;

    // A restart lists them in whatever order: the same one serves.
    watch.abort();
    let (registry, watch) = start();
    tokio::time::timeout(Duration::from_secs(90), registry.synced()).await.expect("synced");
    assert_eq!(registry.get("minimal").map(|p| p.id()).as_deref(), Some("minimal@1.0.0"));

    // The serving one goes: the one standing by serves at once.
    cms.delete("minimal-a", &DeleteParams::default()).await.expect("delete a");
    eventually("minimal-b takes over", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@2.0.0")).await;
    assert!(registry.problem("minimal").is_none(), "{:?}", registry.problem("minimal"));
    eventually("the removed plugin's build is freed", || registry.builds_held() == 1).await;
    cms.delete("minimal-b", &DeleteParams::default()).await.expect("delete b");
    eventually("minimal is unloaded", || registry.get("minimal").is_none()).await;
    eventually("nothing is held for a ConfigMap that is gone", || registry.builds_held() == 0).await;
    watch.abort();
}

/// Each ConfigMap loads in a lane of its own: a plugin whose compile takes long (a
/// compile bomb within the shape limits) holds up no other, and its compile is
/// stopped at the deadline, in the child process the operator compiles in.
#[tokio::test]
async fn a_slow_compile_holds_up_no_other_config_map() {
    let cp = control_plane().await;
    let limits = Limits { compile_timeout: Duration::from_secs(20), compile_memory: 2 << 30, ..Limits::default() };
    let optimized = Runtime::new(limits).expect("runtime").with_compiler(&plugdb_tests::plugdb_binary());
    let registry = Registry::new(optimized, Arc::new(Metrics::default()));
    let watch = tokio::spawn(registry.clone().watch(cp.client.clone(), NS.into()));
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);

    let bomb = plugdb_tests::bomb::component("branches", &limits.shape);
    cms.create(&PostParams::default(), &plugin_config_map("a-bomb", "bomb", &bomb, true, None)).await.expect("the bomb's ConfigMap");
    eventually("the bomb is compiling", || registry.compiling() == ["a-bomb"]).await;
    let minimal = plugdb_tests::component("minimal");
    cms.create(&PostParams::default(), &plugin_config_map("b-minimal", "minimal", &minimal, false, None))
        .await
        .expect("minimal's ConfigMap");
    eventually("minimal serves", || registry.get("minimal").is_some()).await;
    assert_eq!(registry.compiling(), ["a-bomb"], "minimal loaded while the bomb was still compiling");

    for _ in 0..120 {
        if registry.problem("bomb").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let problem = registry.problem("bomb").expect("the bomb is refused");
    assert!(problem.reason.contains("compiling took longer than 20s; the compiler was stopped"), "{}", problem.reason);
    assert!(registry.compiling().is_empty());
    watch.abort();
}

/// The PluginLoaded Events about `config_map` (by name) in the plugin namespace.
async fn loaded_events(events: &Api<Event>, config_map: &str) -> Vec<Event> {
    let all = events.list(&ListParams::default()).await.expect("events").items;
    all.into_iter()
        .filter(|e| e.reason.as_deref() == Some("PluginLoaded"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(config_map))
        .collect()
}

/// An operator that starts again loads every plugin again, but announces only what is
/// new: a plugin an earlier run already announced gets no second Event, while one whose
/// ConfigMap was made meanwhile does.
#[tokio::test]
async fn a_restarted_registry_announces_only_what_it_had_not_announced() {
    let cp = control_plane().await;
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);
    let events: Api<Event> = Api::namespaced(cp.client.clone(), NS);
    let start = || {
        let registry = Registry::new(Runtime::new(Limits::default()).expect("runtime"), Arc::new(Metrics::default()));
        (registry.clone(), tokio::spawn(registry.watch(cp.client.clone(), NS.into())))
    };
    let minimal = plugdb_tests::component("minimal");
    cms.create(&PostParams::default(), &plugin_config_map("engine-minimal", "minimal", &minimal, false, None)).await.expect("ConfigMap");
    let (first, watch) = start();
    tokio::time::timeout(Duration::from_secs(60), first.synced()).await.expect("first run synced");
    let announced = loaded_events(&events, "engine-minimal").await;
    assert_eq!(announced.len(), 1, "the first run announces the plugin: {announced:?}");
    watch.abort();

    // While no operator runs, a second engine arrives.
    let postgres = plugdb_tests::component("postgres");
    cms.create(&PostParams::default(), &plugin_config_map("engine-postgres", "postgres", &postgres, false, None)).await.expect("ConfigMap");
    let (second, _watch) = start();
    tokio::time::timeout(Duration::from_secs(60), second.synced()).await.expect("second run synced");
    assert!(second.get("minimal").is_some() && second.get("postgres").is_some(), "the restarted registry serves both");
    let again = loaded_events(&events, "engine-minimal").await;
    assert_eq!(again.len(), 1, "no second Event for what was announced: {again:?}");
    assert_eq!(again[0].series, None, "nor a repeat counted on the first");
    let new = loaded_events(&events, "engine-postgres").await;
    assert_eq!(new.len(), 1, "the plugin new to the cluster is announced: {new:?}");
}

/// A storm of updates to one ConfigMap, good and bad builds mixed, 50 in a few
/// seconds: once it settles, the newest build serves when it loads; when the newest is
/// bad, a good build keeps serving and the problem says the ConfigMap's newest version
/// was refused and why, and, unless the build serving is the newest good one, that
/// versions were replaced before they were tried.
#[tokio::test]
async fn after_a_storm_of_updates_the_newest_good_build_serves_or_the_problem_says_why() {
    let cp = control_plane().await;
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);
    let registry = Registry::new(Runtime::with_tier(Limits::default(), Tier::Quick).expect("runtime"), Arc::new(Metrics::default()));
    let watch = tokio::spawn(registry.clone().watch(cp.client.clone(), NS.into()));
    let (v1, v2) = (plugdb_tests::component("minimal"), plugdb_tests::component("minimal-v2"));
    let garbage = b"\0asm not a component at all".to_vec();
    // The storm's last bad build is refused in words of its own (the version field its
    // bytes say): its refusal, not an earlier one's, ends the storm.
    let last_garbage = b"\0asmLAST, not a component either".to_vec();
    let last_refused = format!("{:#x}", u32::from_le_bytes(*b"LAST"));
    cms.create(&PostParams::default(), &plugin_config_map("storm", "minimal", &v1, false, None)).await.expect("storm");
    eventually("minimal serves", || registry.get("minimal").is_some()).await;

    let storm = |last: &[u8]| {
        let mut builds: Vec<Vec<u8>> = (0..49).map(|i| [&v1, &v2, &garbage][i % 3].clone()).collect();
        builds.push(last.to_vec());
        builds
    };
    for (ending, last, id) in [("good", &v2, "minimal@2.0.0"), ("bad", &last_garbage, "")] {
        for build in storm(last) {
            let cm = plugin_config_map("storm", "minimal", &build, false, None);
            cms.patch("storm", &PatchParams::apply("storm").force(), &Patch::Apply(&cm)).await.expect("update");
        }
        match ending {
            "good" => {
                eventually("the newest build serves", || registry.get("minimal").is_some_and(|p| p.id() == id)).await;
                eventually("no problem is left", || registry.problem("minimal").is_none()).await;
            }
            _ => {
                eventually("the newest build's refusal is the problem", || {
                    registry.problem("minimal").is_some_and(|p| p.config_map == "storm" && p.reason.contains(&last_refused))
                })
                .await;
                let serving = registry.get("minimal").expect("a good build keeps serving").id();
                // The newest good build of the storm is its 49th, v1.
                let newest_good = storm(last).into_iter().rev().find(|b| *b != garbage && *b != last_garbage).expect("a good build");
                let newest_good = if newest_good == v1 { "minimal@1.0.0" } else { "minimal@2.0.0" };
                let reason = registry.problem("minimal").map(|p| p.reason).unwrap_or_default();
                assert!(
                    serving == newest_good || reason.contains("replaced by newer ones before they were tried"),
                    "{serving} serves, and the problem does not say the newest good build was never tried: {reason}"
                );
            }
        }
    }
    watch.abort();
}

/// The engines bundled with the operator load at start through the same checks; a
/// ConfigMap for the same engine serves instead while it exists, and a relist (a new
/// term of leading) never unloads a bundled engine.
#[tokio::test]
async fn a_config_map_takes_precedence_over_a_bundled_engine_which_takes_over_when_it_goes() {
    let cp = control_plane().await;
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NS);
    let bundled = tempfile::tempdir().expect("dir");
    std::fs::write(bundled.path().join("minimal.wasm"), plugdb_tests::component("minimal")).expect("bundled minimal");
    std::fs::write(bundled.path().join("broken.wasm"), b"not a component").expect("bundled junk");
    std::fs::write(bundled.path().join("README"), b"not a plugin").expect("another file");
    let registry = Registry::new(Runtime::with_tier(Limits::default(), Tier::Quick).expect("runtime"), Arc::new(Metrics::default()));
    let outcomes = registry.load_bundled(bundled.path()).await.expect("the directory");
    let files: Vec<&str> = outcomes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(files, ["broken.wasm", "minimal.wasm"], "only *.wasm, in name order");
    assert!(matches!(&outcomes[0].1, plugdb::plugin::registry::Outcome::Rejected(_)), "{:?}", outcomes[0]);
    assert_eq!(registry.get("minimal").map(|p| p.id()).as_deref(), Some("minimal@1.0.0"), "bundled, before any ConfigMap");

    let watch = tokio::spawn(registry.clone().watch(cp.client.clone(), NS.into()));
    tokio::time::timeout(Duration::from_secs(90), registry.synced()).await.expect("synced");
    assert_eq!(registry.get("minimal").map(|p| p.id()).as_deref(), Some("minimal@1.0.0"), "a relist keeps the bundled engine");
    let v2 = plugdb_tests::component("minimal-v2");
    cms.create(&PostParams::default(), &plugin_config_map("engine-minimal", "minimal", &v2, false, None)).await.expect("cm");
    eventually("the ConfigMap serves", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@2.0.0")).await;
    cms.delete("engine-minimal", &DeleteParams::default()).await.expect("delete");
    eventually("the bundled engine serves again", || registry.get("minimal").is_some_and(|p| p.id() == "minimal@1.0.0")).await;
    watch.abort();
    let missing = registry.load_bundled(&bundled.path().join("nowhere")).await;
    assert!(missing.is_err(), "a missing directory is said, not ignored");
}
