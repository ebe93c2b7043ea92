//! Tests of the format module on synthetic files (a small builder below) and, with `KVSTORE_STATE_DIR`
//! set, on real slot files.
//!
//! CONTRACT: test code only; the tests that read real slot files are `#[ignore]`d by a plain `cargo test`,
//! run by `./dev test` (`--include-ignored`), and fail without the files.

use super::*;

// ------------------------------------------------------------------------------------------------
// builder

#[derive(Clone)]
struct L {
    k_ty: i32,
    k_row: usize,
    v_ty: i32,
    /// V bytes per cell; with v_trans this is el * n_embd.
    v_row: usize,
    el: usize,
}

fn f16_layers(n: usize, row: usize) -> Vec<L> {
    vec![L { k_ty: 1, k_row: row, v_ty: 1, v_row: row, el: 2 }; n]
}

#[derive(Clone)]
struct Sec {
    n_stream: u32,
    cell_stream: u32,
    ext: bool,
    pos: Vec<i32>,
    seq: i32,
    v_trans: bool,
    rot: (u32, u32),
    layers: Vec<L>,
    /// Distinguishes the values of different sections (e.g. non-SWA vs SWA layers).
    salt: u8,
}

impl Sec {
    fn new(pos: Vec<i32>, layers: Vec<L>) -> Sec {
        Sec { n_stream: 1, cell_stream: 0, ext: false, pos, seq: 0, v_trans: false, rot: (0, 0), layers, salt: 0 }
    }
}

/// The logical value of byte `b` of the K (kind 0) or V (kind 1) row of the cell at `pos` in `layer`.
fn val(salt: u8, layer: usize, kind: u8, pos: i32, b: usize) -> u8 {
    let x = (pos as u32).wrapping_mul(2_654_435_761) ^ (layer as u32).wrapping_mul(40503) ^ ((kind as u32) << 7) ^ (b as u32).wrapping_mul(97);
    (x ^ (x >> 13) ^ salt as u32) as u8
}

fn row(s: &Sec, layer: usize, kind: u8, pos: i32, len: usize) -> Vec<u8> {
    (0..len).map(|b| val(s.salt, layer, kind, pos, b)).collect()
}

fn put32(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_le_bytes());
}

fn sec_bytes(s: &Sec) -> Vec<u8> {
    let mut o = Vec::new();
    put32(&mut o, s.n_stream);
    for st in 0..s.n_stream {
        if st != s.cell_stream || s.pos.is_empty() {
            put32(&mut o, 0);
            continue;
        }
        put32(&mut o, s.pos.len() as u32);
        for (i, &p) in s.pos.iter().enumerate() {
            put32(&mut o, p as u32);
            put32(&mut o, 1);
            if s.ext {
                for e in [p, 0, 5000 + i as i32] {
                    put32(&mut o, e as u32);
                }
            }
            put32(&mut o, s.seq as u32);
        }
        put32(&mut o, s.v_trans as u32);
        put32(&mut o, s.layers.len() as u32);
        put32(&mut o, s.rot.0);
        put32(&mut o, s.rot.1);
        for (li, l) in s.layers.iter().enumerate() {
            put32(&mut o, l.k_ty as u32);
            o.extend_from_slice(&(l.k_row as u64).to_le_bytes());
            for &p in &s.pos {
                o.extend(row(s, li, 0, p, l.k_row));
            }
        }
        for (li, l) in s.layers.iter().enumerate() {
            put32(&mut o, l.v_ty as u32);
            if !s.v_trans {
                o.extend_from_slice(&(l.v_row as u64).to_le_bytes());
                for &p in &s.pos {
                    o.extend(row(s, li, 1, p, l.v_row));
                }
            } else {
                let n_embd = l.v_row / l.el;
                put32(&mut o, l.el as u32);
                put32(&mut o, n_embd as u32);
                let rows: Vec<Vec<u8>> = s.pos.iter().map(|&p| row(s, li, 1, p, l.v_row)).collect();
                for j in 0..n_embd {
                    for r in &rows {
                        o.extend_from_slice(&r[j * l.el..(j + 1) * l.el]);
                    }
                }
            }
        }
    }
    o
}

