//! Slot file bytes -> [`SlotFile`] (structure plus borrowed payload slices). No copying of K/V data.
//!
//! CONTRACT: the file does not say which memory module wrote it, so sections are parsed greedily: after a section the
//! rest is empty, starts with the `SCKP` appendix magic, is all zero bytes (padding the server ignores), or
//! must be another section: a recurrent one if it reads as one up to that end (see `recurrent.rs`), else KV.
//! Whether metadata entries carry the 12-byte cell ext is not flagged either; the whole file is parsed without
//! it first and, if that fails, with it.

use super::ggml::{check_rot, check_rows, check_trans};
use super::model::*;
use super::reader::Reader;
use super::head::{IO_MAGIC, SCKP_MAGIC, SCKP_VERSION};
use super::FormatError;


pub(crate) fn parse_file(buf: &[u8]) -> Result<SlotFile<'_>, FormatError> {
    // Magic, version and a token count that fits the file: the same check the file reader makes at the door.
    super::head::check_head(buf, buf.len() as u64)?;
    let mut r = Reader::new(buf, 0);
    r.take(8, "magic and version")?;
    match parse_rest(r.clone(), false) {
        Ok(f) => Ok(f),
        Err(e0) => match parse_rest(r, true) {
            Ok(f) => Ok(f),
            // Report the likelier reading of the file: one that found a bad type or size where a layer header
            // belongs (a misread lands in row data and fails on structure), else the one that got further.
            Err(e1) if err_rank(&e1) > err_rank(&e0) => Err(e1),
            Err(_) => Err(e0),
        },
    }
}

fn err_rank(e: &FormatError) -> (bool, u64) {
    match e {
        FormatError::UnknownType { offset, .. }
        | FormatError::SizeMismatch { offset, .. }
        | FormatError::BadRotation { offset, .. } => (true, *offset),
        FormatError::Truncated { offset, .. } | FormatError::Invalid { offset, .. } => (false, *offset),
        _ => (false, 0),
    }
}

fn parse_rest<'a>(mut r: Reader<'a>, ext: bool) -> Result<SlotFile<'a>, FormatError> {
    let n_words = r.u32("n_token_words")?;
    let words = r.take(n_words as u64 * 4, "token words")?;
    tokens_from_words(words).map_err(|d| FormatError::Invalid { offset: 12, what: "token payload", detail: d })?;

    let body_end = |r: &Reader<'_>| {
        let rest = r.peek_rest();
        rest.is_empty() || r.peek_u32() == Some(SCKP_MAGIC) || rest.iter().all(|&b| b == 0)
    };
    let (sections, recurrent) = parse_sections(&mut r, ext, body_end)?;
    let appendix = if r.peek_u32() == Some(SCKP_MAGIC) { Some(parse_appendix(&mut r, ext)?) } else { None };
    Ok(SlotFile { words, sections, recurrent, appendix, trailing: r.rest() })
}

/// KV sections, then at most one recurrent section (`llama_memory_hybrid` writes attention first), until
/// `at_end`; at least one section. Before each section the recurrent reading is tried first: it must end
/// exactly at `at_end`, which a KV section does not; failing that, the bytes must be a KV section.
fn parse_sections<'a>(
    r: &mut Reader<'a>,
    ext: bool,
    at_end: impl Fn(&Reader<'a>) -> bool + Copy,
) -> Result<(Vec<Section<'a>>, Option<Recurrent<'a>>), FormatError> {
    let mut sections = Vec::new();
    loop {
        let rec = super::recurrent::parse_to_end(r, at_end);
        if let Ok(rc) = rec {
            return Ok((sections, Some(rc)));
        }
        match parse_section(r, ext) {
            Ok(s) => sections.push(s),
            // The recurrent error only if that reading got through the section header: then it is the likelier.
            Err(e) => return Err(match rec {
                Err(re) if super::recurrent::past_header(&re) && err_rank(&re) > err_rank(&e) => re,
                _ => e,
            }),
        }
        if at_end(r) {
            return Ok((sections, None));
        }
    }
}

/// One KV section (`llama_kv_cache::state_write`).
pub(crate) fn parse_section<'a>(r: &mut Reader<'a>, ext: bool) -> Result<Section<'a>, FormatError> {
    let n_stream = r.u32("n_stream")?;
    if n_stream == 0 || n_stream > super::MAX_EMIT_STREAMS {
        return Err(r.invalid(4, "n_stream", format!("{n_stream} streams is outside 1..={}", super::MAX_EMIT_STREAMS)));
    }
    let mut cells = None;
    let mut cell_stream = 0;
    for s in 0..n_stream {
        let count = r.u32("cell_count")?;
        if count == 0 {
            continue;
        }
        if cells.is_some() {
            return Err(r.invalid(4, "cell_count", format!("stream {s} holds cells too; only single-sequence saves are supported")));
        }
        cells = Some(parse_cells(r, count, ext)?);
        cell_stream = s;
    }
    Ok(Section { n_stream, cell_stream, cell_ext: ext, cells })
}

