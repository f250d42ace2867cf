//! Whole passes at unit speed: the reconciler runs one pass over hand-built caches
//! (`Caches::holding`) with the bundled plugins, against a mocked API client that
//! records every request in order (`MockApi`; the fixtures are `plugdb_tests::pass`). No cluster, no root: what a pass
//! decides and writes, request by request, for a table of situations. What the API
//! server and the nodes make of those writes is the real tiers' part.

use std::sync::Arc;

use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::plugin::Registry;
use plugdb::reconcile::cache::Caches;
use plugdb::reconcile::{self, Context};
use plugdb::stamp::STAMP;
use plugdb_tests::mock_api::{Call, MockApi};
use plugdb_tests::operator::test_settings;
use plugdb_tests::pass::{
    Server, backup_job, database, lines, made, pass, pass_over, passes_over, registry, registry_of, running, serving, status, written,
};
use serde_json::{Value, json};

const DATABASES: &str = "/apis/plugdb.io/v1alpha1/namespaces/shop/databases/orders";

/// The children a new Database's first pass makes, in order, each by a create.
const CHILDREN: [&str; 8] = [
    "POST /api/v1/namespaces/shop/configmaps",
    "POST /api/v1/namespaces/shop/services",
    "POST /api/v1/namespaces/shop/services",
    "POST /api/v1/namespaces/shop/services",
    "POST /apis/apps/v1/namespaces/shop/statefulsets",
    "POST /apis/policy/v1/namespaces/shop/poddisruptionbudgets",
    "POST /apis/policy/v1/namespaces/shop/poddisruptionbudgets",
    "POST /apis/networking.k8s.io/v1/namespaces/shop/networkpolicies",
];

#[tokio::test]
async fn a_new_databases_first_pass_makes_its_children_and_a_second_writes_nothing() {
    let registry = registry().await;
    let db = database(json!({"replicas": 3}));
    let (calls, api) = pass(&registry, &db, &[]).await;
    // The finalizer first: a final backup (the default policy, Snapshot) is owed from
    // now. Credentials and the application's login, then the children, each made by a
    // create (nothing had the name).
    let secrets = "POST /api/v1/namespaces/shop/secrets";
    let mut expected = vec![format!("PATCH {DATABASES}"), secrets.into(), secrets.into()];
    expected.extend(CHILDREN.map(str::to_string));
    // This operator knows no image of its own: a Warning says the members run no agent.
    expected.push("POST /apis/events.k8s.io/v1/namespaces/shop/events".into());
    // The status last, once.
    expected.push(format!("PATCH {DATABASES}/status"));
    assert_eq!(lines(&calls), expected);
    assert_eq!((&calls[11].body["reason"], &calls[11].body["type"]), (&json!("NoOperatorImage"), &json!("Warning")));
    let made = written(&calls);
    application_login_is_the_credentials_key(&made);
    for object in &made {
        let (name, controller) = (&object["metadata"]["name"], &object["metadata"]["ownerReferences"][0]);
        if name == "orders-credentials" || name == "orders-app" {
            // Kept after the Database unless its policy is Delete: labelled, not owned.
            assert_eq!((controller, &object["metadata"]["labels"]["app.kubernetes.io/instance"]), (&Value::Null, &json!("orders")));
        } else {
            assert_eq!((&controller["uid"], &controller["controller"]), (&json!("db-uid"), &json!(true)), "{name}");
        }
    }
    let set = made.iter().find(|o| o["kind"] == "StatefulSet").expect("the StatefulSet");
    assert_eq!(set["spec"]["replicas"], 3);
    let status = status(&api);
    assert_eq!(status.phase, Some(plugdb::crd::Phase::Creating));
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    let agents = status.conditions.iter().find(|c| c.type_ == "MemberAgents").expect("MemberAgents");
    assert_eq!((agents.status.as_str(), agents.reason.as_str()), ("False", "NoOperatorImage"));
    assert!(agents.message.contains("no failover, fence or switchover happens"), "{}", agents.message);
    assert!(api.database().metadata.finalizers.iter().flatten().any(|f| f == reconcile::FINALIZER));

    // The same pass over what the first one made, as the caches now hold it: nothing to write.
    let (again, _) = pass(&registry, &api.database(), &made).await;
    assert_eq!(lines(&again), Vec::<String>::new(), "a pass over an unchanged cluster writes nothing");
}

/// The application's login (Secret `orders-app`) is user `app` of database `app` at the
/// read-write Service, with the password the credentials Secret holds for it: not the
/// superuser's.
fn application_login_is_the_credentials_key(made: &[Value]) {
    let secret = |name: &str| made.iter().find(|o| o["metadata"]["name"] == name && o["kind"] == "Secret").expect(name).clone();
    let (credentials, login) = (secret("orders-credentials"), secret("orders-app"));
    let key = |s: &Value, k: &str| -> String {
        let bytes: k8s_openapi::ByteString = serde_json::from_value(s["data"][k].clone()).expect(k);
        String::from_utf8(bytes.0).expect("text")
    };
    let password = key(&credentials, "app-password");
    assert_ne!(password, key(&credentials, "superuser-password"));
    let text = &login["stringData"];
    assert_eq!(text["username"], "app");
    assert_eq!(text["password"], password.as_str());
    assert_eq!(text["dbname"], "app");
    assert_eq!(text["host"], "orders.shop.svc");
    assert_eq!(text["port"], "5432");
    assert_eq!(text["uri"], format!("postgresql://app:{password}@orders.shop.svc:5432/app"));
}

/// A Database made before its plugin named an application login: its credentials Secret
/// gains the key (added, nothing replaced), and the login is made with the value added.
#[tokio::test]
async fn a_database_made_before_the_application_login_gains_it_without_losing_a_password() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3})).await;
    let mut objects: Vec<Value> = made.iter().filter(|o| o["metadata"]["name"] != "orders-app").cloned().collect();
    let credentials = objects.iter_mut().find(|o| o["metadata"]["name"] == "orders-credentials").expect("credentials");
    credentials["data"].as_object_mut().expect("data").remove("app-password");
    credentials["metadata"]["resourceVersion"] = json!("7");
    // As an older plugdb made it, stamped when the operator upgraded ([`plugdb::stamp::Upgrade`]).
    *credentials = stamped(credentials);
    let credentials = credentials.clone();
    let served = [("/api/v1/namespaces/shop/secrets/orders-credentials".to_string(), credentials.clone())];
    let (result, calls, _) = pass_over(&registry, &db, &objects, &serving(&served)).await;
    result.expect("the pass");
    let secrets: Vec<&Call> = calls.iter().filter(|c| c.path.contains("/secrets")).collect();
    let lines: Vec<String> = secrets.iter().map(|c| c.line()).collect();
    assert_eq!(
        lines,
        [
            "GET /api/v1/namespaces/shop/secrets/orders-credentials",
            "PATCH /api/v1/namespaces/shop/secrets/orders-credentials",
            "POST /api/v1/namespaces/shop/secrets"
        ]
    );
    let added = &secrets[1].body["data"];
    assert_eq!(added.as_object().map(|o| o.keys().collect::<Vec<_>>()), Some(vec![&"app-password".to_string()]), "{added}");
    let mut after = credentials.clone();
    after["data"]["app-password"] = added["app-password"].clone();
    // The patch carries the stamp of the Secret as it is once patched.
    after["metadata"]["annotations"][STAMP] = secrets[1].body["metadata"]["annotations"][STAMP].clone();
    let mut patched: k8s_openapi::api::core::v1::Secret = serde_json::from_value(after.clone()).expect("a Secret");
    reconcile::fresh_stamper().judge(&mut patched);
    assert!(plugdb::stamp::held(&patched.metadata), "the credentials' stamp holds once the key is added");
    application_login_is_the_credentials_key(&[after, secrets[2].body.clone()]);
}

/// `secret` (a Secret as the API server serves it) stamped by this process's operator.
fn stamped(secret: &Value) -> Value {
    let stamped = reconcile::fresh_stamper().stamped(serde_json::from_value(secret.clone()).expect("a Secret"));
    let mut value = secret.clone();
    value["metadata"]["annotations"] = json!(stamped.metadata.annotations);
    value
}

/// Kept credentials (labelled for the Database, no controller) are its own only with
/// plugdb's stamp: a Secret made with plugdb's labels by anyone else, or changed since,
/// stops the pass before anything mounts it, named in the status; one plugdb stamped is
/// taken as the Database's.
#[tokio::test]
async fn kept_credentials_are_taken_only_with_plugdbs_stamp() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3})).await;
    let credentials = made.iter().find(|o| o["metadata"]["name"] == "orders-credentials").expect("credentials").clone();
    assert_eq!(credentials["metadata"]["ownerReferences"][0], Value::Null, "kept: no controller");
    let mut forged = credentials.clone();
    forged["metadata"]["annotations"] = json!({});
    let mut changed = credentials.clone();
    changed["data"]["password"] = json!("Y2hvc2Vu");
    for (what, secret) in [("labelled, unstamped", forged), ("stamped, a value changed since", changed)] {
        let objects: Vec<Value> =
            made.iter().map(|o| if o["metadata"]["name"] == "orders-credentials" { secret.clone() } else { o.clone() }).collect();
        // The API server holds it: the operator's create of its own is refused.
        let served = [("/api/v1/namespaces/shop/secrets/orders-credentials".to_string(), secret)];
        let (result, calls, api) = pass_over(&registry, &db, &objects, &serving(&served)).await;
        let error = result.expect_err(what).to_string();
        assert!(error.contains("Secret shop/orders-credentials") && error.contains("not plugdb's stamp"), "{what}: {error}");
        assert!(!calls.iter().any(|c| c.path.contains("/statefulsets")), "{what}: nothing mounts it: {:?}", lines(&calls));
        let status = status(&api);
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NameTaken"), "{what}");
    }
    let (result, calls, _) = pass_over(&registry, &db, &made, &Server::default()).await;
    result.expect("plugdb's own kept credentials are the Database's");
    assert!(!calls.iter().any(|c| c.path.contains("/secrets")), "taken as they are: {:?}", lines(&calls));
}

#[tokio::test]
async fn members_that_run_make_the_database_ready_and_then_nothing_is_written() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3})).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    assert_eq!(lines(&calls), [format!("PATCH {DATABASES}/status")], "the status only");
    let status = status(&api);
    assert_eq!(status.phase, Some(plugdb::crd::Phase::Running));
    assert_eq!(status.members.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(), ["orders-0", "orders-1", "orders-2"]);
    let (again, _) = pass(&registry, &api.database(), &cluster).await;
    assert_eq!(lines(&again), Vec::<String>::new(), "a steady Database's pass writes nothing");
}

