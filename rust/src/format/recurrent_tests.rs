//! Unit tests of the recurrent section codec on hand-made sections.
//!
//! CONTRACT: test code only; real recurrent and hybrid slot files are tested from Python
//! (tests/format/test_recurrent.py).

use super::reader::{PutLe, Reader};
use super::recurrent::*;

fn section(count: u32, entries: &[(i32, u64)], tail: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.put_u32(count);
    for c in 0..count {
        b.put_i32(7 + c as i32);
        b.put_u32(0);
    }
    b.put_u32(0);
    b.put_u32(4);
    for (i, &(ty, row)) in entries.iter().enumerate() {
        b.put_i32(ty);
        b.put_u64(row);
        b.extend(std::iter::repeat_n(i as u8 + 1, (row * count as u64) as usize));
    }
    b.extend_from_slice(tail);
    b
}

#[test]
fn parses_emits_and_encodes() {
    let es = [(0, 8), (0, 8), (0, 0), (0, 0)];
    let file = section(1, &es, &[]);
    let mut r = Reader::new(&file, 0);
    let rc = parse_to_end(&mut r, |r| r.is_empty()).unwrap();
    assert_eq!((rc.count, rc.n_layer, rc.entries.len()), (1, 4, 4));
    assert_eq!(rc.layout(), "rec[4:f32/8*2;f32/0*2]");
    assert_eq!((rc.block_len().unwrap(), rc.elem_size()), (16, 4));
    let mut out = Vec::new();
    emit(&rc, &rc.block(), &mut out);
    assert_eq!(out, file);
    let mut sk = Vec::new();
    encode(&rc, &mut sk);
    let d = decode(&mut Reader::new(&sk, 0)).unwrap();
    assert_eq!((d.entries, d.meta), (rc.entries.clone(), rc.meta));
    // An empty slot still carries the headers, and has no block.
    let empty = section(0, &es, &[]);
    let rc = parse_to_end(&mut Reader::new(&empty, 0), |r| r.is_empty()).unwrap();
    assert_eq!(rc.n_blocks().unwrap(), 0);
}

#[test]
fn refuses_what_it_cannot_rebuild() {
    let odd = section(1, &[(0, 8), (0, 8), (0, 4)], &[]);
    assert!(parse_to_end(&mut Reader::new(&odd, 0), |r| r.is_empty()).is_err());
    let bad_type = section(1, &[(0, 8), (900, 8)], &[]);
    assert!(parse_to_end(&mut Reader::new(&bad_type, 0), |r| r.is_empty()).is_err());
    let tail = section(1, &[(0, 8), (0, 8)], &[1, 2, 3]);
    let mut r = Reader::new(&tail, 0);
    assert!(parse_to_end(&mut r, |r| r.is_empty()).is_err());
    assert_eq!(r.offset(), 0, "a failed parse leaves the reader where it was");
}

// ------------------------------------------------------------------------------------------------
// whole files: hybrid (KV, then recurrent) and pure recurrent, each with a recurrent-only checkpoint

fn put_rec(b: &mut Vec<u8>, pos: i32, fill: u8) {
    b.put_u32(1);
    b.put_i32(pos);
    b.put_u32(0);
    b.put_u32(0);
    b.put_u32(2);
    for (ty, row) in [(0, 8u64), (0, 16)] {
        b.put_i32(ty);
        b.put_u64(row);
        b.extend((0..row).map(|i| fill.wrapping_add(i as u8)));
    }
}

fn whole_file(n: u32, hybrid: bool, fill: u8) -> Vec<u8> {
    let mut b = Vec::new();
    for w in [super::MAGIC, super::VERSION, n + 4, u32::MAX, 1, n] {
        b.put_u32(w);
    }
    (0..n).for_each(|t| b.put_u32(100 + t));
    b.put_u32(0);
    if hybrid {
        b.extend([1u32, n].iter().flat_map(|w| w.to_le_bytes()));
        for p in 0..n as i32 {
            b.put_i32(p);
            b.put_u32(1);
            b.put_i32(0);
        }
        [0u32, 1, 0, 0].iter().for_each(|&w| b.put_u32(w));
        for _ in 0..2 {
            b.put_i32(1);
            b.put_u64(4);
            b.extend((0..4 * n).map(|i| i as u8));
        }
    }
    put_rec(&mut b, n as i32 - 1, fill);
    let mut blob = Vec::new();
    blob.put_u32(super::head::IO_MAGIC);
    blob.put_i32(0);
    put_rec(&mut blob, n as i32 - 5, fill ^ 0x55);
    [super::SCKP_MAGIC, 1, 1].iter().for_each(|&w| b.put_u32(w));
    b.put_i64(n as i64 - 4);
    b.put_i32(0);
    b.put_i32(n as i32 - 5);
    b.put_u64(blob.len() as u64);
    b.extend_from_slice(&blob);
    b.put_u64(0);
    b.put_u64(0);
    b
}

