//! Helpers shared by the unit tests (compiled only for `cargo test`): temp dirs, sample bytes, fingerprints,
//! synthetic decomposed states, a small store.
//!
//! CONTRACT: test code only; a `TempDir` is gone when dropped; `synthetic` states share their parent's
//! blocks below the fork, as real ones do.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::format::{Block, Decomposed};
use crate::manifest::Fingerprint;
use crate::store::{IngestReport, Store};

/// A fresh directory under the system temp dir (`tempfile`), removed on drop; `.0` is its path.
pub struct TempDir(pub PathBuf, #[allow(dead_code)] tempfile::TempDir);
impl TempDir {
    pub fn new(tag: &str) -> Self {
        let d = tempfile::Builder::new().prefix(&format!("kvstore-test-{tag}-")).tempdir().unwrap();
        TempDir(d.path().to_path_buf(), d)
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
pub fn synthetic(tokens: &[i32], b: usize) -> (Decomposed, u64, crate::store::FileSums) {
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
        Decomposed { skeleton, blocks, tokens: tokens.to_vec(), layout: "kv[test]".into(), n_stream: 1, n_checkpoints: 0,
                     shape: crate::format::Shape { kv_layers: vec![Some(1)], recurrent: false } };
    (d, file.len() as u64, crate::store::FileSums::of(&file))
}

pub fn put_synthetic(s: &Store, name: &str, ns: &str, tokens: &[i32], f: &Fingerprint) -> IngestReport {
    let (d, len, h) = synthetic(tokens, s.block_size() as usize);
    s.ingest_decomposed(name, ns, len, h, d, f, None, false, Instant::now()).unwrap()
}

/// A store in `d` with block size `b`, zstd level 1 and a 64 MiB map.
pub fn open(d: &TempDir, b: u32) -> Store {
    Store::open(&d.0, b, 1, 1 << 26).unwrap()
}

/// `$KVSTORE_STATE_DIR`, the directory of real slot files (tests/make_states.py) that the tests marked
/// `#[ignore = "needs real slot files: ./dev test"]` read. Unset is a failure, never a silent pass.
pub fn state_dir() -> PathBuf {
    match std::env::var_os("KVSTORE_STATE_DIR") {
        Some(d) => PathBuf::from(d),
        None => panic!(
            "KVSTORE_STATE_DIR is unset: this test reads real slot files (tests/make_states.py); run it through \
             ./dev test, or set KVSTORE_STATE_DIR to a directory of them"
        ),
    }
}

/// Every `*.bin` in the state directory, sorted; none is a failure.
pub fn state_files() -> Vec<PathBuf> {
    let dir = state_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("KVSTORE_STATE_DIR={}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "KVSTORE_STATE_DIR={} holds no *.bin files", dir.display());
    files
}

/// One real slot file of the state directory, by name.
pub fn state_file(name: &str) -> Vec<u8> {
    let p: &Path = &state_dir().join(name);
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
