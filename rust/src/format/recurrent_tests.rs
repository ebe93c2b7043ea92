//! Unit tests of the recurrent section codec on hand-made sections (real files: tests/test_recurrent.py).

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
        b.extend(std::iter::repeat(i as u8 + 1).take((row * count as u64) as usize));
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
