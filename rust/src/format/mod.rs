//! llama.cpp slot-save files (`ggsq` version 4): cut into a skeleton plus blocks, and put back together.
//!
//! CONTRACT (docs/design.md): `recompose(decompose(f)) == f` byte for byte. KV blocks are keyed by cell
//! position, never by file index, and hold rows cell-major, so their bytes do not depend on cell count or ring
//! order. A recurrent section (recurrent and hybrid models) has no positions: its state is one whole block.
//! This module knows nothing about objects, hashes or LMDB.
//!
//! Modules: `head` (the magic words, the 12-byte head check), `reader` (bounds-checked cursor), `model` (the
//! parsed structure), `parse` (file -> structure),
//! `plan` (cells -> blocks by position), `emit` (rows between file and block layout), `recurrent` (the
//! recurrent section, documented there), `skeleton` (the
//! versioned skeleton codec, format documented there), `layout` (the canonical layout string, documented there),
//! `rows` (row access to a decomposed state), `checkpoint` (sections from chosen rows, the cut checkpoint),
//! `cut` (a slot file for the first P tokens of a state: a cut), `complete` (the sections a model implies),
//! `sink` (where an emitted file goes: a buffer, or pieces pointing at the blocks), `place` (where each
//! block's rows go in the file, from the skeleton alone: a restore that writes blocks as they arrive).

mod checkpoint;
mod complete;
mod cut;
mod emit;
mod ggml;
mod head;
mod layout;
mod model;
mod parse;
mod place;
mod plan;
mod reader;
mod recurrent;
mod rows;
mod sink;
mod skeleton;
#[cfg(test)]
mod cut_tests;
#[cfg(test)]
mod recurrent_tests;
#[cfg(test)]
mod tests;

pub use complete::{ModelShape, Shape};
pub use head::{check_head, HEAD_LEN};
pub use place::{place, Placement, RowRun};
pub use sink::Pieces;
use model::{SlotFile, Unit};
pub use cut::{emit_prefix, Prefix, PrefixSpec, RowOrigin, StateRef};
use plan::UnitPlan;

/// First bytes of every skeleton (`b"KVSK"`), followed by a u32 skeleton version.
pub const SKELETON_MAGIC: [u8; 4] = skeleton::SKELETON_MAGIC;
/// The skeleton encoding this build writes and reads.
pub const SKELETON_VERSION: u32 = skeleton::SKELETON_VERSION;
/// Largest `n_stream` accepted in a file, a skeleton or `EmitOptions` (llama.cpp's own limit on sequences is far lower).
pub const MAX_EMIT_STREAMS: u32 = 65_536;

