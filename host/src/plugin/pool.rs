//! Plugin calls off the async executor. Each call runs on one of `total` threads kept
//! for plugin calls, at most `per_engine` of them for one engine: a plugin that spends
//! its whole deadline on every call delays only its own engine's reconciles, never the
//! others', the health endpoints or the lease renewal. The bound also caps the memory
//! plugin calls can hold at once (`total` × the per-call memory cap).
//!
//! A call runs at the operator's own priority while it is quick. One still running
//! after [`SLOW_CALL`] lowers its thread to nice [`SLOW_CALL_NICENESS`] for the rest of
//! it: where the CPU is short, a plugin burning its deadline gets what the executor
//! (watches, lease, health, API requests) and, on a shared node, its other processes
//! leave, instead of an equal share, while the microsecond calls of every other engine
//! never wait behind anything for the CPU. An unprivileged thread cannot raise its
//! priority again, so a lowered thread retires after that call and a new thread, at the
//! operator's priority, takes its place. A call that spins is still stopped at its
//! wall-clock deadline.
//!
//! Callers are reconciles, and a reconcile waiting here holds one of the controller's
//! reconcile slots: a slow engine must not hold the slots other engines' Databases
//! need. So an engine's calls queue (running or waiting) only `QUEUE_PER_THREAD` ×
//! `per_engine` deep, unless the engine is known to be quick: deeper only while the
//! expected wait — the calls ahead, each as long as the engine's recent calls and its
//! oldest running one — stays within `QUEUE_WAIT`. A caller beyond that is told its
//! engine is [`Busy::Full`] at once instead of waiting. A fast engine's burst thus
//! waits its turn (microseconds), and a slow engine's is turned away.
//!
//! And a caller waits for a call of an engine not known to be quick for
//! [`DETACH_AFTER`] only ([`CallPool::run_keyed`]). A call still running or queued
//! then goes on without it, kept under the key of its function and input; the caller
//! is told [`Busy::Running`] and when to come back, and whoever asks again with the
//! same key takes the answer (or learns it is still coming). So a slow engine holds
//! no reconcile slot while its calls run, and its Databases still see every answer,
//! the deadline's failure included.
//!
//! Last, the CPU: a lowered thread still spins wherever the CPU would otherwise idle
//! between the operator's and the API server's turns, and on a small node that alone
//! slows everything else. So each engine has an allowance of call-thread time: it
//! earns [`DEFAULT_CPU_PER_ENGINE`] (or [`CallPool::with_cpu_per_engine`]) seconds a
//! second, up to [`CPU_BURST`], and each call spends what it ran. While the allowance
//! is overdrawn the engine's next call waits for it to be earned back, holding only its
//! engine's thread. Microsecond calls never come near it; a plugin that spends its
//! deadline on every call is held to that share of one thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinHandle};

#[cfg(doc)]
use super::SLOW_CALL_NICENESS;
use super::calls::{Answer, Key};
use super::{CallError, Plugin, SLOW_CALL, Sandboxed};

/// Calls of one engine running or waiting, per thread the engine may use, that are
/// always let in.
const QUEUE_PER_THREAD: usize = 2;

/// The longest expected wait beyond that depth: a queue that would wait longer is full.
const QUEUE_WAIT: Duration = Duration::from_millis(20);

/// How long a caller waits for a call of an engine whose calls are not known to be
/// quick before the call goes on without it.
pub const DETACH_AFTER: Duration = SLOW_CALL;

/// When a caller turned away from a full queue is expected back.
pub const FULL_RETRY: Duration = Duration::from_secs(1);

/// How long the answer of a call that went on without its caller waits to be taken.
const KEEP_ANSWER: Duration = Duration::from_secs(30);

/// Answers of calls that went on without their callers kept at most (the calls still
/// running are bounded by the queues).
const MAX_KEPT: usize = 256;

/// The call-thread seconds a second one engine's calls may take, on average, unless
/// the pool is told otherwise.
pub const DEFAULT_CPU_PER_ENGINE: f64 = 0.5;

