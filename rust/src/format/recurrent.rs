//! The recurrent section (`llama_memory_recurrent::state_write`): parse, skeleton codec, block and re-emit.
//!
//! CONTRACT: file layout (llama.cpp b11434 `llama-memory-recurrent.cpp`, verified on LFM2 and Mamba-2 slot files):
//! ```text
//! u32 cell_count                         a slot owns one cell (its current state), 0 when empty
//! cell_count x { i32 pos, u32 n_seq_id, i32 seq_id[n_seq_id] }   (n_seq_id is 0 in a slot save)
//! u32 s_trans (0)   u32 n_layer (all layers of the model, recurrent or not)
//! k x { i32 type, u64 row, cell_count x row bytes }   conv state (r) of each recurrent layer
//! k x { i32 type, u64 row, cell_count x row bytes }   ssm/wkv state (s) of each recurrent layer
//! ```
//! Nothing names the layers or says `k`: every recurrent layer has both an r and an s tensor, so the entries
//! are read greedily until the section's end and split in half. A section is accepted only if it ends exactly
//! where the caller's end is (end of file, `SCKP`, end of a checkpoint blob). Refused (typed errors): a
//! transposed s (`s_trans != 0`, never written), an odd entry count or more than `2 * n_layer` entries, a
//! type id that is no ggml type - which is what a PLE conv row (`u64 row` without a type, DeepSeek-V4 style
//! models) looks like, so those files are refused rather than misread.
//!
//! The state summarises the whole sequence; no prefix of it exists. So the payload is one block: all entries'
//! rows concatenated in file order (r then s). Equal states give equal blocks, which the store keeps once.
//!
//! Skeleton encoding (skeleton version 2, after the KV sections it belongs to):
//! `u32 cell_count, u64 len, meta, u32 s_trans, u32 n_layer, u32 k, 2k x { i32 type, u64 row }`.

use super::model::scan_meta;
use super::reader::{PutLe, Reader};
use super::FormatError;

/// ggml type ids are small; anything larger means the bytes are not an entry header.
const MAX_GGML_TYPE: i32 = 127;

#[derive(Debug)]
pub(crate) struct Recurrent<'a> {
    pub count: u32,
    /// Per-cell metadata exactly as in the file.
    pub meta: &'a [u8],
    pub s_trans: u32,
    pub n_layer: u32,
    /// `(type, row bytes)` of each r entry, then each s entry (equal numbers of each).
    pub entries: Vec<(i32, u64)>,
    /// Each entry's rows (`count * row` bytes); empty when decoded from a skeleton.
    pub payload: Vec<&'a [u8]>,
}

impl Recurrent<'_> {
    /// Bytes of the section's one block (0: the section has no block).
    pub fn block_len(&self) -> Result<usize, FormatError> {
        self.entries
            .iter()
            .try_fold(0u64, |acc, &(_, row)| acc.checked_add(row.checked_mul(self.count as u64)?))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| FormatError::Skeleton("recurrent state size overflows".into()))
    }

    /// Blocks this section owns: one unless it holds no bytes.
    pub fn n_blocks(&self) -> Result<usize, FormatError> {
        Ok((self.block_len()? > 0) as usize)
    }

    /// The block: every entry's rows, in file order.
    pub fn block(&self) -> Vec<u8> {
        self.payload.concat()
    }

    /// Byte-plane width for compression: 4 if all entries are f32, 2 if all are f16/bf16, else 1.
    pub fn elem_size(&self) -> u8 {
        use super::model::{GGML_BF16, GGML_F16, GGML_F32};
        let tys = || self.entries.iter().map(|e| e.0);
        if tys().all(|t| t == GGML_F32) {
            4
        } else if tys().all(|t| t == GGML_F16 || t == GGML_BF16) {
            2
        } else {
            1
        }
    }

    /// `rec[<n_layer>:<r entries>;<s entries>]`, entries as `<type>/<row bytes>`, equal neighbours as `*n`.
    pub fn layout(&self) -> String {
        let half = self.entries.len() / 2;
        let desc = |es: &[(i32, u64)]| {
            let mut runs: Vec<(String, usize)> = Vec::new();
            for &(ty, row) in es {
                let d = format!("{}/{}", super::layout::ggml_type_name(ty), row);
                match runs.last_mut() {
                    Some((p, n)) if *p == d => *n += 1,
                    _ => runs.push((d, 1)),
                }
            }
            let parts: Vec<String> =
                runs.into_iter().map(|(d, n)| if n == 1 { d } else { format!("{d}*{n}") }).collect();
            parts.join("|")
        };
        format!("rec[{}:{};{}]", self.n_layer, desc(&self.entries[..half]), desc(&self.entries[half..]))
    }
}

/// Parse a recurrent section that must end where `at_end` says; on failure the reader is left unmoved.
pub(crate) fn parse_to_end<'a>(
    r: &mut Reader<'a>,
    at_end: impl Fn(&Reader<'a>) -> bool,
) -> Result<Recurrent<'a>, FormatError> {
    let mut t = r.clone();
    let rc = parse(&mut t)?;
    if !at_end(&t) {
        return Err(t.invalid(0, "recurrent section", "bytes follow the last state entry"));
    }
    *r = t;
    Ok(rc)
}

