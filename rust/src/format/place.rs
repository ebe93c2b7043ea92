//! Where a recomposed file's bytes go, known from the skeleton alone: the bytes the emitter makes (heads,
//! words), and for every block reference the file offsets of its rows. So a restore can write each block's
//! rows the moment that block arrives (`pwrite`), in whatever order blocks arrive, instead of waiting for all
//! of them to write the file front to back.
//!
//! CONTRACT: writing `made()` and every block's rows (`rows_of`) at their offsets into a file of `file_len`
//! bytes gives exactly `recompose(skeleton, blocks, opts)`, for blocks of the lengths `block_len` names. A
//! file whose made bytes are computed from rows (transposed V without flash attention, recurrent rows) has
//! no such placement: `place` returns None and the caller recomposes as usual.

use super::sink::Sink;
use super::{EmitOptions, FormatError};

/// `len` bytes at `block_at` of a block go to `file_at` in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRun {
    pub file_at: u64,
    pub block_at: usize,
    pub len: usize,
}

/// A file's bytes by where they come from.
#[derive(Debug, Default)]
pub struct Placement {
    pub file_len: u64,
    made: Vec<u8>,
    /// (file offset, start in `made`, end in `made`), in file order.
    made_at: Vec<(u64, usize, usize)>,
    /// Per block reference, in reference order.
    rows: Vec<Vec<RowRun>>,
    block_lens: Vec<usize>,
    /// Start in `made` and in the file of the made run still being appended to (`file_len` counts the bytes
    /// before it).
    open: Option<(usize, u64)>,
    /// Set when the emitter computed made bytes from rows (`Sink::made_from_rows`).
    from_rows: bool,
}

impl Placement {
    /// The made bytes with the file offset of each run.
    pub fn made(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.made_at.iter().map(|&(at, a, b)| (at, &self.made[a..b]))
    }

    /// Where block reference `i`'s rows go.
    pub fn rows_of(&self, i: usize) -> &[RowRun] {
        &self.rows[i]
    }

    /// The length block reference `i` must have.
    pub fn block_len(&self, i: usize) -> usize {
        self.block_lens[i]
    }

    pub fn n_blocks(&self) -> usize {
        self.block_lens.len()
    }

    /// Ends the open made run: `file_len` is then every byte emitted so far.
    fn close(&mut self) {
        if let Some((from, at)) = self.open.take() {
            if from < self.made.len() {
                self.made_at.push((at, from, self.made.len()));
                self.file_len += (self.made.len() - from) as u64;
            }
        }
    }
}

impl<'b> Sink<'b> for Placement {
    fn made(&mut self) -> &mut Vec<u8> {
        if self.open.is_none() {
            self.open = Some((self.made.len(), self.file_len));
        }
        &mut self.made
    }
    fn block(&mut self, block: usize, at: usize, rows: &'b [u8]) {
        if rows.is_empty() {
            return;
        }
        self.close();
        self.rows[block].push(RowRun { file_at: self.file_len, block_at: at, len: rows.len() });
        self.file_len += rows.len() as u64;
    }
    fn mark_u64(&mut self) -> (usize, u64) {
        let made = Sink::made(self);
        let at = made.len();
        made.extend_from_slice(&[0; 8]);
        (at, self.len())
    }
    fn fill_u64(&mut self, at: usize, v: u64) {
        self.made[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn len(&self) -> u64 {
        self.file_len + self.open.map_or(0, |(from, _)| self.made.len() - from) as u64
    }
    fn made_from_rows(&mut self) {
        self.from_rows = true;
    }
}

/// The placement of the file `skeleton` recomposes to (with `opts`); None where made bytes depend on rows.
pub fn place(skeleton: &[u8], opts: &EmitOptions) -> Result<Option<Placement>, FormatError> {
    let block_lens = super::skeleton_block_lengths(skeleton)?;
    // The emitter slices rows out of the blocks it is given, never reads them: one buffer of zeros as long as
    // the longest block stands in for every block.
    let zeros = vec![0u8; block_lens.iter().copied().max().unwrap_or(0)];
    let stand_ins: Vec<&[u8]> = block_lens.iter().map(|&n| &zeros[..n]).collect();
    let mut p = Placement { rows: vec![Vec::new(); block_lens.len()], block_lens, ..Default::default() };
    super::emit_into(skeleton, &stand_ins, opts, &mut p)?;
    if p.from_rows {
        return Ok(None);
    }
    p.close();
    Ok(Some(p))
}
