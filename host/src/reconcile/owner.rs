//! Whose an object with a child's name is. A Database creates, changes and deletes
//! only what is its own: an object that carries its controller reference (by uid) or,
//! for what plugdb keeps after a Database goes (credentials, its authority, backup Jobs,
//! volume claims), plugdb's labels for a Database of this name and no controller (and
//! for a Secret, plugdb's stamp: [`crate::stamp`]).
//! Anything else with a child's name — a user's object, another Database's — is left
//! untouched and stops the pass ([`Taken`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, OwnerReference};
use kube::ResourceExt;

use crate::build::Kind;
use crate::crd::Database;
use crate::names::{INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER};

/// An object with the name of one of a Database's children that is not the Database's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name} exists and is not this Database's: {why}")]
pub struct Taken {
    /// Its kind.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Whose it is instead.
    pub why: String,
}

/// Whether a kind of child may outlive its Database, and so be found again without a
/// controller reference by a Database of the same name.
fn may_be_kept(kind: Kind) -> bool {
    match kind {
        Kind::Secret | Kind::Job | Kind::PersistentVolumeClaim => true,
        Kind::ConfigMap | Kind::Service | Kind::StatefulSet | Kind::PodDisruptionBudget | Kind::NetworkPolicy => false,
    }
}

/// The name the API gives `kind`.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Secret => "Secret",
        Kind::ConfigMap => "ConfigMap",
        Kind::Service => "Service",
        Kind::StatefulSet => "StatefulSet",
        Kind::PodDisruptionBudget => "PodDisruptionBudget",
        Kind::NetworkPolicy => "NetworkPolicy",
        Kind::Job => "Job",
        Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
    }
}

/// The reference of the object's controller, if it has one.
pub fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// `Ok` when the existing object `kind` described by `meta` is `db`'s to write, else
/// what it is instead.
pub fn check(db: &Database, kind: Kind, meta: &ObjectMeta) -> Result<(), Taken> {
    check_as(db, kind_name(kind), may_be_kept(kind), meta)
}

/// [`check`] for an object of a kind the caches do not hold (cert-manager's
/// `Certificate`), named `kind`; `kept`: it may outlive its Database.
pub fn check_as(db: &Database, kind: &'static str, kept: bool, meta: &ObjectMeta) -> Result<(), Taken> {
    let why = match controller(meta) {
        Some(c) if db.uid().is_some_and(|uid| uid == c.uid) => return Ok(()),
        // A member's data claim, which the Database's StatefulSet may own (its claim
        // retention policy `Delete`).
        Some(c) if kept && c.kind == "StatefulSet" && c.name == db.name_any() => return Ok(()),
        Some(c) => format!("it is controlled by {} {}", c.kind, c.name),
        None => {
            let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str);
            let plugdbs = label(MANAGED_BY_LABEL) == Some(MANAGER);
            match label(INSTANCE_LABEL) {
                Some(instance) if plugdbs && instance == db.name_any() && kept && !stamp_missing(db, kind, meta) => return Ok(()),
                Some(instance) if plugdbs && instance == db.name_any() && kept => {
                    "it has plugdb's labels but not plugdb's stamp: plugdb did not make it, or it changed since".to_string()
                }
                Some(instance) if plugdbs => format!("plugdb made it for Database {instance}"),
                _ => "nothing controls it (not made by plugdb)".to_string(),
            }
        }
    };
    Err(Taken {
        kind,
        namespace: meta.namespace.clone().or_else(|| db.namespace()).unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        why,
    })
}

/// Whether `meta` describes a Secret whose stamp the operator did not find to hold
/// ([`crate::stamp`]). The certificate Secret cert-manager wrote for the Database (its
/// `<name>-tls`, annotated with that Certificate's name) is cert-manager's to check
/// against the issuer the user named; once `issuerRef` is removed it is only replaced.
fn stamp_missing(db: &Database, kind: &str, meta: &ObjectMeta) -> bool {
    let tls = crate::names::Names(&db.name_any()).tls();
    let certificate = meta.annotations.as_ref().and_then(|a| a.get(crate::tls::CERTIFICATE_NAME));
    let cert_managers = meta.name.as_ref() == Some(&tls) && certificate == Some(&tls);
    kind == "Secret" && !cert_managers && !crate::stamp::held(meta)
}

/// Whether `entry` holds the fields `MANAGER` set on the object itself (not a
/// subresource) by `operation` (`Update` for a create, or `Apply`).
pub fn set_by_us(entry: &ManagedFieldsEntry, operation: &str) -> bool {
    entry.manager.as_deref() == Some(MANAGER) && entry.operation.as_deref() == Some(operation) && entry.subresource.is_none()
}

