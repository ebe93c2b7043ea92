//! The KVOB object encoding: zstd, with byte planes for f16/bf16/f32 rows (`planes.rs`), and per-thread
//! reusable zstd contexts; bytes that compression would save too little of are stored as they are.
//!
//! CONTRACT: pure functions of bytes (no I/O, no ids); `decode(encode(x)) == x` for any `x` and element size;
//! the layout below is what every object file holds; `decode` returns the reason a file is corrupt as text
//! (the caller names the object) and refuses a header whose `raw_len` is over `MAX_RAW_LEN`.
//!
//! ```text
//! b"KVOB" u8 version=1 u8 codec u8 planes u8 0  u64le raw_len      (16 bytes)
//! codec 0: one zstd frame of the raw bytes
//! codec 1: planes x u64le frame_len, then `planes` zstd frames; plane p = raw[p::planes]
//! codec 2: the raw bytes as they are (planes = 1)
//! ```
//!
//! Why codec 2: a restore decodes every object on its critical path. KV rows hold no repeats, so all zstd
//! finds in them is entropy in the high byte plane (measured on real SmolLM2 / Gemma 3 states: that plane
//! shrinks to 0.74, the low one not at all, the object to 0.87), and decoding that entropy code runs at
//! ~1 GB/s per core, a third of a page-cache copy. Saving 13% of a state's unique bytes is not worth making
//! every restore of it several times slower, so an encoding that saves less than `MIN_SAVING_PERCENT`
//! is dropped for the raw bytes (dedup, which is where a store's savings come from, is unaffected).

use std::cell::RefCell;
use std::io;

use super::planes::{deinterleave, interleave, plane_len, plane_offsets};

pub const MAGIC: &[u8; 4] = b"KVOB";
pub const OBJECT_VERSION: u8 = 1;
pub const CODEC_ZSTD: u8 = 0;
pub const CODEC_PLANES: u8 = 1;
pub const CODEC_RAW: u8 = 2;
/// An encoding is kept only if it saves at least this share of the raw bytes (see the header: why).
pub const MIN_SAVING_PERCENT: usize = 25;
pub const HEADER_LEN: usize = 16;
/// Largest object this build will decode (bounds the allocation a corrupt header could ask for).
pub const MAX_RAW_LEN: u64 = 1 << 36;

thread_local! {
    /// Per-thread zstd contexts (a context costs an allocation and setup; objects are encoded and decoded on
    /// rayon workers, many per state).
    static CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    /// Planes of the object being encoded or decoded, back to back.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_cctx<R>(level: i32, f: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> io::Result<R>) -> io::Result<R> {
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        f(&mut c.as_mut().unwrap().1)
    })
}

fn with_dctx<R>(f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> R) -> Result<R, String> {
    DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
        }
        Ok(f(d.as_mut().unwrap()))
    })
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0);
        }
        f(&mut s[..len])
    })
}

/// Encode raw bytes as an object file: compressed where that saves at least `MIN_SAVING_PERCENT`, else raw.
pub fn encode(raw: &[u8], elem_size: u8, level: i32) -> io::Result<Vec<u8>> {
    let compressed = encode_compressed(raw, elem_size, level)?;
    let stored = compressed.len() - HEADER_LEN;
    if stored * 100 <= raw.len() * (100 - MIN_SAVING_PERCENT) {
        return Ok(compressed);
    }
    let mut out = compressed;
    out.clear();
    out.reserve(HEADER_LEN + raw.len());
    out.extend_from_slice(&header(CODEC_RAW, 1, raw.len()));
    out.extend_from_slice(raw);
    Ok(out)
}

fn header(codec: u8, planes: u8, raw_len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4] = OBJECT_VERSION;
    h[5] = codec;
    h[6] = planes;
    h[8..].copy_from_slice(&(raw_len as u64).to_le_bytes());
    h
}

/// The zstd encodings (codec 0, or 1 for elements of more than one byte).
fn encode_compressed(raw: &[u8], elem_size: u8, level: i32) -> io::Result<Vec<u8>> {
    let planes = if elem_size > 1 && raw.len() >= elem_size as usize { elem_size as usize } else { 1 };
    let mut out = Vec::with_capacity(HEADER_LEN + 8 * planes + zstd::zstd_safe::compress_bound(raw.len()));
    out.extend_from_slice(&header(if planes > 1 { CODEC_PLANES } else { CODEC_ZSTD }, planes as u8, raw.len()));
    if planes == 1 {
        with_cctx(level, |cx| {
            let at = out.len();
            out.resize(out.capacity(), 0);
            let n = cx.compress_to_buffer(raw, &mut out[at..])?;
            out.truncate(at + n);
            Ok(())
        })?;
        return Ok(out);
    }
    let table = out.len();
    out.resize(table + 8 * planes, 0);
    with_scratch(raw.len(), |split| {
        deinterleave(raw, planes, split);
        let offs = plane_offsets(raw.len(), planes);
        with_cctx(level, |cx| {
            for p in 0..planes {
                let plane = &split[offs[p]..offs[p] + plane_len(raw.len(), planes, p)];
                let at = out.len();
                out.resize(at + zstd::zstd_safe::compress_bound(plane.len()), 0);
                let n = cx.compress_to_buffer(plane, &mut out[at..])?;
                out.truncate(at + n);
                out[table + 8 * p..table + 8 * p + 8].copy_from_slice(&(n as u64).to_le_bytes());
            }
            Ok(())
        })
    })?;
    Ok(out)
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A frame that declares its size must declare `expect` bytes.
fn check_declared(frame: &[u8], expect: usize, what: &str) -> Result<(), String> {
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n != expect as u64 => Err(format!("{what}: frame declares {n} bytes, header says {expect}")),
        Err(_) => Err(format!("{what}: not a zstd frame")),
        _ => Ok(()),
    }
}