struct Ck {
    n_tokens: i64,
    tgt: Vec<u8>,
    dft: Vec<u8>,
    spec: Vec<u8>,
}

fn tgt_blob(seq: i32, secs: &[Sec]) -> Vec<u8> {
    let mut o = Vec::new();
    put32(&mut o, 0xAF14_3CD8);
    put32(&mut o, seq as u32);
    for s in secs {
        o.extend(sec_bytes(s));
    }
    o
}

fn packed(tokens: &[i32]) -> Vec<i32> {
    let mut w = vec![-1, 1, tokens.len() as i32];
    w.extend_from_slice(tokens);
    w.push(0);
    w
}

fn toks(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| 1000 + i * 7).collect()
}

fn file(words: &[i32], secs: &[Sec], cks: Option<&[Ck]>, trailing: &[u8]) -> Vec<u8> {
    let mut o = Vec::new();
    put32(&mut o, MAGIC);
    put32(&mut o, VERSION);
    put32(&mut o, words.len() as u32);
    for &w in words {
        put32(&mut o, w as u32);
    }
    for s in secs {
        o.extend(sec_bytes(s));
    }
    if let Some(cks) = cks {
        put32(&mut o, SCKP_MAGIC);
        put32(&mut o, 1);
        put32(&mut o, cks.len() as u32);
        for c in cks {
            o.extend_from_slice(&c.n_tokens.to_le_bytes());
            put32(&mut o, 0);
            put32(&mut o, c.n_tokens as u32 - 1);
            for b in [&c.tgt, &c.dft, &c.spec] {
                o.extend_from_slice(&(b.len() as u64).to_le_bytes());
                o.extend_from_slice(b);
            }
        }
    }
    o.extend_from_slice(trailing);
    o
}

fn range(a: i32, b: i32) -> Vec<i32> {
    (a..b).collect()
}

/// gemma3-like: 3 global layers over all positions, 15 SWA layers over a wrapped window, plus a checkpoint.
fn iswa_file(n: i32, with_ck: bool) -> Vec<u8> {
    let mut g = Sec::new(range(0, n), f16_layers(3, 16));
    g.n_stream = 2;
    g.cell_stream = 1;
    g.seq = 1;
    let swa_lo = (n - 40).max(0);
    let split = swa_lo + (n - swa_lo) / 3;
    let mut pos = range(split, n);
    pos.extend(range(swa_lo, split));
    let mut w = Sec::new(pos, f16_layers(5, 16));
    w.n_stream = 2;
    w.cell_stream = 1;
    w.seq = 1;
    w.salt = 9;
    let ck_sec = Sec { pos: range(0, n / 2), ..w.clone() };
    let cks = [
        Ck { n_tokens: (n / 2) as i64, tgt: tgt_blob(1, &[ck_sec]), dft: vec![], spec: vec![] },
        Ck { n_tokens: 3, tgt: vec![1, 2, 3], dft: vec![5; 9], spec: vec![] },
    ];
    file(&packed(&toks(n as usize)), &[g, w], if with_ck { Some(&cks) } else { None }, &[])
}

fn blocks_of(d: &Decomposed) -> Vec<&[u8]> {
    d.blocks.iter().map(|b| b.bytes.as_slice()).collect()
}

fn roundtrip(f: &[u8], bs: u32) -> Decomposed {
    let d = decompose(f, bs).unwrap_or_else(|e| panic!("decompose: {e}"));
    let back = recompose(&d.skeleton, &blocks_of(&d), &EmitOptions::default()).unwrap();
    assert!(back == f, "round trip differs ({} vs {} bytes)", back.len(), f.len());
    assert_eq!(skeleton_block_count(&d.skeleton).unwrap(), d.blocks.len());
    assert_eq!(skeleton_tokens(&d.skeleton).unwrap(), d.tokens);
    assert_eq!(skeleton_block_size(&d.skeleton).unwrap(), bs);
    let lens: Vec<usize> = d.blocks.iter().map(|b| b.bytes.len()).collect();
    assert_eq!(skeleton_block_lengths(&d.skeleton).unwrap(), lens);
    check_placed(&d, f, None);
    d
}

