//! Prefix states: a valid slot file for the first P tokens of a decomposed state, for any P.
//!
//! CONTRACT: `emit_prefix(base, extras, spec)` returns either
//! * `Prefix::File`: the file llama-server would have saved after evaluating exactly `base.tokens[..P]`,
//!   up to which evaluation produced the rows: the token list cut at P; every non-SWA row of `[0, P)`
//!   (from the base's body); for an iSWA cache the SWA rows of the window `[max(0, P - n_swa), P)`,
//!   sorted by position; and an SCKP appendix with one checkpoint at P (see `checkpoint.rs`), so the server
//!   resumes at P with nothing re-evaluated. A cache without SWA section gets no appendix.
//! * `Prefix::Missing`: positions whose rows no source holds; nothing is emitted.
//!
//! Cell layout: llama.cpp restores cells into the first free cells of the slot's stream, in file order. A
//! fresh evaluation of P <= (SWA cache size) tokens keeps position q in cell q, masked cells included; with
//! the window alone the same rows sit at other cell indices and some CPU kernels (flash attention on f16,
//! softmax without it) then sum in another order: a few tenths of a percent in probabilities. `fill_masked`
//! restores the fresh layout by writing zero rows for the masked positions `[0, P - n_swa)` in the body's SWA
//! section (never in the checkpoint): every query at or after P masks them, and the server never saves them
//! again (its save drops masked cells). The SWA cache must hold P cells, else the restore fails: the caller
//! passes the cache size it knows.
//!
//! Where the SWA rows come from, first hit per position: the base's body, the base's checkpoints (newest
//! first), then each extra state's body and checkpoints in the order given. A row of an extra state is used
//! only if that state's tokens equal the base's through that position and its non-SWA rows at that
//! position are byte-identical to the base's (same content address: computed the same way). Extras of
//! another shape (layers, types, V layout, rotation) are ignored. Standard (non-chunked) SWA only;
//! `n_swa` comes from the model (GGUF `*.attention.sliding_window`), the file does not record it.

use std::ops::Range;

use super::checkpoint::{cut_words, write_cut_appendix, write_section, CutCheckpoint, Pick};
use super::model::tokens_from_words;
use super::reader::PutLe;
use super::rows::{Indexed, SecRows, StateRows};
use super::{head, parse, FormatError, MAGIC, VERSION};

/// A decomposed state: its skeleton and the blocks it references, in reference order.
#[derive(Clone, Copy)]
pub struct StateRef<'a> {
    pub skeleton: &'a [u8],
    pub blocks: &'a [&'a [u8]],
}

#[derive(Debug, Clone, Copy)]
pub struct PrefixSpec {
    /// P: tokens (= cells) of the emitted state, 1..=the base's token count.
    pub n_tokens: u32,
    /// The model's sliding window (0 for a model without SWA layers).
    pub n_swa: u32,
    /// Emit for a server with this many streams; `None` keeps the base's layout.
    pub n_stream: Option<u32>,
    /// When P is at most this (the server's SWA cache size in cells), the SWA section also holds zero rows
    /// for `[0, P - n_swa)`; 0 = never. See "Cell layout" above.
    pub fill_masked: u32,
}

/// Where the rows of a range of window positions came from: `state` 0 is the base, `i + 1` is `extras[i]`;
/// `checkpoint` is an index into that state's SCKP checkpoints, `None` for its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOrigin {
    pub state: usize,
    pub checkpoint: Option<usize>,
    pub positions: Range<i32>,
}

#[derive(Debug)]
pub enum Prefix {
    File { bytes: Vec<u8>, window: Range<i32>, origins: Vec<RowOrigin> },
    Missing { missing: Vec<Range<i32>> },
}

fn invalid(what: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::Invalid { offset: 0, what, detail: detail.into() }
}

fn ranges(mut ps: impl Iterator<Item = i32>) -> Vec<Range<i32>> {
    let mut out: Vec<Range<i32>> = Vec::new();
    if let Some(first) = ps.next() {
        out.push(first..first + 1);
        for p in ps {
            match out.last_mut() {
                Some(r) if r.end == p => r.end += 1,
                _ => out.push(p..p + 1),
            }
        }
    }
    out
}

struct Candidate<'r, 's> {
    rows: &'r SecRows<'s>,
    state: usize,
    checkpoint: Option<usize>,
    /// Positions below this are usable (the state's tokens agree with the base's).
    limit: i32,
    /// For an extra state: its non-SWA rows, which must equal the base's at the position.
    check: Option<&'r SecRows<'s>>,
}

fn same_full_rows(a: &SecRows<'_>, b: &SecRows<'_>, pos: i32) -> bool {
    a.has(pos) && b.has(pos) && (0..a.cells.layers.len()).all(|l| a.k(l, pos) == b.k(l, pos) && a.v(l, pos) == b.v(l, pos))
}

