//! Plugin calls off the async executor. Each call runs on a blocking thread, at most
//! `total` at once and at most `per_engine` for one engine: a plugin that spends its
//! whole deadline on every call delays only its own engine's reconciles, never the
//! others', the health endpoints or the lease renewal. The bound also caps the memory
//! plugin calls can hold at once (`total` × the per-call memory cap).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::Plugin;

/// The bounded set of threads plugin calls run on.
#[derive(Debug)]
pub struct CallPool {
    total: Arc<Semaphore>,
    per_engine: usize,
    engines: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl CallPool {
    /// At most `total` calls at once, `per_engine` of them for one engine (both ≥ 1).
    pub fn new(total: usize, per_engine: usize) -> Self {
        Self { total: Arc::new(Semaphore::new(total.max(1))), per_engine: per_engine.max(1), engines: Mutex::default() }
    }

    fn engine(&self, engine: &str) -> Arc<Semaphore> {
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        engines.entry(engine.to_string()).or_insert_with(|| Arc::new(Semaphore::new(self.per_engine))).clone()
    }

    /// Runs `call` on `plugin` on a blocking thread once its engine and the pool have
    /// room. The slots are held until the call itself ends, even if the caller gives up.
    pub async fn run<T: Send + 'static>(&self, plugin: &Plugin, call: impl FnOnce(&Plugin) -> T + Send + 'static) -> T {
        let engine = self.engine(&plugin.info().engine).acquire_owned().await.expect("the engine's semaphore is never closed");
        let slot = self.total.clone().acquire_owned().await.expect("the pool's semaphore is never closed");
        let plugin = plugin.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _held = (engine, slot);
            call(&plugin)
        });
        match task.await {
            Ok(value) => value,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a plugin call was cancelled: {e}"),
        }
    }
}
