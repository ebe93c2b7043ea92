//! Tests of `emit_prefix` on the real slot files in `$KVSTORE_STATE_DIR` (tests/make_states.py).
//!
//! CONTRACT: test code only; every emitted file is re-parsed and each of its rows compared with the row at the
//! same position of its source. All need those files: ignored by a plain `cargo test`, run (and failing
//! without them) by `./dev test`.

use super::model::{Cells, SlotFile, Tgt, VLayout};
use super::*;

use crate::testutil::state_file as real;

struct Dec(Decomposed);

impl Dec {
    fn of(f: &[u8]) -> Dec {
        Dec(decompose(f, 32).unwrap())
    }
    fn blocks(&self) -> Vec<&[u8]> {
        self.0.blocks.iter().map(|b| b.bytes.as_slice()).collect()
    }
}

fn emit(base: &Dec, extras: &[&Dec], p: u32, n_swa: u32) -> Prefix {
    let bb = base.blocks();
    let eb: Vec<Vec<&[u8]>> = extras.iter().map(|e| e.blocks()).collect();
    let refs: Vec<StateRef<'_>> = extras.iter().zip(&eb).map(|(e, b)| StateRef { skeleton: &e.0.skeleton, blocks: b }).collect();
    emit_prefix(StateRef { skeleton: &base.0.skeleton, blocks: &bb }, &refs, &PrefixSpec { n_tokens: p, n_swa, n_stream: None, fill_masked: 0 })
        .unwrap()
}

fn file_of(p: Prefix) -> (Vec<u8>, std::ops::Range<i32>, Vec<RowOrigin>) {
    match p {
        Prefix::File { bytes, window, origins } => (bytes, window, origins),
        Prefix::Missing { missing } => panic!("missing rows {missing:?}"),
    }
}

/// (K row, V row cell-major) of the cell at `pos`, from a parsed file's payload.
fn row(c: &Cells<'_>, layer: usize, pos: i32) -> Option<(Vec<u8>, Vec<u8>)> {
    let i = c.pos.iter().position(|&q| q == pos)?;
    let (k, v) = c.payload[layer];
    let h = c.layers[layer];
    let kr = h.k_row as usize;
    let vv = match h.v {
        VLayout::Rows { row, .. } => v[i * row as usize..(i + 1) * row as usize].to_vec(),
        VLayout::Trans { el, n_embd, .. } => (0..n_embd as usize)
            .flat_map(|j| v[(j * c.count as usize + i) * el as usize..][..el as usize].to_vec())
            .collect(),
    };
    Some((k[i * kr..(i + 1) * kr].to_vec(), vv))
}

fn ck_cells<'a>(f: &'a SlotFile<'a>, i: usize) -> &'a Cells<'a> {
    match &f.appendix.as_ref().unwrap().checkpoints[i].tgt {
        Tgt::Parsed { sections, .. } => sections[0].cells.as_ref().unwrap(),
        Tgt::Opaque(_) => panic!("opaque checkpoint"),
    }
}

/// Every cell of `got` equals the cell at the same position of some section in `srcs`; positions as expected.
fn same_rows(got: &Cells<'_>, want_pos: std::ops::Range<i32>, srcs: &[&Cells<'_>]) {
    assert_eq!(got.pos, want_pos.clone().collect::<Vec<_>>(), "cells must be the range, sorted");
    for &q in &got.pos {
        for l in 0..got.layers.len() {
            let g = row(got, l, q).unwrap();
            assert!(srcs.iter().any(|s| row(s, l, q).as_ref() == Some(&g)), "row at pos {q} layer {l} not from a source");
        }
    }
}

fn check_cut(src: &[u8], out: &[u8], p: i32, n_swa: i32) {
    let s = parse::parse_file(src).unwrap();
    let o = parse::parse_file(out).unwrap();
    let st = model::tokens_from_words(s.words).unwrap();
    assert_eq!(model::tokens_from_words(o.words).unwrap(), st[..p as usize]);
    assert_eq!(o.sections.len(), s.sections.len());
    same_rows(o.sections[0].cells.as_ref().unwrap(), 0..p, &[s.sections[0].cells.as_ref().unwrap()]);
    assert_eq!(o.sections[0].n_stream, s.sections[0].n_stream);
    assert_eq!(o.sections[0].cell_stream, s.sections[0].cell_stream);
    if s.sections.len() == 2 {
        let w = (p - n_swa).max(0)..p;
        let mut srcs = vec![s.sections[1].cells.as_ref().unwrap()];
        srcs.extend((0..s.appendix.as_ref().map_or(0, |a| a.checkpoints.len())).map(|i| ck_cells(&s, i)));
        same_rows(o.sections[1].cells.as_ref().unwrap(), w.clone(), &srcs);
        let a = o.appendix.as_ref().expect("a cut checkpoint");
        assert_eq!(a.checkpoints.len(), 1);
        let c = &a.checkpoints[0];
        assert_eq!((c.n_tokens, c.pos_min, c.pos_max), (p as i64, (w.start - 1).max(0), p));
        same_rows(ck_cells(&o, 0), w, &srcs);
    } else {
        assert!(o.appendix.is_none());
    }
}

