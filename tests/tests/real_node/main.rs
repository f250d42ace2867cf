//! Tier 5: scenarios on three real nodes. The operator renders; containerd, runc and
//! real kubelets run what it rendered from engine images built from Debian packages;
//! the scenarios talk to the real servers through the rendered Services and check data.
//!
//! Run with `cargo test -p plugdb-tests --test real_node [FILTER]` (as root); the nodes
//! serve the whole run and are torn down at its end, also after a failure or Ctrl-C.

mod alerts;
mod anomalies;
mod autoscaling;
mod consensus;
mod data;
mod faults;
mod growth;
mod harness;
mod install;
mod lifecycle;
mod members;
mod network;
mod nodes;
mod placement;
mod tls;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use plugdb::crd::Database;
use plugdb::names::SWITCHOVER;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, pod_ip};
use serde_json::json;

fn main() -> ExitCode {
    harness::run(
        &[
            ("postgres_children_then_a_quiet_steady_state_and_restart", |c| Box::pin(lifecycle::children_then_quiet(c))),
            ("mysql_operator_killed_at_random_points_of_create_scale_backup_upgrade_delete", |c| {
                Box::pin(faults::killed_at_random_points(c))
            }),
            // The chart's operator, in a pod, is the only one reconciling meanwhile.
            ("helm_install_then_the_example_database_runs_on_the_bundled_engines", |c| {
                Box::pin(install::helm_install_then_the_example_runs(c))
            }),
            // The operator every scenario shares is killed mid-failover.
            ("mysql_hung_primary_is_stopped_before_a_replica_is_promoted_and_loses_no_write_with_the_operator_killed_mid_failover", |c| {
                Box::pin(members::hung_primary_under_a_writer(c, Engine::Mysql, "11.8"))
            }),
            // These take a node away from every member on it: nothing else runs meanwhile.
            // Last of these, when the other tiers beside the real nodes have ended: the
            // node-loss scenario's 21 members share the two cores with nothing but them.
            ("postgres_and_mysql_node_drained_under_writers_within_the_disruption_budgets", |c| Box::pin(nodes::drain_under_writers(c))),
            ("a_node_lost_for_two_minutes_under_replicas_a_primary_and_etcds_leader_then_back", |c| Box::pin(nodes::node_lost_and_back(c))),
        ],
        &[
            ("the_machine_namespace_gains_only_the_veth", |c| Box::pin(contained(c))),
            ("plugins_arrive_and_change_at_run_time", |c| Box::pin(lifecycle::plugins_arrive_and_change(c))),
            ("a_spec_the_plugin_rejects_is_a_readable_condition", |c| Box::pin(lifecycle::rejected_spec(c))),
            ("postgres_a_replica_in_trouble_fires_the_charts_alerts_in_a_real_prometheus_and_they_resolve", |c| {
                Box::pin(alerts::a_replica_in_trouble_fires_alerts_that_resolve(c))
            }),
            ("postgres_a_setting_the_engine_cannot_start_with_is_a_crash_loop_named_with_its_last_words", |c| {
                Box::pin(lifecycle::crash_loop_named(c))
            }),
            ("postgres_scheduled_backups_with_retention_and_on_demand", |c| Box::pin(lifecycle::scheduled_backups(c))),
            ("postgres_hung_primary_fails_over_past_a_replica_whose_agent_is_silent", |c| Box::pin(members::failover_promotion(c))),
            ("postgres_synchronous_commits_wait_for_a_frozen_replica_then_degrade_and_recover", |c| {
                Box::pin(members::synchronous_commits_wait_then_degrade(c, Engine::Postgres, "17"))
            }),
            ("mysql_synchronous_commits_wait_for_a_frozen_replica_then_degrade_and_recover", |c| {
                Box::pin(members::synchronous_commits_wait_then_degrade(c, Engine::Mysql, "11.8"))
            }),
            ("postgres_members_replicate_and_accept_the_secret_password", |c| Box::pin(members_replicate(c, Engine::Postgres, "15"))),
            ("mysql_members_replicate_and_accept_the_secret_password", |c| Box::pin(members_replicate(c, Engine::Mysql, "11.8"))),
            ("postgres_scale_3_to_5_restarts_no_running_member_and_back_keeps_volumes", |c| {
                Box::pin(members::scale_up(c, Engine::Postgres, "17"))
            }),
            ("mysql_scale_3_to_5_restarts_no_running_member_and_back_keeps_volumes", |c| {
                Box::pin(members::scale_up(c, Engine::Mysql, "11.8"))
            }),
            ("postgres_survives_primary_pod_deletion_and_engine_kill", |c| Box::pin(members::primary_failures(c, Engine::Postgres, "15"))),
            ("mysql_survives_primary_pod_deletion_and_engine_kill", |c| Box::pin(members::primary_failures(c, Engine::Mysql, "10.11"))),
            ("postgres_parameter_change_rolls_replicas_first_primary_last", |c| Box::pin(members::parameter_roll(c))),
            ("postgres_minor_upgrade_with_a_writer_loses_no_write", |c| Box::pin(members::minor_upgrade(c))),
            ("mysql_10_11_to_11_8_upgrades_each_members_system_tables_as_it_starts", |c| Box::pin(members::mariadb_major_upgrade(c))),
            ("postgres_backup_restores_into_a_new_database", |c| Box::pin(data::backup_and_restore(c, Engine::Postgres, "15"))),
            ("mysql_backup_restores_into_a_new_database", |c| Box::pin(data::backup_and_restore(c, Engine::Mysql, "10.11"))),
            ("postgres_backups_in_a_bucket_retained_and_restored_in_another_namespace", |c| {
                Box::pin(data::backups_in_object_storage(c, Engine::Postgres, "15"))
            }),
            ("mysql_backups_in_a_bucket_retained_and_restored_in_another_namespace", |c| {
                Box::pin(data::backups_in_object_storage(c, Engine::Mysql, "11.8"))
            }),
            ("etcd_elects_its_leader_and_changes_membership_safely", |c| {
                Box::pin(consensus::elects_its_leader_and_changes_membership_safely(c))
            }),
            ("etcd_snapshot_restores_into_a_new_three_member_cluster", |c| Box::pin(consensus::snapshot_restores_into_a_new_cluster(c))),
            ("postgres_serves_tls_with_its_own_authority_and_replicates_over_it", |c| {
                Box::pin(tls::sql_engine_serves_tls(c, Engine::Postgres, "17", tls::Issuer::Own))
            }),
            ("mysql_serves_tls_with_its_own_authority_and_replicates_over_it", |c| {
                Box::pin(tls::sql_engine_serves_tls(c, Engine::Mysql, "11.8", tls::Issuer::Own))
            }),
            ("postgres_serves_tls_from_a_cert_manager_issuer_and_replicates_over_it", |c| {
                Box::pin(tls::sql_engine_serves_tls(c, Engine::Postgres, "17", tls::Issuer::CertManager))
            }),
            ("etcd_members_and_clients_speak_tls_and_the_leader_is_asked_over_it", |c| Box::pin(tls::etcd_serves_tls(c))),
            ("postgres_deletion_retains_or_removes_volumes_by_policy", |c| Box::pin(data::deletion_policies(c))),
            ("postgres_scaled_by_kubectl_then_by_a_horizontal_pod_autoscaler_on_cpu", |c| {
                Box::pin(autoscaling::scaled_by_kubectl_then_by_cpu(c))
            }),
            ("postgres_and_mysql_volumes_grow_online_before_they_fill_on_storage_that_grows", |c| {
                Box::pin(growth::volumes_grow_before_they_fill(c))
            }),
            ("postgres_and_mysql_transaction_left_open_and_connections_near_the_limit_named_before_an_outage", |c| {
                Box::pin(anomalies::named_before_an_outage(c))
            }),
            ("postgres_and_mysql_members_spread_over_nodes_and_zones_and_volumes_grow_when_allowed", |c| {
                Box::pin(placement::spread_and_volume_growth(c))
            }),
        ],
    )
}

