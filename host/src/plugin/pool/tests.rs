//! The call pool's bounds: threads per engine, the CPU allowance, slow calls.

use super::*;
use crate::plugin::SLOW_CALL_NICENESS;

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
/// known to be quick queues as deep as its callers come. (Of 16 calls, 2 run and 4
/// wait; on a loaded machine a call may end before the burst is in, or a slot be
/// taken a moment late: one more or fewer turned away.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_quick_engine_queues_beyond_its_depth() {
    let pool = Arc::new(CallPool::new(4, 2));
    let unknown = burst(&pool, "new", 16, Duration::from_millis(50)).await;
    assert!((11..=13).contains(&unknown), "an engine with no call ended yet queues 4 deep: {unknown} turned away");

    assert_eq!(burst(&pool, "fast", 1, Duration::ZERO).await, 0);
    let fast = burst(&pool, "fast", 16, Duration::from_micros(200)).await;
    assert_eq!(fast, 0, "16 calls of 0.2 ms wait 2 ms at most: all let in");

    assert_eq!(burst(&pool, "slow", 1, Duration::from_millis(50)).await, 0);
    let slow = burst(&pool, "slow", 16, Duration::from_millis(50)).await;
    assert!((11..=13).contains(&slow), "calls of 50 ms queue 4 deep: {slow} turned away");
}

/// Calls run on the pool's own threads at the operator's priority, answering before
/// their instance is reset; a thread a slow call lowered gives way to a new one at
/// the operator's priority; and a panicking call leaves its thread serving the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_answer_before_their_reset_and_a_lowered_thread_gives_way_to_a_new_one() {
    let pool = Arc::new(CallPool::new(1, 1));
    let nice = || rustix::process::getpriority_process(None).expect("nice value");
    let caller = nice();
    assert!(caller < SLOW_CALL_NICENESS, "the test runs above the lowest priority");
    let on = move || (std::thread::current().id(), nice());
    let (first, at) = pool.run_for("e", on).await.expect("a slot");
    assert_eq!(at, caller, "a quick call runs at the operator's priority");
    let slow = pool
        .run_for("e", move || {
            crate::plugin::runtime::lower_priority();
            on()
        })
        .await;
    assert_eq!(slow, Ok((first, SLOW_CALL_NICENESS)), "the slow call lowered its own thread");
    assert_eq!(nice(), caller, "the caller keeps its own priority");
    let (next, at) = pool.run_for("e", on).await.expect("a slot");
    assert_ne!(next, first, "a new thread took the lowered one's place");
    assert_eq!(at, caller, "at the operator's priority");
    let panicked = tokio::spawn({
        let pool = pool.clone();
        async move { pool.run_for("e", || panic!("a plugin call panicked")).await }
    });
    assert!(panicked.await.expect_err("the panic reaches the caller").is_panic());
    assert_eq!(pool.run_for("e", on).await.map(|(id, _)| id), Ok(next), "the one thread still serves");
    // The caller gets each answer before the call's instance is reset.
    assert_eq!(pool.run_for("e", crate::plugin::runtime::resets_deferred).await, Ok(true));
    assert!(!crate::plugin::runtime::resets_deferred(), "the caller's own calls reset before they return");
}

/// A caller of an engine not known to be quick waits [`DETACH_AFTER`] at most: the
/// call goes on without it, and whoever asks again with the same key takes its
/// answer, from the one call that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_goes_on_without_its_caller_who_takes_its_answer_later() {
    use crate::plugin::calls::{Function, Validate};
    let answer = |what: &str| Validate::keep(Ok(vec![crate::plugin::Violation { field: "f".into(), message: what.into() }]));
    let said = |kept: Result<Answer, Busy>| Validate::take(kept.ok()?)?.ok().map(|v| v[0].message.clone());
    use std::sync::atomic::{AtomicUsize, Ordering};
    let pool = Arc::new(CallPool::new(4, 2));
    let ran = Arc::new(AtomicUsize::new(0));
    let call = |ran: &Arc<AtomicUsize>| {
        let ran = ran.clone();
        move || {
            ran.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(600));
            answer("slow")
        }
    };
    let ask = |key: Key| pool.run_detaching("slow", pool.share("slow"), "render", key, call(&ran));
    let asked = Instant::now();
    assert!(matches!(ask([1; 32]).await, Err(Busy::Running { function: "render", .. })), "the first caller is let go");
    assert!(asked.elapsed() < Duration::from_millis(300), "the caller waited {:?} for a 600 ms call", asked.elapsed());
    assert!(matches!(ask([1; 32]).await, Err(Busy::Running { .. })), "asked again while it runs: still running");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(said(ask([1; 32]).await), Some("slow".into()), "the answer is taken");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "one call ran for the three asks");
    assert!(lock(&pool.detached).is_empty(), "a taken answer is not kept");

    // A call that ends within the wait is answered at once, and nothing is kept.
    assert_eq!(
        said(pool.run_detaching("quick", pool.share("quick"), "render", [2; 32], move || answer("quick")).await),
        Some("quick".into())
    );
    assert!(lock(&pool.detached).is_empty(), "an answer given at once is not kept");
}