#[test]
fn hybrid_and_recurrent_files_round_trip() {
    use super::{decompose, recompose, skeleton_block_lengths, EmitOptions};
    for hybrid in [true, false] {
        let f = whole_file(40, hybrid, 7);
        let d = decompose(&f, 32).unwrap();
        let rec = "rec[2:f32/8;f32/16]";
        let want = if hybrid { format!("kv[1:f16/4,f16/4;vt0;rot0,0;ext0]+{rec}") } else { rec.to_string() };
        assert_eq!(d.layout, want);
        assert_eq!(d.n_checkpoints, 1);
        assert_eq!(d.tokens, (100..140).collect::<Vec<i32>>());
        // KV by position (2 blocks of 32), then the body's state, then the checkpoint's state: whole blocks
        let n_kv = if hybrid { 2 } else { 0 };
        assert_eq!(d.blocks.len(), n_kv + 2);
        assert_eq!(d.blocks[n_kv].bytes.len(), 24);
        assert_eq!(d.blocks[n_kv].elem_size, 4);
        assert_eq!(u32::from_le_bytes(d.skeleton[4..8].try_into().unwrap()), 2, "skeleton version 2");
        let lens: Vec<usize> = d.blocks.iter().map(|b| b.bytes.len()).collect();
        assert_eq!(skeleton_block_lengths(&d.skeleton).unwrap(), lens);
        let blocks: Vec<&[u8]> = d.blocks.iter().map(|b| b.bytes.as_slice()).collect();
        assert!(recompose(&d.skeleton, &blocks, &EmitOptions::default()).unwrap() == f);
        assert!(super::tests::pieces_bytes(&d.skeleton, &blocks, None) == f, "pieces: a recurrent state with a checkpoint");
        // a wrong-sized state block is refused, not emitted
        let mut short = blocks.clone();
        short[n_kv] = &blocks[n_kv][..8];
        assert!(recompose(&d.skeleton, &short, &EmitOptions::default()).is_err());
        // the same state in a longer file is the same block; another state is another block
        let longer = decompose(&whole_file(50, hybrid, 7), 32).unwrap();
        assert_eq!(longer.blocks[n_kv].bytes, d.blocks[n_kv].bytes);
        let other = decompose(&whole_file(40, hybrid, 9), 32).unwrap();
        assert_ne!(other.blocks[n_kv].bytes, d.blocks[n_kv].bytes);
        // bytes after the recurrent section that are no appendix: refused
        let mut bad = f.clone();
        let at = bad.len() - (f.len() - f.windows(4).position(|w| w == b"SCKP").unwrap());
        bad.insert(at, 1);
        assert!(decompose(&bad, 32).is_err());
    }
}

#[test]
fn recurrent_states_are_never_cut() {
    // docs/design.md "Recurrent and hybrid models": no part of the recurrent state is the state after P tokens.
    use super::{decompose, emit_prefix, PrefixSpec, StateRef};
    for hybrid in [true, false] {
        let d = decompose(&whole_file(40, hybrid, 7), 32).unwrap();
        let blocks: Vec<&[u8]> = d.blocks.iter().map(|b| b.bytes.as_slice()).collect();
        let spec = PrefixSpec { n_tokens: 20, n_swa: 16, n_stream: None, fill_masked: 0 };
        let err = emit_prefix(StateRef { skeleton: &d.skeleton, blocks: &blocks }, &[], &spec).unwrap_err();
        assert!(err.to_string().contains("recurrent"), "{err}");
    }
}