/// Whether a parse error arose after the section header (cell metadata, s_trans, n_layer) was read.
pub(crate) fn past_header(e: &FormatError) -> bool {
    let what = match e {
        FormatError::Truncated { what, .. } | FormatError::Invalid { what, .. } => *what,
        _ => return false,
    };
    matches!(what, "recurrent state type" | "recurrent row size" | "recurrent state rows" | "recurrent section")
}

fn parse<'a>(r: &mut Reader<'a>) -> Result<Recurrent<'a>, FormatError> {
    let count = r.u32("recurrent cell_count")?;
    let meta_start = r.peek_rest();
    let before = r.remaining();
    scan_meta(r, count, false)?;
    let meta = &meta_start[..before - r.remaining()];
    let s_trans = r.u32("recurrent s_trans")?;
    if s_trans != 0 {
        return Err(r.invalid(4, "recurrent s_trans", format!("{s_trans}: transposed states are not supported")));
    }
    let n_layer = r.u32("recurrent n_layer")?;
    let mut entries = Vec::new();
    let mut payload = Vec::new();
    let max = 2 * u64::from(n_layer);
    while !r.is_empty() && r.peek_u32() != Some(super::head::SCKP_MAGIC) && (entries.len() as u64) < max {
        let ty = r.i32("recurrent state type")?;
        if !(0..=MAX_GGML_TYPE).contains(&ty) {
            return Err(r.invalid(4, "recurrent state type", format!("{ty} is no ggml type")));
        }
        let row = r.u64("recurrent row size")?;
        let len = row
            .checked_mul(count as u64)
            .ok_or_else(|| r.invalid(8, "recurrent row size", format!("{row} x {count} cells overflows")))?;
        payload.push(r.take(len, "recurrent state rows")?);
        entries.push((ty, row));
    }
    if entries.is_empty() || entries.len() % 2 != 0 {
        let n = entries.len();
        return Err(r.invalid(0, "recurrent section", format!("{n} state entries; expected r and s per layer")));
    }
    Ok(Recurrent { count, meta, s_trans, n_layer, entries, payload })
}

pub(crate) fn encode(rc: &Recurrent<'_>, out: &mut Vec<u8>) {
    out.put_u32(rc.count);
    out.put_u64(rc.meta.len() as u64);
    out.extend_from_slice(rc.meta);
    out.put_u32(rc.s_trans);
    out.put_u32(rc.n_layer);
    out.put_u32((rc.entries.len() / 2) as u32);
    for &(ty, row) in &rc.entries {
        out.put_i32(ty);
        out.put_u64(row);
    }
}

pub(crate) fn decode<'a>(r: &mut Reader<'a>) -> Result<Recurrent<'a>, FormatError> {
    let count = r.u32("recurrent cell_count")?;
    let n = r.u64("recurrent meta length")?;
    let meta = r.take(n, "recurrent meta")?;
    let mut mr = Reader::new(meta, 0);
    scan_meta(&mut mr, count, false)?;
    if !mr.is_empty() {
        return Err(FormatError::Skeleton("recurrent meta longer than its cells".into()));
    }
    let s_trans = r.u32("recurrent s_trans")?;
    let n_layer = r.u32("recurrent n_layer")?;
    let k = r.u32("recurrent entries")?;
    if k == 0 || k > n_layer || s_trans != 0 {
        return Err(FormatError::Skeleton(format!("recurrent section: {k} layers of {n_layer}, s_trans {s_trans}")));
    }
    r.need(u64::from(k) * 24, "recurrent entries")?;
    let entries = (0..2 * k).map(|_| Ok((r.i32("type")?, r.u64("row")?))).collect::<Result<Vec<_>, FormatError>>()?;
    Ok(Recurrent { count, meta, s_trans, n_layer, entries, payload: Vec::new() })
}

/// Skeleton v2: `u8 0`, or `u8 1` and the section. Writes nothing for a v1 skeleton.
pub(crate) fn encode_opt(v2: bool, rc: Option<&Recurrent<'_>>, out: &mut Vec<u8>) {
    if v2 {
        out.put_u8(rc.is_some() as u8);
        rc.into_iter().for_each(|rc| encode(rc, out));
    }
}

/// Reads what `encode_opt` wrote.
pub(crate) fn decode_opt<'a>(v2: bool, r: &mut Reader<'a>) -> Result<Option<Recurrent<'a>>, FormatError> {
    match if v2 { r.u8("has_recurrent")? } else { 0 } {
        0 => Ok(None),
        1 => decode(r).map(Some),
        k => Err(FormatError::Skeleton(format!("has_recurrent {k}"))),
    }
}

/// Write the section; `block` is its one block (checked to be `block_len` bytes), or empty when it has none.
pub(crate) fn emit(rc: &Recurrent<'_>, block: &[u8], out: &mut Vec<u8>) {
    out.put_u32(rc.count);
    out.extend_from_slice(rc.meta);
    out.put_u32(rc.s_trans);
    out.put_u32(rc.n_layer);
    let mut at = 0usize;
    for &(ty, row) in &rc.entries {
        out.put_i32(ty);
        out.put_u64(row);
        let len = (row * rc.count as u64) as usize; // bounded by block_len, checked by the caller
        out.extend_from_slice(&block[at..at + len]);
        at += len;
    }
}