/// A Database of three members that became Ready at revision `r1`: the Database as
/// its passes left it, and the cluster (`running`).
async fn steady(registry: &Registry) -> (Database, Vec<Value>) {
    let (db, made) = made(registry, json!({"replicas": 3})).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (_, api) = pass(registry, &db, &cluster).await;
    (api.database(), made)
}

/// More memory for the members: the plugin's memory settings follow, and the members roll
/// onto them (the configuration's hash is on their template).
#[tokio::test]
async fn more_memory_renders_larger_settings_and_rolls_the_members() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3, "resources": {"limits": {"memory": "1Gi"}}})).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (_, api) = pass(&registry, &db, &cluster).await;
    let mut db = api.database();
    let mut spec = serde_json::to_value(&db.spec).expect("the spec");
    spec["resources"]["limits"]["memory"] = json!("2Gi");
    db.spec = serde_json::from_value(spec).expect("a spec");
    db.metadata.generation = Some(2);
    let (calls, _) = pass(&registry, &db, &cluster).await;
    let config = calls.iter().find(|c| c.path.ends_with("/configmaps/orders-config")).expect("the configuration applied");
    let conf = config.body["data"]["postgresql.conf"].as_str().unwrap_or_default();
    assert!(conf.contains("shared_buffers = '512MB'") && conf.contains("effective_cache_size = '1536MB'"), "{conf}");
    let set = calls.iter().find(|c| c.path.ends_with("/statefulsets/orders")).expect("the members' template applied");
    let hash = |object: &Value| object["spec"]["template"]["metadata"]["annotations"]["plugdb.io/config-hash"].clone();
    let before = made.iter().find(|o| o["kind"] == "StatefulSet").map(hash).expect("the StatefulSet made");
    assert_ne!(hash(&set.body), before, "the members roll onto the new configuration");
}

/// A replica whose agent has said for two minutes that it streams nothing, its pod ready
/// all along, is taken as down: named in `Degraded` with why, and restarted (made again)
/// with a Warning saying why.
#[tokio::test]
async fn a_replica_that_streams_nothing_is_named_and_made_again() {
    let registry = registry().await;
    let (mut db, made) = steady(&registry).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let two_minutes_ago = (chrono::Utc::now() - chrono::Duration::minutes(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let before = db.status.as_mut().expect("a status");
    let said = before.members.iter_mut().find(|m| m.pod == "orders-1").expect("orders-1");
    (said.position, said.lag, said.heard) = (Some("0/3000148".into()), None, Some(two_minutes_ago));
    let leads = before.members.iter_mut().find(|m| m.pod == "orders-0").expect("orders-0");
    leads.position = Some("0/3000200".into());
    let (calls, api) = pass(&registry, &db, &cluster).await;
    assert!(lines(&calls).contains(&"DELETE /api/v1/namespaces/shop/pods/orders-1".to_string()), "{:?}", lines(&calls));
    let why = "ready, but it has not replicated from orders-0 for 1";
    let warned = calls.iter().any(|c| {
        c.body["reason"] == "MemberRestarted"
            && c.body["type"] == "Warning"
            && c.body["note"].as_str().is_some_and(|n| n.starts_with(&format!("restarted orders-1 to make it again: {why}")))
    });
    assert!(warned, "{:?}", calls.iter().map(|c| &c.body["note"]).collect::<Vec<_>>());
    let status = status(&api);
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").expect("Degraded");
    assert_eq!(degraded.status, "True");
    assert!(degraded.message.starts_with(&format!("2/3 members ready; orders-1: {why}")), "{}", degraded.message);
    assert!(status.members.iter().any(|m| m.pod == "orders-1" && !m.ready), "{:?}", status.members);
}

#[tokio::test]
async fn a_scale_up_applies_the_new_count_and_says_it_is_progressing() {
    let registry = registry().await;
    let (mut db, made) = steady(&registry).await;
    db.spec.replicas = 5;
    db.metadata.generation = Some(2);
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let expected = [
        "PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
        // The disruption budget follows the count: a majority stays.
        "PATCH /apis/policy/v1/namespaces/shop/poddisruptionbudgets/orders".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert!(calls[..2].iter().all(Call::is_apply), "children change by server-side apply");
    assert_eq!(calls[0].body["spec"]["replicas"], 5);
    let status = status(&api);
    let progressing = status.conditions.iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert_eq!((progressing.status.as_str(), progressing.observed_generation), ("True", Some(2)));
}

#[tokio::test]
async fn a_change_that_keeps_the_members_template_keeps_the_database_ready_and_one_that_does_not_is_updating() {
    let registry = registry().await;
    let (mut db, made) = steady(&registry).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    // Another deletion policy: claims kept otherwise, and the members' template as it was.
    db.spec.deletion_policy = plugdb::crd::DeletionPolicy::Delete;
    db.metadata.generation = Some(2);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    assert!(lines(&calls).contains(&"PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string()), "{:?}", lines(&calls));
    let said = status(&api);
    let ready = said.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!((said.phase, ready.status.as_str()), (Some(plugdb::crd::Phase::Running), "True"), "{}", ready.message);
    // Another parameter: a new template, which no member runs yet.
    db.spec.parameters = serde_json::from_value(json!({"max_connections": 150})).expect("parameters");
    let (_, api) = pass(&registry, &db, &cluster).await;
    let said = status(&api);
    let ready = said.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!((said.phase, ready.status.as_str()), (Some(plugdb::crd::Phase::Updating), "False"));
    assert_eq!(ready.message, "3/3 members ready; not all run the current spec yet");
}

#[tokio::test]
async fn a_roll_restarts_one_replica_at_a_time_the_highest_first() {
    let registry = registry().await;
    let (db, made) = steady(&registry).await;
    // The StatefulSet's template changed: its members are to run revision r2.
    let cluster = running(&made, "r2", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let expected = [
        "DELETE /api/v1/namespaces/shop/pods/orders-2".to_string(),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["reason"], "MemberRestarted");
    assert!(status(&api).conditions.iter().any(|c| c.type_ == "Progressing" && c.status == "True"));
    // The next pass, the restarted member back and Ready at r2: the next replica.
    let cluster = running(&made, "r2", &[(true, "r1"), (true, "r1"), (true, "r2")]);
    let (calls, _) = pass(&registry, &api.database(), &cluster).await;
    assert_eq!(calls[0].line(), "DELETE /api/v1/namespaces/shop/pods/orders-1");
    // The primary last.
    let cluster = running(&made, "r2", &[(true, "r1"), (true, "r2"), (true, "r2")]);
    let (calls, _) = pass(&registry, &api.database(), &cluster).await;
    assert_eq!(calls[0].line(), "DELETE /api/v1/namespaces/shop/pods/orders-0");
}

#[tokio::test]
async fn a_primary_lost_with_no_replica_position_known_is_not_replaced_and_the_database_is_degraded() {
    let registry = registry().await;
    let (db, made) = steady(&registry).await;
    // Without the operator's image there is no member agent to say where each replica
    // has replayed to: no member is known to be safe to promote.
    let cluster = running(&made, "r1", &[(false, "r1"), (true, "r1"), (true, "r1")]);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let expected = [
        // The lost member's node, to say whether the node is lost too.
        "GET /api/v1/nodes/node-0".to_string(),
        // The agents' credentials, to ask them (there are none).
        "GET /api/v1/namespaces/shop/secrets/orders-agent".into(),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[2].body["reason"], "NoSafeFailover");
    let status = status(&api);
    assert_eq!((status.phase, status.primary.as_deref()), (Some(plugdb::crd::Phase::Degraded), Some("orders-0")));
    // Nothing of the members changed: no pod deleted, relabelled or re-rendered.
    assert!(calls.iter().all(|c| c.method != "DELETE" && !c.path.contains("/pods/") && !c.path.contains("statefulsets")));
}

#[tokio::test]
async fn a_backup_asked_for_starts_one_job_and_retention_deletes_the_oldest_beyond_the_count() {
    let registry = registry().await;
    let backup = json!({"backup": {"schedule": "0 2 * * *", "retention": 2, "storage": "1Gi"}});
    let (mut db, made) = made(&registry, backup).await;
    let mut cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    cluster.extend([
        backup_job("orders-2611260200", Some("2026-11-26T02:01:00Z")),
        backup_job("orders-2611270200", Some("2026-11-27T02:01:00Z")),
        backup_job("orders-2611280200", Some("2026-11-28T02:01:00Z")),
    ]);
    db.metadata.annotations = Some([("plugdb.io/backup-now".to_string(), "now-1".to_string())].into());
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let manual = plugdb::reconcile::decide::manual_backup("orders", "now-1");
    let expected = [
        // The backup volume, made with the first backup Job.
        "POST /api/v1/namespaces/shop/persistentvolumeclaims".to_string(),
        "POST /apis/batch/v1/namespaces/shop/jobs".into(),
        // The newest two successful backups stay.
        "DELETE /apis/batch/v1/namespaces/shop/jobs/orders-2611260200".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["metadata"]["name"], manual.as_str());
    assert_eq!(calls[2].body["propagationPolicy"], "Background", "the Job's pods go with it");
    let status = status(&api);
    assert_eq!(status.backup_request.as_deref(), Some("now-1"), "the request is acted on once");
    assert_eq!(status.last_backup.map(|b| b.name).as_deref(), Some("orders-2611280200"));
    // The same request seen again (the Job made, the status written): nothing more.
    cluster.extend(written(&calls));
    let (again, _) = pass(&registry, &api.database(), &cluster).await;
    assert!(again.iter().all(|c| c.method != "POST"), "{:?}", lines(&again));
}

#[tokio::test]
async fn a_scheduled_backup_due_starts_its_job_once() {
    let registry = registry().await;
    let backup = json!({"backup": {"schedule": "* * * * *", "storage": "1Gi"}});
    let (mut db, made) = made(&registry, backup).await;
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    db.metadata.creation_timestamp = serde_json::from_value(json!(an_hour_ago)).expect("a time");
    let mut cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let expected = [
        "POST /api/v1/namespaces/shop/persistentvolumeclaims".to_string(),
        "POST /apis/batch/v1/namespaces/shop/jobs".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    let status = status(&api);
    let due = status.last_scheduled_backup.expect("the backup started is remembered");
    assert_eq!(calls[1].body["metadata"]["name"], due.as_str());
    assert_eq!(calls[1].body["metadata"]["labels"]["plugdb.io/backup-of"], "orders");
    assert!(status.next_backup.is_some());
    // The next pass: that fire time is remembered, its backup is not started again (a
    // minute later the next one is due).
    cluster.extend(written(&calls));
    let (again, _) = pass(&registry, &api.database(), &cluster).await;
    assert!(again.iter().all(|c| c.body["metadata"]["name"] != due.as_str()), "{:?}", lines(&again));
}

#[tokio::test]
async fn a_users_object_with_a_childs_name_is_left_alone_and_the_pass_stops_saying_so() {
    let registry = registry().await;
    // The user's own Service, named as the Database's read-write Service would be.
    let theirs = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "their-uid", "labels": {"app": "theirs"}},
        "spec": {"ports": [{"port": 80}]},
    });
    let served = [("/api/v1/namespaces/shop/services/orders".to_string(), theirs)];
    let db = database(json!({"replicas": 3}));
    let (result, calls, api) = pass_over(&registry, &db, &[], &serving(&served)).await;
    assert!(matches!(result, Err(reconcile::Error::Taken(_))), "{result:?}");
    let touched: Vec<&Call> = calls.iter().filter(|c| c.path.ends_with("/services/orders") && c.method != "GET").collect();
    assert!(touched.is_empty(), "the user's Service is not written: {:?}", lines(&calls));
    let status = status(&api);
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NameTaken"));
    assert!(ready.message.contains("orders"), "{}", ready.message);
    assert!(calls.iter().any(|c| c.body["reason"] == "NameTaken"), "a Warning Event says it: {:?}", lines(&calls));
}

/// A bucket endpoint the tenant points at the node's own loopback (where an API server or
/// a kubelet may listen) is refused before anything is sent there: the condition says so,
/// and no listing reaches it.
#[tokio::test]
async fn a_bucket_endpoint_at_the_clusters_own_addresses_is_refused_unasked() {
    let registry = registry().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.set_nonblocking(true).expect("nonblocking");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let s3 = json!({"endpoint": endpoint, "bucket": "b", "credentials": {"secretName": "s3"}});
    let (db, made) = made(&registry, json!({"replicas": 3, "backup": {"schedule": "0 2 * * *", "s3": s3}})).await;
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s3", "namespace": "shop"},
        "data": {"accessKeyId": "aWQ=", "secretAccessKey": "a2V5"},
    });
    let served = [("/api/v1/namespaces/shop/secrets/s3".to_string(), secret)];
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &serving(&served)).await;
    assert!(result.is_ok(), "{result:?}: {:?}", lines(&calls));
    let status = status(&api);
    let backups = status.conditions.iter().find(|c| c.type_ == "BackupHealthy").expect("BackupHealthy");
    assert_eq!(backups.status, "False", "{backups:?}");
    assert!(backups.message.contains("spec.backup.s3.endpoint") && backups.message.contains("127.0.0.0/8"), "{}", backups.message);
    assert!(listener.accept().is_err(), "nothing connected to the endpoint");
}

#[tokio::test]
async fn a_replica_on_a_node_lost_past_the_users_delay_is_moved() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3, "spread": {"moveFromLostNodeAfter": "5m"}})).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (false, "r1")]);
    let (_, api) = pass(&registry, &db, &running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")])).await;
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data-orders-2", "namespace": "shop", "uid": "claim-2",
            "labels": {"app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "plugdb"},
            "ownerReferences": [{"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "name": "orders", "uid": "db-uid", "controller": true}],
        },
        "spec": {"resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
    });
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let lost = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-2"},
        "status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.", "lastTransitionTime": an_hour_ago,
        }]},
    });
    let served = [("/api/v1/nodes/node-2".to_string(), lost)];
    let mut objects = cluster.clone();
    objects.push(claim);
    let (result, calls, api) = pass_over(&registry, &api.database(), &objects, &serving(&served)).await;
    result.expect("the pass");
    let expected = [
        // The down member's node, read once.
        "GET /api/v1/nodes/node-2".to_string(),
        // Its volume (only while it is still the one the cache saw), then the pod at once.
        "DELETE /api/v1/namespaces/shop/persistentvolumeclaims/data-orders-2".into(),
        "DELETE /api/v1/namespaces/shop/pods/orders-2".into(),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["preconditions"]["uid"], "claim-2");
    assert_eq!(calls[2].body["gracePeriodSeconds"], 0);
    assert_eq!(calls[3].body["reason"], "MemberMoved");
    let member = status(&api).members.into_iter().find(|m| m.pod == "orders-2").expect("orders-2 in the status");
    assert!(format!("{member:?}").contains("node-2"), "{member:?}");
    // The primary is never moved.
    let primary_down = running(&made, "r1", &[(false, "r1"), (true, "r1"), (true, "r1")]);
    let served = [("/api/v1/nodes/node-0".to_string(), served[0].1.clone())];
    let (_, calls, _) = pass_over(&registry, &api.database(), &primary_down, &serving(&served)).await;
    assert!(calls.iter().all(|c| c.method != "DELETE"), "{:?}", lines(&calls));
}

