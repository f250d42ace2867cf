//! Plugin calls off the async executor. Each call runs on one of `total` threads kept
//! for plugin calls, at most `per_engine` of them for one engine: a plugin that spends
//! its whole deadline on every call delays only its own engine's reconciles, never the
//! others', the health endpoints or the lease renewal. The bound also caps the memory
//! plugin calls can hold at once (`total` × the per-call memory cap).
//!
//! Those threads run at a lower scheduling priority (nice [`CALL_NICENESS`]) than the
//! operator's own: where the CPU is short, a plugin burning its deadline gets what the
//! executor (watches, lease, health, API requests) and, on a shared node, its other
//! processes leave, instead of an equal share. A call of a few microseconds does not
//! notice; a call that spins is still stopped at its wall-clock deadline.
//!
//! Callers are reconciles, and a reconcile waiting here holds one of the controller's
//! reconcile slots: a slow engine with more Databases than slots must not hold every
//! slot. So an engine's calls queue (running or waiting) only `QUEUE_PER_THREAD` ×
//! `per_engine` deep, unless the engine is known to be quick: deeper only while the
//! expected wait — the calls ahead, each as long as the engine's recent calls and its
//! oldest running one — stays within `QUEUE_WAIT`. A caller beyond that is told its
//! engine is [`Busy`] at once instead of waiting. A fast engine's burst thus waits its
//! turn (microseconds), and a slow engine's is turned away.

use std::collections::HashMap;
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, oneshot};

use super::Plugin;

/// Calls of one engine running or waiting, per thread the engine may use, that are
/// always let in.
const QUEUE_PER_THREAD: usize = 2;

/// The longest expected wait beyond that depth: a queue that would wait longer is full.
const QUEUE_WAIT: Duration = Duration::from_millis(20);

/// The nice value of the threads plugin calls run on (the operator's own run at 0;
/// 19 is the lowest priority).
pub const CALL_NICENESS: i32 = 19;

/// The bounded set of threads plugin calls run on.
#[derive(Debug)]
pub struct CallPool {
    total: Arc<Semaphore>,
    per_engine: usize,
    engines: Mutex<HashMap<String, Share>>,
    workers: Workers,
}

type Job = Box<dyn FnOnce() + Send>;

/// How long a call thread waits for a call before it lets go of the instance it keeps
/// (its pool slot, and the compiled code of a plugin that may since have been replaced).
pub const IDLE_RELEASE: Duration = Duration::from_secs(10);

/// Threads that run plugin calls, started with the pool and ended with it (a thread
/// whose sender is gone ends). A call is handed over only once it holds a slot of the
/// pool, so a thread is always free for it.
///
/// The thread that finished last takes the next call: its caches are warm, and the
/// instance it keeps is likely the one the next call needs. The others stay idle, and
/// one idle for [`IDLE_RELEASE`] lets go of its instance.
#[derive(Debug)]
struct Workers {
    /// The idle threads, the one that finished last on top.
    idle: Arc<Mutex<Vec<Sender<Job>>>>,
}

impl Workers {
    fn start(count: usize, release_after: Duration) -> Self {
        let mut idle = Vec::with_capacity(count);
        for i in (0..count).rev() {
            let (jobs, queue) = std::sync::mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new().name(format!("plugdb-call-{i}")).spawn(move || {
                // Linux keeps a nice value per thread: this lowers only this one.
                if let Err(e) = rustix::process::setpriority_process(None, CALL_NICENESS) {
                    tracing::warn!(error = %e, "plugin call thread keeps the operator's priority");
                }
                super::defer_resets(true);
                loop {
                    match queue.recv_timeout(release_after) {
                        Ok(job) => job(),
                        Err(RecvTimeoutError::Timeout) => super::runtime::release_held(),
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            });
            match spawned {
                Ok(_) => idle.push(jobs),
                Err(e) => tracing::error!(error = %e, "could not start a plugin call thread"),
            }
        }
        Self { idle: Arc::new(Mutex::new(idle)) }
    }

    /// Runs `call` on an idle worker; its panic, if any, comes back as the error. The
    /// answer is sent before the instance the call used is reset (the caller goes on
    /// meanwhile); then the worker is idle again, and `held` is dropped.
    async fn run<T: Send + 'static>(&self, held: impl Send + 'static, call: impl FnOnce() -> T + Send + 'static) -> std::thread::Result<T> {
        let (tx, rx) = oneshot::channel();
        let worker = lock(&self.idle).pop().expect("a call that holds a pool slot finds a plugin call thread idle");
        let (idle, back) = (self.idle.clone(), worker.clone());
        let job: Job = Box::new(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)));
            super::reset_spent();
            // Idle before the slot is given back: the next holder of the slot finds it.
            lock(&idle).push(back);
            drop(held);
        });
        assert!(worker.send(job).is_ok(), "a plugin call thread is gone");
        rx.await.expect("a plugin call thread ended during a call")
    }
}