// ------------------------------------------------------------------------------------------------
// round trips

#[test]
fn roundtrip_variants() {
    // q8_0 rows of 64 elements (2 blocks of 34 bytes): a rotation of 64 divides them
    let q8 = vec![L { k_ty: 8, k_row: 68, v_ty: 8, v_row: 68, el: 1 }; 2];
    let mut cases: Vec<(&str, Vec<u8>, usize)> = Vec::new();
    let one = |s: Sec, n: usize| file(&packed(&toks(n)), &[s], None, &[]);
    cases.push(("rows", one(Sec::new(range(0, 100), f16_layers(3, 8)), 100), 2));
    cases.push(("trans", one(Sec { v_trans: true, ..Sec::new(range(0, 100), f16_layers(3, 8)) }, 100), 2));
    cases.push(("ext", one(Sec { ext: true, ..Sec::new(range(0, 70), f16_layers(2, 8)) }, 70), 2));
    cases.push(("q8 rot", one(Sec { rot: (64, 64), ..Sec::new(range(0, 33), q8) }, 33), 1));
    cases.push(("f32 trans", one(Sec { v_trans: true, ..Sec::new(range(5, 40), vec![L { k_ty: 0, k_row: 8, v_ty: 0, v_row: 12, el: 4 }]) }, 35), 1));
    cases.push(("iswa", iswa_file(100, false), 4));
    cases.push(("iswa ckpt", iswa_file(100, true), 5));
    cases.push(("legacy tokens", file(&toks(10), &[Sec::new(range(0, 10), f16_layers(1, 4))], None, &[]), 1));
    let empty = file(&packed(&[]), &[Sec { n_stream: 2, ..Sec::new(vec![], vec![]) }], None, &[]);
    assert_eq!(empty.len(), 40);
    cases.push(("empty", empty, 0));
    cases.push(("zero padding", file(&packed(&toks(10)), &[Sec::new(range(0, 10), f16_layers(1, 4))], None, &[0; 100]), 1));
    let ck = [Ck { n_tokens: 4, tgt: vec![], dft: vec![1, 2], spec: vec![3] }];
    cases.push(("trailing after appendix", file(&packed(&toks(10)), &[Sec::new(range(0, 10), f16_layers(1, 4))], Some(&ck), b"junk"), 1));
    for (name, f, min_blocks) in &cases {
        let d = roundtrip(f, 64);
        assert_eq!(d.blocks.len(), *min_blocks, "{name}");
    }
    // token extraction
    let d = decompose(&cases[0].1, 64).unwrap();
    assert_eq!(d.tokens, toks(100));
    let d = decompose(&cases[7].1, 64).unwrap();
    assert_eq!(d.tokens, toks(10), "legacy list");
    let d = decompose(&cases[8].1, 64).unwrap();
    assert!(d.tokens.is_empty() && d.blocks.is_empty());
    assert_eq!((d.layout.as_str(), d.n_stream, d.n_checkpoints), ("kv[-]", 2, 0));
    let d = decompose(&cases[6].1, 64).unwrap();
    assert_eq!((d.n_stream, d.n_checkpoints), (2, 2));
}