/// `db` being deleted, under `policy`.
fn deleted(mut db: Database, policy: &str) -> Database {
    db.spec.deletion_policy = serde_json::from_value(json!(policy)).expect("a policy");
    db.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    db
}

#[tokio::test]
async fn deletion_follows_the_policy() {
    let registry = registry().await;
    let (db, made) = steady(&registry).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let finalizers = |call: &Call| call.body["metadata"]["finalizers"].clone();

    // Retain and Delete: the finalizer goes at once; the API server's garbage collector
    // removes what the owner references say.
    for policy in ["Retain", "Delete"] {
        let (calls, _) = pass(&registry, &deleted(db.clone(), policy), &cluster).await;
        assert_eq!(lines(&calls), [format!("PATCH {DATABASES}")], "{policy}");
        assert_eq!(finalizers(&calls[0]), json!([]), "{policy}");
    }

    // Snapshot: a final backup Job first (unless its namespace is going), the Database
    // kept meanwhile.
    let (calls, api) = pass(&registry, &deleted(db.clone(), "Snapshot"), &cluster).await;
    let expected = [
        "GET /api/v1/namespaces/shop".to_string(),
        "POST /api/v1/namespaces/shop/persistentvolumeclaims".into(),
        "POST /apis/batch/v1/namespaces/shop/jobs".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[2].body["metadata"]["name"], "orders-final");
    assert_eq!(status(&api).phase, Some(plugdb::crd::Phase::Deleting));
    // Once it succeeded, the finalizer goes.
    let mut with_final = cluster.clone();
    with_final.push(backup_job("orders-final", Some("2026-11-29T00:00:00Z")));
    let (calls, _) = pass(&registry, &api.database(), &with_final).await;
    let expected = [
        "GET /api/v1/namespaces/shop".to_string(),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["reason"], "FinalBackupTaken");
    assert_eq!(finalizers(&calls[2]), json!([]));
}

/// `objects` with each of `newer` in place of the one of its kind and name.
fn replaced(objects: &[Value], newer: &[Value]) -> Vec<Value> {
    let key = |o: &Value| (o["kind"].clone(), o["metadata"]["name"].clone());
    let mut out: Vec<Value> = objects.iter().filter(|o| !newer.iter().any(|n| key(n) == key(o))).cloned().collect();
    out.extend(newer.iter().cloned());
    out
}

