//! The skeleton: everything of a slot file except the K/V rows, as a small versioned binary.
//!
//! CONTRACT: encoding (little-endian), version 1, or 2 when the file has a recurrent section (`[v2: ...]` below):
//! ```text
//! b"KVSK"  u32 skeleton_version  u32 block_size  u32 n_blocks
//! u32 n_token_words  i32 token_words[n]                  -- verbatim from the file
//! u32 n_sections  section[n]  [v2: rec]                  -- the body's KV sections, recurrent section
//! u8 has_appendix  [u32 sckp_version  u32 count  checkpoint[count]]
//! u64 len  trailing bytes
//!
//! section:    u32 n_stream  u32 cell_stream  u8 cell_ext  u32 cell_count
//!             if cell_count > 0:
//!               u64 len  meta bytes (verbatim, file order)
//!               u32 v_trans  u32 n_layer  u32 n_rot_k  u32 n_rot_v
//!               n_layer x { i32 k_type  u64 k_row  i32 v_type  (u64 v_row | u32 el  u32 n_embd if v_trans) }
//! rec:        u8 0 (none) | u8 1, the section (encoding in recurrent.rs)
//! checkpoint: i64 n_tokens  i32 pos_min  i32 pos_max
//!             u8 0, u64 len, data_tgt verbatim  |  u8 1, u32 io_magic, i32 seq_id, u32 n, section[n], [v2: rec]
//!             u64 len  data_dft   u64 len  data_spec
//! ```
//! Blocks are referenced implicitly: each section with cells owns the next `k` block indices, where `k` is the
//! number of distinct `pos / block_size` among its cells (recomputed from the meta on decode and checked
//! against `n_blocks`); a recurrent section with bytes owns one. Order: `SlotFile::units`.

use super::model::*;
use super::reader::{PutLe, Reader};
use super::recurrent;
use super::FormatError;

pub(crate) const SKELETON_MAGIC: [u8; 4] = *b"KVSK";
/// The newest version; files without a recurrent section are still written as version 1.
pub(crate) const SKELETON_VERSION: u32 = 2;

pub(crate) fn encode(f: &SlotFile<'_>, block_size: u32, n_blocks: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + f.words.len() + f.trailing.len());
    let v2 = f.units().iter().any(|u| matches!(u, Unit::Rec(_)));
    out.extend_from_slice(&SKELETON_MAGIC);
    out.put_u32(if v2 { 2 } else { 1 });
    out.put_u32(block_size);
    out.put_u32(n_blocks);
    out.put_u32((f.words.len() / 4) as u32);
    out.extend_from_slice(f.words);
    put_sections(&mut out, &f.sections);
    recurrent::encode_opt(v2, f.recurrent.as_ref(), &mut out);
    match &f.appendix {
        None => out.put_u8(0),
        Some(a) => {
            out.put_u8(1);
            out.put_u32(a.version);
            out.put_u32(a.checkpoints.len() as u32);
            for c in &a.checkpoints {
                out.put_i64(c.n_tokens);
                out.put_i32(c.pos_min);
                out.put_i32(c.pos_max);
                match &c.tgt {
                    Tgt::Opaque(b) => {
                        out.put_u8(0);
                        put_bytes(&mut out, b);
                    }
                    Tgt::Parsed { io_magic, seq_id, sections, recurrent } => {
                        out.put_u8(1);
                        out.put_u32(*io_magic);
                        out.put_i32(*seq_id);
                        put_sections(&mut out, sections);
                        recurrent::encode_opt(v2, recurrent.as_ref(), &mut out);
                    }
                }
                put_bytes(&mut out, c.dft);
                put_bytes(&mut out, c.spec);
            }
        }
    }
    put_bytes(&mut out, f.trailing);
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.put_u64(b.len() as u64);
    out.extend_from_slice(b);
}

fn put_sections(out: &mut Vec<u8>, sections: &[Section<'_>]) {
    out.put_u32(sections.len() as u32);
    for s in sections {
        out.put_u32(s.n_stream);
        out.put_u32(s.cell_stream);
        out.put_u8(s.cell_ext as u8);
        let Some(c) = &s.cells else {
            out.put_u32(0);
            continue;
        };
        out.put_u32(c.count);
        put_bytes(out, c.meta);
        out.put_u32(c.v_trans);
        out.put_u32(c.layers.len() as u32);
        out.put_u32(c.n_rot_k);
        out.put_u32(c.n_rot_v);
        for l in &c.layers {
            out.put_i32(l.k_ty);
            out.put_u64(l.k_row);
            out.put_i32(l.v.ty());
            match l.v {
                VLayout::Rows { row, .. } => out.put_u64(row),
                VLayout::Trans { el, n_embd, .. } => {
                    out.put_u32(el);
                    out.put_u32(n_embd);
                }
            }
        }
    }
}

/// A decoded skeleton: the file structure without payload.
pub(crate) struct Decoded<'a> {
    pub file: SlotFile<'a>,
    pub block_size: u32,
    pub n_blocks: u32,
}

fn corrupt(e: FormatError) -> FormatError {
    if let FormatError::Skeleton(_) = e { e } else { FormatError::Skeleton(e.to_string()) }
}

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError::Skeleton(msg.into())
}

