//! The in-memory structure of a slot file, shared by the parser, the skeleton codec and the emitter.
//!
//! CONTRACT: slices borrow either from the file (after `parse`) or from the skeleton (after `skeleton::decode`);
//! in the latter case the K/V payload is absent and comes from the blocks instead.

use super::reader::Reader;
pub(crate) use super::recurrent::Recurrent;
use super::FormatError;

/// ggml type ids we name in layouts and use for `elem_size`.
pub(crate) const GGML_F32: i32 = 0;
pub(crate) const GGML_F16: i32 = 1;
pub(crate) const GGML_BF16: i32 = 30;

/// The V half of one layer's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VLayout {
    /// `v_trans == 0`: `i32 type, u64 row_size`, rows cell by cell.
    Rows { ty: i32, row: u64 },
    /// `v_trans == 1`: `i32 type, u32 el_size, u32 n_embd_v_gqa`, element-major.
    Trans { ty: i32, el: u32, n_embd: u32 },
}

impl VLayout {
    pub fn ty(&self) -> i32 {
        match *self {
            VLayout::Rows { ty, .. } | VLayout::Trans { ty, .. } => ty,
        }
    }

    /// Bytes of one cell's V (a row, or all its elements).
    pub fn row_bytes(&self) -> u64 {
        match *self {
            VLayout::Rows { row, .. } => row,
            VLayout::Trans { el, n_embd, .. } => el as u64 * n_embd as u64,
        }
    }
}

/// Header of one layer (K and V), in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerHdr {
    pub k_ty: i32,
    pub k_row: u64,
    pub v: VLayout,
}

/// The one stream of a KV section that holds cells.
#[derive(Debug)]
pub(crate) struct Cells<'a> {
    pub count: u32,
    /// Per-cell metadata exactly as in the file (pos, n_seq_id, [ext], seq_ids), in file order.
    pub meta: &'a [u8],
    /// Positions parsed from `meta`, in file order.
    pub pos: Vec<i32>,
    pub v_trans: u32,
    pub n_rot_k: u32,
    pub n_rot_v: u32,
    pub layers: Vec<LayerHdr>,
    /// `(K, V)` payload of each layer as laid out in the file; empty when decoded from a skeleton.
    pub payload: Vec<(&'a [u8], &'a [u8])>,
}

impl Cells<'_> {
    /// Bytes per cell over all layers (K + V); None on overflow.
    pub fn cell_bytes(&self) -> Option<u64> {
        self.layers.iter().try_fold(0u64, |acc, l| acc.checked_add(l.k_row)?.checked_add(l.v.row_bytes()))
    }

    /// Byte-plane width for the blocks: 2 if every type is f16/bf16, 4 if every type is f32, else 1.
    pub fn elem_size(&self) -> u8 {
        let types = || self.layers.iter().flat_map(|l| [l.k_ty, l.v.ty()]);
        if self.layers.is_empty() {
            1
        } else if types().all(|t| t == GGML_F16 || t == GGML_BF16) {
            2
        } else if types().all(|t| t == GGML_F32) {
            4
        } else {
            1
        }
    }
}

/// One `llama_kv_cache::state_write` section.
#[derive(Debug)]
pub(crate) struct Section<'a> {
    pub n_stream: u32,
    /// Index of the stream that holds `cells` (0 when none does).
    pub cell_stream: u32,
    /// Whether each meta entry carries the 12-byte `llama_kv_cell_ext`.
    pub cell_ext: bool,
    pub cells: Option<Cells<'a>>,
}

/// `data_tgt` of a checkpoint.
#[derive(Debug)]
pub(crate) enum Tgt<'a> {
    /// Kept verbatim (empty, or not parseable as `io_magic, seq_id, KV sections`).
    Opaque(&'a [u8]),
    /// `u32 io_magic, i32 seq_id`, then KV sections and/or a recurrent section that exactly fill the blob.
    Parsed { io_magic: u32, seq_id: i32, sections: Vec<Section<'a>>, recurrent: Option<Recurrent<'a>> },
}

#[derive(Debug)]
pub(crate) struct Checkpoint<'a> {
    pub n_tokens: i64,
    pub pos_min: i32,
    pub pos_max: i32,
    pub tgt: Tgt<'a>,
    pub dft: &'a [u8],
    pub spec: &'a [u8],
}