#[test]
fn cell_ext_guess_survives_degenerate_ext_values() {
    // ext = (pos, index, 7) makes the meta also readable without ext (n_seq_id 7 swallows the rest), but
    // with duplicate positions; the parser must then fall back to the ext reading.
    let s = Sec { ext: true, ..Sec::new(range(0, 20), f16_layers(2, 8)) };
    let mut f = file(&packed(&toks(20)), &[s], None, &[]);
    let meta_at = 12 + 4 * (20 + 4) + 8;
    for i in 0..20usize {
        let at = meta_at + i * 24 + 8;
        f[at..at + 12].copy_from_slice(&[i as u32, i as u32, 7].map(|v| v.to_le_bytes()).concat());
    }
    let d = roundtrip(&f, 8);
    assert!(d.layout.ends_with("ext1]"), "{}", d.layout);
    assert_eq!(d.blocks.len(), 3);
}

#[test]
fn elem_sizes() {
    let one = |layers: Vec<L>| file(&packed(&toks(4)), &[Sec::new(range(0, 4), layers)], None, &[]);
    let es = |f: Vec<u8>| decompose(&f, 64).unwrap().blocks[0].elem_size;
    assert_eq!(es(one(f16_layers(2, 4))), 2);
    assert_eq!(es(one(vec![L { k_ty: 30, k_row: 4, v_ty: 1, v_row: 4, el: 2 }])), 2);
    assert_eq!(es(one(vec![L { k_ty: 0, k_row: 4, v_ty: 0, v_row: 4, el: 4 }])), 4);
    assert_eq!(es(one(vec![L { k_ty: 0, k_row: 4, v_ty: 1, v_row: 4, el: 2 }])), 1);
    assert_eq!(es(one(vec![L { k_ty: 8, k_row: 34, v_ty: 8, v_row: 34, el: 1 }])), 1);
}

// ------------------------------------------------------------------------------------------------
// block identity

#[test]
fn blocks_independent_of_count_order_and_transposition() {
    let layers = f16_layers(3, 8);
    let mk = |pos: Vec<i32>, vt: bool| {
        let n = pos.len();
        file(&packed(&toks(n)), &[Sec { v_trans: vt, ..Sec::new(pos, layers.clone()) }], None, &[])
    };
    let short = decompose(&mk(range(0, 70), false), 32).unwrap(); // blocks 0..32, 32..64, 64..70
    let long = decompose(&mk(range(0, 300), false), 32).unwrap();
    assert_eq!(short.blocks[0].bytes, long.blocks[0].bytes);
    assert_eq!(short.blocks[1].bytes, long.blocks[1].bytes);
    assert_ne!(short.blocks[2].bytes, long.blocks[2].bytes);
    assert_eq!(short.blocks[0].bytes.len(), 32 * 3 * 16);
    // SWA ring order: 768..999 then 488..767 gives the same blocks as sorted 488..999
    let mut ring = range(768, 1000);
    ring.extend(range(488, 768));
    let a = decompose(&mk(ring.clone(), false), 64).unwrap();
    let b = decompose(&mk(range(488, 1000), false), 64).unwrap();
    assert_eq!(a.blocks.len(), b.blocks.len());
    for (x, y) in a.blocks.iter().zip(&b.blocks) {
        assert_eq!(x.bytes, y.bytes);
    }
    // transposed V with the same logical values gives the same blocks, also in ring order
    let t = decompose(&mk(ring, true), 64).unwrap();
    for (x, y) in t.blocks.iter().zip(&b.blocks) {
        assert_eq!(x.bytes, y.bytes);
    }
    let ts = decompose(&mk(range(0, 70), true), 32).unwrap();
    assert_eq!(ts.blocks[0].bytes, long.blocks[0].bytes);
    // block content: layer 0 K rows of pos 0..32 first
    assert_eq!(&long.blocks[0].bytes[..8], &row(&Sec::new(vec![], vec![]), 0, 0, 0, 8)[..]);
    // layouts differ (v_trans) but round trips hold
    assert_ne!(t.layout, a.layout);
    roundtrip(&mk(range(488, 1000), true), 64);
}

// ------------------------------------------------------------------------------------------------
// n_stream re-emission

