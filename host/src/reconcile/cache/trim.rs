//! What each cache keeps of an object: what a pass reads of its kind, and nothing else.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, Node, NodeSpec, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, Pod, PodSpec, PodStatus, Secret, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::LAST_APPLIED;
use crate::crd::Database;
use crate::names::{
    APPLIED_HASH, FENCED, FOLLOWS, INSTANCE_LABEL, MANAGED_BY_LABEL, NAME_LABEL, PRIMARY_ANNOTATION, PROMOTED, REPLACES, REVISION_LABEL,
    ROLE_FREE_HASH, ROLE_LABEL, SYNCHRONOUS,
};
use crate::reconcile::owner;
use crate::stamp::{self, Stamper};
use crate::tls;

pub(super) fn no_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// A Database as the reconciler reads it: without who manages which field, and
/// without the copy of the whole manifest `kubectl apply` keeps in an annotation.
pub(in crate::reconcile) fn database_essentials(db: &mut Database) {
    no_managed_fields(db);
    if let Some(annotations) = &mut db.metadata.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

/// Metadata reduced to what a pass reads: name, namespace, uid, version, generation,
/// when it was made and is being deleted, the `annotations` and `labels` named, and the
/// controller reference (what the controller maps a change back to its Database by).
/// Managed fields are left as they are.
fn meta_essentials(meta: &mut ObjectMeta, annotations: &[&str], labels: &[&str]) {
    let only = |map: Option<BTreeMap<String, String>>, keys: &[&str]| {
        let kept: BTreeMap<String, String> = map.into_iter().flatten().filter(|(k, _)| keys.contains(&k.as_str())).collect();
        (!kept.is_empty()).then_some(kept)
    };
    let controller = owner::controller(meta).map(|c| OwnerReference {
        api_version: c.api_version.clone(),
        kind: c.kind.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
        controller: Some(true),
        ..Default::default()
    });
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        annotations: only(meta.annotations.take(), annotations),
        labels: only(meta.labels.take(), labels),
        managed_fields: meta.managed_fields.take(),
        owner_references: controller.map(|c| vec![c]),
        ..Default::default()
    };
}

/// A Secret as a pass reads it: the names of its keys (no values); the annotations
/// that say whose certificate it is, for which names, until when and how it was
/// applied; and, for one no Database controls (credentials kept after their Database
/// went), the labels that say which Database's it was and whether plugdb's stamp
/// holds (judged by `stamper` while the values are there).
pub(super) fn key_names_only(stamper: &Stamper, s: &mut Secret) {
    stamper.judge(s);
    no_managed_fields(s);
    let annotations = [APPLIED_HASH, tls::NOT_AFTER, tls::NAMES, tls::CERTIFICATE_NAME, crate::agent::CLIENTS_HASH, stamp::HELD];
    let labels: &[&str] = if owner::controller(&s.metadata).is_none() { &[MANAGED_BY_LABEL, INSTANCE_LABEL] } else { &[] };
    meta_essentials(&mut s.metadata, &annotations, labels);
    s.string_data = None;
    if let Some(data) = &mut s.data {
        data.values_mut().for_each(|v| v.0 = Vec::new());
    }
}

/// A volume claim as a pass reads it: whether it is bound, what it asks for and holds,
/// and the labels that say which Database's it is (a kept claim has no controller).
pub(super) fn claim_essentials(c: &mut PersistentVolumeClaim) {
    no_managed_fields(c);
    meta_essentials(&mut c.metadata, &[APPLIED_HASH], &[MANAGED_BY_LABEL, INSTANCE_LABEL]);
    let requests = c.spec.take().and_then(|s| s.resources).and_then(|r| r.requests);
    c.spec = Some(PersistentVolumeClaimSpec {
        resources: requests.map(|requests| VolumeResourceRequirements { requests: Some(requests), ..Default::default() }),
        ..Default::default()
    });
    c.status = c.status.take().map(|s| PersistentVolumeClaimStatus { phase: s.phase, capacity: s.capacity, ..Default::default() });
}

/// A node as a pass reads it: its name, and whether it is cordoned.
pub(super) fn node_essentials(n: &mut Node) {
    let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable);
    *n = Node {
        metadata: ObjectMeta { name: n.metadata.name.take(), resource_version: n.metadata.resource_version.take(), ..Default::default() },
        spec: Some(NodeSpec { unschedulable, ..Default::default() }),
        status: None,
    };
}

/// A pod as a pass reads it: the labels that say whose member it is, in which role and
/// revision; the annotations that say what it was rendered for and what its agent did
/// (fenced it, promoted it and whom it replaces, had it follow, or had commits wait for);
/// its Ready and PodScheduled conditions, phase, address and node; whether it runs the
/// member agent (that container, by name only);
/// and, for a container that is not ready, why not (no images, no ids, no spec, nothing
/// of a ready container: what a member costs is mostly what its pod is kept as).
pub(super) fn pod_essentials(p: &mut Pod) {
    no_managed_fields(p);
    let annotations = [PRIMARY_ANNOTATION, ROLE_FREE_HASH, FENCED, PROMOTED, REPLACES, FOLLOWS, SYNCHRONOUS];
    meta_essentials(&mut p.metadata, &annotations, &[NAME_LABEL, INSTANCE_LABEL, ROLE_LABEL, REVISION_LABEL]);
    p.spec = p.spec.take().map(|s| {
        let agent = s.containers.into_iter().find(|c| c.name == crate::build::agent::CONTAINER);
        let containers = agent.map(|c| vec![Container { name: c.name, ..Default::default() }]).unwrap_or_default();
        PodSpec { node_name: s.node_name, containers, ..Default::default() }
    });
    p.status = p.status.take().map(|s| {
        // Shrunk: a list filtered in place keeps its whole buffer.
        fn shrunk<T>(mut kept: Vec<T>) -> Vec<T> {
            kept.shrink_to_fit();
            kept
        }
        let conditions =
            s.conditions.map(|cs| shrunk(cs.into_iter().filter(|c| c.type_ == "Ready" || c.type_ == "PodScheduled").collect()));
        let unready = s.container_statuses.into_iter().flatten().filter(|c| !c.ready);
        let containers: Vec<_> = unready
            .map(|c| ContainerStatus {
                name: c.name,
                ready: c.ready,
                state: c.state.map(short_state),
                last_state: c.last_state.map(short_state),
                restart_count: c.restart_count,
                ..Default::default()
            })
            .collect();
        let containers = (!containers.is_empty()).then(|| shrunk(containers));
        PodStatus { conditions, phase: s.phase, pod_ip: s.pod_ip, container_statuses: containers, ..Default::default() }
    });
}

/// A container's state with its messages cut to what a condition shows: a waiting
/// reason's first 200 bytes, and the last 200 of what a container that ended said (its
/// log's end: its last words).
fn short_state(mut state: ContainerState) -> ContainerState {
    if let Some(text) = state.waiting.as_mut().and_then(|w| w.message.as_mut()) {
        let end = crate::said::cut(text, 200).len();
        text.truncate(end);
    }
    if let Some(text) = state.terminated.as_mut().and_then(|t| t.message.as_mut()) {
        *text = crate::said::last(text.trim_end(), 200).to_string();
    }
    state
}
