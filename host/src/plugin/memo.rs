//! Results of plugin calls, remembered. The contract makes plugins pure (the same
//! input gives the same output), so a call already answered for the same plugin build
//! and the same input is answered from here, without instantiating anything. Bounded
//! by entries and bytes (least recently used first out); a plugin's entries are
//! dropped when it stops serving. Deadline and trap failures are not remembered: they
//! depend on the machine, not only on the input.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// What a result is remembered under: the plugin build, the function and the input.
pub(crate) type Key = [u8; 32];

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
    value: Arc<dyn Any + Send + Sync>,
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

    /// The key of `function` of the plugin build `digest` called with `input`.
    pub fn key(digest: &str, function: &str, input: &impl serde::Serialize) -> Option<Key> {
        let mut hasher = Sha256::new();
        hasher.update(digest.as_bytes());
        hasher.update([0]);
        hasher.update(function.as_bytes());
        hasher.update([0]);
        serde_json::to_writer(HashWriter(&mut hasher), input).ok()?;
        Some(hasher.finalize().into())
    }

    /// The remembered result for `key`, if any.
    pub fn get<T: Clone + 'static>(&self, key: &Key) -> Option<T> {
        let mut inner = self.lock();
        inner.uses += 1;
        let used = inner.uses;
        let entry = inner.map.get_mut(key)?;
        let value = entry.value.downcast_ref::<T>()?.clone();
        entry.used = used;
        inner.order.push_back((*key, used));
        compact(&mut inner);
        Some(value)
    }

    /// Remembers `value` (about `bytes` big) for `key` of plugin build `digest`.
    pub fn put<T: Send + Sync + 'static>(&self, key: Key, digest: &str, value: T, bytes: usize) {
        if bytes > self.max_bytes / 8 {
            return;
        }
        let mut inner = self.lock();
        inner.uses += 1;
        let used = inner.uses;
        if let Some(old) = inner.map.insert(key, Entry { value: Arc::new(value), bytes, digest: digest.into(), used }) {
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

/// Feeds serialised input straight into the hash.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_by_build_function_and_input_within_its_bounds() {
        let memo = Memo::new(2, 1 << 20);
        let key = |d: &str, f: &str, i: u32| Memo::key(d, f, &i).expect("key");
        memo.put(key("a", "render", 1), "a", "one".to_string(), 10);
        assert_eq!(memo.get::<String>(&key("a", "render", 1)).as_deref(), Some("one"));
        assert_eq!(memo.get::<String>(&key("a", "render", 2)), None, "another input");
        assert_eq!(memo.get::<String>(&key("b", "render", 1)), None, "another build");
        assert_eq!(memo.get::<String>(&key("a", "validate", 1)), None, "another function");
        memo.put(key("a", "render", 2), "a", "two".to_string(), 10);
        // 1 was used after 2 went in: 2 is the least recently used, and goes first.
        let _ = memo.get::<String>(&key("a", "render", 1));
        memo.put(key("b", "render", 3), "b", "three".to_string(), 10);
        assert_eq!(memo.len(), 2);
        assert!(memo.get::<String>(&key("a", "render", 2)).is_none());
        assert!(memo.get::<String>(&key("a", "render", 1)).is_some());
        memo.forget("a");
        assert_eq!(memo.len(), 1);
        assert!(memo.get::<String>(&key("b", "render", 3)).is_some());
    }

    #[test]
    fn bytes_are_bounded_and_huge_results_not_kept() {
        let memo = Memo::new(100, 800);
        for i in 0..10u32 {
            memo.put(Memo::key("a", "render", &i).expect("key"), "a", i, 100);
        }
        assert_eq!(memo.len(), 8);
        memo.put(Memo::key("a", "render", &99u32).expect("key"), "a", 99u32, 500);
        assert!(memo.get::<u32>(&Memo::key("a", "render", &99u32).expect("key")).is_none(), "over an eighth of the bound");
    }
}