/// Whether the existing object is `db`'s (see [`check`]).
pub fn is_ours(db: &Database, kind: Kind, meta: &ObjectMeta) -> bool {
    check(db, kind, meta).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(uid: &str) -> Database {
        let mut db: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop", "uid": uid},
            "spec": {"engine": "postgres", "storage": "1Gi"},
        }))
        .expect("a Database");
        db.metadata.uid = Some(uid.into());
        db
    }

    fn meta(controller: Option<(&str, &str, &str)>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("orders".into()),
            namespace: Some("shop".into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            owner_references: controller.map(|(kind, name, uid)| {
                vec![OwnerReference { kind: kind.into(), name: name.into(), uid: uid.into(), controller: Some(true), ..Default::default() }]
            }),
            ..Default::default()
        }
    }

    /// (what, kind, controller (kind, name, uid), labels, expected: None when ours, else the reason)
    type Row<'a> = (&'a str, Kind, Option<(&'a str, &'a str, &'a str)>, &'a [(&'a str, &'a str)], Option<&'a str>);

    #[test]
    fn only_the_databases_own_objects_and_what_plugdb_kept_for_its_name_are_its_own() {
        let db = database("u-1");
        let ours = [(MANAGED_BY_LABEL, MANAGER), (INSTANCE_LABEL, "orders")];
        let other = [(MANAGED_BY_LABEL, MANAGER), (INSTANCE_LABEL, "orders-replicas")];
        let mine = Some(("Database", "orders", "u-1"));
        let earlier = Some(("Database", "orders", "u-0"));
        let neighbour = Some(("Database", "coll", "u-2"));
        let rows: [Row; 10] = [
            ("its own Service", Kind::Service, mine, &ours, None),
            ("a user's Service", Kind::Service, None, &[], Some("nothing controls it (not made by plugdb)")),
            ("another Database's Service", Kind::Service, neighbour, &other, Some("it is controlled by Database coll")),
            ("a Service labelled as ours, no owner", Kind::Service, None, &ours, Some("plugdb made it for Database orders")),
            ("an earlier Database of the same name", Kind::ConfigMap, earlier, &ours, Some("it is controlled by Database orders")),
            ("credentials with plugdb's labels, unstamped", Kind::Secret, None, &ours, Some(UNSTAMPED)),
            ("a user's Secret", Kind::Secret, None, &[], Some("nothing controls it (not made by plugdb)")),
            ("credentials kept for another name", Kind::Secret, None, &other, Some("plugdb made it for Database orders-replicas")),
            ("a kept volume claim", Kind::PersistentVolumeClaim, None, &ours, None),
            ("a claim of its StatefulSet", Kind::PersistentVolumeClaim, Some(("StatefulSet", "orders", "s-1")), &ours, None),
        ];
        for (what, kind, controller, labels, expected) in rows {
            let got = check(&db, kind, &meta(controller, labels)).err().map(|t| t.why);
            assert_eq!(got.as_deref(), expected, "{what}");
        }
        // Kept credentials: the operator found its stamp to hold when it read them.
        let mut kept = meta(None, &ours);
        kept.annotations = Some([(crate::stamp::HELD.to_string(), "true".to_string())].into());
        assert_eq!(check(&db, Kind::Secret, &kept), Ok(()), "kept credentials, stamped");
        kept.labels = Some(other.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        assert!(check(&db, Kind::Secret, &kept).is_err(), "stamped for another Database's name");
        // What cert-manager wrote for the Database's certificate is cert-manager's to check;
        // its annotation makes no other Secret the Database's.
        let cert_managers = |name: &str| ObjectMeta {
            name: Some(name.into()),
            annotations: Some([(crate::tls::CERTIFICATE_NAME.to_string(), name.to_string())].into()),
            ..meta(None, &ours)
        };
        assert_eq!(check(&db, Kind::Secret, &cert_managers("orders-tls")), Ok(()), "cert-manager's certificate");
        assert!(check(&db, Kind::Secret, &cert_managers("orders-credentials")).is_err(), "credentials annotated as a certificate");
    }

    const UNSTAMPED: &str = "it has plugdb's labels but not plugdb's stamp: plugdb did not make it, or it changed since";

    #[test]
    fn the_message_names_the_object_and_whose_it_is() {
        let db = database("u-1");
        let taken = check(
            &db,
            Kind::Service,
            &ObjectMeta { name: Some("kubernetes".into()), namespace: Some("default".into()), ..Default::default() },
        )
        .expect_err("not ours");
        assert_eq!(
            taken.to_string(),
            "Service default/kubernetes exists and is not this Database's: nothing controls it (not made by plugdb)"
        );
    }
}