/// Three members become Ready by their real probes; a row written through the
/// read-write Service is on every member; the Secret's password is the one the
/// engine accepts, and another is refused.
async fn members_replicate(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = format!("{}-replication", engine.name());
    cluster.apply_database(&ns, database("orders", engine, version, 3, json!({}))).await.expect("apply");
    cluster.wait_database(&ns, "orders", "3 members Ready", WAIT, |d| is_running(d, 3)).await.expect("running");

    let client = Arc::new(Client::new(&cluster, engine, &ns, "orders").await);
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;
    client.query(&primary, "INSERT INTO orders VALUES (1, 'written to the primary')").await.expect("insert");

    let members = client.members().await;
    assert_eq!(members.len(), 3);
    // Preferred spreading (the default) with three nodes free: one member on each.
    let mut placed: Vec<String> = members.iter().map(nodes::node_of).collect();
    placed.sort();
    placed.dedup();
    assert_eq!(placed.len(), 3, "members on three different nodes: {placed:?}");
    for pod in &members {
        let rows =
            client.eventually(&pod_ip(pod), "SELECT item FROM orders WHERE id = 1", Duration::from_secs(30), |r| !r.is_empty()).await;
        assert_eq!(rows, "written to the primary", "on {}", kube::ResourceExt::name_any(pod));
    }
    let replica_sql = match engine {
        Engine::Postgres => "SELECT pg_is_in_recovery()",
        Engine::Mysql => "SELECT @@read_only",
    };
    for pod in &members[1..] {
        let in_recovery = client.query(&pod_ip(pod), replica_sql).await.expect("replica state");
        assert!(in_recovery == "t" || in_recovery == "1", "{} follows the primary: {in_recovery}", kube::ResourceExt::name_any(pod));
    }

    let wrong = client.query_as(&primary, "not-the-password", "SELECT 1").await;
    assert!(wrong.is_err(), "a wrong password is refused: {wrong:?}");

    // The member agents are asked every half minute: each replica's lag reaches status.members.
    let lags = |d: &Database| -> Vec<Option<String>> {
        d.status.iter().flat_map(|s| &s.members).filter(|m| m.role == "replica").map(|m| m.lag.clone()).collect()
    };
    let db = cluster
        .wait_database(&ns, "orders", "each replica's lag in status.members", WAIT, |d| {
            lags(d).len() == 2 && lags(d).iter().all(Option::is_some)
        })
        .await
        .expect("the replicas' lag");
    eprintln!("{ns}: the replicas say they lag {:?}", lags(&db));
    members_are_measured(&client.members().await, &ns, engine).await;
    exporters_are_watched(&cluster, &client, &ns, engine).await;

    // `kubectl plugdb status`: the plugdb binary under the kubectl plugin's name, against
    // this cluster through KUBECONFIG, shows each member where it runs, in its role, and a replica's lag.
    let screen = kubectl_plugdb(&cluster, &["status", "orders", "--namespace", &ns]);
    assert!(screen.starts_with(&format!("Database {ns}/orders: {} {version}, Running", engine.name())), "{screen}");
    assert!(screen.contains("members:  3/3 ready, primary orders-0"), "{screen}");
    for pod in &members {
        let name = kube::ResourceExt::name_any(pod);
        let row = screen.lines().find(|l| l.trim_start().starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {screen}"));
        let role = if name == "orders-0" { "primary" } else { "replica" };
        assert!(row.contains(&nodes::node_of(pod)) && row.contains(role) && row.contains("yes"), "{row}");
        let said = db.status.iter().flat_map(|s| &s.members).find(|m| m.pod == name);
        let lag = said.and_then(|m| m.lag.clone());
        assert!(lag.is_none_or(|lag| row.contains(&lag)), "{row}");
        // How full its data volume is, as its agent measured it.
        let volume = said.and_then(|m| m.volume.clone()).unwrap_or_else(|| panic!("{name}: its volume in status.members"));
        // Its size as status said it; how full it is may have moved a percent since.
        let size = volume.split_once("% of ").map(|(_, size)| size).unwrap_or_else(|| panic!("{name}: {volume}"));
        assert!(row.contains(&format!("% of {size}")), "{volume}: {row}");
        // What its agent last saw of its exporter.
        assert!(row.ends_with(" up"), "its exporter reaches its engine: {row}");
    }
    let help = kubectl_plugdb(&cluster, &["status", "--help"]);
    assert!(help.contains("kubectl plugdb status"), "{help}");

    // A planned switchover under a writer: the member asked for leads once it has all the
    // fenced primary wrote, no acknowledged write is lost, the old primary follows it.
    // Every member is asked to take a write throughout (a postgres session turning the
    // read-only default off first): the fenced primary takes none once the other may.
    let probes = nodes::Writers::start(client.clone(), engine).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1000, stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let uid_of = |pods: Vec<k8s_openapi::api::core::v1::Pod>, name: &str| {
        pods.into_iter().find(|p| p.name_any() == name).and_then(|p| p.metadata.uid).expect("a member's uid")
    };
    let bystander = uid_of(client.members().await, "orders-1");
    let target = uid_of(client.members().await, "orders-2");
    let asked = Instant::now();
    let said = plugdb(&cluster, &["switchover", "orders", "2", "--namespace", &ns]).await;
    assert!(said.starts_with(&format!("orders-2 leads Database {ns}/orders")), "{said}");
    let led = |d: &Database| d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some("orders-2");
    cluster
        .wait_database(&ns, "orders", "orders-2 primary, the request removed", WAIT, |d| {
            led(d) && !d.annotations().contains_key(SWITCHOVER)
        })
        .await
        .expect("switched over");
    let switched = asked.elapsed();
    cluster.wait_database(&ns, "orders", "3 members Ready", WAIT, |d| is_running(d, 3)).await.expect("the old primary follows");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (written, longest) = nodes::no_acknowledged_write_lost(&client, &stop, writer).await;
    let (turns, took) = probes.turns().await;
    assert_eq!(turns, ["orders-0", "orders-2"], "the members that took writes, in turn");
    let leader = pod_ip(&client.members().await.into_iter().find(|p| p.name_any() == "orders-2").expect("orders-2"));
    let lost = nodes::Writers::lost(&client, &leader, &took).await;
    assert!(lost.is_empty(), "acknowledged by a member, then lost: {lost:?}");
    let old = client.members().await.into_iter().find(|p| p.name_any() == "orders-0").expect("orders-0");
    let follows = client.query(&pod_ip(&old), replica_sql).await.expect("replica state");
    assert!(follows == "t" || follows == "1", "the old primary follows the new one: {follows}");
    let events = Api::<Event>::namespaced(cluster.client.clone(), &ns).list(&ListParams::default()).await.expect("events").items;
    let said: Vec<String> =
        events.iter().filter(|e| e.reason.as_deref() == Some("SwitchoverPromoted")).filter_map(|e| e.note.clone()).collect();
    assert!(said.iter().any(|n| n.contains("orders-0 fenced") && n.contains("promoting orders-2")), "{said:?}");
    // orders-1 follows orders-2 at once, told by its agent, and is not restarted to.
    assert!(said.iter().any(|n| n.ends_with("; 1 of 1 replicas told to follow it")), "{said:?}");
    assert_eq!(uid_of(client.members().await, "orders-1"), bystander, "orders-1 runs on as it was");
    // orders-2 was promoted in place by its agent, not restarted to lead.
    assert_eq!(uid_of(client.members().await, "orders-2"), target, "orders-2 leads as it ran");
    eprintln!(
        "{ns}: switchover to orders-2 in {switched:?}, writes unavailable at most {longest:?}; {written} acknowledged writes, none lost; \
         every member asked directly: {} writes taken, by orders-0 then orders-2 alone, none lost",
        took.len()
    );
    if engine == Engine::Postgres {
        second_primary(&cluster, &client, &ns).await;
        replica_not_replicating(&cluster, &client, &ns).await;
    }
    network::members_reached_as_allowed(&cluster, &client, engine, &ns).await;
}

/// Each member's agent serves its series to anyone who scrapes its pod's metrics port
/// (the one its annotations name): up, in the role it has, a replica's lag, and its data
/// volume's size and use, labelled with the Database, the engine and the member.
async fn members_are_measured(members: &[k8s_openapi::api::core::v1::Pod], ns: &str, engine: Engine) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for pod in members {
        let name = pod.name_any();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let port = annotations.get("prometheus.io/port").and_then(|p| p.parse::<u16>().ok()).expect("the metrics port, annotated");
        assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"), "{name}");
        let mut stream = tokio::net::TcpStream::connect((pod_ip(pod).as_str(), port)).await.expect("the metrics port answers");
        stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: member\r\n\r\n").await.expect("asked");
        let mut scraped = String::new();
        stream.read_to_string(&mut scraped).await.expect("the series");
        let role = if name == "orders-0" { "primary" } else { "replica" };
        let labels = format!(r#"{{namespace="{ns}",database="orders",engine="{}",member="{name}",role="{role}"}}"#, engine.name());
        let value = |series: &str| -> Option<f64> {
            let line = scraped.lines().find(|l| l.starts_with(&format!("plugdb_member_{series}{labels} ")))?;
            line.rsplit(' ').next()?.parse().ok()
        };
        assert_eq!(value("up"), Some(1.0), "{name}: {scraped}");
        assert_eq!(value("fenced"), Some(0.0), "{name}: {scraped}");
        assert_eq!(value("replication_lag_seconds").is_some(), role == "replica", "{name}: {scraped}");
        let (size, used) = (value("volume_size_bytes").unwrap_or_default(), value("volume_used_bytes").unwrap_or_default());
        assert!(size > 0.0 && used > 0.0 && used <= size, "{name}: {used} of {size} bytes: {scraped}");
        // The engine's own, from its exporter, logged in as the monitoring user: a
        // replica's say it is one.
        let series = match engine {
            Engine::Postgres => plugdb_tests::scenario::engine_series(pod, "pg_up 1").await,
            Engine::Mysql => plugdb_tests::scenario::engine_series(pod, "mysql_up 1").await,
        };
        let replica = match engine {
            Engine::Postgres => "pg_replication_is_replica 1",
            Engine::Mysql => "mysql_slave_status_slave_io_running",
        };
        assert_eq!(series.lines().any(|l| l.starts_with(replica)), role == "replica", "{name}: {replica}: {series}");
    }
    eprintln!("{ns}: every member's series scraped from its metrics port, and its engine's from its exporter");
}

/// Each member's agent looks at its engine's exporter: `EngineMetrics` is True while every
/// exporter reaches its engine. postgres: the monitoring user's password changed by hand
/// (what the exporter logs in with no longer works), every member's status and the
/// condition name its exporter as unable to reach its engine, until the password is back.
/// mysql: the exporter's process killed, it is started again inside its container, which
/// never ends: the member stays ready (an exporter never takes its member out of its
/// Services) and no container restarts.
async fn exporters_are_watched(cluster: &Arc<Cluster>, client: &Client, ns: &str, engine: Engine) {
    let engine_metrics = |ok: &'static str, reason: &'static str| {
        move |d: &Database| {
            let found = d.status.iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "EngineMetrics");
            found.is_some_and(|c| c.status == ok && c.reason == reason)
        }
    };
    cluster.wait_database(ns, "orders", "EngineMetrics True", WAIT, engine_metrics("True", "ExportersUp")).await.expect("exporters up");
    let members = client.members().await;
    match engine {
        Engine::Postgres => {
            let primary = members.iter().find(|p| p.name_any() == "orders-0").expect("orders-0");
            let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(cluster.client.clone(), ns);
            let credentials = secret.get("orders-credentials").await.expect("the credentials");
            let key = credentials.data.as_ref().and_then(|d| d.get("monitor-password")).expect("monitor-password");
            let password = String::from_utf8(key.0.clone()).expect("text");
            let broke = Instant::now();
            client.administer(primary, "ALTER ROLE plugdb_monitor PASSWORD 'not-the-one'").await.expect("the password changed");
            // The exporters' sessions, logged in before, end: each logs in again, and cannot.
            let ended = "SELECT count(pg_terminate_backend(pid)) >= 0 FROM pg_stat_activity WHERE usename = 'plugdb_monitor'";
            let verifier = "SELECT rolpassword FROM pg_authid WHERE rolname = 'plugdb_monitor'";
            let changed = client.administer(primary, verifier).await.expect("the new verifier");
            for member in &members {
                client.eventually_administered(member, verifier, Duration::from_secs(30), |v| v == changed).await;
                client.administer(member, ended).await.expect("the exporter's session ended");
            }
            let db = cluster
                .wait_database(ns, "orders", "EngineMetrics False", WAIT, engine_metrics("False", "ExporterDown"))
                .await
                .expect("the exporters named");
            let condition = db.status.iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "EngineMetrics").expect("condition");
            assert!(condition.message.contains("its exporter cannot reach its engine"), "{}", condition.message);
            let said: Vec<Option<String>> = db.status.iter().flat_map(|s| &s.members).map(|m| m.exporter.clone()).collect();
            assert!(said.contains(&Some("cannot reach its engine".into())), "{said:?}");
            eprintln!("{ns}: an exporter that cannot log in named {:.0} s after its password changed", broke.elapsed().as_secs_f64());
            let back = format!("ALTER ROLE plugdb_monitor PASSWORD '{}'", password.replace('\'', "''"));
            client.administer(primary, &back).await.expect("the password back");
            cluster.wait_database(ns, "orders", "EngineMetrics True again", WAIT, engine_metrics("True", "ExportersUp")).await.expect("up");
        }
        Engine::Mysql => {
            let replica = members.iter().find(|p| p.name_any() == "orders-1").expect("orders-1");
            plugdb_tests::scenario::signal_container(replica, "exporter", "mysqld_exporter", "KILL");
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cluster.client.clone(), ns);
            for _ in 0..10 {
                let pod = pods.get("orders-1").await.expect("orders-1");
                let ready = pod.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True");
                let restarts: i32 = pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum();
                assert!(ready && restarts == 0, "orders-1 stays ready with no container restarted: {:?}", pod.status);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            plugdb_tests::scenario::engine_series(replica, "mysql_up 1").await;
            eprintln!("{ns}: an exporter killed is started again in its container; its member stayed ready");
        }
    }
}