#[tokio::test]
async fn a_minor_upgrade_rolls_the_members_onto_the_new_version_then_completes() {
    let registry = registry().await;
    let (db, made) = made(&registry, json!({"replicas": 3, "version": "17.2"})).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (_, api) = pass(&registry, &db, &cluster).await;
    let mut db = api.database();
    db.spec.version = "17.5".into();
    db.metadata.generation = Some(2);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    let expected = [
        "PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
        // Events after the writes they tell of, the status last.
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["reason"], "UpgradeStarted");
    let image = calls[0].body["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
    assert!(image.ends_with(":17.5"), "{image}");
    let rolling = status(&api);
    assert_eq!(rolling.phase, Some(plugdb::crd::Phase::Updating));
    let upgrade = rolling.upgrade.expect("the upgrade's progress");
    assert_eq!((upgrade.from.as_str(), upgrade.to.as_str(), upgrade.step), ("17.2", "17.5", 0));
    assert_eq!(rolling.current_version.as_deref(), Some("17.2"), "the members run 17.2 until the roll is done");

    // Every member rolled onto the new revision: the upgrade is done.
    let cluster = running(&replaced(&made, &written(&calls)), "r2", &[(true, "r2"), (true, "r2"), (true, "r2")]);
    let (calls, api) = pass(&registry, &api.database(), &cluster).await;
    assert_eq!(lines(&calls), ["POST /apis/events.k8s.io/v1/namespaces/shop/events".to_string(), format!("PATCH {DATABASES}/status")]);
    assert_eq!(calls[0].body["reason"], "UpgradeCompleted");
    let done = status(&api);
    assert_eq!((done.current_version.as_deref(), done.upgrade, done.phase), (Some("17.5"), None, Some(plugdb::crd::Phase::Running)));
}

#[tokio::test]
async fn an_upgrade_of_a_database_with_backups_takes_one_first_at_the_running_version() {
    let registry = registry().await;
    let spec = json!({"replicas": 3, "version": "17.2", "backup": {"schedule": "0 2 * * *", "storage": "1Gi"}});
    let (db, made) = made(&registry, spec).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (_, api) = pass(&registry, &db, &cluster).await;
    let mut db = api.database();
    db.spec.version = "17.5".into();
    db.metadata.generation = Some(2);
    let (calls, _) = pass(&registry, &db, &cluster).await;
    let expected = [
        "POST /api/v1/namespaces/shop/persistentvolumeclaims".to_string(),
        "POST /apis/batch/v1/namespaces/shop/jobs".into(),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected, "no member is rendered at the new version before the backup");
    assert_eq!(calls[2].body["reason"], "UpgradeStarted");
    let job = &calls[1].body;
    assert_eq!(job["metadata"]["annotations"]["plugdb.io/backup"], job["metadata"]["name"]);
    let image = job["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap_or_default();
    assert!(image.ends_with(":17.2"), "taken by the running version: {image}");
}

#[tokio::test]
async fn a_restore_fills_the_first_members_volume_before_any_member_starts() {
    let registry = registry().await;
    let db = database(json!({"replicas": 2, "restoreFrom": {"database": "old", "backup": "old-2611280200"}}));
    let (calls, api) = pass(&registry, &db, &[]).await;
    let expected = [
        format!("PATCH {DATABASES}"),
        "POST /api/v1/namespaces/shop/secrets".into(),
        "POST /api/v1/namespaces/shop/secrets".into(),
        "POST /api/v1/namespaces/shop/persistentvolumeclaims".into(),
        "POST /apis/batch/v1/namespaces/shop/jobs".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected, "no StatefulSet: members wait for their data");
    assert_eq!(calls[3].body["metadata"]["name"], "data-orders-0");
    assert_eq!(calls[4].body["metadata"]["annotations"]["plugdb.io/backup"], "old-2611280200");
    assert_eq!(status(&api).phase, Some(plugdb::crd::Phase::Restoring));
}

#[tokio::test]
async fn tls_and_agent_certificates_come_from_one_authority_before_anything_mounts_them() {
    let registry = registry().await;
    let db = database(json!({"replicas": 3, "tls": {"enabled": true}}));
    // With the operator's image, members get an agent: its certificates too.
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let (result, calls, api) = pass_over(&registry, &db, &[], &server).await;
    result.expect("the pass");
    let expected = [
        // Read by the observe stage (the cache may be behind): the certificates, then the
        // authority that is to issue them. Nothing is written yet.
        "GET /api/v1/namespaces/shop/secrets/orders-tls".to_string(),
        "GET /api/v1/namespaces/shop/secrets/orders-agent".into(),
        "GET /api/v1/namespaces/shop/secrets/orders-ca".into(),
        format!("PATCH {DATABASES}"),
        // The Secrets, before anything that mounts them: credentials, the application's, the authority
        // (made once), the TLS and the agents' certificates it issued.
        "POST /api/v1/namespaces/shop/secrets".into(),
        "POST /api/v1/namespaces/shop/secrets".into(),
        "POST /api/v1/namespaces/shop/secrets".into(),
        "PATCH /api/v1/namespaces/shop/secrets/orders-tls".into(),
        "PATCH /api/v1/namespaces/shop/secrets/orders-agent".into(),
    ];
    let mut expected = expected.to_vec();
    expected.extend(CHILDREN.map(str::to_string));
    expected.push(format!("PATCH {DATABASES}/status"));
    assert_eq!(lines(&calls), expected, "no Warning: the members run their agent");
    assert!(status(&api).conditions.iter().all(|c| c.type_ != "MemberAgents"));
    let made = written(&calls);
    let named = |name: &str| made.iter().find(|o| o["metadata"]["name"] == name && o["kind"] == "Secret").expect(name).clone();
    let (authority, certificate, agents) = (named("orders-ca"), named("orders-tls"), named("orders-agent"));
    assert!(authority["data"]["ca.crt"].is_string(), "{authority}");
    for issued in [&certificate, &agents] {
        assert_eq!(issued["data"]["ca.crt"], authority["data"]["ca.crt"], "issued by the authority made: {}", issued["metadata"]["name"]);
    }
    // The certificate's expiry is on the members' template: a renewal rolls them.
    let set = made.iter().find(|o| o["kind"] == "StatefulSet").expect("the StatefulSet");
    let stamp = &certificate["metadata"]["annotations"]["plugdb.io/not-after"];
    assert!(stamp.is_string(), "{certificate}");
    assert_eq!(&set["spec"]["template"]["metadata"]["annotations"]["plugdb.io/tls-not-after"], stamp);

    // Over what it made, as the caches hold it: nothing is read or issued again.
    let (_, again, _) = pass_over(&registry, &api.database(), &made, &server).await;
    assert_eq!(lines(&again), Vec::<String>::new());
}

#[tokio::test]
async fn a_volume_growth_the_api_server_refuses_is_said_once_and_tried_again() {
    let registry = registry().await;
    let (mut db, made) = steady(&registry).await;
    db.spec.storage.0 = "2Gi".into();
    let mut cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    for ordinal in 0..3 {
        cluster.push(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("data-orders-{ordinal}"), "namespace": "shop", "uid": format!("claim-{ordinal}"),
                "labels": {"app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "plugdb"}},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
        }));
    }
    // A storage class that cannot expand: the API server refuses the growth.
    let claim = "/api/v1/namespaces/shop/persistentvolumeclaims/data-orders-0";
    let server = Server { refused: vec![(claim.into(), 403)], ..Server::default() };
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let expected = [
        "PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
        format!("PATCH {claim}"),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[1].body["spec"]["resources"]["requests"]["storage"], "2Gi");
    assert_eq!((calls[2].body["reason"].as_str(), calls[2].body["type"].as_str()), (Some("VolumeGrowFailed"), Some("Warning")));
    let status = status(&api);
    let progressing = status.conditions.iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("False", "VolumeGrowFailed"));
    assert!(progressing.message.contains("data-orders-0 cannot grow to 2Gi: refused as the test asked"), "{}", progressing.message);

    // The next pass tries again; the status already says why, so no second Warning.
    let (_, again, _) = pass_over(&registry, &api.database(), &cluster, &server).await;
    assert!(again.iter().any(|c| c.line() == format!("PATCH {claim}")), "{:?}", lines(&again));
    assert!(again.iter().all(|c| c.body["reason"] != "VolumeGrowFailed"), "{:?}", lines(&again));
}

/// Member agents as the members run them, at `addresses` on the agent's port: each
/// answers with `status` as its member's status command prints it, fences with a command
/// that succeeds, and promotes with one that does where the plugin promotes in place. They serve the certificate the pass
/// issued (Secret `orders-agent`, in `made`) and answer only the operator's. The
/// directory holds their certificates and what they marked; it goes when dropped.
async fn agents(made: &[Value], members: &[(&str, &str)]) -> tempfile::TempDir {
    let secret = made.iter().find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == "orders-agent").expect("the agents' Secret");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret.clone()).expect("a Secret");
    let data = secret.data.expect("certificates");
    let dir = tempfile::tempdir().expect("a directory");
    for file in plugdb::agent::FILES {
        std::fs::write(dir.path().join(file), &data[file].0).expect("a certificate on disk");
    }
    let sh = |script: &str| vec!["sh".to_string(), "-c".into(), script.into()];
    // Promoting in place where the plugin says how, as the members' agents are given.
    let set = made.iter().find(|o| o["kind"] == "StatefulSet").expect("the StatefulSet");
    let promotes = set["spec"]["template"]["spec"]["containers"].to_string().contains("--promote-command");
    // Trusting the authority the members' template pins, as the agents there do.
    let agent =
        set["spec"]["template"]["spec"]["containers"].as_array().into_iter().flatten().find(|c| c["name"] == "agent").expect("the agent");
    let argv: Vec<String> = serde_json::from_value(agent["command"].clone()).expect("its command");
    let clients = argv.iter().skip_while(|a| *a != "--clients").nth(1).expect("--clients").clone();
    for (ordinal, (address, status)) in members.iter().enumerate() {
        let state = dir.path().join(format!("member-{ordinal}"));
        std::fs::create_dir_all(&state).expect("the member's state");
        let fence = plugdb::agent::Fence {
            argv: sh("true"),
            mark: state.join(plugdb::agent::FENCED_FILE),
            stop: state.join(plugdb::agent::guard::STOP_FILE),
            members: "orders-headless.shop.svc.invalid".into(),
            own: None,
            // Never cut off: only the operator fences it.
            control_plane: None,
            cut_off_after: plugdb::agent::ISOLATED_FENCE_AFTER,
        };
        let commands = plugdb::agent::Commands {
            status: sh(&format!("echo {status}")),
            fence: Some(fence),
            promote: if promotes { sh("true") } else { Vec::new() },
            // Says how many replicas commits wait for, and of which members, as the agent was asked.
            synchronous: sh(&format!(
                "echo ${} ${} > {}",
                plugdb::agent::SYNCHRONOUS_ENV,
                plugdb::agent::SYNCHRONOUS_MEMBERS_ENV,
                state.join("synchronous").display()
            )),
            ..Default::default()
        };
        let address: std::net::SocketAddr = format!("{address}:{}", plugdb::agent::PORT).parse().expect("an address");
        let trust = plugdb::agent::Trust { certs: dir.path().to_path_buf(), clients: clients.clone() };
        tokio::spawn(plugdb::agent::serve(address, trust, commands, None));
        while tokio::net::TcpStream::connect(address).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    dir
}

/// Loopback addresses for `n` members from the `first`th, apart from another copy of
/// these tests running at the same time (and, by `first`, from another test's in this run).
fn loopback_from(first: usize, n: usize) -> Vec<String> {
    let id = std::process::id();
    (0..n).map(|i| format!("127.{}.{}.{}", 1 + (id >> 8) % 250, id % 256, first + i)).collect()
}

/// A Database of three members made by a first pass on `server`, its members `ready` as
/// given, at loopback addresses from the `first`th, each with an agent saying `said`.
/// The Database, what the caches hold, the API server (serving the agents' Secret) and
/// the agents.
async fn with_agents(
    registry: &Registry,
    server: Server,
    first: usize,
    ready: [bool; 3],
    said: [&str; 3],
) -> (Database, Vec<Value>, Server, tempfile::TempDir) {
    with_agents_of(registry, json!({"replicas": 3}), server, first, ready, said).await
}

/// [`with_agents`], the Database's spec `spec` (over a minimal one).
async fn with_agents_of(
    registry: &Registry,
    spec: Value,
    server: Server,
    first: usize,
    ready: [bool; 3],
    said: [&str; 3],
) -> (Database, Vec<Value>, Server, tempfile::TempDir) {
    let (result, calls, api) = pass_over(registry, &database(spec), &[], &server).await;
    result.expect("the first pass");
    let mut made = written(&calls);
    let secret = made.iter_mut().find(|o| o["metadata"]["name"] == "orders-agent").expect("the agents' Secret");
    secret["metadata"]["resourceVersion"] = json!("1");
    let secret = secret.clone();
    let addresses = loopback_from(first, 3);
    let members = ready.map(|ready| (ready, "r1"));
    let mut cluster = running(&made, "r1", &members);
    for (pod, address) in cluster.iter_mut().filter(|o| o["kind"] == "Pod").zip(&addresses) {
        pod["status"]["podIP"] = json!(address);
    }
    let said: Vec<(&str, &str)> = addresses.iter().map(String::as_str).zip(said).collect();
    let agents = agents(&made, &said).await;
    let server = Server { served: vec![("/api/v1/namespaces/shop/secrets/orders-agent".into(), secret)], ..server };
    (api.database(), cluster, server, agents)
}