#[test]
fn n_stream_reemit() {
    let f = iswa_file(90, true); // n_stream 2, cells in stream 1, checkpoint blob too
    let d = decompose(&f, 32).unwrap();
    let blocks = blocks_of(&d);
    for k in [1u32, 2, 3] {
        let g = recompose(&d.skeleton, &blocks, &EmitOptions { n_stream: Some(k) }).unwrap();
        let p = parse::parse_file(&g).unwrap();
        for s in p.all_sections() {
            assert_eq!((s.n_stream, s.cell_stream), (k, 0));
        }
        let e = decompose(&g, 32).unwrap();
        assert_eq!(e.n_stream, k);
        assert_eq!(e.layout, d.layout);
        assert_eq!(e.tokens, d.tokens);
        assert_eq!(blocks_of(&e), blocks, "same blocks after re-emit with n_stream {k}");
        // idempotent: cells already in stream 0 with the same n_stream give the exact bytes
        let again = recompose(&e.skeleton, &blocks_of(&e), &EmitOptions { n_stream: Some(k) }).unwrap();
        assert!(again == g);
    }
    // a 1-stream file re-emitted with Some(1) is byte-exact; Some(0) is refused
    let mut s = Sec::new(range(0, 20), f16_layers(2, 4));
    s.n_stream = 1;
    let single = file(&packed(&toks(20)), &[s], None, &[]);
    let d1 = decompose(&single, 8).unwrap();
    assert!(recompose(&d1.skeleton, &blocks_of(&d1), &EmitOptions { n_stream: Some(1) }).unwrap() == single);
    assert!(recompose(&d1.skeleton, &blocks_of(&d1), &EmitOptions { n_stream: Some(0) }).is_err());
    // empty slot re-emits its zero counts
    let empty = file(&packed(&[]), &[Sec { n_stream: 2, ..Sec::new(vec![], vec![]) }], None, &[]);
    let de = decompose(&empty, 8).unwrap();
    let g = recompose(&de.skeleton, &[], &EmitOptions { n_stream: Some(3) }).unwrap();
    assert_eq!(g.len(), 44);
}

// ------------------------------------------------------------------------------------------------
// errors

fn is_err(f: &[u8]) -> bool {
    decompose(f, 16).is_err()
}

#[test]
fn truncation_at_every_offset() {
    let f = iswa_file(24, true);
    let p = parse::parse_file(&f).unwrap();
    // Cuts at a section boundary (end of the first or second body section) leave a valid, shorter file:
    // the format cannot tell how many sections the memory module wrote.
    let sec0 = 12 + p.words.len() + sec_len(&p.sections[0]);
    let body = sec0 + sec_len(&p.sections[1]);
    for cut in 0..f.len() {
        let r = decompose(&f[..cut], 16);
        if cut == sec0 || cut == body {
            assert!(r.is_ok(), "cut at section boundary {cut}");
        } else {
            assert!(r.is_err(), "truncation at {cut} of {} accepted", f.len());
        }
    }
    // the same for a transposed, ext, 1-section file
    let f = file(&packed(&toks(9)), &[Sec { v_trans: true, ext: true, ..Sec::new(range(0, 9), f16_layers(2, 4)) }], None, &[]);
    for cut in 0..f.len() {
        assert!(is_err(&f[..cut]), "cut {cut}");
    }
}

fn sec_len(s: &model::Section<'_>) -> usize {
    let mut n = 4 + 4 * s.n_stream as usize;
    if let Some(c) = &s.cells {
        n += c.meta.len() + 16;
        for l in &c.layers {
            n += 12 + (l.k_row as usize) * c.count as usize;
            n += 12 + l.v.row_bytes() as usize * c.count as usize; // both V headers are 12 bytes
        }
    }
    n
}