#[derive(Debug)]
pub(crate) struct Appendix<'a> {
    pub version: u32,
    pub checkpoints: Vec<Checkpoint<'a>>,
}

/// A whole slot file.
#[derive(Debug)]
pub(crate) struct SlotFile<'a> {
    /// The raw token words (`n_token_words * 4` bytes).
    pub words: &'a [u8],
    pub sections: Vec<Section<'a>>,
    /// The recurrent section after the KV sections (recurrent and hybrid models).
    pub recurrent: Option<Recurrent<'a>>,
    pub appendix: Option<Appendix<'a>>,
    /// Bytes after everything else, kept verbatim.
    pub trailing: &'a [u8],
}

/// A part of a file that owns blocks: a KV section's cells, or a recurrent section.
#[derive(Clone, Copy)]
pub(crate) enum Unit<'x, 'a> {
    Kv(&'x Cells<'a>),
    Rec(&'x Recurrent<'a>),
}

impl<'a> SlotFile<'a> {
    /// Every KV section in file order: the body, then each parsed checkpoint blob.
    #[cfg(test)]
    pub fn all_sections(&self) -> impl Iterator<Item = &Section<'a>> {
        let ck = self.appendix.iter().flat_map(|a| a.checkpoints.iter()).flat_map(|c| match &c.tgt {
            Tgt::Parsed { sections, .. } => sections.as_slice(),
            Tgt::Opaque(_) => &[],
        });
        self.sections.iter().chain(ck)
    }

    /// Every part that owns blocks, in block order: the body's KV cells and recurrent section, then the same
    /// for each parsed checkpoint blob.
    pub fn units(&self) -> Vec<Unit<'_, 'a>> {
        fn push<'x, 'a>(out: &mut Vec<Unit<'x, 'a>>, ss: &'x [Section<'a>], rc: &'x Option<Recurrent<'a>>) {
            out.extend(ss.iter().filter_map(|s| s.cells.as_ref()).map(Unit::Kv));
            out.extend(rc.iter().map(Unit::Rec));
        }
        let mut out = Vec::new();
        push(&mut out, &self.sections, &self.recurrent);
        for c in self.appendix.iter().flat_map(|a| a.checkpoints.iter()) {
            if let Tgt::Parsed { sections, recurrent, .. } = &c.tgt {
                push(&mut out, sections, recurrent);
            }
        }
        out
    }
}

pub(crate) const TOKEN_NULL: i32 = -1;

/// Token ids from the token words: the packed `server_tokens` v1 payload (word 0 == -1) or a legacy plain list.
pub(crate) fn tokens_from_words(words: &[u8]) -> Result<Vec<i32>, String> {
    let word = |i: usize| -> Option<i32> {
        let b = words.get(i * 4..i * 4 + 4)?;
        Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let n_words = words.len() / 4;
    if word(0) != Some(TOKEN_NULL) {
        return Ok((0..n_words).filter_map(word).collect());
    }
    let version = word(1).ok_or("packed token payload without a version word")? as u32;
    if version != 1 {
        return Err(format!("packed server_tokens version {version}, expected 1"));
    }
    let n = word(2).ok_or("packed token payload without n_tokens")? as u32 as usize;
    if n > n_words - 3 {
        return Err(format!("packed token payload claims {n} tokens, only {} words follow", n_words - 3));
    }
    Ok((3..3 + n).filter_map(word).collect())
}

/// Walk `count` per-cell metadata entries; returns the positions. Bounds are checked before allocating.
pub(crate) fn scan_meta(r: &mut Reader<'_>, count: u32, ext: bool) -> Result<Vec<i32>, FormatError> {
    let min_entry: u64 = if ext { 20 } else { 8 };
    r.need(count as u64 * min_entry, "cell metadata")?;
    let mut pos = Vec::with_capacity(count as usize);
    for _ in 0..count {
        pos.push(r.i32("cell pos")?);
        let n_seq = r.u32("cell n_seq_id")?;
        if ext {
            r.take(12, "cell ext")?;
        }
        r.take(n_seq as u64 * 4, "cell seq_ids")?;
    }
    Ok(pos)
}