/// The file's magic words ("qsgg", version 4, the "SCKP" checkpoint appendix): `head.rs`.
pub use head::{MAGIC, SCKP_MAGIC, VERSION};

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
    #[error("slot file invalid at byte {offset}: {what} {code} is not a ggml type llama.cpp defines; the file is damaged: save the slot again")]
    UnknownType { offset: u64, what: &'static str, code: i32 },
    #[error("slot file invalid at byte {offset}: {what} {size} does not fit type {ty} ({detail}); the file is damaged: save the slot again")]
    SizeMismatch { offset: u64, what: &'static str, ty: String, size: u64, detail: String },
    #[error("slot file invalid at byte {offset}: {what} {n_rot} ({detail}); the file is damaged: save the slot again")]
    BadRotation { offset: u64, what: &'static str, n_rot: u32, detail: String },
    #[error("slot file incomplete: {want}, but it holds {found}; it was cut short or saved by another model: save the slot again")]
    Incomplete { want: String, found: String },
    #[error("the slot file holds 0 tokens (an empty slot): nothing to store; save the slot after a request has used it")]
    Empty,
    #[error("{}: {kind}, not a regular file; pass a slot file that llama-server wrote into its --slot-save-path", path.display())]
    NotAFile { path: std::path::PathBuf, kind: &'static str },
}

/// KV rows of the cells whose positions fall in one block range of one KV section, or a whole recurrent state.
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
    /// Canonical description of the cache layout, e.g. gemma3 with f16 cache and flash attention:
    /// `kv[3:f16/512,f16/512*3;vt0;rot0,0;ext0]+kv[15:f16/512,f16/512*15;vt0;rot0,0;ext0]`; an empty slot is
    /// `kv[-]` per section. A recurrent section adds e.g. `+rec[4:f32/512*2;f32/0*2]` (LFM2: 4 layers, two
    /// of them short-conv layers with a conv state and no ssm state). Equal layouts restore into each other's
    /// servers (given equal `n_stream`, which is not part of it), different ones never do. Grammar: `layout.rs`.
    pub layout: String,
    /// `n_stream` of the saving server's KV sections (0 if the file has no KV section).
    pub n_stream: u32,
    /// Number of SCKP checkpoints in the appendix.
    pub n_checkpoints: u32,
    /// The sections it holds, for `Shape::check` against the model.
    pub shape: Shape,
}

/// How to emit a file.
#[derive(Debug, Clone, Default)]
pub struct EmitOptions {
    /// Re-emit every KV section for a server with this many streams (`--parallel`, or 1 with `--kv-unified`).
    /// `None` keeps the original, which makes the output byte-exact.
    pub n_stream: Option<u32>,
}

/// Split a slot file into a skeleton and KV blocks of `block_size` positions. Refuses anything it cannot
/// rebuild byte for byte: bad magic/version, truncation, a malformed appendix, more than one stream with
/// cells, duplicate positions within a KV section.
pub fn decompose(file: &[u8], block_size: u32) -> Result<Decomposed, FormatError> {
    if block_size == 0 {
        return Err(FormatError::Invalid { offset: 0, what: "block_size", detail: "must be at least 1".into() });
    }
    let f = parse::parse_file(file)?;
    let tokens = model::tokens_from_words(f.words)
        .map_err(|detail| FormatError::Invalid { offset: 12, what: "token payload", detail })?;
    let mut blocks = Vec::new();
    for u in f.units() {
        let c = match u {
            Unit::Kv(c) => c,
            Unit::Rec(rc) => {
                if rc.n_blocks()? == 1 {
                    blocks.push(Block { bytes: rc.block(), elem_size: rc.elem_size() });
                }
                continue;
            }
        };
        let plan = plan::plan(&c.pos, block_size).map_err(|p| FormatError::Invalid {
            offset: (c.meta.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize) as u64,
            what: "cell positions",
            detail: format!("position {p} occurs twice in one KV section"),
        })?;
        let elem_size = c.elem_size();
        blocks.extend(emit::cut(c, &plan).into_iter().map(|bytes| Block { bytes, elem_size }));
    }
    let n_blocks = u32::try_from(blocks.len())
        .map_err(|_| FormatError::Invalid { offset: 0, what: "blocks", detail: "more than 2^32 blocks".into() })?;
    Ok(Decomposed {
        skeleton: skeleton::encode(&f, block_size, n_blocks),
        blocks,
        tokens,
        layout: layout::layout(&f.sections, f.recurrent.as_ref()),
        n_stream: f.sections.first().map_or(0, |s| s.n_stream),
        n_checkpoints: f.appendix.as_ref().map_or(0, |a| a.checkpoints.len() as u32),
        shape: Shape::of(&f),
    })
}

/// Token ids recorded in a skeleton.
pub fn skeleton_tokens(skeleton: &[u8]) -> Result<Vec<i32>, FormatError> {
    let (_, _, _, words, _) = skeleton::decode_head(skeleton)?;
    model::tokens_from_words(words).map_err(FormatError::Skeleton)
}

/// Number of block references in a skeleton (the manifest's block list must have this length).
/// Decodes and cross-checks the whole skeleton (cheap: it holds no K/V data).
pub fn skeleton_block_count(skeleton: &[u8]) -> Result<usize, FormatError> {
    let (_, plans) = decode_planned(skeleton)?;
    Ok(plans.iter().map(UnitPlan::n_blocks).sum())
}

/// Block size (in positions) the skeleton was cut with.
pub fn skeleton_block_size(skeleton: &[u8]) -> Result<u32, FormatError> {
    Ok(skeleton::decode_head(skeleton)?.1)
}

/// Expected byte length of every block the skeleton references, in reference order.
pub fn skeleton_block_lengths(skeleton: &[u8]) -> Result<Vec<usize>, FormatError> {
    let (d, plans) = decode_planned(skeleton)?;
    let mut out = Vec::new();
    for (u, plan) in d.file.units().into_iter().zip(&plans) {
        out.extend(unit_block_lengths(u, plan)?);
    }
    Ok(out)
}

fn unit_block_lengths(u: Unit<'_, '_>, plan: &UnitPlan) -> Result<Vec<usize>, FormatError> {
    match (u, plan) {
        (Unit::Kv(c), UnitPlan::Kv(p)) => emit::block_lengths(c, p),
        (Unit::Rec(rc), UnitPlan::Rec(n)) => Ok(if *n == 1 { vec![rc.block_len()?] } else { Vec::new() }),
        _ => unreachable!("plans_of follows units()"),
    }
}

fn decode_planned(skeleton: &[u8]) -> Result<(skeleton::Decoded<'_>, Vec<UnitPlan>), FormatError> {
    let d = skeleton::decode(skeleton)?;
    let plans = plans_of(&d.file, d.block_size)?;
    let total: usize = plans.iter().map(UnitPlan::n_blocks).sum();
    if total != d.n_blocks as usize {
        return Err(FormatError::Skeleton(format!("header says {} blocks, sections need {total}", d.n_blocks)));
    }
    Ok((d, plans))
}

fn plans_of(f: &SlotFile<'_>, block_size: u32) -> Result<Vec<UnitPlan>, FormatError> {
    let dup = |p| FormatError::Skeleton(format!("duplicate position {p}"));
    f.units()
        .into_iter()
        .map(|u| match u {
            Unit::Kv(c) => plan::plan(&c.pos, block_size).map(UnitPlan::Kv).map_err(dup),
            Unit::Rec(rc) => Ok(UnitPlan::Rec(rc.n_blocks()?)),
        })
        .collect()
}

/// Rebuild a file. `blocks[i]` is the block the skeleton references as index i; lengths are checked.
pub fn recompose(skeleton: &[u8], blocks: &[&[u8]], opts: &EmitOptions) -> Result<Vec<u8>, FormatError> {
    let (d, plans) = checked_plans(skeleton, blocks, opts)?;
    let payload: usize = blocks.iter().map(|b| b.len()).sum();
    let streams = opts.n_stream.unwrap_or(0) as usize * 4 * (d.file.sections.len() + 64);
    let mut out = Vec::with_capacity(skeleton.len().saturating_add(payload).saturating_add(streams));
    emit::Emitter { plans: plans.iter(), blocks, n_stream: opts.n_stream, first_block: 0 }.file(&d.file, &mut out);
    Ok(out)
}

/// [`recompose`] as pieces: the bytes it makes, and the blocks' rows pointed at, not copied (`sink.rs`).
pub fn recompose_pieces<'b>(skeleton: &[u8], blocks: &[&'b [u8]], opts: &EmitOptions) -> Result<Pieces<'b>, FormatError> {
    let mut out = Pieces::default();
    emit_into(skeleton, blocks, opts, &mut out)?;
    Ok(out)
}

