//! Plugin calls off the async executor. Each call runs on a blocking thread, at most
//! `total` at once and at most `per_engine` for one engine: a plugin that spends its
//! whole deadline on every call delays only its own engine's reconciles, never the
//! others', the health endpoints or the lease renewal. The bound also caps the memory
//! plugin calls can hold at once (`total` × the per-call memory cap).
//!
//! An engine's calls may also only queue so deep (`QUEUE_PER_THREAD` × `per_engine`,
//! running or waiting): a caller beyond that is told its engine is [`Busy`] at once
//! instead of waiting. Callers are reconciles, and a reconcile waiting here holds one
//! of the controller's reconcile slots: without the bound, a slow engine with more
//! Databases than slots would hold every slot and starve the other engines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::Plugin;

/// Calls of one engine running or waiting, per thread the engine may use.
const QUEUE_PER_THREAD: usize = 2;

/// The bounded set of threads plugin calls run on.
#[derive(Debug)]
pub struct CallPool {
    total: Arc<Semaphore>,
    per_engine: usize,
    engines: Mutex<HashMap<String, Share>>,
}

/// One engine's share of the pool: its threads, and how many of its calls are in.
#[derive(Debug, Clone)]
struct Share {
    threads: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
}

/// An engine already has as many calls running or waiting as it may: try again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {engine} plugin already has {queued} calls running or waiting; tried again shortly")]
pub struct Busy {
    /// Engine name.
    pub engine: String,
    /// Its calls running or waiting.
    pub queued: usize,
}

/// A place in an engine's queue, given back when dropped.
struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl CallPool {
    /// At most `total` calls at once, `per_engine` of them for one engine (both ≥ 1).
    pub fn new(total: usize, per_engine: usize) -> Self {
        Self { total: Arc::new(Semaphore::new(total.max(1))), per_engine: per_engine.max(1), engines: Mutex::default() }
    }

    fn share(&self, engine: &str) -> Share {
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        engines
            .entry(engine.to_string())
            .or_insert_with(|| Share { threads: Arc::new(Semaphore::new(self.per_engine)), queued: Arc::default() })
            .clone()
    }

    /// Runs `call` on `plugin` on a blocking thread once its engine and the pool have
    /// room, or says the engine is [`Busy`] when its queue is full. The slots are held
    /// until the call itself ends, even if the caller gives up.
    pub async fn run<T: Send + 'static>(&self, plugin: &Plugin, call: impl FnOnce(&Plugin) -> T + Send + 'static) -> Result<T, Busy> {
        let engine = &plugin.info().engine;
        let share = self.share(engine);
        let depth = QUEUE_PER_THREAD * self.per_engine;
        let queued = share.queued.fetch_add(1, Ordering::AcqRel);
        let ticket = Ticket(share.queued.clone());
        if queued >= depth {
            return Err(Busy { engine: engine.clone(), queued });
        }
        let thread = share.threads.acquire_owned().await.expect("the engine's semaphore is never closed");
        let slot = self.total.clone().acquire_owned().await.expect("the pool's semaphore is never closed");
        let plugin = plugin.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _held = (ticket, thread, slot);
            call(&plugin)
        });
        match task.await {
            Ok(value) => Ok(value),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a plugin call was cancelled: {e}"),
        }
    }
}
