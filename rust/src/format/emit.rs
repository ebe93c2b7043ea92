//! Moving K/V rows between the file layout and the block layout.
//!
//! CONTRACT: a block of `n` cells is `for each layer: K rows (n x k_row), V rows (n x v_row)`, cells sorted by position,
//! V always cell-major. `cut` builds blocks from a parsed file, `emit_file` writes a file from a decoded
//! skeleton plus blocks (into a buffer, or as pieces that point at the blocks: `sink.rs`). Both walk the plan's runs, so contiguous cells move with one `copy_from_slice`;
//! only transposed V needs a strided gather/scatter, done one element column at a time over a run.

use super::model::*;
use super::plan::{Plan, UnitPlan};
use super::reader::PutLe;
use super::sink::Sink;
use super::FormatError;

/// Per-layer byte offset of the layer inside a one-cell block: sum of `k_row + v_row` of the layers before it.
/// `v_trans`, layer count, `n_rot_k`, `n_rot_v`: a KV section's words before its first layer (also checkpoint.rs).
pub(crate) fn put_layers_head(c: &Cells<'_>, out: &mut Vec<u8>) {
    out.put_u32(c.v_trans);
    out.put_u32(c.layers.len() as u32);
    out.put_u32(c.n_rot_k);
    out.put_u32(c.n_rot_v);
}

fn layer_prefix(layers: &[LayerHdr]) -> Vec<usize> {
    let mut acc = 0usize;
    layers
        .iter()
        .map(|l| {
            let here = acc;
            acc += (l.k_row + l.v.row_bytes()) as usize;
            here
        })
        .collect()
}

/// Copy element `col` (width `EL`) of each of `len` cell-major rows from/to an element-major run.
#[inline(always)]
fn gather<const EL: usize>(rows: &mut [u8], row: usize, col: usize, src: &[u8]) {
    for (d, s) in rows.chunks_exact_mut(row).zip(src.chunks_exact(EL)) {
        d[col..col + EL].copy_from_slice(s);
    }
}

#[inline(always)]
fn scatter<const EL: usize>(dst: &mut [u8], rows: &[u8], row: usize, col: usize) {
    for (d, s) in dst.chunks_exact_mut(EL).zip(rows.chunks_exact(row)) {
        d.copy_from_slice(&s[col..col + EL]);
    }
}

fn gather_dyn(rows: &mut [u8], row: usize, col: usize, el: usize, src: &[u8]) {
    match el {
        2 => gather::<2>(rows, row, col, src),
        4 => gather::<4>(rows, row, col, src),
        1 => gather::<1>(rows, row, col, src),
        _ => {
            for (d, s) in rows.chunks_exact_mut(row).zip(src.chunks_exact(el)) {
                d[col..col + el].copy_from_slice(s);
            }
        }
    }
}

fn scatter_dyn(dst: &mut [u8], rows: &[u8], row: usize, col: usize, el: usize) {
    match el {
        2 => scatter::<2>(dst, rows, row, col),
        4 => scatter::<4>(dst, rows, row, col),
        1 => scatter::<1>(dst, rows, row, col),
        _ => {
            for (d, s) in dst.chunks_exact_mut(el).zip(rows.chunks_exact(row)) {
                d.copy_from_slice(&s[col..col + el]);
            }
        }
    }
}

/// Build the blocks of one section from the file payload. All sizes are bounded by the file length.
pub(crate) fn cut(cells: &Cells<'_>, plan: &Plan) -> Vec<Vec<u8>> {
    let per_cell: usize = cells.layers.iter().map(|l| (l.k_row + l.v.row_bytes()) as usize).sum();
    let prefix = layer_prefix(&cells.layers);
    let count = cells.count as usize;
    let mut blocks: Vec<Vec<u8>> = plan.block_cells.iter().map(|&n| vec![0u8; n * per_cell]).collect();
    for (l, (hdr, &(k_data, v_data))) in cells.layers.iter().zip(&cells.payload).enumerate() {
        let k_row = hdr.k_row as usize;
        let v_row = hdr.v.row_bytes() as usize;
        for run in &plan.runs {
            let n_b = plan.block_cells[run.block];
            let b = &mut blocks[run.block];
            let k_at = n_b * prefix[l] + run.row * k_row;
            b[k_at..k_at + run.len * k_row].copy_from_slice(&k_data[run.file * k_row..(run.file + run.len) * k_row]);
            let v_at = n_b * (prefix[l] + k_row) + run.row * v_row;
            let dst = &mut b[v_at..v_at + run.len * v_row];
            match hdr.v {
                VLayout::Rows { .. } => dst.copy_from_slice(&v_data[run.file * v_row..(run.file + run.len) * v_row]),
                VLayout::Trans { el, n_embd, .. } if el > 0 => {
                    let el = el as usize;
                    for j in 0..n_embd as usize {
                        let s = (j * count + run.file) * el;
                        gather_dyn(dst, v_row, j * el, el, &v_data[s..s + run.len * el]);
                    }
                }
                VLayout::Trans { .. } => {} // el_size 0: no bytes
            }
        }
    }
    blocks
}

/// Expected byte length of each block of a section (checked arithmetic: the skeleton is untrusted).
pub(crate) fn block_lengths(cells: &Cells<'_>, plan: &Plan) -> Result<Vec<usize>, FormatError> {
    let per_cell = cells.cell_bytes().ok_or_else(|| FormatError::Skeleton("cell size overflows".into()))?;
    plan.block_cells
        .iter()
        .map(|&n| {
            (n as u64)
                .checked_mul(per_cell)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| FormatError::Skeleton("block size overflows".into()))
        })
        .collect()
}

