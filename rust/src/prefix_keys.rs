//! The prefix-key chain (docs/design.md "Prefix keys") and the common prefix of two token lists.
//!
//! CONTRACT: one 32-byte key per full block of tokens, chained so that key k names the whole token prefix
//! [0, kB) in a namespace under a fingerprint id: `h0 = blake3(PREFIX_DOMAIN ‖ namespace ‖ \0 ‖ fingerprint
//! id)`, `h(k+1) = blake3(h(k) ‖ block k as i32le)`. Lookup walks a query's chain; ingest and sync record each
//! key with its manifest (`Index::put_prefixes`). Changing anything here breaks every stored key.

/// Domain separator of the prefix-key chain.
pub const PREFIX_DOMAIN: &[u8] = b"kvstore-prefix-v1";

/// `h0 = blake3("kvstore-prefix-v1" ‖ namespace ‖ \0 ‖ fingerprint_id)`.
pub fn prefix_seed(namespace: &str, fingerprint_id: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(PREFIX_DOMAIN);
    h.update(namespace.as_bytes());
    h.update(&[0]);
    h.update(fingerprint_id);
    *h.finalize().as_bytes()
}

/// `[h(1), .., h(floor(n/B))]` with `h(k+1) = blake3(h(k) ‖ tokens[kB..(k+1)B] as i32le)`.
pub fn prefix_chain(namespace: &str, fingerprint_id: &[u8; 32], tokens: &[i32], block_size: u32) -> Vec<[u8; 32]> {
    let b = block_size.max(1) as usize;
    let mut h = prefix_seed(namespace, fingerprint_id);
    let mut out = Vec::with_capacity(tokens.len() / b);
    for chunk in tokens.chunks_exact(b) {
        let mut x = blake3::Hasher::new();
        x.update(&h);
        for t in chunk {
            x.update(&t.to_le_bytes());
        }
        h = *x.finalize().as_bytes();
        out.push(h);
    }
    out
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{fingerprint_id, Fingerprint};
    use crate::testutil::fp;

    #[test]
    fn prefix_chain_is_deterministic_and_chained() {
        let f = fingerprint_id(&fp(&[("model", "abc")]));
        let t: Vec<i32> = (0..200).collect();
        let a = prefix_chain("", &f, &t, 64);
        assert_eq!(a.len(), 3);
        assert_eq!(a, prefix_chain("", &f, &t[..199], 64));
        assert_eq!(&prefix_chain("", &f, &t[..64], 64)[..], &a[..1]);
        assert_ne!(a, prefix_chain("tenant", &f, &t, 64));
        assert_ne!(a[0], prefix_chain("", &fingerprint_id(&Fingerprint::new()), &t, 64)[0]);
        let mut t2 = t.clone();
        t2[100] = -1;
        let b = prefix_chain("", &f, &t2, 64);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2]);
        // The spec, spelled out for h(1).
        let mut h0 = blake3::Hasher::new();
        h0.update(b"kvstore-prefix-v1\0");
        h0.update(&f);
        let mut h1 = blake3::Hasher::new();
        h1.update(h0.finalize().as_bytes());
        for x in 0..64i32 {
            h1.update(&x.to_le_bytes());
        }
        assert_eq!(a[0], *h1.finalize().as_bytes());
    }

    #[test]
    fn common_prefix_length() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
