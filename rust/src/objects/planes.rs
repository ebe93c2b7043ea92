//! Byte planes: an array of 2- or 4-byte numbers split into one plane per byte position.
//!
//! CONTRACT: plane p = raw[p::planes], the planes laid back to back (`plane_offsets`, `plane_len`);
//! `interleave(deinterleave(x)) == x`; lengths need not be multiples of `planes`. Why: the high bytes of
//! f16/bf16/f32 rows vary slowly, so zstd compresses each plane far better than the interleaved rows.

use std::mem::MaybeUninit;

/// Start of each plane when the planes of `raw_len` bytes lie back to back.
pub fn plane_offsets(raw_len: usize, planes: usize) -> Vec<usize> {
    let mut at = 0;
    (0..planes)
        .map(|p| {
            let o = at;
            at += plane_len(raw_len, planes, p);
            o
        })
        .collect()
}

/// `raw` split into byte planes laid back to back in `out` (plane p = raw[p::planes]).
pub fn deinterleave(raw: &[u8], planes: usize, out: &mut [u8]) {
    let n = raw.len();
    let full = n / planes;
    let offs = plane_offsets(n, planes);
    match planes {
        2 => {
            let (a, b) = out.split_at_mut(offs[1]);
            for ((c, x), y) in raw.chunks_exact(2).zip(a.iter_mut()).zip(b.iter_mut()) {
                *x = c[0];
                *y = c[1];
            }
        }
        4 => {
            let (a, rest) = out.split_at_mut(offs[1]);
            let (b, rest) = rest.split_at_mut(offs[2] - offs[1]);
            let (c, d) = rest.split_at_mut(offs[3] - offs[2]);
            for ((((w, x), y), z), v) in
                raw.chunks_exact(4).zip(a.iter_mut()).zip(b.iter_mut()).zip(c.iter_mut()).zip(d.iter_mut())
            {
                *x = w[0];
                *y = w[1];
                *z = w[2];
                *v = w[3];
            }
        }
        _ => {
            for (p, &o) in offs.iter().enumerate() {
                for (i, x) in out[o..o + full].iter_mut().enumerate() {
                    *x = raw[i * planes + p];
                }
            }
        }
    }
    for i in full * planes..n {
        out[offs[i - full * planes] + full] = raw[i];
    }
}

/// Inverse of [`deinterleave`], into memory that may be uninitialized: every byte of `raw` is written (a
/// decoded object goes into a buffer kept from an earlier read, not zeroed first).
pub fn interleave(src: &[u8], planes: usize, raw: &mut [MaybeUninit<u8>]) {
    let n = raw.len();
    let full = n / planes;
    let offs = plane_offsets(n, planes);
    match planes {
        2 => {
            let (a, b) = src.split_at(offs[1]);
            for ((c, &x), &y) in raw.chunks_exact_mut(2).zip(a).zip(b) {
                c[0].write(x);
                c[1].write(y);
            }
        }
        4 => {
            let (a, rest) = src.split_at(offs[1]);
            let (b, rest) = rest.split_at(offs[2] - offs[1]);
            let (c, d) = rest.split_at(offs[3] - offs[2]);
            for ((((w, &x), &y), &z), &v) in raw.chunks_exact_mut(4).zip(a).zip(b).zip(c).zip(d) {
                w[0].write(x);
                w[1].write(y);
                w[2].write(z);
                w[3].write(v);
            }
        }
        _ => {
            for (p, &o) in offs.iter().enumerate() {
                for (i, &x) in src[o..o + full].iter().enumerate() {
                    raw[i * planes + p].write(x);
                }
            }
        }
    }
    for i in full * planes..n {
        raw[i].write(src[offs[i - full * planes] + full]);
    }
}

pub fn plane_len(raw_len: usize, planes: usize, p: usize) -> usize {
    if raw_len > p {
        (raw_len - p).div_ceil(planes)
    } else {
        0
    }
}
