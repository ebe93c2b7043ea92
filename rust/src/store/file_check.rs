//! The sums a saved slot file is checked against when a restore rebuilds it byte-exact: blake3 (`file_hash`,
//! every manifest) and xxh3-128 (`file_xxh3`, manifests written since it was added).
//!
//! CONTRACT: `FileSums::of` is what an ingest records of the original file. `matches` checks a rebuild given as
//! pieces in file order: its length, then xxh3 where the manifest carries it and every part came from a file
//! this machine holds (a local store's objects, a bucket store's cache, or a cache fill's bytes still in memory:
//! each was verified by its id, or by a blake3 file hash, before it was kept there), else blake3. What a bucket
//! sent is checked by blake3 alone: a bucket is shared, and a copy planted there must not pass by a sum that
//! can be forged. Why two sums: the check runs beside the file's write on the second core and blake3 (~5 GB/s
//! per core here) held that write back (70 MB state: write 15 ms alone, 22 ms with blake3 beside it); xxh3
//! (~20 GB/s) is what the local objects need against rot and torn writes. (`twox-hash`, not `xxhash-rust`: it
//! picks AVX2 at run time, and a wheel is built for the baseline x86-64; 2.5 vs 3.1 ms for 70 MB here.)

use twox_hash::XxHash3_128;

use crate::id::hex;
use crate::manifest::Manifest;

/// What an ingest records of the original slot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSums {
    pub blake3: [u8; 32],
    pub xxh3: u128,
}

impl FileSums {
    /// Both sums of `file`, in one pass: each 1 MiB is hashed by blake3, then by xxh3 while it is still in the
    /// CPU's cache (two passes over a 70 MB file cost an ingest 17-20% of its throughput; this, ~2 ms).
    pub fn of(file: &[u8]) -> FileSums {
        let mut b = blake3::Hasher::new();
        let mut x = XxHash3_128::new();
        for chunk in file.chunks(HASH_STAGE) {
            b.update(chunk);
            x.write(chunk);
        }
        FileSums { blake3: *b.finalize().as_bytes(), xxh3: x.finish_128() }
    }

    pub fn blake3_hex(&self) -> String {
        hex(&self.blake3)
    }

    pub fn xxh3_hex(&self) -> String {
        xxh3_hex(self.xxh3)
    }
}

fn xxh3_hex(sum: u128) -> String {
    hex(&sum.to_be_bytes())
}

/// The sum that checks a rebuilt file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSum {
    Xxh3,
    Blake3,
}

impl FileSum {
    /// The sum for a read of `m`'s parts; `local`: every part was read from a file this machine holds (none
    /// fetched from a bucket during the read).
    pub fn for_read(m: &Manifest, local: bool) -> FileSum {
        match m.file_xxh3 {
            Some(_) if local => FileSum::Xxh3,
            _ => FileSum::Blake3,
        }
    }

    /// As a restore reports it (`MaterializeReport::verified_by`).
    pub fn name(self) -> &'static str {
        match self {
            FileSum::Xxh3 => "file xxh3",
            FileSum::Blake3 => "file blake3",
        }
    }
}

/// Whether `pieces` concatenated are the file `m` was saved from, checked by `FileSum::for_read(m, local)`.
pub fn matches(m: &Manifest, pieces: &[&[u8]], local: bool) -> bool {
    let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
    if len != m.file_bytes {
        return false;
    }
    match FileSum::for_read(m, local) {
        FileSum::Xxh3 => m.file_xxh3.as_deref() == Some(&xxh3_hex(xxh3_pieces(pieces))),
        FileSum::Blake3 => hex(blake3_pieces(pieces).as_bytes()) == m.file_hash,
    }
}

fn xxh3_pieces(pieces: &[&[u8]]) -> u128 {
    if let [whole] = pieces {
        return XxHash3_128::oneshot(whole);
    }
    let mut h = XxHash3_128::new();
    for piece in pieces {
        h.write(piece);
    }
    h.finish_128()
}

/// Bytes staged per blake3 update (1 MiB: measured best of 64 KiB to 4 MiB).
const HASH_STAGE: usize = 1 << 20;