#[test]
fn header_errors() {
    let mut f = iswa_file(10, false);
    f[0] ^= 1;
    assert!(matches!(decompose(&f, 16), Err(FormatError::BadMagic { .. })));
    let mut f = iswa_file(10, false);
    f[4] = 3;
    assert!(matches!(decompose(&f, 16), Err(FormatError::BadVersion { found: 3 })));
    assert!(matches!(decompose(&[], 16), Err(FormatError::Truncated { .. })));
    assert!(decompose(&iswa_file(10, false), 0).is_err());
    // packed token payload claiming more tokens than words
    let mut w = packed(&toks(3));
    w[2] = 1000;
    let f = file(&w, &[Sec::new(range(0, 3), f16_layers(1, 4))], None, &[]);
    assert!(matches!(decompose(&f, 16), Err(FormatError::Invalid { .. })));
}

/// A hand-made header + section prefix, for absurd counts.
fn raw(words: &[u32]) -> Vec<u8> {
    let mut o = Vec::new();
    for &w in [MAGIC, VERSION, 0].iter().chain(words) {
        put32(&mut o, w);
    }
    o
}

#[test]
fn absurd_counts_fail_fast() {
    let cases: Vec<Vec<u8>> = vec![
        raw(&[u32::MAX]),                               // n_stream
        raw(&[1, u32::MAX]),                            // cell_count
        raw(&[1, 1, 0, 1, 0, 0, u32::MAX, 0, 0]),       // n_layer
        raw(&[1, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0xffff_ffff, 0xffff_ffff]), // K row size u64::MAX
        raw(&[1, 1, 0, u32::MAX]),                      // n_seq_id
        raw(&[2, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1]),     // two streams with cells
        raw(&[1, 1, 0, 1, 0, 2, 0, 0, 0]),              // v_trans 2
        raw(&[0]),                                      // n_stream 0
        raw(&[0x6767_7371]),                            // just garbage
    ];
    for (i, c) in cases.iter().enumerate() {
        assert!(decompose(c, 16).is_err(), "case {i}");
    }
    // absurd SCKP count / checkpoint length after a valid body
    let base = file(&packed(&toks(2)), &[Sec::new(range(0, 2), f16_layers(1, 4))], None, &[]);
    for tail in [vec![SCKP_MAGIC, 1, u32::MAX], vec![SCKP_MAGIC, 1, 1, 1, 0, 0, 0, 0xffff_ffff, 0xffff_ffff], vec![SCKP_MAGIC, 2, 0]] {
        let mut f = base.clone();
        for w in tail {
            put32(&mut f, w);
        }
        assert!(decompose(&f, 16).is_err());
    }
    // duplicate positions
    let f = file(&packed(&toks(3)), &[Sec::new(vec![0, 1, 0], f16_layers(1, 4))], None, &[]);
    assert!(matches!(decompose(&f, 16), Err(FormatError::Invalid { what: "cell positions", .. })));
    // garbage after the body that is neither SCKP nor zeros nor a section
    let mut f = base.clone();
    f.extend_from_slice(&[1, 2, 3]);
    assert!(decompose(&f, 16).is_err());
}

#[test]
fn checkpoint_blobs_opaque_or_parsed() {
    let s = Sec::new(range(0, 10), f16_layers(1, 4));
    let good = tgt_blob(0, &[Sec::new(range(0, 5), f16_layers(1, 4))]);
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 1;
    let mut short = good.clone();
    short.pop();
    let mut long = good.clone();
    long.push(0);
    let cks: Vec<Ck> = [good, bad_magic, short, long, vec![0xD8, 0x3C, 0x14, 0xAF]]
        .into_iter()
        .map(|t| Ck { n_tokens: 5, tgt: t, dft: vec![9; 3], spec: vec![8; 2] })
        .collect();
    let f = file(&packed(&toks(10)), &[s], Some(&cks), &[]);
    let d = roundtrip(&f, 4);
    // body 0..10 -> 3 blocks; only the first checkpoint blob is parsed (0..5 -> 2 blocks)
    assert_eq!(d.blocks.len(), 5);
    assert_eq!(d.n_checkpoints, 5);
    assert_eq!(d.blocks[0].bytes, d.blocks[3].bytes, "checkpoint rows dedup against the body");
}

