//! Row access to a decomposed state: which positions each KV section holds, and the K/V bytes of one cell.
//!
//! CONTRACT: `StateRows::open(skeleton, blocks)` checks the skeleton and the block lengths exactly as
//! `recompose` does, then indexes every KV section that has cells: body sections in file order, and the
//! sections of each parsed checkpoint blob. `SecRows::meta(pos)`, `k(layer, pos)` and `v(layer, pos)`
//! return borrowed bytes (V always cell-major, the block layout) for a position the section holds.
//! Nothing here decides which rows belong in a new file; `cut.rs` does.

use std::collections::HashMap;

use super::model::*;
use super::plan::{Plan, UnitPlan};
use super::{emit, skeleton, FormatError};

/// The rows of one KV section with cells.
pub(crate) struct SecRows<'a> {
    pub cells: &'a Cells<'a>,
    pub cell_ext: bool,
    /// pos -> (block, row within block, byte offset of the meta entry in `cells.meta`)
    at: HashMap<i32, (usize, usize, usize)>,
    block_cells: Vec<usize>,
    blocks: &'a [&'a [u8]],
    /// Byte offset of each layer inside a one-cell block (sum of k_row + v_row of the layers before it).
    prefix: Vec<usize>,
}

impl<'a> SecRows<'a> {
    fn new(cells: &'a Cells<'a>, cell_ext: bool, plan: &Plan, blocks: &'a [&'a [u8]]) -> Self {
        let entry = |n_seq: usize| 8 + if cell_ext { 12 } else { 0 } + 4 * n_seq;
        let mut meta_off = Vec::with_capacity(cells.pos.len());
        let mut off = 0usize;
        for _ in &cells.pos {
            meta_off.push(off);
            let n_seq = u32::from_le_bytes(cells.meta[off + 4..off + 8].try_into().expect("4 bytes")) as usize;
            off += entry(n_seq);
        }
        let mut at = HashMap::with_capacity(cells.pos.len());
        for run in &plan.runs {
            for i in 0..run.len {
                at.insert(cells.pos[run.file + i], (run.block, run.row + i, meta_off[run.file + i]));
            }
        }
        let mut acc = 0usize;
        let prefix = cells
            .layers
            .iter()
            .map(|l| {
                let here = acc;
                acc += (l.k_row + l.v.row_bytes()) as usize;
                here
            })
            .collect();
        SecRows { cells, cell_ext, at, block_cells: plan.block_cells.clone(), blocks, prefix }
    }

    pub fn has(&self, pos: i32) -> bool {
        self.at.contains_key(&pos)
    }

    /// The cell's metadata entry as in the file (pos, n_seq_id, [ext], seq_ids).
    pub fn meta(&self, pos: i32) -> &'a [u8] {
        let (_, _, off) = self.at[&pos];
        let n_seq = u32::from_le_bytes(self.cells.meta[off + 4..off + 8].try_into().expect("4 bytes")) as usize;
        &self.cells.meta[off..off + 8 + if self.cell_ext { 12 } else { 0 } + 4 * n_seq]
    }

    pub fn k(&self, layer: usize, pos: i32) -> &'a [u8] {
        let (b, row, _) = self.at[&pos];
        let k_row = self.cells.layers[layer].k_row as usize;
        let at = self.block_cells[b] * self.prefix[layer] + row * k_row;
        &self.blocks[b][at..at + k_row]
    }

    pub fn v(&self, layer: usize, pos: i32) -> &'a [u8] {
        let (b, row, _) = self.at[&pos];
        let l = &self.cells.layers[layer];
        let (k_row, v_row) = (l.k_row as usize, l.v.row_bytes() as usize);
        let at = self.block_cells[b] * (self.prefix[layer] + k_row) + row * v_row;
        &self.blocks[b][at..at + v_row]
    }

    /// Whether rows of `other` can stand in for rows of this section (same layers, V layout, rotation, ext).
    pub fn same_shape(&self, other: &SecRows<'_>) -> bool {
        let (a, b) = (self.cells, other.cells);
        a.layers == b.layers && a.v_trans == b.v_trans && (a.n_rot_k, a.n_rot_v) == (b.n_rot_k, b.n_rot_v)
            && self.cell_ext == other.cell_ext
    }
}