fn parse_cells<'a>(r: &mut Reader<'a>, count: u32, ext: bool) -> Result<Cells<'a>, FormatError> {
    let meta_start = r.peek_rest();
    let before = r.remaining();
    let pos = scan_meta(r, count, ext)?;
    let meta = &meta_start[..before - r.remaining()];
    // A single sequence holds each position once; a duplicate also exposes a wrong cell-ext guess.
    let mut sorted = pos.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(FormatError::Invalid {
            offset: r.offset() - (before - r.remaining()) as u64,
            what: "cell positions",
            detail: format!("position {} occurs twice in one KV section", w[0]),
        });
    }

    let v_trans = r.u32("v_trans")?;
    if v_trans > 1 {
        return Err(r.invalid(4, "v_trans", format!("{v_trans} is neither 0 nor 1")));
    }
    let n_layer = r.u32("n_layer")?;
    let rot_off = r.offset();
    let n_rot_k = r.u32("n_rot_k")?;
    let n_rot_v = r.u32("n_rot_v")?;
    // Each layer needs at least a 12-byte K header and a 12-byte V header.
    r.need(n_layer as u64 * 24, "layer headers")?;
    let payload_len = |r: &Reader<'_>, row: u64, what: &'static str| {
        row.checked_mul(count as u64).ok_or_else(|| r.invalid(12, what, format!("row size {row} x {count} cells overflows")))
    };
    let mut ks = Vec::with_capacity(n_layer as usize);
    let (mut k_widths, mut v_widths) = (Vec::with_capacity(n_layer as usize), Vec::with_capacity(n_layer as usize));
    for _ in 0..n_layer {
        let hdr = r.offset();
        let ty = r.i32("K type")?;
        let row = r.u64("K row size")?;
        k_widths.push(check_rows(ty, row, hdr, ["K type", "K row size"])?);
        let len = payload_len(r, row, "K row size")?;
        ks.push((ty, row, r.take(len, "K rows")?));
    }
    let mut layers = Vec::with_capacity(n_layer as usize);
    let mut payload = Vec::with_capacity(n_layer as usize);
    for (k_ty, k_row, k_data) in ks {
        let hdr = r.offset();
        let ty = r.i32("V type")?;
        let v = if v_trans == 0 {
            VLayout::Rows { ty, row: r.u64("V row size")? }
        } else {
            VLayout::Trans { ty, el: r.u32("V el size")?, n_embd: r.u32("V n_embd_v_gqa")? }
        };
        v_widths.push(match v {
            VLayout::Rows { ty, row } => check_rows(ty, row, hdr, ["V type", "V row size"])?,
            VLayout::Trans { ty, el, n_embd } => check_trans(ty, el, n_embd, hdr)?,
        });
        let len = payload_len(r, v.row_bytes(), "V size")?;
        let v_data = r.take(len, "V data")?;
        layers.push(LayerHdr { k_ty, k_row, v });
        payload.push((k_data, v_data));
    }
    check_rot(n_rot_k, &k_widths, rot_off, "n_rot_k")?;
    check_rot(n_rot_v, &v_widths, rot_off + 4, "n_rot_v")?;
    Ok(Cells { count, meta, pos, v_trans, n_rot_k, n_rot_v, layers, payload })
}

fn parse_appendix<'a>(r: &mut Reader<'a>, ext: bool) -> Result<Appendix<'a>, FormatError> {
    r.u32("SCKP magic")?;
    let version = r.u32("SCKP version")?;
    if version != SCKP_VERSION {
        return Err(r.invalid(4, "SCKP version", format!("{version}, expected {SCKP_VERSION}")));
    }
    let count = r.u32("SCKP count")?;
    // n_tokens, pos_min, pos_max and three u64 lengths: 40 bytes at least per checkpoint.
    r.need(count as u64 * 40, "SCKP checkpoints")?;
    let mut checkpoints = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n_tokens = r.i64("checkpoint n_tokens")?;
        let pos_min = r.i32("checkpoint pos_min")?;
        let pos_max = r.i32("checkpoint pos_max")?;
        let n = r.u64("checkpoint data_tgt length")?;
        let tgt_off = r.offset();
        let tgt = parse_tgt(r.take(n, "checkpoint data_tgt")?, tgt_off, ext);
        let n = r.u64("checkpoint data_dft length")?;
        let dft = r.take(n, "checkpoint data_dft")?;
        let n = r.u64("checkpoint data_spec length")?;
        let spec = r.take(n, "checkpoint data_spec")?;
        checkpoints.push(Checkpoint { n_tokens, pos_min, pos_max, tgt, dft, spec });
    }
    Ok(Appendix { version, checkpoints })
}

/// `io_magic, seq_id, sections...` filling the blob exactly, or else the blob verbatim.
fn parse_tgt(blob: &[u8], base: u64, ext: bool) -> Tgt<'_> {
    let parsed = || -> Result<Tgt<'_>, FormatError> {
        let mut r = Reader::new(blob, base);
        let io_magic = r.u32("io magic")?;
        if io_magic != IO_MAGIC {
            return Err(r.invalid(4, "io magic", "not a state blob"));
        }
        let seq_id = r.i32("seq_id")?;
        let (sections, recurrent) = parse_sections(&mut r, ext, |r| r.is_empty())?;
        Ok(Tgt::Parsed { io_magic, seq_id, sections, recurrent })
    };
    parsed().unwrap_or(Tgt::Opaque(blob))
}
