//! Helpers shared by the unit tests (compiled only for `cargo test`): temp dirs, sample bytes, fingerprints,
//! synthetic decomposed states, a small store.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use crate::format::{Block, Decomposed};
use crate::manifest::Fingerprint;
use crate::objects::atomic::random_suffix;
use crate::store::{IngestReport, Store};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);
impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("kvstore-test-{tag}-{}", random_suffix()));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// f16-like rows: smooth high bytes, noisy low bytes.
pub fn sample(n: usize) -> Vec<u8> {
    (0..n).map(|i| if i % 2 == 1 { (i / 64) as u8 } else { (i * 31 % 251) as u8 }).collect()
}

pub fn fp(kv: &[(&str, &str)]) -> Fingerprint {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A synthetic decomposed state: block k is a function of tokens [kB, (k+1)B) (so children share their
/// parent's blocks below the fork), skeleton = token list.
pub fn synthetic(tokens: &[i32], b: usize) -> (Decomposed, u64, [u8; 32]) {
    let blocks: Vec<Block> = tokens
        .chunks(b)
        .map(|c| Block { bytes: c.iter().flat_map(|t| [(t & 0xff) as u8, 0x3c].repeat(16)).collect(), elem_size: 2 })
        .collect();
    let skeleton: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut file = skeleton.clone();
    for bl in &blocks {
        file.extend_from_slice(&bl.bytes);
    }
    let d =
        Decomposed { skeleton, blocks, tokens: tokens.to_vec(), layout: "kv[test]".into(), n_stream: 1, n_checkpoints: 0 };
    (d, file.len() as u64, *blake3::hash(&file).as_bytes())
}

pub fn put_synthetic(s: &Store, name: &str, ns: &str, tokens: &[i32], f: &Fingerprint) -> IngestReport {
    let (d, len, h) = synthetic(tokens, s.block_size() as usize);
    s.ingest_decomposed(name, ns, len, h, d, f, None, Instant::now()).unwrap()
}

/// A store in `d` with block size `b`, zstd level 1 and a 64 MiB map.
pub fn open(d: &TempDir, b: u32) -> Store {
    Store::open(&d.0, b, 1, 1 << 26).unwrap()
}