/// Writes a whole file. `plans[i]` belongs to the i-th entry of `file.units()` and owns its next
/// `plans[i].n_blocks()` entries of `blocks`, whose lengths the caller has checked. Into a buffer or as pieces
/// that point at the blocks (`sink.rs`).
pub(crate) struct Emitter<'p, 'a, 'b> {
    pub plans: std::slice::Iter<'p, UnitPlan>,
    pub blocks: &'a [&'b [u8]],
    pub n_stream: Option<u32>,
    /// Index (in the whole file's reference order) of `blocks[0]`: the sink is told which block rows are from.
    pub first_block: usize,
}

impl<'b> Emitter<'_, '_, 'b> {
    pub fn file(&mut self, f: &SlotFile<'_>, out: &mut impl Sink<'b>) {
        let m = out.made();
        m.put_u32(super::MAGIC);
        m.put_u32(super::VERSION);
        m.put_u32((f.words.len() / 4) as u32);
        m.extend_from_slice(f.words);
        for s in &f.sections {
            self.section(s, out);
        }
        if let Some(rc) = &f.recurrent {
            self.recurrent(rc, out);
        }
        if let Some(a) = &f.appendix {
            let m = out.made();
            m.put_u32(super::SCKP_MAGIC);
            m.put_u32(a.version);
            m.put_u32(a.checkpoints.len() as u32);
            for c in &a.checkpoints {
                let m = out.made();
                m.put_i64(c.n_tokens);
                m.put_i32(c.pos_min);
                m.put_i32(c.pos_max);
                match &c.tgt {
                    Tgt::Opaque(b) => {
                        m.put_u64(b.len() as u64);
                        m.extend_from_slice(b);
                    }
                    Tgt::Parsed { io_magic, seq_id, sections, recurrent } => {
                        let (len_at, start) = out.mark_u64();
                        out.made().put_u32(*io_magic);
                        out.made().put_i32(*seq_id);
                        for s in sections {
                            self.section(s, out);
                        }
                        if let Some(rc) = recurrent {
                            self.recurrent(rc, out);
                        }
                        let len = out.len() - start;
                        out.fill_u64(len_at, len);
                    }
                }
                let m = out.made();
                m.put_u64(c.dft.len() as u64);
                m.extend_from_slice(c.dft);
                m.put_u64(c.spec.len() as u64);
                m.extend_from_slice(c.spec);
            }
        }
        out.made().extend_from_slice(f.trailing);
    }

    fn section(&mut self, s: &Section<'_>, out: &mut impl Sink<'b>) {
        let (n_stream, cell_stream) = match self.n_stream {
            Some(k) => (k, 0),
            None => (s.n_stream, s.cell_stream),
        };
        out.made().put_u32(n_stream);
        for st in 0..n_stream {
            match &s.cells {
                Some(c) if st == cell_stream => self.cells(c, out),
                _ => out.made().put_u32(0),
            }
        }
    }

    fn recurrent(&mut self, rc: &Recurrent<'_>, out: &mut impl Sink<'b>) {
        let Some(UnitPlan::Rec(n)) = self.plans.next() else { unreachable!("plans follow units()") };
        let (blocks, rest) = self.blocks.split_at(*n);
        self.blocks = rest;
        self.first_block += *n;
        if !blocks.is_empty() {
            out.made_from_rows();
        }
        super::recurrent::emit(rc, blocks.first().copied().unwrap_or_default(), out.made());
    }

    fn cells(&mut self, c: &Cells<'_>, out: &mut impl Sink<'b>) {
        let Some(UnitPlan::Kv(plan)) = self.plans.next() else { unreachable!("plans follow units()") };
        let (blocks, rest) = self.blocks.split_at(plan.block_cells.len());
        self.blocks = rest;
        let first = self.first_block;
        self.first_block += blocks.len();
        let prefix = layer_prefix(&c.layers);
        let count = c.count as usize;
        let m = out.made();
        m.put_u32(c.count);
        m.extend_from_slice(c.meta);
        put_layers_head(c, m);
        for (l, hdr) in c.layers.iter().enumerate() {
            out.made().put_i32(hdr.k_ty);
            out.made().put_u64(hdr.k_row);
            let k_row = hdr.k_row as usize;
            for run in &plan.runs {
                let at = plan.block_cells[run.block] * prefix[l] + run.row * k_row;
                out.block(first + run.block, at, &blocks[run.block][at..at + run.len * k_row]);
            }
        }
        for (l, hdr) in c.layers.iter().enumerate() {
            let k_row = hdr.k_row as usize;
            let v_row = hdr.v.row_bytes() as usize;
            let v_at = |run: &super::plan::Run| plan.block_cells[run.block] * (prefix[l] + k_row) + run.row * v_row;
            match hdr.v {
                VLayout::Rows { ty, row } => {
                    out.made().put_i32(ty);
                    out.made().put_u64(row);
                    for run in &plan.runs {
                        let at = v_at(run);
                        out.block(first + run.block, at, &blocks[run.block][at..at + run.len * v_row]);
                    }
                }
                VLayout::Trans { ty, el, n_embd } => {
                    if el > 0 && count > 0 {
                        out.made_from_rows();
                    }
                    let m = out.made();
                    m.put_i32(ty);
                    m.put_u32(el);
                    m.put_u32(n_embd);
                    let el = el as usize;
                    let start = m.len();
                    m.resize(start + count * v_row, 0);
                    let region = &mut m[start..];
                    for j in 0..if el == 0 { 0 } else { n_embd as usize } {
                        for run in &plan.runs {
                            let at = v_at(run);
                            let rows = &blocks[run.block][at..at + run.len * v_row];
                            let d = (j * count + run.file) * el;
                            scatter_dyn(&mut region[d..d + run.len * el], rows, v_row, j * el, el);
                        }
                    }
                }
            }
        }
    }
}
