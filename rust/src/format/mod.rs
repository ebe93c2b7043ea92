//! llama.cpp slot-save files (`ggsq` version 4): cut into a skeleton plus KV row blocks, and put back together.
//!
//! CONTRACT (docs/design.md): `recompose(decompose(f)) == f` byte for byte. Blocks are keyed by cell position,
//! never by file index, and hold rows cell-major, so their bytes do not depend on cell count or ring order.
//! This module knows nothing about objects, hashes or LMDB.

/// "qsgg" on disk.
pub const MAGIC: u32 = 0x6767_7371;
/// The only version the llama.cpp loader accepts (`LLAMA_STATE_SEQ_VERSION`).
pub const VERSION: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a llama.cpp slot file: magic {found:#010x}, expected 0x67677371")]
    BadMagic { found: u32 },
    #[error("slot file version {found} is not supported; this build reads version 4 (llama.cpp LLAMA_STATE_SEQ_VERSION)")]
    BadVersion { found: u32 },
    #[error("slot file truncated at byte {offset}: {what} needs {need} bytes, {have} left")]
    Truncated { offset: u64, what: &'static str, need: u64, have: u64 },
    #[error("slot file invalid at byte {offset}: {what}: {detail}")]
    Invalid { offset: u64, what: &'static str, detail: String },
    #[error("stored skeleton is corrupt: {0}")]
    Skeleton(String),
}

/// KV rows of the cells whose positions fall in one block range of one KV section.
#[derive(Debug, Clone)]
pub struct Block {
    pub bytes: Vec<u8>,
    /// Element width for byte-plane compression: 2 for f16/bf16, 4 for f32, 1 for quantized or mixed types.
    pub elem_size: u8,
}

#[derive(Debug)]
pub struct Decomposed {
    /// Versioned, self-describing bytes; references blocks by index into `blocks`.
    pub skeleton: Vec<u8>,
    /// In the order the skeleton references them (identical blocks may repeat).
    pub blocks: Vec<Block>,
    /// Token ids of the state (media positions are -1); empty for an empty slot.
    pub tokens: Vec<i32>,
    /// Canonical description of the cache layout, e.g. `kv[3:f16/512,f16/512;vt0;rot0,0]+kv[15:...]`;
    /// equal layouts restore into each other's servers, different ones never do.
    pub layout: String,
    /// `n_stream` of the saving server's KV sections (0 if the file has no KV section).
    pub n_stream: u32,
    /// Number of SCKP checkpoints in the appendix.
    pub n_checkpoints: u32,
}

/// How to emit a file.
#[derive(Debug, Clone, Default)]
pub struct EmitOptions {
    /// Re-emit every KV section for a server with this many streams (`--parallel`, or 1 with `--kv-unified`).
    /// `None` keeps the original, which makes the output byte-exact.
    pub n_stream: Option<u32>,
}

pub fn decompose(file: &[u8], block_size: u32) -> Result<Decomposed, FormatError> {
    let _ = (file, block_size);
    unimplemented!("format::decompose")
}

/// Token ids recorded in a skeleton.
pub fn skeleton_tokens(skeleton: &[u8]) -> Result<Vec<i32>, FormatError> {
    let _ = skeleton;
    unimplemented!("format::skeleton_tokens")
}

/// Number of block references in a skeleton (the manifest's block list must have this length).
pub fn skeleton_block_count(skeleton: &[u8]) -> Result<usize, FormatError> {
    let _ = skeleton;
    unimplemented!("format::skeleton_block_count")
}

/// Rebuild a file. `blocks[i]` is the block the skeleton references as index i; lengths are checked.
pub fn recompose(skeleton: &[u8], blocks: &[&[u8]], opts: &EmitOptions) -> Result<Vec<u8>, FormatError> {
    let _ = (skeleton, blocks, opts);
    unimplemented!("format::recompose")
}
