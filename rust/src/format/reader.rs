//! A bounds-checked little-endian cursor over a byte slice.
//!
//! CONTRACT: every read either succeeds or returns [`FormatError::Truncated`] naming the absolute offset and the field.
//! Sizes are `u64` (they come from the file) and are compared with the bytes left before anything is sliced,
//! so absurd lengths fail fast and never allocate.

use super::FormatError;

#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Absolute offset of `buf[0]` in the file, for error messages (nested blobs).
    base: u64,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], base: u64) -> Self {
        Reader { buf, pos: 0, base }
    }

    /// Absolute offset of the next byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Fails unless `n` more bytes are available.
    pub fn need(&self, n: u64, what: &'static str) -> Result<(), FormatError> {
        let have = self.remaining() as u64;
        if n > have {
            return Err(FormatError::Truncated { offset: self.offset(), what, need: n, have });
        }
        Ok(())
    }

    pub fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], FormatError> {
        self.need(n, what)?;
        let n = n as usize; // fits: n <= remaining
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FormatError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, FormatError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, FormatError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub fn i64(&mut self, what: &'static str) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// The next u32 without consuming it (None when fewer than 4 bytes are left).
    pub fn peek_u32(&self) -> Option<u32> {
        let s = self.buf.get(self.pos..self.pos.checked_add(4)?)?;
        Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// Everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// The unread bytes, without consuming them.
    pub fn peek_rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// An `Invalid` error at the current offset minus `back` bytes (the field just read).
    pub fn invalid(&self, back: u64, what: &'static str, detail: impl Into<String>) -> FormatError {
        FormatError::Invalid { offset: self.offset().saturating_sub(back), what, detail: detail.into() }
    }
}

/// Little-endian writer helpers on `Vec<u8>`.
pub(crate) trait PutLe {
    fn put_u8(&mut self, v: u8);
    fn put_u32(&mut self, v: u32);
    fn put_i32(&mut self, v: i32);
    fn put_u64(&mut self, v: u64);
    fn put_i64(&mut self, v: i64);
}

impl PutLe for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i32(&mut self, v: i32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_truncates() {
        let b = [1u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 9];
        let mut r = Reader::new(&b, 100);
        assert_eq!(r.peek_u32(), Some(1));
        assert_eq!(r.u32("a").unwrap(), 1);
        assert_eq!(r.i32("b").unwrap(), -1);
        assert_eq!(r.offset(), 108);
        match r.u32("c") {
            Err(FormatError::Truncated { offset: 108, what: "c", need: 4, have: 1 }) => {}
            other => panic!("{other:?}"),
        }
        assert!(r.take(u64::MAX, "huge").is_err());
        assert_eq!(r.peek_u32(), None);
        assert_eq!(r.rest(), &[9]);
        assert!(r.is_empty());
    }
}