/// A replica promoted behind the operator's back (its agent says it takes writes while
/// member 0 leads) is fenced by the next look at the members, named in `Degraded` and a
/// Warning; the primary stays.
#[tokio::test]
async fn a_second_primary_is_fenced_and_named() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let said = ["primary 0/5000000", "primary 0/5000100", "replica 0/5000000 0"];
    let (db, cluster, server, agents) = with_agents(&registry, server, 30, [true; 3], said).await;
    let (result, calls, api2) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let fenced: Vec<&Call> = calls.iter().filter(|c| c.line() == "PATCH /api/v1/namespaces/shop/pods/orders-1").collect();
    assert_eq!(fenced.len(), 1, "{:?}", lines(&calls));
    assert_eq!(fenced[0].body["metadata"]["annotations"]["plugdb.io/fenced"], "true");
    assert!(agents.path().join("member-1").join(plugdb::agent::FENCED_FILE).exists(), "its agent fenced it");
    assert!(!agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "not the primary");
    assert!(calls.iter().any(|c| c.body["reason"] == "SecondPrimary" && c.body["type"] == "Warning"), "{:?}", lines(&calls));
    let status = status(&api2);
    assert_eq!(status.primary.as_deref(), Some("orders-0"), "the primary stays");
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").expect("Degraded");
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "SecondPrimary"), "{degraded:?}");
    assert!(degraded.message.starts_with("orders-1 says it takes writes while orders-0 is the primary"), "{}", degraded.message);
}

/// A member's volume past `spec.storageGrowth`'s threshold, as its agent measured it, grows
/// every member's claim by the step (a Normal Event, the `StorageGrowth` condition and
/// `status.storageGrowth` say so); once grown, nothing grows again within the interval.
#[tokio::test]
async fn volumes_past_the_threshold_grow_by_the_step_and_not_again_within_the_interval() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let spec = json!({"replicas": 3, "storageGrowth": {"thresholdPercent": 80, "step": "1Gi", "limit": "3Gi"}});
    // What each member's agent says: its status, then its data volume (bytes used of its size).
    let said = ["primary 0/5; echo volume 10 100", "replica 0/5 0; echo volume 85 100", "replica 0/5 0; echo volume 20 100"];
    let (db, mut cluster, server, _agents) = with_agents_of(&registry, spec, server, 130, [true; 3], said).await;
    let claim = bound_claim;
    cluster.extend((0..3).map(|o| claim(o, "1Gi")));
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let claims: Vec<&Call> = calls.iter().filter(|c| c.line().contains("/persistentvolumeclaims/")).collect();
    assert_eq!(claims.len(), 3, "every member's claim: {:?}", lines(&calls));
    assert!(claims.iter().all(|c| c.body["spec"]["resources"]["requests"]["storage"] == "2Gi"), "{:?}", lines(&calls));
    let event = calls.iter().find(|c| c.body["reason"] == "VolumesGrown").expect("an Event");
    assert_eq!(event.body["type"], "Normal");
    assert_eq!(event.body["note"], "orders-1's volume was 85 % full: every member's volume grows from 1Gi to 2Gi");
    let said = status(&api);
    let grown = said.storage_growth.clone().expect("status.storageGrowth");
    assert_eq!((grown.size.as_str(), grown.count), ("2Gi", 1));
    let condition = said.conditions.iter().find(|c| c.type_ == "StorageGrowth").expect("StorageGrowth");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "VolumesGrown"));

    // Grown, and still over the threshold: nothing more within the interval.
    let cluster: Vec<Value> =
        cluster.into_iter().filter(|o| o["kind"] != "PersistentVolumeClaim").chain((0..3).map(|o| claim(o, "2Gi"))).collect();
    let (result, again, api) = pass_over(&registry, &api.database(), &cluster, &server).await;
    result.expect("the next pass");
    assert!(again.iter().all(|c| !c.line().contains("/persistentvolumeclaims/")), "{:?}", lines(&again));
    assert_eq!(status(&api).storage_growth, Some(grown), "as it was");
}

/// What each member's agent last saw of its engine's exporter reaches the member's status,
/// and `EngineMetrics` names the members whose exporter cannot reach its engine.
#[tokio::test]
async fn the_members_whose_exporter_cannot_reach_the_engine_are_named() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let said = ["primary 0/5; echo exporter up", "replica 0/5 0; echo exporter down", "replica 0/5 0; echo exporter silent"];
    let (db, cluster, server, _agents) = with_agents_of(&registry, json!({"replicas": 3}), server, 130, [true; 3], said).await;
    let (result, _, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let said = status(&api);
    let exporters: Vec<Option<&str>> = said.members.iter().map(|m| m.exporter.as_deref()).collect();
    assert_eq!(exporters, [Some("up"), Some("cannot reach its engine"), Some("does not answer")]);
    let condition = said.conditions.iter().find(|c| c.type_ == "EngineMetrics").expect("EngineMetrics");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "ExporterDown"));
    assert_eq!(condition.message, "orders-1: its exporter cannot reach its engine; orders-2: its exporter does not answer");
}

/// Below the threshold, a volume over half full that its agent says fills fast enough to
/// be full within a day grows every member's claim now.
#[tokio::test]
async fn a_volume_that_would_fill_within_a_day_grows_them_all_early() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let spec = json!({"replicas": 3, "storageGrowth": {"thresholdPercent": 90, "step": "1Gi", "limit": "3Gi"}});
    // Member 2: 60 bytes of 100 used, filling by 20 bytes an hour: full in 2 h.
    let said = ["primary 0/5; echo volume 10 100 0", "replica 0/5 0; echo volume 20 100", "replica 0/5 0; echo volume 60 100 20"];
    let (db, mut cluster, server, _agents) = with_agents_of(&registry, spec, server, 170, [true; 3], said).await;
    cluster.extend((0..3).map(|o| bound_claim(o, "1Gi")));
    let (result, calls, _) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let grown = calls.iter().filter(|c| c.line().contains("/persistentvolumeclaims/")).count();
    assert_eq!(grown, 3, "{:?}", lines(&calls));
    let event = calls.iter().find(|c| c.body["reason"] == "VolumesGrown").expect("an Event");
    let note =
        "orders-2's volume was 60 % full and would be full within 2 h at the rate it fills: every member's volume grows from 1Gi to 2Gi";
    assert_eq!(event.body["note"], note);
}

/// Member `ordinal`'s data claim, bound, with `size` asked for and had.
fn bound_claim(ordinal: u32, size: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": format!("data-orders-{ordinal}"), "namespace": "shop", "uid": format!("claim-{ordinal}"),
            "labels": {"app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "plugdb"}},
        "spec": {"resources": {"requests": {"storage": size}}},
        "status": {"phase": "Bound", "capacity": {"storage": size}},
    })
}

/// A volume past the threshold with every volume at `storageGrowth.limit` grows nothing:
/// `StorageGrowth=False` and a Warning say so, once; a pass that asks no agent (they are
/// asked every half minute) keeps saying it.
#[tokio::test]
async fn volumes_at_their_limit_are_said_once_and_a_pass_that_hears_nothing_keeps_it() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let spec = json!({"replicas": 3, "storageGrowth": {"limit": "1Gi"}});
    let said = ["primary 0/5; echo volume 95 100", "replica 0/5 0; echo volume 10 100", "replica 0/5 0; echo volume 10 100"];
    let (db, mut cluster, server, _agents) = with_agents_of(&registry, spec, server, 150, [true; 3], said).await;
    cluster.extend((0..3).map(|o| bound_claim(o, "1Gi")));
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    assert!(calls.iter().all(|c| !c.line().contains("/persistentvolumeclaims/")), "nothing grows: {:?}", lines(&calls));
    let warning = calls.iter().find(|c| c.body["reason"] == "StorageLimitReached").expect("a Warning");
    assert_eq!(warning.body["type"], "Warning");
    let limited = |api: &MockApi| {
        let c = status(api).conditions.into_iter().find(|c| c.type_ == "StorageGrowth").expect("StorageGrowth");
        (c.status, c.reason)
    };
    assert_eq!(limited(&api), ("False".to_string(), "StorageLimitReached".to_string()));

    let quiet = Server { poll: false, ..server.clone() };
    let (result, again, api) = pass_over(&registry, &api.database(), &cluster, &quiet).await;
    result.expect("a pass that asks no agent");
    assert!(again.iter().all(|c| c.body["reason"] != "StorageLimitReached"), "said once: {:?}", lines(&again));
    assert_eq!(limited(&api), ("False".to_string(), "StorageLimitReached".to_string()), "kept");
    let (_, heard_again, _) = pass_over(&registry, &api.database(), &cluster, &server).await;
    assert!(heard_again.iter().all(|c| c.body["reason"] != "StorageLimitReached"), "still said once: {:?}", lines(&heard_again));
}

/// A Database of three members whose primary (member 0) has not been ready for an hour,
/// its node gone, while its agent still answers; member 2 received more than member 1.
/// The registry, the Database, what the caches hold, the API server and the agents (at
/// loopback addresses from the `first`th, apart from the other tests').
async fn a_lost_primary(first: usize) -> (Registry, Database, Vec<Value>, Server, tempfile::TempDir) {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    // Member 0 (the primary) has not been ready for an hour, its node gone; its agent
    // still answers. Member 2 received more than member 1.
    let said = ["primary 0/5000000", "replica 0/4000000 1.5", "replica 0/5000000 0"];
    let (db, cluster, server, agents) = with_agents(&registry, server, first, [false, true, true], said).await;
    (registry, db, cluster, server, agents)
}