/// One engine's share of the pool: its threads, and how its calls are going.
#[derive(Debug, Clone)]
struct Share {
    threads: Arc<Semaphore>,
    load: Arc<Mutex<Load>>,
}

/// An engine's calls in the pool and how long they take.
#[derive(Debug, Default)]
struct Load {
    /// Calls running or waiting.
    queued: usize,
    /// When each running call started (at most `per_engine`).
    running: Vec<Instant>,
    /// A moving average of how long its calls ran; `None` until one has ended.
    typical: Option<Duration>,
}

impl Load {
    /// How long a call let in now would wait, if the engine's calls are known.
    fn expected_wait(&self, threads: usize, now: Instant) -> Option<Duration> {
        let oldest = self.running.iter().map(|started| now.saturating_duration_since(*started)).max().unwrap_or_default();
        let each = self.typical?.max(oldest);
        let rounds = (self.queued + 1).div_ceil(threads) as u32;
        Some(each.saturating_mul(rounds))
    }

    fn ended(&mut self, started: Instant, ran: Duration) {
        if let Some(i) = self.running.iter().position(|s| *s == started) {
            self.running.swap_remove(i);
        }
        // Each call weighs a quarter: a plugin that turns slow is seen within a few calls.
        self.typical = Some(self.typical.map_or(ran, |t| (t * 3 + ran) / 4));
    }
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
struct Ticket(Arc<Mutex<Load>>);

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.0).queued -= 1;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl CallPool {
    /// At most `total` calls at once, `per_engine` of them for one engine (both ≥ 1).
    pub fn new(total: usize, per_engine: usize) -> Self {
        Self::releasing_after(total, per_engine, IDLE_RELEASE)
    }

    /// The same, with threads that let go of their kept instance once idle for
    /// `release_after`.
    pub fn releasing_after(total: usize, per_engine: usize, release_after: Duration) -> Self {
        let workers = Workers::start(total.max(1), release_after);
        // As many slots as threads started: a call that holds one always finds a thread.
        let started = lock(&workers.idle).len();
        Self { total: Arc::new(Semaphore::new(started)), per_engine: per_engine.max(1), engines: Mutex::default(), workers }
    }

    fn share(&self, engine: &str) -> Share {
        let mut engines = lock(&self.engines);
        engines
            .entry(engine.to_string())
            .or_insert_with(|| Share { threads: Arc::new(Semaphore::new(self.per_engine)), load: Arc::default() })
            .clone()
    }

    /// Runs `call` on `plugin` on a call thread once its engine and the pool have
    /// room, or says the engine is [`Busy`] when its queue is full. The slots are held
    /// until the call itself ends, even if the caller gives up.
    pub async fn run<T: Send + 'static>(&self, plugin: &Plugin, call: impl FnOnce(&Plugin) -> T + Send + 'static) -> Result<T, Busy> {
        let plugin = plugin.clone();
        self.run_for(&plugin.info().engine.clone(), move || call(&plugin)).await
    }

    async fn run_for<T: Send + 'static>(&self, engine: &str, call: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        let share = self.share(engine);
        let ticket = {
            let mut load = lock(&share.load);
            let always = QUEUE_PER_THREAD * self.per_engine;
            let quick = || load.expected_wait(self.per_engine, Instant::now()).is_some_and(|wait| wait <= QUEUE_WAIT);
            if load.queued >= always && !quick() {
                return Err(Busy { engine: engine.to_string(), queued: load.queued });
            }
            load.queued += 1;
            Ticket(share.load.clone())
        };
        let thread = share.threads.acquire_owned().await.expect("the engine's semaphore is never closed");
        let slot = self.total.clone().acquire_owned().await.expect("the pool's semaphore is never closed");
        // The thread's slots are given back once its instance is reset: a call handed
        // over always finds a thread free.
        let ran = self.workers.run((ticket, thread, slot), move || {
            let started = Instant::now();
            lock(&share.load).running.push(started);
            let value = call();
            lock(&share.load).ended(started, started.elapsed());
            value
        });
        match ran.await {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn burst(pool: &Arc<CallPool>, engine: &'static str, calls: usize, each: Duration) -> usize {
        let tasks: Vec<_> = (0..calls)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run_for(engine, move || std::thread::sleep(each)).await })
            })
            .collect();
        let mut busy = 0;
        for task in tasks {
            busy += usize::from(task.await.expect("task").is_err());
        }
        busy
    }

    /// An engine not yet seen, or a slow one, queues only so deep; one whose calls are
    /// known to be quick queues as deep as its callers come.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_quick_engine_queues_beyond_its_depth() {
        let pool = Arc::new(CallPool::new(4, 2));
        let unknown = burst(&pool, "new", 16, Duration::from_millis(50)).await;
        assert_eq!(unknown, 12, "an engine with no call ended yet queues 4 deep");

        assert_eq!(burst(&pool, "fast", 1, Duration::ZERO).await, 0);
        let fast = burst(&pool, "fast", 16, Duration::from_micros(200)).await;
        assert_eq!(fast, 0, "16 calls of 0.2 ms wait 2 ms at most: all let in");

        assert_eq!(burst(&pool, "slow", 1, Duration::from_millis(50)).await, 0);
        let slow = burst(&pool, "slow", 16, Duration::from_millis(50)).await;
        assert_eq!(slow, 12, "calls of 50 ms queue 4 deep");
    }

    /// Calls run on the pool's own threads, below the operator's priority, answering
    /// before their instance is reset, and a panicking call leaves its thread serving
    /// the next one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_run_below_the_operators_priority_and_answer_before_their_reset() {
        let pool = Arc::new(CallPool::new(1, 1));
        let caller = rustix::process::getpriority_process(None).expect("the caller's nice value");
        let nice = || rustix::process::getpriority_process(None).expect("nice value");
        assert_eq!(pool.run_for("e", nice).await, Ok(CALL_NICENESS));
        assert_eq!(rustix::process::getpriority_process(None).expect("nice value"), caller, "the caller keeps its own");
        let panicked = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run_for("e", || panic!("a plugin call panicked")).await }
        });
        assert!(panicked.await.expect_err("the panic reaches the caller").is_panic());
        assert_eq!(pool.run_for("e", nice).await, Ok(CALL_NICENESS), "the one thread still serves");
        // The caller gets each answer before the call's instance is reset.
        assert_eq!(pool.run_for("e", crate::plugin::runtime::resets_deferred).await, Ok(true));
        assert!(!crate::plugin::runtime::resets_deferred(), "the caller's own calls reset before they return");
    }

    /// A call that has been running long marks its engine slow before it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_running_call_counts_before_it_ends() {
        let pool = Arc::new(CallPool::new(4, 2));
        assert_eq!(burst(&pool, "turns", 1, Duration::ZERO).await, 0);
        let long = tokio::spawn({
            let pool = pool.clone();
            async move { burst(&pool, "turns", 4, Duration::from_millis(300)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(burst(&pool, "turns", 2, Duration::ZERO).await, 2, "the queue is 4 deep and its calls have run 100 ms");
        assert_eq!(long.await.expect("task"), 0);
    }
}