/// A replica whose stream breaks (the administrator took the replication role's login and
/// ended orders-0's stream) still answers, so its pod stays ready: the operator's looks
/// find it streams nothing and it is named (`Degraded`, the member down with why), a
/// switchover to it is refused before the primary is fenced, and it is restarted; once
/// it can log in again it streams, and the Database is whole.
async fn replica_not_replicating(cluster: &Arc<Cluster>, client: &Client, ns: &str) {
    let leader = client.members().await.into_iter().find(|p| p.name_any() == "orders-2").expect("orders-2");
    let primary = pod_ip(&leader);
    client.administer(&leader, "ALTER ROLE replicator NOLOGIN").await.expect("the replication role loses its login");
    let ended = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication WHERE application_name = 'orders-0'";
    assert_eq!(client.administer(&leader, ended).await.as_deref(), Ok("1"), "orders-0's stream ended");
    // A write it does not receive: it is behind, not merely idle.
    client.query(&primary, "INSERT INTO orders VALUES (2999999, 'not received')").await.expect("a write");
    let started = Instant::now();
    let named = |d: &Database| {
        d.status.iter().flat_map(|s| &s.conditions).any(|c| {
            c.type_ == "Degraded" && c.status == "True" && c.message.contains("orders-0: ready, but it has not replicated from orders-2")
        })
    };
    cluster.wait_database(ns, "orders", "orders-0 named as not replicating", WAIT, named).await.expect("named");
    let found = started.elapsed();
    let (c, args) = (cluster.clone(), ["switchover", "orders", "0", "--namespace", ns].map(str::to_string));
    let asked = tokio::task::spawn_blocking(move || kubectl_plugdb_with(&c, &args.each_ref().map(String::as_str), None)).await;
    assert!(asked.is_err(), "a switchover to a replica that does not replicate is refused");
    client
        .query(&primary, "INSERT INTO orders VALUES (3000000, 'the primary was not fenced')")
        .await
        .expect("the primary still takes writes");
    // Half a minute after it is named, it is made again (restarted), with a Warning.
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns);
    let remade = |e: &Event| {
        e.reason.as_deref() == Some("MemberRestarted")
            && e.type_.as_deref() == Some("Warning")
            && e.note.as_deref().is_some_and(|n| n.starts_with("restarted orders-0 to make it again"))
    };
    let deadline = Instant::now() + WAIT;
    while !events.list(&ListParams::default()).await.expect("events").items.iter().any(remade) {
        assert!(Instant::now() < deadline, "orders-0 is made again within {WAIT:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    client.administer(&leader, "ALTER ROLE replicator LOGIN").await.expect("the replication role logs in again");
    let whole = |d: &Database| is_running(d, 3) && !named(d) && d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some("orders-2");
    cluster.wait_database(ns, "orders", "orders-0 streams again, 3 members Ready", WAIT, whole).await.expect("whole again");
    let back = pod_ip(&client.members().await.into_iter().find(|p| p.name_any() == "orders-0").expect("orders-0"));
    let rows = client.eventually(&back, "SELECT item FROM orders WHERE id = 3000000", Duration::from_secs(60), |r| !r.is_empty()).await;
    assert_eq!(rows, "the primary was not fenced");
    eprintln!("{ns}: a replica that streams nothing named {found:?} after its stream ended, made again, and whole once it logs in");
}

/// A replica promoted behind the operator's back (`pg_promote()`, run by someone with the
/// superuser inside the member) takes writes of its own: the operator's next look at the members fences it
/// and names it (`Degraded`, `SecondPrimary`, a Warning), it takes no more (no session
/// but its agent's gets in), and it is made again to follow the primary.
async fn second_primary(cluster: &Arc<Cluster>, client: &Client, ns: &str) {
    let rogue = client.members().await.into_iter().find(|p| p.name_any() == "orders-1").expect("orders-1");
    let ip = pod_ip(&rogue);
    assert_eq!(client.administer(&rogue, "SELECT pg_promote()").await.as_deref(), Ok("t"), "promoted behind the operator's back");
    client.query(&ip, "INSERT INTO orders VALUES (2000000, 'taken by a second primary')").await.expect("a second primary takes writes");
    let named = |d: &Database| {
        d.status.iter().flat_map(|s| &s.conditions).any(|c| {
            c.type_ == "Degraded"
                && c.status == "True"
                && c.reason == "SecondPrimary"
                && c.message.starts_with("orders-1 says it takes writes")
        })
    };
    let started = Instant::now();
    cluster.wait_database(ns, "orders", "the second primary named", WAIT, named).await.expect("named");
    let found = started.elapsed();
    let forced =
        "SET default_transaction_read_only = off; BEGIN READ WRITE; INSERT INTO orders VALUES (2000001, 'after the fence'); COMMIT";
    let after = client.query(&ip, forced).await;
    assert!(after.as_ref().is_err_and(|e| e.contains("no pg_hba.conf entry")), "a fenced second primary lets no session in: {after:?}");
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("SecondPrimary") && e.type_.as_deref() == Some("Warning")),
        "a Warning says it"
    );
    cluster.wait_database(ns, "orders", "3 members Ready, orders-2 primary", WAIT, |d| is_running(d, 3)).await.expect("it follows again");
    let primary = cluster
        .wait_database(ns, "orders", "orders-2 leads", WAIT, |d| d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some("orders-2"))
        .await;
    assert!(primary.is_ok(), "the primary stays");
    eprintln!("{ns}: a second primary fenced and named {found:?} after it took a write");
}

