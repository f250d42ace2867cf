//! The threads plugin calls run on: each call on its own thread, handed over only
//! with a pool slot, and a thread that a slow call lowered replaced by a new one.

use std::sync::mpsc::{SendError, Sender};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::lock;

/// A call for a thread, which says whether the thread serves on after it.
type Job = Box<dyn FnOnce() -> bool + Send>;

/// Threads that run plugin calls, started with the pool and ended with it (a thread
/// whose sender is gone ends). A call is handed over only once it holds a slot of the
/// pool, so a thread is always free for it.
///
/// The thread that finished last takes the next call: its caches are warm.
#[derive(Debug)]
pub(super) struct Workers {
    /// The idle threads, the one that finished last on top.
    pub(super) idle: Arc<Mutex<Vec<Sender<Job>>>>,
    /// Where a thread a slow call lowered hands over its slot when it retires: a thread
    /// inherits its creator's priority, so its successor is started by a thread that
    /// never runs a plugin. `None` if that thread could not start (lowered threads then
    /// serve on).
    successors: Option<Sender<Retired>>,
}

/// A retired thread's name and pool slot: the slot is given back once a successor is
/// idle in its place.
struct Retired {
    name: String,
    slot: OwnedSemaphorePermit,
}

/// Starts a call thread named `name`, at the priority of the thread that calls this.
fn serve(name: String) -> std::io::Result<Sender<Job>> {
    let (jobs, queue) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new().name(name).spawn(move || {
        crate::plugin::defer_resets(true);
        crate::plugin::runtime::lower_priority_when_slow(true);
        while let Ok(job) = queue.recv() {
            if !job() {
                return;
            }
        }
    })?;
    Ok(jobs)
}

impl Workers {
    pub(super) fn start(count: usize) -> Self {
        let idle = Arc::new(Mutex::new(Vec::with_capacity(count)));
        for i in (0..count).rev() {
            match serve(format!("plugdb-call-{i}")) {
                Ok(jobs) => lock(&idle).push(jobs),
                Err(e) => tracing::error!(error = %e, "could not start a plugin call thread"),
            }
        }
        let (successors, retired) = std::sync::mpsc::channel::<Retired>();
        let to = idle.clone();
        let starter = std::thread::Builder::new().name("plugdb-call-start".into()).spawn(move || {
            for Retired { name, slot } in retired {
                match serve(name) {
                    Ok(jobs) => lock(&to).push(jobs),
                    Err(e) => {
                        tracing::error!(error = %e, "could not start a plugin call thread: the pool keeps one fewer");
                        slot.forget();
                    }
                }
            }
        });
        if let Err(e) = &starter {
            tracing::error!(error = %e, "could not start the thread that replaces plugin call threads");
        }
        Self { idle, successors: starter.ok().map(|_| successors) }
    }

    /// Runs `call` on an idle worker; its panic, if any, comes back as the error. The
    /// answer is sent before the instance the call used is reset (the caller goes on
    /// meanwhile); then the worker is idle again and `slot` and `held` are dropped, or,
    /// lowered, the worker drops `held` and hands `slot` on to its successor.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        slot: OwnedSemaphorePermit,
        held: impl Send + 'static,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::Result<T> {
        let (tx, rx) = oneshot::channel();
        let worker = lock(&self.idle).pop().expect("a call that holds a pool slot finds a plugin call thread idle");
        let (idle, back, successors) = (self.idle.clone(), worker.clone(), self.successors.clone());
        let job: Job = Box::new(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)));
            crate::plugin::reset_spent();
            match successors.filter(|_| crate::plugin::runtime::priority_lowered()) {
                Some(successors) => {
                    drop(held);
                    let name = std::thread::current().name().unwrap_or("plugdb-call").to_string();
                    if let Err(SendError(retired)) = successors.send(Retired { name, slot }) {
                        retired.slot.forget();
                    }
                    false
                }
                None => {
                    // Idle before the slots are given back: the next call of the engine
                    // finds this thread on top.
                    lock(&idle).push(back);
                    drop((held, slot));
                    true
                }
            }
        });
        assert!(worker.send(job).is_ok(), "a plugin call thread is gone");
        rx.await.expect("a plugin call thread ended during a call")
    }
}
