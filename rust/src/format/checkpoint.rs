//! Writing chosen rows as a KV section, and the SCKP appendix that lets llama-server resume at a cut.
//!
//! CONTRACT: `write_section` emits exactly what `llama_kv_cache::state_write` writes for one sequence
//! (`n_stream`, per stream a cell count, the cells' metadata, then K rows and V rows or transposed V),
//! with the cells in the order of `picks` (callers pass them sorted by position). `write_cut_appendix`
//! emits an appendix with one checkpoint at `n_tokens = P` whose blob is `io_magic, seq_id` and the
//! given SWA section; its recorded position range is [`cut_range`].
//!
//! Resume rule relied on (llama.cpp `tools/server/server-context.cpp`, measured on xllamacpp b11549, see
//! docs/design.md "Prefix states"): after a restore, a prompt that extends the restored tokens at
//! `pos_next = P` needs a checkpoint (the SWA cache holds no row older than `P - n_swa`, so
//! `pos_min >= pos_next - n_swa`). The server takes the newest checkpoint with `pos_max <= pos_next` and
//! (`pos_min < pos_next - n_swa` or `pos_min == 0`), loads it, and resumes at
//! `min(pos_next, max(pos_min + 1, pos_max))` tokens. Recording `pos_max = P` and
//! `pos_min = max(0, window_start - 1)` therefore resumes at exactly P, with nothing re-evaluated.
//! The rows in the blob are the window `[P - n_swa, P)`, which is all the attention at position P reads.

use super::model::{VLayout, TOKEN_NULL};
use super::head::{SCKP_MAGIC, SCKP_VERSION};
use super::reader::PutLe;
use super::rows::SecRows;

/// One cell of an output section: the row at `pos` of `src`, or (`None`) a zero row for a position that every
/// later query masks (it only keeps the window's cells where a fresh evaluation keeps them, see `cut.rs`).
#[derive(Clone, Copy)]
pub(crate) struct Pick<'r, 'a> {
    pub pos: i32,
    pub src: Option<&'r SecRows<'a>>,
}

impl<'r, 'a> Pick<'r, 'a> {
    fn k<'z>(&self, l: usize, zero: &'z [u8]) -> &'z [u8]
    where
        'a: 'z,
    {
        self.src.map_or(zero, |s| s.k(l, self.pos))
    }

    fn v<'z>(&self, l: usize, zero: &'z [u8]) -> &'z [u8]
    where
        'a: 'z,
    {
        self.src.map_or(zero, |s| s.v(l, self.pos))
    }

    fn meta(&self, shape: &SecRows<'_>, out: &mut Vec<u8>) {
        match self.src {
            Some(s) => out.extend_from_slice(s.meta(self.pos)),
            None => {
                // Any held cell's entry (n_seq_id 1, the slot's seq id; ext zeroed) with this position.
                let at = out.len();
                out.extend_from_slice(shape.meta(shape.cells.pos[0]));
                out[at..at + 4].copy_from_slice(&self.pos.to_le_bytes());
                if shape.cell_ext {
                    out[at + 8..at + 20].fill(0);
                }
            }
        }
    }
}

/// A KV section of `picks` (all of `shape`'s layer layout), cells in stream `cell_stream` of `n_stream`.
pub(crate) fn write_section(out: &mut Vec<u8>, n_stream: u32, cell_stream: u32, shape: &SecRows<'_>, picks: &[Pick<'_, '_>]) {
    out.put_u32(n_stream);
    for st in 0..n_stream {
        if st != cell_stream || picks.is_empty() {
            out.put_u32(0);
            continue;
        }
        let c = shape.cells;
        out.put_u32(picks.len() as u32);
        for p in picks {
            p.meta(shape, out);
        }
        super::emit::put_layers_head(c, out);
        for (l, hdr) in c.layers.iter().enumerate() {
            out.put_i32(hdr.k_ty);
            out.put_u64(hdr.k_row);
            let zero = vec![0u8; hdr.k_row as usize];
            for p in picks {
                out.extend_from_slice(p.k(l, &zero));
            }
        }
        for (l, hdr) in c.layers.iter().enumerate() {
            let zero = vec![0u8; hdr.v.row_bytes() as usize];
            match hdr.v {
                VLayout::Rows { ty, row } => {
                    out.put_i32(ty);
                    out.put_u64(row);
                    for p in picks {
                        out.extend_from_slice(p.v(l, &zero));
                    }
                }
                VLayout::Trans { ty, el, n_embd } => {
                    out.put_i32(ty);
                    out.put_u32(el);
                    out.put_u32(n_embd);
                    let el = el as usize;
                    let rows: Vec<&[u8]> = picks.iter().map(|p| p.v(l, &zero)).collect();
                    for j in 0..if el == 0 { 0 } else { n_embd as usize } {
                        for r in &rows {
                            out.extend_from_slice(&r[j * el..(j + 1) * el]);
                        }
                    }
                }
            }
        }
    }
}

/// The `(pos_min, pos_max)` recorded for the checkpoint at the cut `p` whose rows start at `window_start`.
pub(crate) fn cut_range(p: i32, window_start: i32) -> (i32, i32) {
    ((window_start - 1).max(0), p)
}

/// The SCKP appendix with the one checkpoint at the cut.
pub(crate) struct CutCheckpoint<'r, 'a> {
    pub n_tokens: u32,
    pub window_start: i32,
    pub io_magic: u32,
    pub seq_id: i32,
    pub n_stream: u32,
    pub cell_stream: u32,
    pub shape: &'r SecRows<'a>,
    pub picks: &'r [Pick<'r, 'a>],
}

pub(crate) fn write_cut_appendix(out: &mut Vec<u8>, ck: &CutCheckpoint<'_, '_>) {
    out.put_u32(SCKP_MAGIC);
    out.put_u32(SCKP_VERSION);
    out.put_u32(1);
    let (pos_min, pos_max) = cut_range(ck.n_tokens as i32, ck.window_start);
    out.put_i64(i64::from(ck.n_tokens));
    out.put_i32(pos_min);
    out.put_i32(pos_max);
    let len_at = out.len();
    out.put_u64(0);
    out.put_u32(ck.io_magic);
    out.put_i32(ck.seq_id);
    write_section(out, ck.n_stream, ck.cell_stream, ck.shape, ck.picks);
    let len = (out.len() - len_at - 8) as u64;
    out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    out.put_u64(0); // data_dft: no draft model
    out.put_u64(0); // data_spec: no speculative state
}

/// Token words for the first `p` tokens, in the payload format of `words` (packed `server_tokens` v1 or a
/// legacy plain list). Err when the payload carries media chunks, which this cut does not rewrite.
pub(crate) fn cut_words(words: &[u8], tokens: &[i32], p: usize) -> Result<Vec<u8>, String> {
    let word = |i: usize| words.get(i * 4..i * 4 + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut out = Vec::with_capacity(4 * (p + 5));
    if word(0) != Some(TOKEN_NULL) {
        for &t in &tokens[..p] {
            out.put_i32(t);
        }
        return Ok(out);
    }
    let n = tokens.len();
    match word(3 + n) {
        Some(0) => {}
        Some(m) => return Err(format!("the token payload carries {m} media chunk(s); a prefix cannot cut them")),
        None => return Err("packed token payload without a media count".into()),
    }
    if tokens[..p].contains(&TOKEN_NULL) {
        return Err("a media position lies inside the prefix".into());
    }
    out.put_i32(TOKEN_NULL);
    out.put_u32(1);
    out.put_u32(p as u32);
    for &t in &tokens[..p] {
        out.put_i32(t);
    }
    out.put_u32(0);
    Ok(out)
}