/// The call-thread time an engine may take ahead of its allowance: a burst of calls
/// after a quiet spell runs at once.
pub const CPU_BURST: Duration = Duration::from_secs(1);

/// The bounded set of threads plugin calls run on.
#[derive(Debug)]
pub struct CallPool {
    total: Arc<Semaphore>,
    per_engine: usize,
    cpu_per_engine: f64,
    engines: Mutex<HashMap<String, Share>>,
    workers: Workers,
    detached: Mutex<HashMap<Key, Detached>>,
}

/// A call that went on without its caller.
struct Detached {
    /// When a caller last stopped waiting for it.
    since: Instant,
    /// Whether it has ended.
    done: AbortHandle,
    /// The call, to be awaited for its answer.
    answer: JoinHandle<Answer>,
}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached").field("since", &self.since).field("done", &self.done.is_finished()).finish()
    }
}

/// One engine's share of the pool: its threads, and how its calls are going.
#[derive(Debug, Clone)]
struct Share {
    threads: Arc<Semaphore>,
    load: Arc<Mutex<Load>>,
}

/// An engine's calls in the pool and how long they take.
#[derive(Debug)]
struct Load {
    /// Calls running or waiting.
    queued: usize,
    /// When each running call started (at most `per_engine`).
    running: Vec<Instant>,
    /// A moving average of how long its calls ran; `None` until one has ended.
    typical: Option<Duration>,
    /// Its allowance of call-thread time.
    allowance: Allowance,
}

impl Load {
    fn new(cpu: f64) -> Self {
        Self { queued: 0, running: Vec::new(), typical: None, allowance: Allowance::new(cpu) }
    }

    /// How long a call let in now would wait, if the engine's calls are known.
    fn expected_wait(&self, threads: usize, now: Instant) -> Option<Duration> {
        let oldest = self.running.iter().map(|started| now.saturating_duration_since(*started)).max().unwrap_or_default();
        let each = self.typical?.max(oldest);
        let rounds = (self.queued + 1).div_ceil(threads) as u32;
        Some(each.saturating_mul(rounds) + self.allowance.wait(now))
    }

    fn ended(&mut self, started: Instant, ran: Duration) {
        if let Some(i) = self.running.iter().position(|s| *s == started) {
            self.running.swap_remove(i);
        }
        // Each call weighs a quarter: a plugin that turns slow is seen within a few calls.
        self.typical = Some(self.typical.map_or(ran, |t| (t * 3 + ran) / 4));
        self.allowance.spend(ran, Instant::now());
    }
}

/// Call-thread time an engine may still take: it earns `rate` seconds a second, up to
/// [`CPU_BURST`], and is overdrawn (negative) after calls that ran longer.
#[derive(Debug)]
struct Allowance {
    rate: f64,
    /// Seconds, as of `at`.
    balance: f64,
    at: Instant,
}

impl Allowance {
    fn new(rate: f64) -> Self {
        Self { rate, balance: CPU_BURST.as_secs_f64(), at: Instant::now() }
    }

    fn balance(&self, now: Instant) -> f64 {
        let earned = self.rate * now.saturating_duration_since(self.at).as_secs_f64();
        (self.balance + earned).min(CPU_BURST.as_secs_f64())
    }

    /// How long until the engine's next call may start.
    fn wait(&self, now: Instant) -> Duration {
        let owed = -self.balance(now);
        if owed > 0.0 { Duration::from_secs_f64(owed / self.rate) } else { Duration::ZERO }
    }

    fn spend(&mut self, ran: Duration, now: Instant) {
        self.balance = self.balance(now) - ran.as_secs_f64();
        self.at = self.at.max(now);
    }
}

/// A call's answer is not here yet: ask again after [`Busy::retry_in`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// The engine already has as many calls running or waiting as it may.
    #[error("the {engine} plugin already has {queued} calls running or waiting; tried again shortly")]
    Full {
        /// Engine name.
        engine: String,
        /// Its calls running or waiting.
        queued: usize,
    },
    /// The call runs (or waits for a thread) without its caller; asking again with the
    /// same input takes its answer.
    #[error("the {engine} plugin's {function} call is still running; its answer is taken in {retry_in:?}")]
    Running {
        /// Engine name.
        engine: String,
        /// The function called.
        function: &'static str,
        /// When the answer is expected.
        retry_in: Duration,
    },
}