#[test]
fn recompose_checks_blocks_and_skeleton() {
    let f = iswa_file(50, true);
    let d = decompose(&f, 16).unwrap();
    let mut blocks = blocks_of(&d);
    let short = &blocks[1][..blocks[1].len() - 1];
    blocks[1] = short;
    assert!(matches!(recompose(&d.skeleton, &blocks, &EmitOptions::default()), Err(FormatError::Skeleton(_))));
    let blocks = blocks_of(&d);
    assert!(matches!(recompose(&d.skeleton, &blocks[1..], &EmitOptions::default()), Err(FormatError::Skeleton(_))));
    // every truncation of the skeleton is an error; every single-byte corruption is an error or a clean result
    for cut in 0..d.skeleton.len() {
        assert!(recompose(&d.skeleton[..cut], &blocks, &EmitOptions::default()).is_err(), "cut {cut}");
        assert!(skeleton_block_count(&d.skeleton[..cut]).is_err());
    }
    let mut s = d.skeleton.clone();
    for i in 0..s.len() {
        for x in [0x01u8, 0x80, 0xff] {
            s[i] ^= x;
            let _ = recompose(&s, &blocks, &EmitOptions::default());
            let _ = recompose(&s, &blocks, &EmitOptions { n_stream: Some(3) });
            let _ = skeleton_block_count(&s);
            let _ = skeleton_tokens(&s);
            s[i] ^= x;
        }
    }
    let mut s = d.skeleton.clone();
    s[0] = b'X';
    assert!(matches!(skeleton_tokens(&s), Err(FormatError::Skeleton(_))));
    let mut s = d.skeleton.clone();
    s[4] = 2;
    assert!(matches!(skeleton_block_count(&s), Err(FormatError::Skeleton(_))));
    assert!(&d.skeleton[..4] == b"KVSK");
}

// ------------------------------------------------------------------------------------------------
// layout

#[test]
fn layout_strings() {
    let lay = |s: Sec, n: usize| decompose(&file(&packed(&toks(n)), &[s], None, &[]), 16).unwrap().layout;
    let base = Sec::new(range(0, 20), f16_layers(3, 8));
    let l0 = lay(base.clone(), 20);
    assert_eq!(l0, "kv[3:f16/8,f16/8*3;vt0;rot0,0;ext0]");
    // independent of token count, slot id, n_stream and stream index
    assert_eq!(lay(Sec { pos: range(0, 50), ..base.clone() }, 50), l0);
    assert_eq!(lay(Sec { n_stream: 3, cell_stream: 2, seq: 2, ..base.clone() }, 20), l0);
    // differs for v_trans, rotation, ext, types and row sizes
    let t = lay(Sec { v_trans: true, ..base.clone() }, 20);
    assert_eq!(t, "kv[3:f16/8,f16/2x4*3;vt1;rot0,0;ext0]");
    let wide = Sec { layers: f16_layers(3, 128), ..base.clone() }; // 64 elements: rotation 64 fits
    assert_ne!(lay(Sec { rot: (64, 64), ..wide.clone() }, 20), lay(wide, 20));
    assert_ne!(lay(Sec { ext: true, ..base.clone() }, 20), l0);
    assert_ne!(lay(Sec { layers: f16_layers(3, 16), ..base.clone() }, 20), l0);
    assert_ne!(lay(Sec { layers: f16_layers(2, 8), ..base.clone() }, 20), l0);
    let mut mixed = f16_layers(3, 8);
    mixed[1].k_ty = 30;
    assert_eq!(lay(Sec { layers: mixed, ..base.clone() }, 20), "kv[3:f16/8,f16/8|bf16/8,f16/8|f16/8,f16/8;vt0;rot0,0;ext0]");
    // iSWA: two sections, independent of the checkpoint appendix
    let a = decompose(&iswa_file(30, false), 16).unwrap().layout;
    assert_eq!(a, decompose(&iswa_file(60, true), 16).unwrap().layout);
    assert!(a.contains('+'));
}

