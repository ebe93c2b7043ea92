//! `Fills`, what a bucket store's cache is writing behind its restores (`LruCache::fill_behind`): each fill by
//! number, and the encoded bytes of its objects until they are on disk.
//!
//! CONTRACT: `begin` registers a fill and its objects and returns its `Fill`, which holds them until dropped
//! (the fill ended, panicked, or never started: it is no longer waited for). `bytes_of` hands out an object a
//! running fill holds; `settle_for` waits until no running fill holds an object; `settle` waits for every fill
//! begun before the call, whoever else waits too (a fill begun after it is not waited for, so no waiter starves).
//! Knows nothing of files: the caller writes them before it drops the `Fill`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;

use crate::id::ObjectId;

#[derive(Default)]
pub struct Fills {
    state: Mutex<State>,
    /// Told when a fill ends.
    done: Condvar,
}

#[derive(Default)]
struct State {
    begun: u64,
    running: BTreeSet<u64>,
    /// The objects of the running fills, each with the last fill that holds it and its encoded bytes.
    pending: HashMap<ObjectId, (u64, Bytes)>,
}

/// A running fill; dropping it ends it.
pub struct Fill {
    fills: Arc<Fills>,
    k: u64,
    ids: Vec<ObjectId>,
}

impl Fills {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fill of these objects begins: until its `Fill` is dropped they are `bytes_of` and waited for.
    pub fn begin(self: &Arc<Self>, objects: &[(ObjectId, Bytes)]) -> Fill {
        let mut state = self.state();
        let k = state.begun;
        state.begun += 1;
        state.running.insert(k);
        state.pending.extend(objects.iter().map(|(id, bytes)| (*id, (k, bytes.clone()))));
        Fill { fills: Arc::clone(self), k, ids: objects.iter().map(|(id, _)| *id).collect() }
    }

    /// The encoded bytes of `id` while a running fill holds it.
    pub fn bytes_of(&self, id: &ObjectId) -> Option<Bytes> {
        self.state().pending.get(id).map(|(_, bytes)| bytes.clone())
    }

    /// Wait until no running fill holds `id`.
    pub fn settle_for(&self, id: &ObjectId) {
        let mut state = self.state();
        while state.pending.contains_key(id) {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait for the fills begun before this call.
    pub fn settle(&self) {
        let mut state = self.state();
        let upto = state.begun;
        while state.running.first().is_some_and(|&k| k < upto) {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        let mut state = self.fills.state();
        state.running.remove(&self.k);
        for id in &self.ids {
            if state.pending.get(id).is_some_and(|(k, _)| *k == self.k) {
                state.pending.remove(id);
            }
        }
        drop(state);
        self.fills.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// An object is handed out while any running fill holds it; `settle` waits for a running fill begun before
    /// it; `settle_for` waits for the fills that hold its object and for no other.
    #[test]
    fn fills_hold_their_objects_until_dropped_and_are_waited_for() {
        let fills = Arc::new(Fills::default());
        let (x, y) = (ObjectId::of(b"x"), ObjectId::of(b"y"));
        let first = fills.begin(&[(x, Bytes::from_static(b"x bytes"))]);
        let second = fills.begin(&[(x, Bytes::from_static(b"x bytes")), (y, Bytes::from_static(b"y bytes"))]);
        let (said, heard) = mpsc::channel();
        let waiter = {
            let (fills, said) = (Arc::clone(&fills), said.clone());
            std::thread::spawn(move || {
                fills.settle();
                said.send("settled").unwrap();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(heard.try_recv().is_err(), "settle returned while fills begun before it run");
        drop(first);
        assert_eq!(fills.bytes_of(&x).as_deref(), Some(&b"x bytes"[..]), "the second fill still holds x");

        let for_y = {
            let fills = Arc::clone(&fills);
            std::thread::spawn(move || {
                fills.settle_for(&y);
                said.send("y settled").unwrap();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(heard.try_recv().is_err(), "settle or settle_for returned while a fill holds y");
        fills.settle_for(&ObjectId::of(b"z")); // held by no fill: returns at once
        drop(second);
        let mut got = vec![heard.recv_timeout(Duration::from_secs(30)).unwrap(), heard.recv_timeout(Duration::from_secs(30)).unwrap()];
        got.sort();
        assert_eq!(got, ["settled", "y settled"]);
        waiter.join().unwrap();
        for_y.join().unwrap();
        assert!(fills.bytes_of(&x).is_none() && fills.bytes_of(&y).is_none(), "ended fills hold nothing");
        fills.settle(); // nothing running: returns at once
    }
}