/// Decompress one frame into exactly `out` (its length is what the header promises).
fn decompress_exact(frame: &[u8], out: &mut [u8], what: &str) -> Result<(), String> {
    let expect = out.len();
    check_declared(frame, expect, what)?;
    let n = with_dctx(|d| d.decompress_to_buffer(frame, out))?.map_err(|e| format!("{what}: zstd: {e}"))?;
    if n != expect {
        return Err(format!("{what}: decompressed {n} bytes, header says {expect}"));
    }
    Ok(())
}

/// Decode an object file; the error is the reason it is corrupt.
pub fn decode(b: &[u8]) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    decode_into(b, &mut raw)?;
    Ok(raw)
}

/// The raw length an object file's header declares (None if it has no header).
pub fn declared_len(b: &[u8]) -> Option<u64> {
    if b.len() < HEADER_LEN || &b[..4] != MAGIC {
        return None;
    }
    read_u64(b, 8)
}

/// Whether a file of `file_len` bytes that begins with `head` is a codec-2 object whose header is whole and
/// true (its bytes are then the file's after the header, to be used as they lie).
pub fn is_raw_file(head: &[u8; HEADER_LEN], file_len: u64) -> bool {
    let raw_len = read_u64(head, 8).unwrap_or(u64::MAX);
    &head[..4] == MAGIC
        && head[4] == OBJECT_VERSION
        && head[5] == CODEC_RAW
        && raw_len <= MAX_RAW_LEN
        && file_len.checked_sub(HEADER_LEN as u64) == Some(raw_len)
}