/// Emit the file `skeleton` and `blocks` recompose to into `out` (`place.rs`: a sink that only notes where rows
/// go).
fn emit_into<'b>(skeleton: &[u8], blocks: &[&'b [u8]], opts: &EmitOptions, out: &mut impl sink::Sink<'b>) -> Result<(), FormatError> {
    let (d, plans) = checked_plans(skeleton, blocks, opts)?;
    emit::Emitter { plans: plans.iter(), blocks, n_stream: opts.n_stream, first_block: 0 }.file(&d.file, out);
    Ok(())
}

/// The skeleton decoded and its plans, once `opts` and the blocks' lengths are checked against it.
fn checked_plans<'s>(
    skeleton: &'s [u8],
    blocks: &[&[u8]],
    opts: &EmitOptions,
) -> Result<(skeleton::Decoded<'s>, Vec<UnitPlan>), FormatError> {
    if let Some(k) = opts.n_stream {
        if k == 0 || k > MAX_EMIT_STREAMS {
            return Err(FormatError::Invalid {
                offset: 0,
                what: "EmitOptions.n_stream",
                detail: format!("{k} is outside 1..={MAX_EMIT_STREAMS}"),
            });
        }
    }
    let (d, plans) = decode_planned(skeleton)?;
    if blocks.len() != d.n_blocks as usize {
        return Err(FormatError::Skeleton(format!("skeleton references {} blocks, got {}", d.n_blocks, blocks.len())));
    }
    let mut i = 0usize;
    for (u, plan) in d.file.units().into_iter().zip(&plans) {
        for want in unit_block_lengths(u, plan)? {
            if blocks[i].len() != want {
                return Err(FormatError::Skeleton(format!("block {i} has {} bytes, expected {want}", blocks[i].len())));
            }
            i += 1;
        }
    }
    Ok((d, plans))
}