#[test]
#[ignore = "needs real slot files: ./dev test"]
fn cuts_of_real_files_hold_the_source_rows() {
    for name in ["gemma3_parent.bin", "gemma3_child.bin", "gemma3_fa_off.bin", "gemma3_q8.bin", "smollm2_parent.bin", "smollm2_fa_off.bin"] {
        let f = real(name);
        let d = Dec::of(&f);
        let n = d.0.tokens.len() as u32;
        let mut ps: Vec<u32> = [1, 2, 31, 32, 33, n / 2, n - 1, n].into_iter().filter(|&p| p >= 1 && p <= n).collect();
        ps.dedup();
        for p in ps {
            for n_swa in [512u32, 16] {
                let (bytes, window, origins) = file_of(emit(&d, &[], p, n_swa));
                check_cut(&f, &bytes, p as i32, n_swa as i32);
                if d.0.layout.contains('+') {
                    assert_eq!(window, (p as i32 - n_swa as i32).max(0)..p as i32, "{name} P={p}");
                    assert!(origins.iter().all(|o| o.state == 0), "{name}: rows from the base only");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs real slot files: ./dev test"]
fn missing_window_rows_are_reported_and_found_in_a_related_state() {
    let (parent, child) = (real("gemma3_parent.bin"), real("gemma3_child.bin"));
    let dp = Dec::of(&parent);
    // A 300-token cut with a 32-token window holds SWA rows [268, 300) only (body and its one checkpoint).
    let (cut, _, _) = file_of(emit(&dp, &[], 300, 32));
    let dc = Dec::of(&cut);
    match emit(&dc, &[], 200, 32) {
        Prefix::Missing { missing } => assert_eq!(missing, vec![168..200]),
        Prefix::File { .. } => panic!("rows 168..200 are not in the cut"),
    }
    // The parent holds them, and so does the child (restored from the parent: same non-SWA rows).
    for (extra, state) in [(&dp, 1usize), (&Dec::of(&child), 1)] {
        let (bytes, window, origins) = file_of(emit(&dc, &[extra], 200, 32));
        assert_eq!(window, 168..200);
        assert!(origins.iter().all(|o| o.state == state), "{origins:?}");
        check_cut(&parent, &bytes, 200, 32);
    }
    // A state whose tokens differ before the window lends nothing.
    let other = real("gemma3_fa_on.bin");
    match emit(&dc, &[&Dec::of(&other)], 200, 32) {
        Prefix::Missing { missing } => assert_eq!(missing, vec![168..200]),
        Prefix::File { .. } => panic!("an unrelated state must not lend rows"),
    }
}

#[test]
#[ignore = "needs real slot files: ./dev test"]
fn bad_requests_are_errors() {
    let f = real("gemma3_parent.bin");
    let d = Dec::of(&f);
    let bb = d.blocks();
    let base = StateRef { skeleton: &d.0.skeleton, blocks: &bb };
    let n = d.0.tokens.len() as u32;
    for spec in [
        PrefixSpec { n_tokens: 0, n_swa: 512, n_stream: None, fill_masked: 0 },
        PrefixSpec { n_tokens: n + 1, n_swa: 512, n_stream: None, fill_masked: 0 },
        PrefixSpec { n_tokens: 10, n_swa: 0, n_stream: None, fill_masked: 0 },
        PrefixSpec { n_tokens: 10, n_swa: 512, n_stream: Some(0), fill_masked: 0 },
    ] {
        assert!(emit_prefix(base, &[], &spec).is_err(), "{spec:?}");
    }
    assert!(emit_prefix(StateRef { skeleton: &d.0.skeleton, blocks: &bb[1..] }, &[], &PrefixSpec { n_tokens: 5, n_swa: 512, n_stream: None, fill_masked: 0 }).is_err());
    // Another stream count: the cells move to stream 0 of k streams.
    let Prefix::File { bytes, .. } = emit_prefix(base, &[], &PrefixSpec { n_tokens: 40, n_swa: 512, n_stream: Some(3), fill_masked: 0 }).unwrap() else { panic!() };
    let o = parse::parse_file(&bytes).unwrap();
    assert!(o.sections.iter().all(|s| s.n_stream == 3 && s.cell_stream == 0));
}

#[test]
#[ignore = "needs real slot files: ./dev test"]
fn fill_masked_keeps_the_fresh_cell_layout() {
    let f = real("gemma3_parent.bin");
    let d = Dec::of(&f);
    let bb = d.blocks();
    let base = StateRef { skeleton: &d.0.skeleton, blocks: &bb };
    let spec = |fill| PrefixSpec { n_tokens: 300, n_swa: 64, n_stream: None, fill_masked: fill };
    // P above the cache size: the window alone, exactly as without the option.
    let Prefix::File { bytes: plain, .. } = emit_prefix(base, &[], &spec(0)).unwrap() else { panic!() };
    let Prefix::File { bytes: small, .. } = emit_prefix(base, &[], &spec(299)).unwrap() else { panic!() };
    assert_eq!(plain, small);
    let Prefix::File { bytes, window, .. } = emit_prefix(base, &[], &spec(300)).unwrap() else { panic!() };
    assert_eq!(window, 236..300);
    let o = parse::parse_file(&bytes).unwrap();
    let s = parse::parse_file(&f).unwrap();
    let swa = o.sections[1].cells.as_ref().unwrap();
    assert_eq!(swa.pos, (0..300).collect::<Vec<_>>(), "masked positions first, in position order");
    for l in 0..swa.layers.len() {
        for q in 0..236 {
            let (k, v) = row(swa, l, q).unwrap();
            assert!(k.iter().chain(&v).all(|&b| b == 0), "masked row {q} is zero");
        }
        for q in 236..300 {
            assert_eq!(row(swa, l, q), row(s.sections[1].cells.as_ref().unwrap(), l, q));
        }
    }
    // the checkpoint holds the window only, and its range is that of the window
    assert_eq!(ck_cells(&o, 0).pos, (236..300).collect::<Vec<_>>());
    let c = &o.appendix.as_ref().unwrap().checkpoints[0];
    assert_eq!((c.pos_min, c.pos_max), (235, 300));
}
