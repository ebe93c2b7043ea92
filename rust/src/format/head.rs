//! The magic words of a slot file, and its first 12 bytes, checked before the rest is read from disk.
//!
//! CONTRACT: `check_head(head, file_len)` passes only if `head` holds the magic, version 4 and a token word
//! count whose words fit in `file_len`; it reports the same errors as the full parse. A reader calls it
//! after reading `HEAD_LEN` bytes, so a file that is not a slot file (an image, a disk image, zeros) costs
//! 12 bytes of reading however large it is. Passing it says nothing about the rest of the file.

use super::reader::Reader;
use super::FormatError;

/// "qsgg" on disk.
pub const MAGIC: u32 = 0x6767_7371;
/// The only version the llama.cpp loader accepts (`LLAMA_STATE_SEQ_VERSION`).
pub const VERSION: u32 = 4;
/// "SCKP": llama-server's context-checkpoint appendix.
pub const SCKP_MAGIC: u32 = 0x504B_4353;
pub(crate) const SCKP_VERSION: u32 = 1;
/// Prefix of `llama_state_seq_get_data` buffers (checkpoint blobs).
pub(crate) const IO_MAGIC: u32 = 0xAF14_3CD8;

/// Bytes of the head: u32 magic, u32 version, u32 n_token_words.
pub const HEAD_LEN: usize = 12;

pub fn check_head(head: &[u8], file_len: u64) -> Result<(), FormatError> {
    let mut r = Reader::new(head, 0);
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(FormatError::BadMagic { found: magic });
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(FormatError::BadVersion { found: version });
    }
    let n_words = r.u32("n_token_words")? as u64;
    let have = file_len.saturating_sub(HEAD_LEN as u64);
    if n_words * 4 > have {
        return Err(FormatError::Truncated { offset: HEAD_LEN as u64, what: "token words", need: n_words * 4, have });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head() {
        let mut h = Vec::new();
        for w in [MAGIC, VERSION, 4] {
            h.extend_from_slice(&w.to_le_bytes());
        }
        assert!(check_head(&h, 28).is_ok());
        assert!(matches!(check_head(&h, 27), Err(FormatError::Truncated { offset: 12, need: 16, have: 15, .. })));
        assert!(matches!(check_head(&h[..8], 100), Err(FormatError::Truncated { .. })));
        assert!(matches!(check_head(&[0u8; 12], 1 << 40), Err(FormatError::BadMagic { found: 0 })));
        h[4] = 3;
        assert!(matches!(check_head(&h, 28), Err(FormatError::BadVersion { found: 3 })));
    }
}