/// [`decode`] into `raw`, replacing what it held and reusing its capacity: the bytes are written once, into
/// memory whose pages a caller that reads many objects has already mapped (no zeroing first either).
pub fn decode_into(b: &[u8], raw: &mut Vec<u8>) -> Result<(), String> {
    raw.clear();
    if b.len() < HEADER_LEN {
        return Err(format!("truncated: {} bytes, header needs {HEADER_LEN}", b.len()));
    }
    if &b[..4] != MAGIC {
        return Err("bad magic (not a kvstore object)".into());
    }
    if b[4] != OBJECT_VERSION {
        return Err(format!("object version {} is not supported (this build reads {OBJECT_VERSION})", b[4]));
    }
    let (codec, planes) = (b[5], b[6] as usize);
    let raw_len = read_u64(b, 8).unwrap();
    if raw_len > MAX_RAW_LEN {
        return Err(format!("header claims {raw_len} raw bytes"));
    }
    let raw_len = raw_len as usize;
    match codec {
        CODEC_ZSTD => {
            let frame = &b[HEADER_LEN..];
            check_declared(frame, raw_len, "frame")?;
            raw.reserve(raw_len);
            // Into the spare capacity (zstd sets the length it wrote); a frame that writes other than raw_len
            // bytes is corrupt, and the buffer is left empty.
            let wrote = with_dctx(|d| d.decompress_to_buffer(frame, raw))?;
            if matches!(wrote, Ok(n) if n == raw_len) {
                return Ok(());
            }
            raw.clear();
            Err(match wrote {
                Ok(n) => format!("frame: decompressed {n} bytes, header says {raw_len}"),
                Err(e) => format!("frame: zstd: {e}"),
            })
        }
        CODEC_PLANES => {
            if planes < 2 {
                return Err(format!("codec 1 with {planes} planes"));
            }
            let table_end = HEADER_LEN + 8 * planes;
            if b.len() < table_end {
                return Err("truncated plane table".into());
            }
            raw.reserve(raw_len);
            with_scratch(raw_len, |split| {
                let mut at = table_end;
                let mut out_at = 0;
                for p in 0..planes {
                    let flen = read_u64(b, HEADER_LEN + 8 * p).unwrap();
                    let frame = usize::try_from(flen)
                        .ok()
                        .and_then(|flen| b.get(at..at.checked_add(flen)?))
                        .ok_or_else(|| format!("plane {p}: truncated frame"))?;
                    at += frame.len();
                    let plen = plane_len(raw_len, planes, p);
                    decompress_exact(frame, &mut split[out_at..out_at + plen], &format!("plane {p}"))?;
                    out_at += plen;
                }
                if at != b.len() {
                    return Err(format!("{} trailing bytes", b.len() - at));
                }
                interleave(split, planes, &mut raw.spare_capacity_mut()[..raw_len]);
                // SAFETY: `interleave` wrote every byte of [0, raw_len), within the capacity reserved above.
                unsafe { raw.set_len(raw_len) };
                Ok(())
            })
        }
        CODEC_RAW => {
            let body = &b[HEADER_LEN..];
            if body.len() != raw_len {
                return Err(format!("raw object holds {} bytes, header says {raw_len}", body.len()));
            }
            raw.extend_from_slice(body);
            Ok(())
        }
        c => Err(format!("unknown codec {c}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::sample;

    #[test]
    fn planes_are_used_and_round_trip() {
        let raw = sample(4096);
        let enc = encode(&raw, 2, 1).unwrap();
        assert_eq!((enc[5], enc[6]), (CODEC_PLANES, 2));
        assert_eq!(decode(&enc).unwrap(), raw);
    }

    #[test]
    fn planes_round_trip_odd_lengths() {
        for planes in [2u8, 3, 4, 5] {
            for n in [planes as usize, 7, 64, 1001, 4099] {
                let raw = sample(n);
                let enc = encode(&raw, planes, 1).unwrap();
                assert_eq!(decode(&enc).unwrap(), raw, "planes={planes} n={n}");
            }
        }
    }

    #[test]
    fn decode_into_a_kept_buffer_replaces_what_it_held() {
        // A buffer left from a larger object, full of other bytes: the decode is exact, whatever its capacity.
        let mut kept = vec![0xAB; 10_000];
        for (elem, n) in [(2u8, 4096usize), (4, 1001), (1, 777), (2, 1), (4, 9_999)] {
            let raw = sample(n);
            let enc = encode(&raw, elem, 1).unwrap();
            decode_into(&enc, &mut kept).unwrap();
            assert_eq!(kept, raw, "elem={elem} n={n}");
            assert_eq!(declared_len(&enc), Some(n as u64));
        }
        // A corrupt object leaves the buffer empty, never holding a previous object's bytes.
        let enc = encode(&sample(4096), 2, 1).unwrap();
        let mut bad = enc.clone();
        bad.truncate(enc.len() - 3);
        assert!(decode_into(&bad, &mut kept).is_err());
        assert!(kept.is_empty());
        let plain = encode(&sample(777), 1, 1).unwrap();
        let mut long = plain.clone();
        long[8..16].copy_from_slice(&700u64.to_le_bytes()); // the header says fewer bytes than the frame holds
        kept.extend_from_slice(&[1; 4000]);
        assert!(decode_into(&long, &mut kept).is_err());
        assert!(kept.is_empty());
    }

    /// Bytes compression saves too little of are stored raw, decode back exactly, and a raw object whose body
    /// is not the length its header gives is corrupt.
    #[test]
    fn bytes_that_barely_compress_are_stored_raw() {
        let mut rng = fastrand::Rng::with_seed(7);
        // f16-like rows whose high bytes take 64 values (entropy coding saves ~12% of the object) and
        // whose low bytes are noise: as real KV rows.
        let rows: Vec<u8> = (0..65536).map(|i| if i % 2 == 1 { 0x20 + rng.u8(0..64) } else { rng.u8(..) }).collect();
        let noise: Vec<u8> = (0..5000).map(|_| rng.u8(..)).collect();
        for (raw, elem) in [(&rows, 2u8), (&noise, 1), (&noise, 4)] {
            let enc = encode(raw, elem, 1).unwrap();
            assert_eq!((enc[5], enc[6]), (CODEC_RAW, 1), "elem {elem}");
            assert_eq!(enc.len(), HEADER_LEN + raw.len());
            assert_eq!(&decode(&enc).unwrap(), raw);
            let saved = encode_compressed(raw, elem, 1).unwrap().len() - HEADER_LEN;
            assert!(saved * 100 > raw.len() * (100 - MIN_SAVING_PERCENT), "elem {elem}: compression saves enough");
            let mut bad = enc.clone();
            bad.pop();
            let mut kept = vec![9u8; 10];
            assert!(decode_into(&bad, &mut kept).unwrap_err().contains("header says"));
            assert!(kept.is_empty());
        }
        // What compresses well still is.
        assert_eq!(encode(&sample(65536), 2, 1).unwrap()[5], CODEC_PLANES);
        assert_eq!(encode(&vec![0u8; 4096], 1, 1).unwrap()[5], CODEC_ZSTD);
    }
}
