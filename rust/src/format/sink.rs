//! Where an emitted file goes: one buffer (`Vec<u8>`), or `Pieces`: the bytes the emitter makes (heads,
//! transposed V, recurrent rows) in one buffer of its own, and the block rows it only points at.
//!
//! CONTRACT: both sinks receive the same calls, and `Pieces::slices` concatenated equal the `Vec` a
//! recompose fills, byte for byte. Why pieces: a restore's rows are already in memory as blocks; pointing
//! at them lets the file be hashed and written from them (one `writev`) instead of copied into a file
//! buffer first, a pass over the whole state (measured: 12 ms of a 42 ms restore of a 70 MB state).

use super::reader::PutLe;

/// What the emitter writes into.
pub(crate) trait Sink<'b> {
    /// The buffer made bytes are appended to (the last piece, for `Pieces`).
    fn made(&mut self) -> &mut Vec<u8>;
    /// Rows of a block, copied (`Vec`) or pointed at (`Pieces`): `rows` are the bytes at `at` of the file's
    /// block reference `block` (a sink that places rows by where they come from: `place.rs`).
    fn block(&mut self, block: usize, at: usize, rows: &'b [u8]);
    /// A u64 to fill in later (a checkpoint's length); returns where it is and the length so far.
    fn mark_u64(&mut self) -> (usize, u64);
    fn fill_u64(&mut self, at: usize, v: u64);
    /// Bytes emitted so far.
    fn len(&self) -> u64;
    /// The made bytes about to be appended are computed from block rows (transposed V, recurrent rows): a
    /// sink that places rows without reading them (`place.rs`) cannot place this file.
    fn made_from_rows(&mut self) {}
}

impl<'b> Sink<'b> for Vec<u8> {
    fn made(&mut self) -> &mut Vec<u8> {
        self
    }
    fn block(&mut self, _block: usize, _at: usize, rows: &'b [u8]) {
        self.extend_from_slice(rows);
    }
    fn mark_u64(&mut self) -> (usize, u64) {
        let at = self.len();
        self.put_u64(0);
        (at, at as u64 + 8)
    }
    fn fill_u64(&mut self, at: usize, v: u64) {
        self[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn len(&self) -> u64 {
        Vec::len(self) as u64
    }
}

/// A file as pieces in order: ranges of `made` and slices of blocks.
#[derive(Default)]
pub struct Pieces<'b> {
    made: Vec<u8>,
    pieces: Vec<Piece<'b>>,
    /// Start in `made` of the range still being appended to (None: the last piece is a block).
    open: Option<usize>,
    block_bytes: u64,
}

enum Piece<'b> {
    Made(usize, usize),
    Block(&'b [u8]),
}

impl<'b> Pieces<'b> {
    fn close(&mut self) {
        if let Some(from) = self.open.take() {
            if from < self.made.len() {
                self.pieces.push(Piece::Made(from, self.made.len()));
            }
        }
    }

    /// The file's bytes, in order.
    pub fn slices(&mut self) -> Vec<&[u8]> {
        self.close();
        self.pieces
            .iter()
            .map(|p| match *p {
                Piece::Made(a, b) => &self.made[a..b],
                Piece::Block(rows) => rows,
            })
            .collect()
    }

    pub fn total_len(&self) -> u64 {
        self.block_bytes + self.made.len() as u64
    }
}

impl<'b> Sink<'b> for Pieces<'b> {
    fn made(&mut self) -> &mut Vec<u8> {
        if self.open.is_none() {
            self.open = Some(self.made.len());
        }
        &mut self.made
    }
    fn block(&mut self, _block: usize, _at: usize, rows: &'b [u8]) {
        if rows.is_empty() {
            return;
        }
        self.close();
        self.block_bytes += rows.len() as u64;
        self.pieces.push(Piece::Block(rows));
    }
    fn mark_u64(&mut self) -> (usize, u64) {
        let made = self.made();
        let at = made.len();
        made.put_u64(0);
        (at, self.total_len())
    }
    fn fill_u64(&mut self, at: usize, v: u64) {
        self.made[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn len(&self) -> u64 {
        self.total_len()
    }
}