// ------------------------------------------------------------------------------------------------
// real files

/// Every `*.bin` in `$KVSTORE_STATE_DIR` must decompose and recompose byte-exactly (and re-emit with another
/// `n_stream`). Fails when the variable is unset or the directory holds no `.bin` file.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn real_files_roundtrip() {
    let files = crate::testutil::state_files();
    for p in &files {
        let f = std::fs::read(p).unwrap();
        for bs in [64u32, 256] {
            let d = decompose(&f, bs).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let blocks = blocks_of(&d);
            let back = recompose(&d.skeleton, &blocks, &EmitOptions::default()).unwrap();
            assert!(back == f, "{}: round trip differs", p.display());
            assert!(pieces_bytes(&d.skeleton, &blocks, None) == f, "{}: pieces differ", p.display());
            check_placed(&d, &f, None);
            assert_eq!(skeleton_block_count(&d.skeleton).unwrap(), d.blocks.len());
            assert_eq!(skeleton_tokens(&d.skeleton).unwrap(), d.tokens);
            let k = d.n_stream % 3 + 1;
            let g = recompose(&d.skeleton, &blocks, &EmitOptions { n_stream: Some(k) }).unwrap();
            assert!(pieces_bytes(&d.skeleton, &blocks, Some(k)) == g, "{}: pieces for {k} streams differ", p.display());
            check_placed(&d, &g, Some(k));
            let e = decompose(&g, bs).unwrap();
            assert_eq!((e.n_stream, &e.layout, &e.tokens), (k, &d.layout, &d.tokens));
            assert_eq!(blocks_of(&e), blocks);
            if bs == 64 {
                eprintln!(
                    "{}: {} B, {} tokens, {} blocks, {} checkpoints, skeleton {} B, layout {}",
                    p.file_name().unwrap().to_string_lossy(),
                    f.len(),
                    d.tokens.len(),
                    d.blocks.len(),
                    d.n_checkpoints,
                    d.skeleton.len(),
                    d.layout
                );
            }
        }
    }
}


/// A file recomposed as pieces, concatenated (checked against its own length).
pub(crate) fn pieces_bytes(skeleton: &[u8], blocks: &[&[u8]], n_stream: Option<u32>) -> Vec<u8> {
    let mut pieces = recompose_pieces(skeleton, blocks, &EmitOptions { n_stream }).unwrap();
    let total = pieces.total_len();
    let bytes = pieces.slices().concat();
    assert_eq!(bytes.len() as u64, total);
    bytes
}

/// A file written from its placement (`place.rs`), blocks in reverse order into a buffer of 0xA5 (a byte the
/// placement left out shows), is the file recomposed; a layout whose made bytes come from rows (transposed V,
/// recurrent rows) has no placement, and every other layout has one.
fn check_placed(d: &Decomposed, want: &[u8], n_stream: Option<u32>) {
    let placed = place(&d.skeleton, &EmitOptions { n_stream }).unwrap();
    let from_rows = d.layout.contains(";vt1;") || d.layout.contains("rec[");
    let Some(p) = placed else {
        assert!(from_rows, "layout {} has no placement", d.layout);
        return;
    };
    assert!(!from_rows, "layout {} computes made bytes from rows, yet was placed", d.layout);
    assert_eq!(p.file_len, want.len() as u64);
    assert_eq!(p.n_blocks(), d.blocks.len());
    let mut out = vec![0xA5u8; want.len()];
    let mut put = |at: u64, bytes: &[u8]| out[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    for (i, b) in d.blocks.iter().enumerate().rev() {
        assert_eq!(p.block_len(i), b.bytes.len());
        for r in p.rows_of(i) {
            put(r.file_at, &b.bytes[r.block_at..r.block_at + r.len]);
        }
    }
    for (at, bytes) in p.made() {
        put(at, bytes);
    }
    assert!(out == want, "layout {}: the placed file differs from the recomposed one", d.layout);
}