/// The pass that finds the primary lost does only the handover, then looks again at
/// once; the next renders the members for the new primary.
#[tokio::test]
async fn a_lost_primary_is_fenced_by_its_agent_and_the_furthest_replica_promoted() {
    let (registry, db, cluster, server, agents) = a_lost_primary(10).await;
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    assert_eq!(result.expect("the pass"), kube::runtime::controller::Action::requeue(std::time::Duration::ZERO), "at once");
    let pod = |n: usize| format!("PATCH /api/v1/namespaces/shop/pods/orders-{n}");
    let expected = [
        // The down member's node, then the operator's certificate for the agents (read
        // once, kept while the Secret's version stands).
        "GET /api/v1/nodes/node-0".to_string(),
        "GET /api/v1/namespaces/shop/secrets/orders-agent".into(),
        // Every agent asked where its member is; the handover: the old primary fenced
        // (its pod marked at once), the read-write Service moved, the new one promoted
        // in place, the role labels.
        pod(0),
        "PATCH /api/v1/namespaces/shop/services/orders".into(),
        pod(2),
        pod(0),
        pod(2),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[2].body["metadata"]["annotations"]["plugdb.io/fenced"], "true");
    assert_eq!(calls[3].body["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "orders-2");
    assert!(
        calls[4].body["metadata"]["annotations"]["plugdb.io/promoted"]
            .as_str()
            .is_some_and(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok()),
        "when"
    );
    assert!(agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "the old primary's agent fenced it");
    assert!(!agents.path().join("member-2").join(plugdb::agent::FENCED_FILE).exists());
    let role = |i: usize| calls[i].body["metadata"]["labels"]["plugdb.io/role"].as_str();
    assert_eq!((role(5), role(6)), (Some("replica"), Some("primary")));
    assert_eq!(calls[7].body["reason"], "FailoverPromoted");
    assert!(
        calls[7].body["note"].as_str().is_some_and(|n| n.contains("fenced by its agent; promoting orders-2")),
        "{}",
        calls[7].body["note"]
    );
    assert_eq!(status(&api).primary.as_deref(), Some("orders-2"));

    // The next pass renders for member 2, and says where each member is.
    let (result, again, api) = pass_over(&registry, &api.database(), &cluster, &server).await;
    result.expect("the next pass");
    let set = again.iter().find(|c| c.path.contains("/statefulsets/")).expect("the members' template");
    assert_eq!(set.body["spec"]["template"]["metadata"]["annotations"]["plugdb.io/primary"], "orders-2");
    assert!(again.iter().all(|c| c.body["reason"] != "FailoverPromoted"), "promoted once: {:?}", lines(&again));
    let status = status(&api);
    let positions: Vec<_> = status.members.iter().map(|m| (m.pod.as_str(), m.position.as_deref())).collect();
    assert_eq!(positions, [("orders-0", Some("0/5000000")), ("orders-1", Some("0/4000000")), ("orders-2", Some("0/5000000"))]);
}

/// An operator stopped after a member's agent promoted it in place and before it recorded
/// the promotion: the member leads, its pod marked as replacing the primary in status
/// (`plugdb.io/replaces`, written before its agent was asked). The next pass gives it to
/// the plugin with what it has (a member that says it leads is otherwise never promoted
/// on its own word), has it promoted again (it leads already) and records it, rather
/// than promote another member that may lack what it confirmed.
#[tokio::test]
async fn a_promotion_an_operator_did_not_record_is_finished_by_the_next_pass() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let said = ["primary 0/5000000", "primary 0/5000100", "replica 0/5000000 0"];
    let (db, mut cluster, server, agents) = with_agents(&registry, server, 250, [false, true, true], said).await;
    let pod = cluster.iter_mut().find(|o| o["kind"] == "Pod" && o["metadata"]["name"] == "orders-1").expect("member 1's pod");
    pod["metadata"]["annotations"]["plugdb.io/promoted"] = json!("2026-01-01T00:00:00Z");
    pod["metadata"]["annotations"]["plugdb.io/replaces"] = json!("orders-0");
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    assert_eq!(status(&api).primary.as_deref(), Some("orders-1"), "{:?}", lines(&calls));
    let event = calls.iter().find(|c| c.body["reason"] == "FailoverPromoted").expect("a FailoverPromoted Event");
    assert!(event.body["note"].as_str().is_some_and(|n| n.contains("promoting orders-1")), "{}", event.body["note"]);
    assert!(!agents.path().join("member-1").join(plugdb::agent::FENCED_FILE).exists(), "not fenced as a second primary");
}

/// A primary not ready only because its engine's probe fails (every container runs, its
/// agent is ready: not fenced) whose engine answers its agent as the primary is not
/// replaced: nothing is fenced, promoted or moved, and `Degraded` says why.
#[tokio::test]
async fn a_primary_whose_probe_fails_while_its_engine_answers_is_not_replaced() {
    let (registry, db, mut cluster, server, agents) = a_lost_primary(190).await;
    let pod = cluster.iter_mut().find(|o| o["kind"] == "Pod" && o["metadata"]["name"] == "orders-0").expect("the primary's pod");
    let running = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
    pod["status"]["containerStatuses"] = json!([
        {"name": "postgres", "ready": false, "restartCount": 0, "image": "e", "imageID": "", "state": running},
        {"name": "agent", "ready": true, "restartCount": 0, "image": "e", "imageID": "", "state": running},
    ]);
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let said = lines(&calls);
    assert!(!said.iter().any(|l| l.contains("/pods/") || l.contains("/services/") || l.contains("statefulsets")), "{said:?}");
    assert!(!agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "not fenced");
    let status = status(&api);
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").expect("Degraded");
    assert!(
        degraded.reason == "NoSafeFailover" && degraded.message.contains("its engine answers its agent as the primary"),
        "{degraded:?}"
    );
}

#[tokio::test]
async fn a_pass_that_fails_after_a_promotion_still_says_who_leads_now() {
    let (registry, db, cluster, server, _agents) = a_lost_primary(210).await;
    // The API server fails the read-write Service's move, once the old primary is fenced
    // and the new one chosen.
    let service = "/api/v1/namespaces/shop/services/orders";
    let server = Server { refused: vec![(service.into(), 500)], ..server };
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    assert!(matches!(result, Err(reconcile::Error::Kube(_))), "{result:?}");
    let tail: Vec<String> = lines(&calls).into_iter().skip_while(|l| *l != format!("PATCH {service}")).collect();
    let expected =
        [format!("PATCH {service}"), "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(), format!("PATCH {DATABASES}/status")];
    assert_eq!(tail, expected);
    assert_eq!(calls.iter().rev().nth(1).map(|c| c.body["reason"].clone()), Some(json!("FailoverPromoted")));
    // The promotion is not undone: the status says who leads, and the next pass keeps it.
    assert_eq!(status(&api).primary.as_deref(), Some("orders-2"));
    let server = Server { refused: vec![], ..server };
    let (result, again, api) = pass_over(&registry, &api.database(), &cluster, &server).await;
    result.expect("the next pass");
    assert!(again.iter().all(|c| c.body["reason"] != "FailoverPromoted"), "{:?}", lines(&again));
    assert_eq!(status(&api).primary.as_deref(), Some("orders-2"));
}

/// A planned switchover to member 2, asked for on the Database, with every agent saying
/// the same position, in three passes of one operator: the first fences the primary and
/// looks again at once; the second reads the positions and, member 2 having all the fenced
/// primary wrote, hands over: the read-write Service leads to member 2, the fence is run
/// again, member 2 is promoted in place, the two relabelled. The third renders for member
/// 2 and removes the request.
#[tokio::test]
async fn a_switchover_fences_the_primary_then_promotes_the_member_once_it_has_all_it_wrote() {
    use kube::runtime::controller::Action;
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let said = ["primary 0/5000000", "replica 0/5000000 0", "replica 0/5000000 0"];
    let (mut db, cluster, server, agents) = with_agents(&registry, server, 50, [true; 3], said).await;
    db.metadata.annotations.get_or_insert_default().insert("plugdb.io/switchover".into(), "orders-2".into());
    let (passes, api) = passes_over(&registry, &db, &cluster, &server, 3).await;
    let [(fenced, fence), (handed, handover), (rendered, after)] = <[_; 3]>::try_from(passes).map_err(|_| "three passes").expect("passes");
    let pod = |n: usize| format!("PATCH /api/v1/namespaces/shop/pods/orders-{n}");
    let service = "PATCH /api/v1/namespaces/shop/services/orders".to_string();

    // The primary fenced (its pod marked); the status says what the switchover waits for.
    let expected = ["GET /api/v1/namespaces/shop/secrets/orders-agent".to_string(), pod(0), format!("PATCH {DATABASES}/status")];
    assert_eq!(lines(&fence), expected);
    assert_eq!(fenced.expect("the first pass"), Action::requeue(std::time::Duration::ZERO), "at once");
    assert_eq!(fence[1].body["metadata"]["annotations"]["plugdb.io/fenced"], "true");
    assert!(agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "the old primary's agent fenced it");
    let progressing =
        fence[2].body[0]["value"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Progressing").cloned());
    let says = progressing.as_ref().and_then(|c| c["message"].as_str()).unwrap_or_default();
    assert!(says.starts_with("switchover to orders-2: orders-0 fenced; waiting for"), "{progressing:?}");

    // Every agent asked where its member is; member 2 has all the fenced primary wrote.
    let expected = [
        service.clone(),
        pod(2),
        pod(0),
        pod(2),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&handover), expected);
    assert_eq!(handed.expect("the second pass"), Action::requeue(std::time::Duration::ZERO), "at once");
    assert_eq!(handover[0].body["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "orders-2");
    assert!(
        handover[1].body["metadata"]["annotations"]["plugdb.io/promoted"]
            .as_str()
            .is_some_and(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok()),
        "when"
    );
    let role = |i: usize| handover[i].body["metadata"]["labels"]["plugdb.io/role"].as_str();
    assert_eq!((role(2), role(3)), (Some("replica"), Some("primary")));
    assert!(!agents.path().join("member-2").join(plugdb::agent::FENCED_FILE).exists(), "not the new primary");
    assert_eq!(handover[4].body["reason"], "SwitchoverPromoted");
    let note = handover[4].body["note"].as_str().unwrap_or_default();
    assert!(note.starts_with("switchover: orders-0 fenced; orders-2 has all it wrote (position 0/5000000); promoting orders-2"), "{note}");

    // Member 2 leads: the members are rendered for it, and the request is done, and goes
    // (only while it still names member 2).
    rendered.expect("the third pass");
    let set = after.iter().find(|c| c.path.contains("/statefulsets/")).expect("the members' template");
    assert_eq!(set.body["spec"]["template"]["metadata"]["annotations"]["plugdb.io/primary"], "orders-2");
    let removed = after.iter().find(|c| c.line() == format!("PATCH {DATABASES}")).expect("the request removed");
    assert_eq!(removed.body[0], json!({"op": "test", "path": "/metadata/annotations/plugdb.io~1switchover", "value": "orders-2"}));
    assert_eq!(removed.body[1]["op"], "remove");
    assert!(after.iter().any(|c| c.body["reason"] == "SwitchoverDone"), "{:?}", lines(&after));
    assert!(after.iter().all(|c| c.body["reason"] != "SwitchoverPromoted"), "promoted once: {:?}", lines(&after));
    assert_eq!(status(&api).primary.as_deref(), Some("orders-2"));
}

/// A switchover to a member that is behind the fenced primary waits: the second pass
/// reads the positions, promotes nothing, says what it waits for, and looks again soon,
/// not at once. An operator started afresh (the fence's answer not kept) fences again
/// before it reads the positions.
#[tokio::test]
async fn a_switchover_to_a_member_behind_waits_and_a_new_operator_fences_again() {
    use kube::runtime::controller::Action;
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let said = ["primary 0/5000000", "replica 0/5000000 0", "replica 0/4000000 2"];
    let (mut db, cluster, server, _agents) = with_agents(&registry, server, 230, [true; 3], said).await;
    db.metadata.annotations.get_or_insert_default().insert("plugdb.io/switchover".into(), "orders-2".into());
    let (passes, api) = passes_over(&registry, &db, &cluster, &server, 2).await;
    let [(_, fence), (waited, waits)] = <[_; 2]>::try_from(passes).map_err(|_| "two passes").expect("passes");
    assert!(fence.iter().any(|c| c.line() == "PATCH /api/v1/namespaces/shop/pods/orders-0"), "fenced: {:?}", lines(&fence));
    let writes: Vec<String> = lines(&waits).into_iter().filter(|l| l.contains("/pods/") || l.contains("/services/")).collect();
    assert!(writes.is_empty(), "nothing moves: {writes:?}");
    assert_ne!(waited.expect("the second pass"), Action::requeue(std::time::Duration::ZERO), "soon, not at once");
    let status = status(&api);
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    let progressing = status.conditions.iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert!(progressing.message.contains("orders-2 (at 0/4000000) to reach orders-0's last position 0/5000000"), "{progressing:?}");

    let (result, again, _) = pass_over(&registry, &api.database(), &cluster, &server).await;
    assert_eq!(result.expect("a new operator's pass"), Action::requeue(std::time::Duration::ZERO));
    assert!(again.iter().any(|c| c.line() == "PATCH /api/v1/namespaces/shop/pods/orders-0"), "fenced again: {:?}", lines(&again));
    assert!(again.iter().all(|c| !c.line().contains("/services/")), "{:?}", lines(&again));
}

/// etcd, loaded beside postgres: an engine that elects its own leader and changes its
/// membership by Jobs. Grown from 3 members to 4, the new member is added by the
/// plugin's Job first, and the StatefulSet grows only once that Job has completed.
#[tokio::test]
async fn an_etcd_member_is_added_by_its_job_before_the_statefulset_grows() {
    let registry = registry_of(&["postgres", "etcd"]).await;
    let spec = json!({"engine": "etcd", "version": "3.5", "replicas": 3});
    let (db, made) = made(&registry, spec).await;
    let mut cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    // Nothing answers at the members' addresses: who leads is not known.
    let addresses = loopback_from(70, 3);
    for (pod, address) in cluster.iter_mut().filter(|o| o["kind"] == "Pod").zip(&addresses) {
        pod["status"]["podIP"] = json!(address);
    }
    let (_, api) = pass(&registry, &db, &cluster).await;
    let mut db = api.database();
    db.spec.replicas = 4;
    db.metadata.generation = Some(2);
    let (calls, api) = pass(&registry, &db, &cluster).await;
    assert_eq!(lines(&calls), ["POST /apis/batch/v1/namespaces/shop/jobs".to_string(), format!("PATCH {DATABASES}/status")]);
    let job = &calls[0].body;
    let script = job["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(script.contains("member add") && script.contains("--learner"), "the plugin's add: {script}");
    let env = job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
    assert!(env.contains(&json!({"name": "MEMBER", "value": "orders-3"})), "{env:?}");
    let progressing = status(&api).conditions.into_iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert_eq!(progressing.status, "True", "{progressing:?}");

    // Its Job still runs: nothing more. Once it has completed, the StatefulSet grows.
    let mut job = job.clone();
    job["metadata"]["uid"] = json!("scale-job-uid");
    job["metadata"]["creationTimestamp"] = json!("2026-11-28T00:00:00Z");
    cluster.push(job.clone());
    let db = api.database();
    let (calls, api) = pass(&registry, &db, &cluster).await;
    assert!(lines(&calls).iter().all(|l| !l.contains("statefulsets") && !l.contains("/jobs")), "{:?}", lines(&calls));
    let done = cluster.iter_mut().find(|o| o["kind"] == "Job").expect("the Job");
    done["status"] = json!({"completionTime": "2026-11-28T00:01:00Z", "conditions": [{"type": "Complete", "status": "True"}]});
    let (calls, _) = pass(&registry, &api.database(), &cluster).await;
    let grown =
        calls.iter().find(|c| c.line() == "PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders").expect("the StatefulSet grows");
    assert_eq!(grown.body["spec"]["replicas"], 4);
}

/// An engine that elects its leader has its members asked who leads over TLS, trusting
/// the CA of the Database's certificate: its Secret is read once, not on every pass, and
/// again once the Secret changes.
#[tokio::test]
async fn the_ca_the_members_are_asked_with_is_read_again_only_when_its_secret_changes() {
    let registry = registry_of(&["postgres", "etcd"]).await;
    let spec = json!({"engine": "etcd", "version": "3.5", "replicas": 3, "tls": {"enabled": true}});
    let (db, made) = made(&registry, spec).await;
    let mut cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    for (pod, address) in cluster.iter_mut().filter(|o| o["kind"] == "Pod").zip(loopback_from(90, 3)) {
        pod["status"]["podIP"] = json!(address);
    }
    const TLS: &str = "/api/v1/namespaces/shop/secrets/orders-tls";
    let versioned = |cluster: &mut Vec<Value>, version: &str| {
        let secret = cluster.iter_mut().find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == "orders-tls").expect("the TLS Secret");
        secret["metadata"]["resourceVersion"] = json!(version);
        secret.clone()
    };
    let secret = versioned(&mut cluster, "5");
    let api = MockApi::new(&db).serving(&[(TLS.to_string(), secret)]);
    let context = |cluster: &[Value]| {
        let caches = Caches::holding(cluster, reconcile::fresh_stamper()).expect("caches");
        Context::new(api.client(), registry.clone(), Arc::new(Metrics::default()), test_settings(), caches)
    };
    let reads = |calls: &[Call]| calls.iter().filter(|c| c.line() == format!("GET {TLS}")).count();
    let pass_with = |ctx: Arc<Context>| {
        let api = api.clone();
        async move {
            loop {
                match reconcile::reconcile(Arc::new(api.database()), ctx.clone()).await {
                    Err(reconcile::Error::Busy(busy)) => tokio::time::sleep(busy.retry_in()).await,
                    ended => break ended.map(|_| ()),
                }
            }
        }
    };
    let ctx = Arc::new(context(&cluster));
    pass_with(ctx.clone()).await.expect("a pass");
    assert_eq!(reads(&api.take()), 1, "read once");
    pass_with(ctx.clone()).await.expect("a pass");
    assert_eq!(reads(&api.take()), 0, "kept while the Secret is the same");
    // The same operator, its cache now holding a newer version of the Secret.
    versioned(&mut cluster, "6");
    let mut ctx = Arc::into_inner(ctx).expect("one context");
    ctx.caches = Caches::holding(&cluster, reconcile::fresh_stamper()).expect("caches");
    pass_with(Arc::new(ctx)).await.expect("a pass");
    assert_eq!(reads(&api.take()), 1, "read again once it changed");
}

/// Synchronous replication with `whenTooFewReplicas: Degrade`: both replicas down for
/// longer than `degradeAfterSeconds`, the primary's agent is told to stop commits waiting
/// (`POST /synchronous/0`), and the condition and a Warning say replication is degraded.
#[tokio::test]
async fn too_few_replicas_for_longer_than_allowed_degrade_synchronous_replication() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let spec = json!({"replicas": 3, "replication": {"mode": "Synchronous", "whenTooFewReplicas": "Degrade", "degradeAfterSeconds": 10}});
    let said = ["primary 0/5000000", "replica 0/5000000 0", "replica 0/5000000 0"];
    let (mut db, cluster, server, agents) = with_agents_of(&registry, spec, server, 90, [true, false, false], said).await;
    let a_minute_ago = (chrono::Utc::now() - chrono::Duration::minutes(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let waiting = json!({
        "type": "SynchronousReplication", "status": "False", "reason": "ReplicasMissing", "lastTransitionTime": a_minute_ago,
        "message": "0 of the 1 replicas each commit waits for are ready",
    });
    // It ran: replicas missing are news (they are not while members are first made).
    db.status.get_or_insert_default().phase = Some(plugdb::crd::Phase::Running);
    let conditions = &mut db.status.get_or_insert_default().conditions;
    conditions.retain(|c| c.type_ != "SynchronousReplication");
    conditions.push(serde_json::from_value(waiting).expect("a condition"));
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let asked = std::fs::read_to_string(agents.path().join("member-0").join("synchronous")).expect("the primary's agent was asked");
    assert_eq!(asked.trim(), "0", "commits no longer wait for a replica");
    for replica in ["member-1", "member-2"] {
        assert!(!agents.path().join(replica).join("synchronous").exists(), "only the primary's agent is asked");
    }
    let warned = calls.iter().find(|c| c.body["reason"] == "ReplicationDegraded").expect("an Event");
    assert_eq!(warned.body["type"], "Warning");
    let condition = status(&api).conditions.into_iter().find(|c| c.type_ == "SynchronousReplication").expect("the condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "ReplicationDegraded"), "{condition:?}");
    assert!(condition.message.contains("for longer than 10s: commits no longer wait for replicas"), "{}", condition.message);
}

/// Synchronous replication names the ready replicas alone: with member 2 not ready, the
/// primary's agent is told that each commit waits for `orders-1`, and so is each
/// replica's (a MariaDB replica confirms only while named); each pod records what its
/// agent was told (with which run of its containers), so that none is told again until
/// that changes.
#[tokio::test]
async fn only_ready_replicas_are_named_to_confirm_synchronous_commits() {
    let registry = registry().await;
    // The agents are heard in this pass (as every 30 s): the replicas' are told then.
    let server = Server { image: Some("plugdb:test"), poll: true, ..Server::default() };
    let spec = json!({"replicas": 3, "replication": {"mode": "Synchronous"}});
    let said = ["primary 0/5000000", "replica 0/5000000 0", "replica 0/4000000 0"];
    let (db, cluster, server, agents) = with_agents_of(&registry, spec, server, 230, [true, true, false], said).await;
    let (result, calls, _) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    let asked = |member: &str| std::fs::read_to_string(agents.path().join(member).join("synchronous"));
    // The primary's agent names them, and each replica's is told (a MariaDB replica
    // confirms only while named); each pod records it.
    let mut cluster = cluster;
    for (member, pod) in [("member-0", "orders-0"), ("member-1", "orders-1"), ("member-2", "orders-2")] {
        let asked = asked(member).unwrap_or_else(|e| panic!("{member}'s agent was asked: {e}"));
        assert_eq!(asked.trim(), "1 orders-1", "one replica confirms each commit, of the ready ones");
        let line = format!("PATCH /api/v1/namespaces/shop/pods/{pod}");
        let marked = calls.iter().find(|c| c.line() == line).unwrap_or_else(|| panic!("{pod} records it: {:?}", lines(&calls)));
        let told = marked.body["metadata"]["annotations"]["plugdb.io/synchronous"].as_str().unwrap_or_default();
        assert!(told.starts_with("1/orders-1@20") && told.ends_with("+0"), "with which run of its containers: {told}");
        let pod = cluster.iter_mut().find(|o| o["kind"] == "Pod" && o["metadata"]["name"] == pod).expect("the pod");
        pod["metadata"]["annotations"]["plugdb.io/synchronous"] = json!(told);
        std::fs::remove_file(agents.path().join(member).join("synchronous")).expect("cleared");
    }
    // Recorded, none is asked again.
    let (result, calls, _) = pass_over(&registry, &db, &cluster, &server).await;
    result.expect("the pass");
    for member in ["member-0", "member-1", "member-2"] {
        assert!(asked(member).is_err(), "{member} asked again: {:?}", lines(&calls));
    }
}

/// Under synchronous replication, a lost primary whose record says it last had orders-1
/// confirm each commit is not replaced while orders-1 is not ready: orders-2, ready and
/// answering, confirmed none of the last commits, and nothing is fenced or promoted;
/// `Degraded` names orders-1. Had the primary named orders-2, orders-2 would lead.
#[tokio::test]
async fn a_failover_waits_for_the_replica_the_lost_primary_had_confirm_its_commits() {
    let registry = registry().await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let spec = json!({"replicas": 3, "replication": {"mode": "Synchronous"}});
    let said = ["primary 0/5000000", "replica 0/5000000 0", "replica 0/4000000 0"];
    for (named, first, promoted) in [("orders-1", 3, None), ("orders-2", 6, Some("orders-2"))] {
        let (db, mut cluster, server, agents) =
            with_agents_of(&registry, spec.clone(), server.clone(), first, [false, false, true], said).await;
        let pod = cluster.iter_mut().find(|o| o["kind"] == "Pod" && o["metadata"]["name"] == "orders-0").expect("the primary's pod");
        // Recorded when the primary was last ready: it has not been since.
        pod["metadata"]["annotations"]["plugdb.io/synchronous"] = json!(format!("1/{named}@2026-01-01T00:00:00Z"));
        let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
        result.expect("the pass");
        let status = status(&api);
        assert_eq!(status.primary.as_deref(), Some(promoted.unwrap_or("orders-0")), "named {named}: {:?}", lines(&calls));
        if promoted.is_some() {
            continue;
        }
        assert!(!calls.iter().any(|c| c.path.contains("/pods/") || c.path.contains("/services/")), "{:?}", lines(&calls));
        assert!(!agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "not fenced");
        let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").expect("Degraded");
        assert_eq!(degraded.reason, "NoSafeFailover");
        assert!(degraded.message.contains("orders-1 is named to confirm each commit (1 of 1)"), "{}", degraded.message);
    }
}

/// MariaDB, loaded beside postgres: its primary lost, its agent fences it, and the
/// replica that has the most is chosen by the plugin's GTID comparison and promoted in
/// place by its agent (no restart); the members' template names it.
#[tokio::test]
async fn a_mysql_primary_lost_is_fenced_and_the_furthest_replica_promoted_in_place() {
    let registry = registry_of(&["postgres", "mysql"]).await;
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let spec = json!({"engine": "mysql", "version": "11.8", "replicas": 3});
    let said = ["primary 0-1-36", "replica 0-1-30 1", "replica 0-1-36 0"];
    let (db, cluster, server, agents) = with_agents_of(&registry, spec, server, 110, [false, true, true], said).await;
    let (passes, api) = passes_over(&registry, &db, &cluster, &server, 2).await;
    let [(handed, calls), (rendered, after)] = <[_; 2]>::try_from(passes).map_err(|_| "two passes").expect("passes");
    handed.expect("the pass");
    let pod = |n: usize| format!("PATCH /api/v1/namespaces/shop/pods/orders-{n}");
    let expected = [
        "GET /api/v1/nodes/node-0".to_string(),
        "GET /api/v1/namespaces/shop/secrets/orders-agent".into(),
        // The old primary fenced, the read-write Service moved, the new one promoted in
        // place, the two relabelled.
        pod(0),
        "PATCH /api/v1/namespaces/shop/services/orders".into(),
        pod(2),
        pod(0),
        pod(2),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected);
    assert_eq!(calls[2].body["metadata"]["annotations"]["plugdb.io/fenced"], "true");
    assert!(
        calls[4].body["metadata"]["annotations"]["plugdb.io/promoted"]
            .as_str()
            .is_some_and(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok()),
        "when"
    );
    assert!(agents.path().join("member-0").join(plugdb::agent::FENCED_FILE).exists(), "the old primary's agent fenced it");
    assert_eq!(calls[3].body["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "orders-2");
    let note = calls[7].body["note"].as_str().unwrap_or_default();
    assert!(note.contains("fenced by its agent; promoting orders-2"), "{note}");
    assert_eq!(status(&api).primary.as_deref(), Some("orders-2"));
    // The members' template names the new primary, which a restart of orders-2 starts as.
    rendered.expect("the next pass");
    let set = after.iter().find(|c| c.path.contains("/statefulsets/")).expect("the members' template");
    let primary = set.body["spec"]["template"]["metadata"]["annotations"]["plugdb.io/primary"].clone();
    assert_eq!(primary, "orders-2", "{}", set.body["spec"]["template"]["metadata"]);
}

/// The controller's backoff for a Database whose passes fail: 2 s, doubling, at most
/// 5 minutes; an engine busy with other calls is no failure (asked again when the answer
/// is expected, the backoff untouched); a pass that succeeds starts the backoff over.
#[tokio::test]
async fn failed_passes_back_off_doubling_a_busy_engine_does_not_and_a_success_starts_over() {
    use kube::runtime::controller::Action;
    use std::time::Duration;
    let registry = registry().await;
    let (db, made) = steady(&registry).await;
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let api = MockApi::new(&db);
    let ctx = Context::new(
        api.client(),
        registry.clone(),
        Arc::new(Metrics::default()),
        test_settings(),
        Caches::holding(&cluster, reconcile::fresh_stamper()).expect("caches"),
    );
    let ctx = Arc::new(ctx);
    let db = Arc::new(db);
    let failed = || reconcile::error_policy(db.clone(), &reconcile::Error::Random("no entropy".into()), ctx.clone());
    let seconds = |n: u64| Action::requeue(Duration::from_secs(n));
    assert_eq!([failed(), failed(), failed()], [seconds(2), seconds(4), seconds(8)]);
    let busy = plugdb::plugin::Busy::Running { engine: "postgres".into(), function: "render", retry_in: Duration::from_millis(300) };
    let asked_again = reconcile::error_policy(db.clone(), &reconcile::Error::Busy(busy), ctx.clone());
    assert_eq!(asked_again, Action::requeue(Duration::from_millis(300)), "when the answer is expected");
    assert_eq!(failed(), seconds(16), "the backoff goes on where it was");
    for _ in 0..6 {
        failed();
    }
    assert_eq!(failed(), seconds(300), "at most five minutes");
    reconcile::reconcile(db.clone(), ctx.clone()).await.expect("a pass that succeeds");
    assert_eq!(failed(), seconds(2), "the backoff starts over");
}

/// A cert-manager issuer named in `spec.tls.issuerRef`: the pass keeps a `Certificate`
/// for the Database's serving certificate (every name a client or a member reaches it
/// by, from that issuer), issues none of its own for it, and makes no member before
/// cert-manager has: `Progressing=False` and a Warning say what it waits for.
#[tokio::test]
async fn a_cert_manager_issuer_gets_a_certificate_asked_for_and_no_member_starts_before_it_is_issued() {
    let registry = registry().await;
    let db = database(json!({"replicas": 3, "tls": {"enabled": true, "issuerRef": {"name": "shop-ca"}}}));
    let server = Server { image: Some("plugdb:test"), ..Server::default() };
    let (result, calls, api) = pass_over(&registry, &db, &[], &server).await;
    result.expect("the pass");
    let certificate = "/apis/cert-manager.io/v1/namespaces/shop/certificates/orders-tls";
    let expected = [
        format!("GET {certificate}"),
        format!("PATCH {DATABASES}"),
        // The credentials and the application's login: no serving certificate of plugdb's.
        "POST /api/v1/namespaces/shop/secrets".into(),
        "POST /api/v1/namespaces/shop/secrets".into(),
        format!("PATCH {certificate}"),
        "POST /apis/events.k8s.io/v1/namespaces/shop/events".into(),
        format!("PATCH {DATABASES}/status"),
    ];
    assert_eq!(lines(&calls), expected, "no member, Service or StatefulSet yet");
    assert!(calls.iter().all(|c| c.body["metadata"]["name"] != "orders-tls" || c.body["kind"] == "Certificate"), "plugdb issues none");
    let asked = &calls[4].body;
    assert!(calls[4].is_apply(), "kept by server-side apply");
    assert_eq!(asked["spec"]["issuerRef"], json!({"group": "cert-manager.io", "kind": "Issuer", "name": "shop-ca"}));
    assert_eq!(asked["spec"]["secretName"], "orders-tls");
    let names = asked["spec"]["dnsNames"].as_array().cloned().unwrap_or_default();
    for name in ["orders.shop.svc", "orders-replicas.shop.svc", "*.orders-headless.shop.svc"] {
        assert!(names.contains(&json!(name)), "{name}: {names:?}");
    }
    let waiting = "waiting for cert-manager to issue Certificate shop/orders-tls from Issuer shop-ca";
    assert_eq!((calls[5].body["reason"].as_str(), calls[5].body["type"].as_str()), (Some("CertificatePending"), Some("Warning")));
    assert!(calls[5].body["note"].as_str().is_some_and(|n| n.starts_with(waiting)), "{}", calls[5].body["note"]);
    let progressing = status(&api).conditions.into_iter().find(|c| c.type_ == "Progressing").expect("Progressing");
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("False", "CertificatePending"));
}