/// The fixed header and the token words; leaves the reader after the words. Returns the skeleton version too.
pub(crate) fn decode_head<'a>(s: &'a [u8]) -> Result<(Reader<'a>, u32, u32, &'a [u8], u32), FormatError> {
    let mut r = Reader::new(s, 0);
    let magic = r.take(4, "skeleton magic").map_err(corrupt)?;
    if magic != SKELETON_MAGIC {
        return Err(bad(format!("bad magic {magic:02x?}, expected \"KVSK\"")));
    }
    let version = r.u32("skeleton version").map_err(corrupt)?;
    if !(1..=SKELETON_VERSION).contains(&version) {
        return Err(bad(format!("skeleton version {version} is not supported (this build: 1 to {SKELETON_VERSION})")));
    }
    let block_size = r.u32("block_size").map_err(corrupt)?;
    (block_size != 0).then_some(()).ok_or_else(|| bad("block_size 0"))?;
    let n_blocks = r.u32("n_blocks").map_err(corrupt)?;
    let n_words = r.u32("n_token_words").map_err(corrupt)?;
    let words = r.take(n_words as u64 * 4, "token words").map_err(corrupt)?;
    Ok((r, block_size, n_blocks, words, version))
}

pub(crate) fn decode(s: &[u8]) -> Result<Decoded<'_>, FormatError> {
    let (mut r, block_size, n_blocks, words, version) = decode_head(s)?;
    let v2 = version >= 2;
    let mut body = || -> Result<SlotFile<'_>, FormatError> {
        let sections = get_sections(&mut r)?;
        let recurrent = recurrent::decode_opt(v2, &mut r)?;
        let appendix = match r.u8("has_appendix")? {
            0 => None,
            1 => {
                let version = r.u32("SCKP version")?;
                let count = r.u32("SCKP count")?;
                r.need(count as u64 * 33, "checkpoints")?;
                let mut checkpoints = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    let n_tokens = r.i64("n_tokens")?;
                    let pos_min = r.i32("pos_min")?;
                    let pos_max = r.i32("pos_max")?;
                    let tgt = match r.u8("tgt kind")? {
                        0 => Tgt::Opaque(get_bytes(&mut r, "data_tgt")?),
                        1 => {
                            let io_magic = r.u32("io_magic")?;
                            let seq_id = r.i32("seq_id")?;
                            let sections = get_sections(&mut r)?;
                            let recurrent = recurrent::decode_opt(v2, &mut r)?;
                            if sections.is_empty() && recurrent.is_none() {
                                return Err(bad("parsed checkpoint blob without sections"));
                            }
                            Tgt::Parsed { io_magic, seq_id, sections, recurrent }
                        }
                        k => return Err(bad(format!("unknown checkpoint blob kind {k}"))),
                    };
                    let dft = get_bytes(&mut r, "data_dft")?;
                    let spec = get_bytes(&mut r, "data_spec")?;
                    checkpoints.push(Checkpoint { n_tokens, pos_min, pos_max, tgt, dft, spec });
                }
                Some(Appendix { version, checkpoints })
            }
            k => return Err(bad(format!("has_appendix {k}"))),
        };
        let trailing = get_bytes(&mut r, "trailing bytes")?;
        if !r.is_empty() {
            return Err(bad(format!("{} unexpected bytes at the end", r.remaining())));
        }
        Ok(SlotFile { words, sections, recurrent, appendix, trailing })
    };
    let file = body().map_err(corrupt)?;
    Ok(Decoded { file, block_size, n_blocks })
}

fn get_bytes<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<&'a [u8], FormatError> {
    let n = r.u64(what)?;
    r.take(n, what)
}

fn get_sections<'a>(r: &mut Reader<'a>) -> Result<Vec<Section<'a>>, FormatError> {
    let n = r.u32("n_sections")?;
    r.need(n as u64 * 13, "sections")?;
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let n_stream = r.u32("n_stream")?;
        let cell_stream = r.u32("cell_stream")?;
        let cell_ext = match r.u8("cell_ext")? {
            k @ (0 | 1) => k == 1,
            k => return Err(bad(format!("cell_ext {k}"))),
        };
        if n_stream == 0 || n_stream > super::MAX_EMIT_STREAMS || cell_stream >= n_stream {
            return Err(bad(format!("cell stream {cell_stream} of {n_stream} streams")));
        }
        let count = r.u32("cell_count")?;
        if count == 0 {
            out.push(Section { n_stream, cell_stream, cell_ext, cells: None });
            continue;
        }
        let meta = get_bytes(r, "cell meta")?;
        let mut mr = Reader::new(meta, 0);
        let pos = scan_meta(&mut mr, count, cell_ext)?;
        if !mr.is_empty() {
            return Err(bad("cell meta longer than its cells"));
        }
        let v_trans = r.u32("v_trans")?;
        if v_trans > 1 {
            return Err(bad(format!("v_trans {v_trans}")));
        }
        let n_layer = r.u32("n_layer")?;
        let n_rot_k = r.u32("n_rot_k")?;
        let n_rot_v = r.u32("n_rot_v")?;
        r.need(n_layer as u64 * 24, "layer headers")?;
        let mut layers = Vec::with_capacity(n_layer as usize);
        for _ in 0..n_layer {
            let k_ty = r.i32("k_type")?;
            let k_row = r.u64("k_row")?;
            let ty = r.i32("v_type")?;
            let v = if v_trans == 0 {
                VLayout::Rows { ty, row: r.u64("v_row")? }
            } else {
                VLayout::Trans { ty, el: r.u32("v_el")?, n_embd: r.u32("v_n_embd")? }
            };
            layers.push(LayerHdr { k_ty, k_row, v });
        }
        let cells = Cells { count, meta, pos, v_trans, n_rot_k, n_rot_v, layers, payload: Vec::new() };
        out.push(Section { n_stream, cell_stream, cell_ext, cells: Some(cells) });
    }
    Ok(out)
}
