//! Rebuild buffers kept between restores.
//!
//! Why: a rebuilt slot file is written from one buffer of its size, and a fresh buffer of a large state pays a
//! page fault per 4 KiB page as it is filled. On this project's 2-core machine, filling a fresh 256 MiB buffer
//! runs at 2.0 GB/s and refilling a kept one at 11.7 GB/s; a page-cache copy of a file runs at ~4 GB/s, so the
//! faults alone cost more than the copy a restore is measured against. glibc keeps freed memory for reuse only
//! below its mmap threshold (at most 32 MiB), so every state above that paid them on every restore.
//!
//! CONTRACT: `take(len)` returns an empty buffer: the smallest kept one with capacity >= `len`, else a new one
//! without capacity (the caller reserves what it needs, after checking it). `give` keeps a buffer only while at most `RETAIN_COUNT` are kept and their capacities total at
//! most `RETAIN_BYTES`, else frees it; what is kept is only ever memory, never state (a taken buffer is empty).

use std::sync::Mutex;

/// Buffers kept: a state's file and its blocks (32 cells each by default), for a few restores at once.
pub const RETAIN_COUNT: usize = 1024;
/// Memory kept idle at most (a state larger than this is rebuilt in fresh memory, as before).
pub const RETAIN_BYTES: usize = 1 << 30;

#[derive(Default)]
pub struct Buffers {
    kept: Mutex<Vec<Vec<u8>>>,
}

impl Buffers {
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let fit = kept.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
        match fit.map(|(i, _)| i) {
            Some(i) => kept.swap_remove(i),
            None => Vec::new(),
        }
    }

    pub fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = kept.iter().map(|b| b.capacity()).sum();
        if kept.len() < RETAIN_COUNT && total.saturating_add(buf.capacity()) <= RETAIN_BYTES {
            kept.push(buf);
        } else if let Some(small) = kept.iter_mut().min_by_key(|b| b.capacity()) {
            // A larger buffer replaces the smallest kept one when it fits: the next restore of this size reuses it.
            if small.capacity() < buf.capacity() && total - small.capacity() + buf.capacity() <= RETAIN_BYTES {
                *small = buf;
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|b| b.capacity()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_is_reused_empty_and_the_kept_memory_is_bounded() {
        let b = Buffers::default();
        let mut x = b.take(1000);
        assert!(x.is_empty());
        x.extend_from_slice(&[1; 1000]);
        let at = x.as_ptr();
        b.give(x);
        let y = b.take(500);
        assert_eq!(y.as_ptr(), at, "the kept buffer is reused");
        assert!(y.is_empty(), "a taken buffer holds nothing of the previous restore");
        b.give(y);
        // Too large to keep: freed, and what is kept stays within the bound.
        b.give(Vec::with_capacity(RETAIN_BYTES + 1));
        assert!(b.kept_bytes() <= RETAIN_BYTES);
        let (p, q, r) = (Vec::with_capacity(10), Vec::with_capacity(10), Vec::with_capacity(10));
        b.give(p);
        b.give(q);
        b.give(r);
        assert_eq!(b.kept.lock().unwrap().len(), 4);
        // A larger one replaces the smallest kept.
        for _ in 4..RETAIN_COUNT {
            b.give(Vec::with_capacity(8));
        }
        assert_eq!(b.kept.lock().unwrap().len(), RETAIN_COUNT);
        b.give(Vec::with_capacity(1 << 20));
        assert!(b.kept_bytes() >= 1 << 20);
        assert_eq!(b.kept.lock().unwrap().len(), RETAIN_COUNT, "the count stays bounded");
    }
}