/// Answers nobody comes back for are dropped after [`KEEP_ANSWER`] and beyond
/// [`MAX_KEPT`]; calls still running are kept.
#[tokio::test]
async fn unclaimed_answers_are_bounded() {
    use crate::plugin::calls::{Function, Validate};
    let answer = |what: &str| Validate::keep(Ok(vec![crate::plugin::Violation { field: "f".into(), message: what.into() }]));
    let ended = || {
        let task = tokio::spawn(async move { answer("ended") });
        (task.abort_handle(), task)
    };
    let (running, never) = {
        let task = tokio::spawn(std::future::pending::<Answer>());
        (task.abort_handle(), task)
    };
    tokio::task::yield_now().await;
    let key = |i: usize| {
        let mut key = [0; 32];
        key[..8].copy_from_slice(&i.to_le_bytes());
        key
    };
    let mut detached = HashMap::new();
    let long_ago = Instant::now() - KEEP_ANSWER - Duration::from_secs(1);
    detached.insert(key(0), Detached { since: long_ago, done: running.clone(), answer: never });
    for i in 1..=MAX_KEPT + 10 {
        let (done, answer) = ended();
        let since = if i <= 5 { long_ago } else { Instant::now() };
        detached.insert(key(i), Detached { since, done, answer });
    }
    while detached.values().filter(|d| d.done.is_finished()).count() < MAX_KEPT + 10 {
        tokio::task::yield_now().await;
    }
    forget_unclaimed(&mut detached);
    assert_eq!(detached.len(), MAX_KEPT);
    assert!(detached.contains_key(&key(0)), "a call still running is kept, however old");
    assert!(detached.values().filter(|d| d.done.is_finished()).all(|d| d.since > long_ago), "old answers went first");
    running.abort();
}

/// An allowance is earned at its rate up to the burst, and overdrawn by what the
/// calls ran: the next call waits until it is earned back.
#[test]
fn an_allowance_is_earned_back_at_its_rate() {
    let start = Instant::now();
    let mut allowance = Allowance { rate: 0.5, balance: 1.0, at: start };
    let at = |secs: u64| start + Duration::from_secs(secs);
    assert_eq!(allowance.wait(start), Duration::ZERO, "a full allowance");
    allowance.spend(Duration::from_secs(2), start);
    assert_eq!(allowance.wait(start), Duration::from_secs(2), "1 s overdrawn at half a second a second");
    assert_eq!(allowance.wait(at(1)), Duration::from_secs(1));
    assert_eq!(allowance.wait(at(2)), Duration::ZERO);
    assert_eq!(allowance.balance(at(100)), CPU_BURST.as_secs_f64(), "earned up to the burst only");
}

/// An engine whose calls have taken more than its share of CPU waits for it to be
/// earned back, and is no longer taken for quick; another engine's call is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_past_its_cpu_share_waits_and_the_others_do_not() {
    let pool = Arc::new(CallPool::new(4, 2).with_cpu_per_engine(0.25));
    // 1.5 s of calls against a 1 s burst and 0.25 s earned a second: 0.125 s
    // overdrawn when the fifth ends, half a second to earn back.
    for _ in 0..5 {
        pool.run_for("spins", || std::thread::sleep(Duration::from_millis(300))).await.expect("a slot");
    }
    let owed = lock(&pool.share("spins").load).expected_wait(2, Instant::now());
    assert!(owed.is_some_and(|wait| wait > DETACH_AFTER), "the engine is not quick while it owes: {owed:?}");
    let asked = Instant::now();
    pool.run_for("other", || ()).await.expect("a slot");
    let other = asked.elapsed();
    pool.run_for("spins", || ()).await.expect("a slot");
    let spins = asked.elapsed();
    assert!(spins >= Duration::from_millis(400), "the engine past its share waited only {spins:?}");
    assert!(other < Duration::from_millis(200), "another engine's call waited {other:?}");
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