/// [`kubectl_plugdb`] off the async runtime's threads: a command may wait minutes.
pub async fn plugdb(cluster: &Arc<Cluster>, args: &[&str]) -> String {
    plugdb_with_input(cluster, args, None).await
}

/// [`plugdb`] with `input` on the command's standard input (a pipe, not a terminal).
pub async fn plugdb_with_input(cluster: &Arc<Cluster>, args: &[&str], input: Option<&str>) -> String {
    let (cluster, input) = (cluster.clone(), input.map(str::to_string));
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    tokio::task::spawn_blocking(move || kubectl_plugdb_with(&cluster, &args.iter().map(String::as_str).collect::<Vec<_>>(), input))
        .await
        .expect("kubectl-plugdb")
}

/// Runs the plugdb binary as the kubectl plugin `kubectl-plugdb` (a link to it, as a
/// user installs it) with `args`, against the cluster's kubeconfig; its output.
fn kubectl_plugdb(cluster: &Cluster, args: &[&str]) -> String {
    kubectl_plugdb_with(cluster, args, None)
}

/// [`kubectl_plugdb`] with `input` on its standard input; kubectl is the cluster's own.
fn kubectl_plugdb_with(cluster: &Cluster, args: &[&str], input: Option<String>) -> String {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("a directory");
    let plugin = dir.path().join("kubectl-plugdb");
    std::os::unix::fs::symlink(plugdb_tests::plugdb_binary(), &plugin).expect("a link");
    let kubectl = plugdb_tests::control_plane::binaries_dir().expect("the Kubernetes binaries").join("kubectl");
    let mut child = std::process::Command::new(&plugin)
        .args(args)
        .env("KUBECONFIG", cluster.backing.kubeconfig())
        .env("KUBECTL", kubectl)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl-plugdb runs");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).expect("input");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("kubectl-plugdb ends");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "kubectl-plugdb {args:?}: {said}{}", String::from_utf8_lossy(&out.stderr));
    said
}