/// A checkpoint of the SCKP appendix, with the rows of its parsed blob.
pub(crate) struct CkRows<'a> {
    pub n_tokens: i64,
    pub io_magic: u32,
    pub seq_id: i32,
    pub sections: Vec<SecRows<'a>>,
}

/// The decoded skeleton of a state; borrow it to index its rows with [`StateRows::index`].
pub(crate) struct StateRows<'a> {
    pub decoded: skeleton::Decoded<'a>,
    plans: Vec<Plan>,
    blocks: &'a [&'a [u8]],
}

/// A state's sections with cells, indexed by position.
pub(crate) struct Indexed<'s> {
    pub tokens: Vec<i32>,
    pub words: &'s [u8],
    pub body: Vec<(u32, u32, SecRows<'s>)>, // (n_stream, cell_stream, rows); body sections without cells are skipped
    pub n_body_sections: usize,
    pub checkpoints: Vec<CkRows<'s>>,
}

impl<'a> StateRows<'a> {
    pub fn open(skel: &'a [u8], blocks: &'a [&'a [u8]]) -> Result<Self, FormatError> {
        let decoded = skeleton::decode(skel)?;
        // A recurrent state is one value for the whole sequence: no part of it is the state after P tokens
        // (docs/design.md "Recurrent and hybrid models"), so such a state is never cut.
        let plans = super::plans_of(&decoded.file, decoded.block_size)?
            .into_iter()
            .map(|u| match u {
                UnitPlan::Kv(p) => Ok(p),
                UnitPlan::Rec(_) => Err(FormatError::Invalid {
                    offset: 0,
                    what: "prefix",
                    detail: "the state has a recurrent section; a recurrent state cannot be cut".into(),
                }),
            })
            .collect::<Result<Vec<Plan>, FormatError>>()?;
        let n: usize = plans.iter().map(|p| p.block_cells.len()).sum();
        if n != decoded.n_blocks as usize || blocks.len() != n {
            return Err(FormatError::Skeleton(format!("skeleton needs {n} blocks, got {}", blocks.len())));
        }
        let mut i = 0usize;
        for (c, plan) in decoded.file.units().into_iter().filter_map(|u| match u {
            Unit::Kv(c) => Some(c),
            Unit::Rec(_) => None,
        }).zip(&plans) {
            for want in emit::block_lengths(c, plan)? {
                if blocks[i].len() != want {
                    return Err(FormatError::Skeleton(format!("block {i} has {} bytes, expected {want}", blocks[i].len())));
                }
                i += 1;
            }
        }
        Ok(StateRows { decoded, plans, blocks })
    }

    pub fn index(&self) -> Result<Indexed<'_>, FormatError> {
        let f = &self.decoded.file;
        let tokens = tokens_from_words(f.words).map_err(FormatError::Skeleton)?;
        let mut plans = self.plans.iter();
        let mut rest: &[&[u8]] = self.blocks;
        let mut next = |s: &'_ Section<'_>| -> Option<(&Plan, &[&[u8]])> {
            s.cells.as_ref()?;
            let p = plans.next().expect("one plan per section with cells");
            let (b, r) = rest.split_at(p.block_cells.len());
            rest = r;
            Some((p, b))
        };
        let mut body = Vec::new();
        for s in &f.sections {
            if let Some((p, b)) = next(s) {
                let c = s.cells.as_ref().expect("has cells");
                body.push((s.n_stream, s.cell_stream, SecRows::new(c, s.cell_ext, p, b)));
            }
        }
        let mut checkpoints = Vec::new();
        for ck in f.appendix.iter().flat_map(|a| a.checkpoints.iter()) {
            let Tgt::Parsed { io_magic, seq_id, sections, .. } = &ck.tgt else { continue };
            let mut rows = Vec::new();
            for s in sections {
                if let Some((p, b)) = next(s) {
                    rows.push(SecRows::new(s.cells.as_ref().expect("has cells"), s.cell_ext, p, b));
                }
            }
            checkpoints.push(CkRows { n_tokens: ck.n_tokens, io_magic: *io_magic, seq_id: *seq_id, sections: rows });
        }
        Ok(Indexed { tokens, words: f.words, body, n_body_sections: f.sections.len(), checkpoints })
    }
}