pub fn emit_prefix(base: StateRef<'_>, extras: &[StateRef<'_>], spec: &PrefixSpec) -> Result<Prefix, FormatError> {
    let opened = StateRows::open(base.skeleton, base.blocks)?;
    let b = opened.index()?;
    let p = spec.n_tokens as usize;
    if p == 0 || p > b.tokens.len() {
        return Err(invalid("prefix length", format!("{p} is outside 1..={} (the state's tokens)", b.tokens.len())));
    }
    if b.body.len() != b.n_body_sections || !(1..=2).contains(&b.body.len()) {
        return Err(invalid("prefix", format!("{} KV sections ({} with cells): only a KV or iSWA cache can be cut",
            b.n_body_sections, b.body.len())));
    }
    if let Some(k) = spec.n_stream {
        if k == 0 || k > super::MAX_EMIT_STREAMS {
            return Err(invalid("PrefixSpec.n_stream", format!("{k} is outside 1..={}", super::MAX_EMIT_STREAMS)));
        }
    }
    let swa = b.body.get(1).map(|(_, _, r)| r);
    if swa.is_some() && spec.n_swa == 0 {
        return Err(invalid("n_swa", "0, but the state has an SWA section; pass the model's sliding window"));
    }
    let p_i = p as i32;
    let full = &b.body[0].2;
    let mut missing: Vec<i32> = (0..p_i).filter(|&q| !full.has(q)).collect();

    let others: Vec<StateRows<'_>> = extras.iter().map(|e| StateRows::open(e.skeleton, e.blocks)).collect::<Result<_, _>>()?;
    let other_idx: Vec<Indexed<'_>> = others.iter().map(|o| o.index()).collect::<Result<_, _>>()?;

    let window = swa.map_or(p_i..p_i, |_| (p_i - spec.n_swa.min(p as u32) as i32)..p_i);
    let mut picks: Vec<Pick<'_, '_>> = Vec::new();
    let mut origins: Vec<RowOrigin> = Vec::new();
    if let Some(swa) = swa {
        let mut cands: Vec<Candidate<'_, '_>> = vec![Candidate { rows: swa, state: 0, checkpoint: None, limit: p_i, check: None }];
        for (ci, ck) in b.checkpoints.iter().enumerate().rev() {
            let lim = p_i.min(i32::try_from(ck.n_tokens).unwrap_or(i32::MAX));
            for s in ck.sections.iter().filter(|s| s.same_shape(swa)) {
                cands.push(Candidate { rows: s, state: 0, checkpoint: Some(ci), limit: lim, check: None });
            }
        }
        for (i, ix) in other_idx.iter().enumerate() {
            let Some((_, _, ofull)) = ix.body.first() else { continue };
            if ix.body.len() != 2 || !ofull.same_shape(full) {
                continue;
            }
            let lcp = ix.tokens.iter().zip(&b.tokens[..p]).take_while(|(x, y)| x == y).count() as i32;
            let oswa = &ix.body[1].2;
            if oswa.same_shape(swa) {
                cands.push(Candidate { rows: oswa, state: i + 1, checkpoint: None, limit: lcp, check: Some(ofull) });
            }
            for (ci, ck) in ix.checkpoints.iter().enumerate().rev() {
                let lim = lcp.min(i32::try_from(ck.n_tokens).unwrap_or(i32::MAX));
                for s in ck.sections.iter().filter(|s| s.same_shape(swa)) {
                    cands.push(Candidate { rows: s, state: i + 1, checkpoint: Some(ci), limit: lim, check: Some(ofull) });
                }
            }
        }
        for q in window.clone() {
            let hit = cands.iter().find(|c| {
                q < c.limit && c.rows.has(q) && c.check.is_none_or(|of| same_full_rows(of, full, q))
            });
            match hit {
                Some(c) => {
                    picks.push(Pick { pos: q, src: Some(c.rows) });
                    match origins.last_mut() {
                        Some(o) if o.state == c.state && o.checkpoint == c.checkpoint && o.positions.end == q => {
                            o.positions.end += 1
                        }
                        _ => origins.push(RowOrigin { state: c.state, checkpoint: c.checkpoint, positions: q..q + 1 }),
                    }
                }
                None => missing.push(q),
            }
        }
    }
    if !missing.is_empty() {
        missing.sort_unstable();
        missing.dedup();
        return Ok(Prefix::Missing { missing: ranges(missing.into_iter()) });
    }

    let words = cut_words(b.words, &b.tokens, p).map_err(|d| invalid("token payload", d))?;
    let streams = |i: usize| spec.n_stream.map_or((b.body[i].0, b.body[i].1), |k| (k, 0));
    let (n_stream, cell_stream) = streams(0);
    let full_picks: Vec<Pick<'_, '_>> = (0..p_i).map(|q| Pick { pos: q, src: Some(full) }).collect();
    let mut out = Vec::new();
    out.put_u32(MAGIC);
    out.put_u32(VERSION);
    out.put_u32((words.len() / 4) as u32);
    out.extend_from_slice(&words);
    write_section(&mut out, n_stream, cell_stream, full, &full_picks);
    if let Some(swa) = swa {
        let (s_stream, s_cell) = streams(1);
        let filled: Vec<Pick<'_, '_>>;
        let body_picks = if window.start > 0 && spec.fill_masked >= spec.n_tokens {
            filled = (0..window.start).map(|q| Pick { pos: q, src: None }).chain(picks.iter().copied()).collect();
            &filled
        } else {
            &picks
        };
        write_section(&mut out, s_stream, s_cell, swa, body_picks);
        // Keep the saving build's blob magic and slot id when the base has a checkpoint to copy them from.
        let (io_magic, seq_id) = b.checkpoints.first().map_or((head::IO_MAGIC, 0), |c| (c.io_magic, c.seq_id));
        let ck = CutCheckpoint {
            n_tokens: p as u32, window_start: window.start, io_magic, seq_id,
            n_stream: s_stream, cell_stream: s_cell, shape: swa, picks: &picks,
        };
        write_cut_appendix(&mut out, &ck);
    }
    // The emitted bytes must read back as a slot file of P tokens (cheap: no K/V copy).
    let back = parse::parse_file(&out)?;
    let toks = tokens_from_words(back.words).map_err(|d| invalid("emitted token payload", d))?;
    if toks[..] != b.tokens[..p] {
        return Err(invalid("emitted prefix", "token list does not read back"));
    }
    Ok(Prefix::File { bytes: out, window, origins })
}
