//! Kubernetes Events (`events.k8s.io/v1`) about the objects the operator manages.
//!
//! A repeat of the same Event — same object, type, reason, related object and note —
//! within [`SERIES_WINDOW`] updates the first one's `series` (count, last seen) instead
//! of creating another. Unlike kube's `Recorder`, the note is part of that identity:
//! two refusals with different messages are two Events, each showing its own text.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::Mutex;

/// How long a repeat joins the earlier Event's series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Longest note kept (the API server refuses notes over 1 kB).
pub const MAX_NOTE: usize = 1000;
/// Most Event series remembered at once; the oldest are forgotten first.
const MAX_REMEMBERED: usize = 4096;

/// What makes two Events the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>, Option<String>),
    related: Option<(Option<String>, Option<String>, Option<String>)>,
    warning: bool,
    reason: String,
    note: String,
}

/// An Event already published: its name, how often it happened, when last.
#[derive(Debug, Clone)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events as `controller` (instance `POD_NAME` when set) taking `action`.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    action: String,
    published: Mutex<HashMap<Key, Published>>,
}

impl Recorder {
    /// A recorder that reports as `controller`, whose Events' action is `action`.
    pub fn new(client: Client, controller: &str, action: &str) -> Self {
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| controller.to_string());
        Self { client, controller: controller.into(), instance, action: action.into(), published: Mutex::default() }
    }

    /// The note of the newest Event with `reason` about `regarding` (that exact object:
    /// its uid), whoever published it: one list of the Events with that reason in its
    /// namespace.
    pub async fn newest_note(&self, regarding: &ObjectReference, reason: &str) -> Result<Option<String>, kube::Error> {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let events = api.list(&ListParams::default().fields(&format!("reason={reason}"))).await?;
        let about = |e: &Event| e.regarding.as_ref().is_some_and(|r| r.uid.is_some() && r.uid == regarding.uid);
        let seen = |e: &Event| e.series.as_ref().map(|s| s.last_observed_time.0).or(e.event_time.as_ref().map(|t| t.0));
        Ok(events.items.into_iter().filter(about).max_by_key(seen).and_then(|e| e.note))
    }

    /// Publishes an Event about `regarding` (and optionally `related`); `note` is cut to
    /// [`MAX_NOTE`] bytes on a character boundary.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let note = crate::said::bounded(note, MAX_NOTE);
        let key = Key {
            regarding: (regarding.namespace.clone(), regarding.name.clone(), regarding.uid.clone(), regarding.kind.clone()),
            related: related.map(|r| (r.namespace.clone(), r.name.clone(), r.kind.clone())),
            warning,
            reason: reason.into(),
            note: note.clone(),
        };
        let now = Timestamp::now();
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let mut published = self.published.lock().await;
        published.retain(|_, p| now.duration_since(p.last).as_secs() < SERIES_WINDOW.as_secs() as i64);
        if let Some(earlier) = published.get_mut(&key) {
            earlier.count += 1;
            earlier.last = now;
            let series = EventSeries { count: earlier.count, last_observed_time: MicroTime(now) };
            let patch = serde_json::json!({"series": series});
            api.patch(&earlier.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            return Ok(());
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", regarding.name.as_deref().unwrap_or(&self.controller), now.as_nanosecond())),
                namespace: Some(namespace),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(self.action.clone()),
            reason: Some(reason.into()),
            note: Some(note),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            regarding: Some(regarding.clone()),
            related: related.cloned(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let created = api.create(&PostParams::default(), &event).await?;
        if published.len() >= MAX_REMEMBERED
            && let Some(oldest) = published.iter().min_by_key(|(_, p)| p.last).map(|(k, _)| k.clone())
        {
            published.remove(&oldest);
        }
        published.insert(key, Published { name: created.metadata.name.unwrap_or_default(), count: 1, last: now });
        Ok(())
    }
}