impl Busy {
    /// When to ask again.
    pub fn retry_in(&self) -> Duration {
        match self {
            Busy::Full { .. } => FULL_RETRY,
            Busy::Running { retry_in, .. } => *retry_in,
        }
    }
}

/// Why a call keyed by its function gave no answer: the engine is busy (ask again
/// later), or the call itself failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    /// Ask again after [`Busy::retry_in`].
    #[error(transparent)]
    Busy(#[from] Busy),
    /// The plugin's call failed.
    #[error(transparent)]
    Failed(CallError),
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
        let workers = Workers::start(total.max(1));
        // As many slots as threads started: a call that holds one always finds a thread.
        let started = lock(&workers.idle).len();
        Self {
            total: Arc::new(Semaphore::new(started)),
            per_engine: per_engine.max(1),
            cpu_per_engine: DEFAULT_CPU_PER_ENGINE,
            engines: Mutex::default(),
            workers,
            detached: Mutex::default(),
        }
    }

    /// Each engine's calls take `threads` call-thread seconds a second on average at
    /// most (> 0; `per_engine` or more leaves only the threads as the bound).
    pub fn with_cpu_per_engine(mut self, threads: f64) -> Self {
        assert!(threads > 0.0 && threads.is_finite(), "an engine's CPU share is a positive number of threads, not {threads}");
        self.cpu_per_engine = threads;
        self
    }

    fn share(&self, engine: &str) -> Share {
        let mut engines = lock(&self.engines);
        if let Some(share) = engines.get(engine) {
            return share.clone();
        }
        engines
            .entry(engine.to_string())
            .or_insert_with(|| Share {
                threads: Arc::new(Semaphore::new(self.per_engine)),
                load: Arc::new(Mutex::new(Load::new(self.cpu_per_engine))),
            })
            .clone()
    }

    /// Runs `call` on `plugin` on a call thread once its engine and the pool have
    /// room, or says the engine is [`Busy::Full`] when its queue is full. The slots are
    /// held until the call itself ends, even if the caller gives up.
    pub async fn run<T: Send + 'static>(&self, plugin: &Plugin, call: impl FnOnce(&Plugin) -> T + Send + 'static) -> Result<T, Busy> {
        let plugin = plugin.clone();
        self.run_for(&plugin.info().engine.clone(), move || call(&plugin)).await
    }

    /// `F` of `plugin` for `input`, as [`CallPool::run`] when the engine's calls are
    /// known to be quick. Otherwise the caller waits [`DETACH_AFTER`] at most: a call
    /// still running then goes on without it and the caller is told [`Busy::Running`];
    /// asking again for the same function and input takes its answer once it has ended
    /// (a panic in the call comes back then).
    pub async fn run_keyed<F: Sandboxed>(self: &Arc<Self>, plugin: &Plugin, input: F::Input) -> Result<F::Output, Unanswered> {
        let engine = plugin.info().engine.clone();
        let share = self.share(&engine);
        let quick = lock(&share.load).expected_wait(self.per_engine, Instant::now()).is_some_and(|wait| wait <= DETACH_AFTER);
        let key = if quick { None } else { F::key(plugin.digest(), &input) };
        let plugin = plugin.clone();
        let call = move || plugin.ask::<F>(&input);
        let answer = match key {
            Some(key) => {
                let kept = self.run_detaching(&engine, share, F::NAME, key, move || F::keep(call())).await?;
                // Another function's answer under this key would take a collision of SHA-256.
                F::take(kept).ok_or(Busy::Running { engine, function: F::NAME, retry_in: DETACH_AFTER })?
            }
            None => {
                let ticket = self.admit(&engine, &share)?;
                self.run_admitted(share, ticket, call).await
            }
        };
        answer.map_err(Unanswered::Failed)
    }

    async fn run_detaching(
        self: &Arc<Self>,
        engine: &str,
        share: Share,
        function: &'static str,
        key: Key,
        call: impl FnOnce() -> Answer + Send + 'static,
    ) -> Result<Answer, Busy> {
        let load = share.load.clone();
        let running = || {
            let wait = lock(&load).expected_wait(self.per_engine, Instant::now()).unwrap_or(FULL_RETRY);
            Busy::Running { engine: engine.to_string(), function, retry_in: wait.clamp(DETACH_AFTER, FULL_RETRY) }
        };
        let kept = lock(&self.detached).remove(&key);
        let mut answer = match kept {
            Some(kept) if kept.done.is_finished() => kept.answer,
            Some(kept) => {
                lock(&self.detached).insert(key, Detached { since: Instant::now(), ..kept });
                return Err(running());
            }
            None => {
                let ticket = self.admit(engine, &share)?;
                let pool = self.clone();
                tokio::spawn(async move { pool.run_admitted(share, ticket, call).await })
            }
        };
        match tokio::time::timeout(DETACH_AFTER, &mut answer).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(joined)) => match joined.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Cancelled: the runtime is shutting down.
                Err(_) => Err(running()),
            },
            Err(_) => {
                let busy = running();
                let done = answer.abort_handle();
                let mut detached = lock(&self.detached);
                detached.insert(key, Detached { since: Instant::now(), done, answer });
                forget_unclaimed(&mut detached);
                Err(busy)
            }
        }
    }

    async fn run_for<T: Send + 'static>(&self, engine: &str, call: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        let share = self.share(engine);
        let ticket = self.admit(engine, &share)?;
        Ok(self.run_admitted(share, ticket, call).await)
    }

    /// A place in `engine`'s queue, or [`Busy::Full`].
    fn admit(&self, engine: &str, share: &Share) -> Result<Ticket, Busy> {
        let mut load = lock(&share.load);
        let always = QUEUE_PER_THREAD * self.per_engine;
        let quick = || load.expected_wait(self.per_engine, Instant::now()).is_some_and(|wait| wait <= QUEUE_WAIT);
        if load.queued >= always && !quick() {
            return Err(Busy::Full { engine: engine.to_string(), queued: load.queued });
        }
        load.queued += 1;
        Ok(Ticket(share.load.clone()))
    }

    async fn run_admitted<T: Send + 'static>(&self, share: Share, ticket: Ticket, call: impl FnOnce() -> T + Send + 'static) -> T {
        let thread = share.threads.clone().acquire_owned().await.expect("the engine's semaphore is never closed");
        // An engine that has taken more than its share of CPU waits, holding only its
        // own engine's thread.
        loop {
            let owed = lock(&share.load).allowance.wait(Instant::now());
            if owed.is_zero() {
                break;
            }
            tokio::time::sleep(owed).await;
        }
        let slot = self.total.clone().acquire_owned().await.expect("the pool's semaphore is never closed");
        // The thread's slots are given back once its instance is reset: a call handed
        // over always finds a thread free.
        let ran = self.workers.run(slot, (ticket, thread), move || {
            let started = Instant::now();
            lock(&share.load).running.push(started);
            let value = call();
            lock(&share.load).ended(started, started.elapsed());
            value
        });
        match ran.await {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Drops the answers nobody came back for within [`KEEP_ANSWER`], and beyond
/// [`MAX_KEPT`] the oldest answers. Calls still running are kept: their number is
/// bounded by the queues.
fn forget_unclaimed(detached: &mut HashMap<Key, Detached>) {
    detached.retain(|_, d| !d.done.is_finished() || d.since.elapsed() < KEEP_ANSWER);
    if let Some(excess) = detached.len().checked_sub(MAX_KEPT).filter(|n| *n > 0) {
        let mut ended: Vec<(Instant, Key)> = detached.iter().filter(|(_, d)| d.done.is_finished()).map(|(k, d)| (d.since, *k)).collect();
        ended.sort_unstable();
        for (_, key) in ended.into_iter().take(excess) {
            detached.remove(&key);
        }
    }
}

mod threads;
use threads::Workers;

#[cfg(test)]
mod tests;