/// blake3 of pieces concatenated. Why staged: blake3 hashes many 1 KiB chunks at once (SIMD) only over input
/// that starts at a large power-of-two offset; pieces start anywhere (heads of a few bytes lie between rows),
/// and hashing them one by one took 2.6x as long as the whole file at once (70 MB state: 42 vs 16 ms).
/// Copying them through a 1 MiB stage costs ~4 ms of that back (21 ms).
fn blake3_pieces(pieces: &[&[u8]]) -> blake3::Hash {
    if let [whole] = pieces {
        return blake3::hash(whole); // a rebuilt file in one buffer: aligned already, nothing to stage
    }
    let mut hasher = blake3::Hasher::new();
    let mut stage = Vec::with_capacity(HASH_STAGE);
    for piece in pieces {
        let mut rest: &[u8] = piece;
        while !rest.is_empty() {
            let take = rest.len().min(HASH_STAGE - stage.len());
            stage.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if stage.len() == HASH_STAGE {
                hasher.update(&stage);
                stage.clear();
            }
        }
    }
    hasher.update(&stage);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_of(file: &[u8], with_xxh3: bool) -> Manifest {
        let sums = FileSums::of(file);
        let mut m = crate::manifest::tests_support::manifest(1, Default::default());
        m.file_bytes = file.len() as u64;
        m.file_hash = sums.blake3_hex();
        m.file_xxh3 = with_xxh3.then(|| sums.xxh3_hex());
        m
    }

    /// Pieces of any split check as the whole file does; one changed byte fails both sums, whichever applies.
    #[test]
    fn pieces_check_like_the_whole_file_and_one_changed_byte_fails() {
        let file: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let splits: [&[usize]; 3] = [&[], &[1, 7, 1 << 20, (1 << 20) + 3], &[999_999, 2_999_999]];
        for with_xxh3 in [false, true] {
            let m = manifest_of(&file, with_xxh3);
            for cuts in splits {
                let mut pieces = Vec::new();
                let mut at = 0;
                for &c in cuts {
                    pieces.push(&file[at..c]);
                    at = c;
                }
                pieces.push(&file[at..]);
                for local in [false, true] {
                    assert!(matches(&m, &pieces, local), "xxh3 {with_xxh3}, local {local}, cuts {cuts:?}");
                }
            }
            let mut bad = file.clone();
            bad[2_500_000] ^= 0x40;
            for local in [false, true] {
                assert!(!matches(&m, &[&bad], local), "xxh3 {with_xxh3}, local {local}");
                assert!(!matches(&m, &[&file[..file.len() - 1]], local), "a short file fails on its length");
            }
        }
    }

    /// The recorded sum is XXH3-128 as every implementation computes it (values from the `xxhash-rust` crate,
    /// another implementation): a manifest outlives the library that wrote it.
    #[test]
    fn the_xxh3_is_the_standard_one_over_chunks() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        assert_eq!(FileSums::of(b"").xxh3_hex(), "99aa06d3014798d86001c324468d497f");
        assert_eq!(FileSums::of(&big).xxh3_hex(), "a47aba2890dab54a09092c89dd574a27");
        assert_eq!(FileSums::of(&big).blake3, *blake3::hash(&big).as_bytes());
    }

    /// Which sum decides: xxh3 only for a read of local files with a manifest that records it; blake3 for a
    /// read that fetched from a bucket even where the xxh3 would pass, and for manifests written before it.
    #[test]
    fn a_bucket_read_is_checked_by_blake3_and_a_local_one_by_xxh3() {
        let file = vec![7u8; 4096];
        let mut m = manifest_of(&file, true);
        assert_eq!((FileSum::for_read(&m, true), FileSum::for_read(&m, false)), (FileSum::Xxh3, FileSum::Blake3));
        m.file_hash = "00".repeat(32); // only blake3 would fail
        assert!(matches(&m, &[&file], true));
        assert!(!matches(&m, &[&file], false));
        let mut m = manifest_of(&file, true);
        m.file_xxh3 = Some(xxh3_hex(0)); // only xxh3 would fail
        assert!(!matches(&m, &[&file], true));
        assert!(matches(&m, &[&file], false));
        let old = manifest_of(&file, false);
        assert_eq!(FileSum::for_read(&old, true), FileSum::Blake3);
        assert!(matches(&old, &[&file], true) && matches(&old, &[&file], false));
    }
}
