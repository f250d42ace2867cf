//! Results of plugin calls, remembered. The contract makes plugins pure (the same
//! input gives the same output), so a call already answered for the same plugin build
//! and the same input is answered from here, without instantiating anything. Bounded
//! by entries and bytes (least recently used first out); a plugin's entries are
//! dropped when it stops serving. Deadline and trap failures are not remembered: they
//! depend on the machine, not only on the input.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::calls::{Answer, Function, Key};

/// The remembered results of every plugin's calls.
#[derive(Debug)]
pub struct Memo {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    /// Keys from least to most recently used, with the use each stands for: a key
    /// used again is pushed again, and its older places are skipped.
    order: VecDeque<(Key, u64)>,
    uses: u64,
    bytes: usize,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("entries", &self.map.len()).field("bytes", &self.bytes).finish()
    }
}

struct Entry {
    value: Answer,
    bytes: usize,
    digest: Arc<str>,
    used: u64,
}

impl Default for Memo {
    /// 32,768 results or 32 MiB, whichever is reached first.
    fn default() -> Self {
        Self::new(32_768, 32 << 20)
    }
}

impl Memo {
    /// A memo holding at most `max_entries` results and `max_bytes` of them.
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self { inner: Mutex::default(), max_entries, max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The remembered answer of `F` for `key` ([`Function::key`]), if any.
    pub fn get<F: Function>(&self, key: &Key) -> Option<Result<F::Output, crate::plugin::CallError>> {
        let mut inner = self.lock();
        inner.uses += 1;
        let used = inner.uses;
        let entry = inner.map.get_mut(key)?;
        let value = F::take(entry.value.clone())?;
        entry.used = used;
        inner.order.push_back((*key, used));
        compact(&mut inner);
        Some(value)
    }

    /// Remembers `value` (about `bytes` big) for `key` of plugin build `digest`.
    pub fn put(&self, key: Key, digest: &str, value: Answer, bytes: usize) {
        if bytes > self.max_bytes / 8 {
            return;
        }
        let mut inner = self.lock();
        inner.uses += 1;
        let used = inner.uses;
        if let Some(old) = inner.map.insert(key, Entry { value, bytes, digest: digest.into(), used }) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        inner.order.push_back((key, used));
        while inner.map.len() > self.max_entries || inner.bytes > self.max_bytes {
            let Some((oldest, stamp)) = inner.order.pop_front() else { break };
            if inner.map.get(&oldest).is_some_and(|e| e.used == stamp)
                && let Some(gone) = inner.map.remove(&oldest)
            {
                inner.bytes -= gone.bytes;
            }
        }
        compact(&mut inner);
    }

    /// Drops every result of plugin build `digest`.
    pub fn forget(&self, digest: &str) {
        let mut inner = self.lock();
        let gone: usize = inner.map.values().filter(|e| &*e.digest == digest).map(|e| e.bytes).sum();
        inner.map.retain(|_, e| &*e.digest != digest);
        inner.bytes -= gone;
        compact(&mut inner);
    }

    /// Results remembered now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops the places of keys used again since, once they outnumber the entries.
fn compact(inner: &mut Inner) {
    if inner.order.len() > 2 * inner.map.len() + 64 {
        let Inner { map, order, .. } = inner;
        order.retain(|(key, stamp)| map.get(key).is_some_and(|e| e.used == *stamp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::calls::{PlanUpgrade, Validate};
    use crate::plugin::{CallError, Violation};

    fn spec(version: &str) -> crate::plugin::EngineSpec {
        crate::plugin::EngineSpec {
            name: "orders".into(),
            namespace: "shop".into(),
            version: version.into(),
            replicas: 1,
            storage_bytes: 1 << 30,
            requests: Default::default(),
            limits: Default::default(),
            parameters: Vec::new(),
            tls: None,
            synchronous_replicas: 0,
        }
    }

    /// A `validate` answer that says `what`.
    fn said(what: &str) -> Answer {
        Validate::keep(Ok(vec![Violation { field: "f".into(), message: what.into() }]))
    }

    fn recalled(memo: &Memo, key: &Key) -> Option<String> {
        memo.get::<Validate>(key).map(|a: Result<Vec<Violation>, CallError>| a.expect("ok")[0].message.clone())
    }

    #[test]
    fn remembers_by_build_function_and_input_within_its_bounds() {
        let memo = Memo::new(2, 1 << 20);
        let key = |d: &str, v: &str| Validate::key(d, &spec(v)).expect("key");
        memo.put(key("a", "1"), "a", said("one"), 10);
        assert_eq!(recalled(&memo, &key("a", "1")).as_deref(), Some("one"));
        assert_eq!(recalled(&memo, &key("a", "2")), None, "another input");
        assert_eq!(recalled(&memo, &key("b", "1")), None, "another build");
        let upgrade = PlanUpgrade::key("a", &(spec("1"), "0".into())).expect("key");
        assert_ne!(upgrade, key("a", "1"), "another function, another key");
        assert!(memo.get::<PlanUpgrade>(&key("a", "1")).is_none(), "another function's answer is not taken for this one's");
        memo.put(key("a", "2"), "a", said("two"), 10);
        // 1 was used after 2 went in: 2 is the least recently used, and goes first.
        let _ = recalled(&memo, &key("a", "1"));
        memo.put(key("b", "3"), "b", said("three"), 10);
        assert_eq!(memo.len(), 2);
        assert!(recalled(&memo, &key("a", "2")).is_none());
        assert!(recalled(&memo, &key("a", "1")).is_some());
        memo.forget("a");
        assert_eq!(memo.len(), 1);
        assert!(recalled(&memo, &key("b", "3")).is_some());
    }

    #[test]
    fn bytes_are_bounded_and_huge_results_not_kept() {
        let memo = Memo::new(100, 800);
        for i in 0..10 {
            memo.put(Validate::key("a", &spec(&i.to_string())).expect("key"), "a", said("x"), 100);
        }
        assert_eq!(memo.len(), 8);
        let huge = Validate::key("a", &spec("99")).expect("key");
        memo.put(huge, "a", said("x"), 500);
        assert!(recalled(&memo, &huge).is_none(), "over an eighth of the bound");
    }
}
