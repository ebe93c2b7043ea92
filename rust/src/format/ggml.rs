//! ggml tensor types in a slot file's layer headers, and the size rules each header must obey.
//!
//! CONTRACT: `check_rows`/`check_trans` accept a K or V header only if its type code is one llama.cpp defines
//! (`enum ggml_type`; the ids of removed types are not defined) and its sizes are whole blocks of that type:
//! a row is `width / block elements * block bytes` for some width > 0; a transposed V element is exactly one
//! element of a non-blocked type. They return the width in elements. `check_rot` accepts `n_rot_k`/`n_rot_v`
//! only as 0 or a power of two >= 64 that divides every layer's width (llama.cpp rotates whole heads in
//! groups of 64, 128, ...). Errors name the absolute offset of the field. Nothing here reads row data.

use super::FormatError;

/// `(id, name, elements per block, bytes per block)` for every type of `enum ggml_type` (ggml.h, llama.cpp
/// b11549). Ids 4, 5, 31-33 and 36-38 belonged to removed types. nvfp4's block geometry is not checked
/// (0, 0): the KV cache cannot use it, so a slot file with it is refused by llama.cpp, not by a size rule here.
const TYPES: &[(i32, &str, u64, u64)] = &[
    (0, "f32", 1, 4),
    (1, "f16", 1, 2),
    (2, "q4_0", 32, 18),
    (3, "q4_1", 32, 20),
    (6, "q5_0", 32, 22),
    (7, "q5_1", 32, 24),
    (8, "q8_0", 32, 34),
    (9, "q8_1", 32, 36),
    (10, "q2_K", 256, 84),
    (11, "q3_K", 256, 110),
    (12, "q4_K", 256, 144),
    (13, "q5_K", 256, 176),
    (14, "q6_K", 256, 210),
    (15, "q8_K", 256, 292),
    (16, "iq2_xxs", 256, 66),
    (17, "iq2_xs", 256, 74),
    (18, "iq3_xxs", 256, 98),
    (19, "iq1_s", 256, 50),
    (20, "iq4_nl", 32, 18),
    (21, "iq3_s", 256, 110),
    (22, "iq2_s", 256, 82),
    (23, "iq4_xs", 256, 136),
    (24, "i8", 1, 1),
    (25, "i16", 1, 2),
    (26, "i32", 1, 4),
    (27, "i64", 1, 8),
    (28, "f64", 1, 8),
    (29, "iq1_m", 256, 56),
    (30, "bf16", 1, 2),
    (34, "tq1_0", 256, 54),
    (35, "tq2_0", 256, 66),
    (39, "mxfp4", 32, 17),
    (40, "nvfp4", 0, 0),
];

/// `(name, elements per block, bytes per block)` of a defined type.
pub(crate) fn type_info(code: i32) -> Option<(&'static str, u64, u64)> {
    TYPES.iter().find(|t| t.0 == code).map(|t| (t.1, t.2, t.3))
}

fn known(code: i32, offset: u64, what: &'static str) -> Result<(&'static str, u64, u64), FormatError> {
    type_info(code).ok_or(FormatError::UnknownType { offset, what, code })
}

fn mismatch(offset: u64, what: &'static str, name: &str, size: u64, detail: String) -> FormatError {
    FormatError::SizeMismatch { offset, what, ty: name.to_string(), size, detail }
}

/// A `i32 type, u64 row_size` header at `offset`; returns the row width in elements (0 if not checkable).
/// `what`: the names of the two fields, e.g. `["K type", "K row size"]`.
pub(crate) fn check_rows(code: i32, row: u64, offset: u64, what: [&'static str; 2]) -> Result<u64, FormatError> {
    let (name, blck, size) = known(code, offset, what[0])?;
    if blck == 0 {
        return Ok(0);
    }
    if row == 0 || !row.is_multiple_of(size) {
        let detail = format!("a row is a positive multiple of {size} bytes ({blck} elements per block)");
        return Err(mismatch(offset + 4, what[1], name, row, detail));
    }
    Ok(row / size * blck)
}

/// A transposed-V header `i32 type, u32 el_size, u32 n_embd` at `offset`; returns `n_embd`.
pub(crate) fn check_trans(code: i32, el: u32, n_embd: u32, offset: u64) -> Result<u64, FormatError> {
    let what = "V type";
    let (name, blck, size) = known(code, offset, what)?;
    if blck != 1 || el as u64 != size {
        let detail = format!("a transposed V element of {name} is {size} bytes (non-blocked types only)");
        return Err(mismatch(offset + 4, "V el size", name, el as u64, detail));
    }
    if n_embd == 0 {
        return Err(mismatch(offset + 8, "V n_embd_v_gqa", name, 0, "a layer has at least one element".into()));
    }
    Ok(n_embd as u64)
}

/// `n_rot_k` or `n_rot_v` at `offset` against the widths (elements) of the layers it rotates.
pub(crate) fn check_rot(n_rot: u32, widths: &[u64], offset: u64, what: &'static str) -> Result<(), FormatError> {
    if n_rot == 0 {
        return Ok(());
    }
    let bad = |detail: String| FormatError::BadRotation { offset, what, n_rot, detail };
    if n_rot < 64 || !n_rot.is_power_of_two() {
        return Err(bad("a rotation is 0 or a power of two >= 64".into()));
    }
    if let Some(w) = widths.iter().find(|&&w| w != 0 && w % n_rot as u64 != 0) {
        return Err(bad(format!("it does not divide a layer of {w} elements")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    const KW: [&str; 2] = ["K type", "K row size"];

    #[test]
    fn types_and_sizes() {
        assert_eq!(check_rows(1, 512, 100, KW).unwrap(), 256);
        assert_eq!(check_rows(8, 272, 100, KW).unwrap(), 256);
        assert!(matches!(check_rows(4, 512, 100, KW), Err(FormatError::UnknownType { offset: 100, code: 4, .. })));
        assert!(matches!(check_rows(0xFE, 512, 7, KW), Err(FormatError::UnknownType { offset: 7, .. })));
        assert!(matches!(check_rows(8, 271, 100, KW), Err(FormatError::SizeMismatch { offset: 104, size: 271, .. })));
        assert!(check_rows(1, 0, 0, KW).is_err());
        assert_eq!(check_trans(1, 2, 192, 0).unwrap(), 192);
        assert!(check_trans(1, 4, 192, 0).is_err());
        assert!(check_trans(8, 34, 192, 0).is_err());
        assert!(check_trans(1, 2, 0, 0).is_err());
        assert!(check_rot(0, &[256], 0, "n_rot_k").is_ok());
        assert!(check_rot(64, &[256, 192], 0, "n_rot_k").is_ok());
        assert!(check_rot(256, &[256, 192], 0, "n_rot_k").is_err());
        for bad in [0xFF, 0x1FF, 0xFF00, 96, 32] {
            assert!(check_rot(bad, &[1 << 16], 5, "n_rot_v").is_err(), "{bad}");
        }
    }
}