/// While the node runs, the machine's own network namespace holds only the harness's
/// veth end, its /30 and the pod range through it (no route to Services, no iptables
/// rules), and the
/// kernel settings the kubelet rewrites are changed only while it runs.
async fn contained(_cluster: Arc<Cluster>) {
    let before = harness::MACHINE_BEFORE.get().expect("taken before the node started");
    let difference = plugdb_tests::node::state_difference(before, &plugdb_tests::node::machine_state());
    let unexpected: Vec<&String> = difference
        .iter()
        .filter(|l| !(l.contains(plugdb_tests::node::VETH_HOST) || l.contains("10.201.0.") || l.contains(plugdb_tests::node::NETNS)))
        // Pods' own sandbox namespaces (containerd names them under /run/netns); removed at teardown.
        .filter(|l| !l.starts_with("+ cni-"))
        // The kubelet's global kernel settings: put back at teardown (the harness checks).
        .filter(|l| !plugdb_tests::node::GLOBAL_SYSCTLS.iter().any(|k| l[2..].starts_with(&format!("{k} = "))))
        .collect();
    assert!(unexpected.is_empty(), "the node changed the machine's namespace: {unexpected:#?}");
    assert!(difference.iter().any(|l| l.contains(plugdb_tests::node::VETH_HOST)), "the veth is there: {difference:#?}");
    let routes: Vec<&String> = difference.iter().filter(|l| l.contains(" via ") || l.contains(plugdb_tests::node::SERVICE_CIDR)).collect();
    let pods_through_the_veth = |l: &&String| l.contains(plugdb_tests::node::POD_CIDR) && l.contains(plugdb_tests::node::VETH_HOST);
    assert!(routes.iter().all(pods_through_the_veth), "the only route added is the pod range through the veth: {routes:#?}");
}
