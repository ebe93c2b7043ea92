//! Typed heed codecs, one per key or value shape of the index tables.
//!
//! CONTRACT: the only code that lays out index bytes. Keys: `IdCodec` (32-byte ids), `NameKeyCodec`
//! (`namespace \0 name`), `PrefixKeyCodec` (32-byte prefix key ‖ manifest id). Range codecs encode a key's
//! leading part (a namespace, a prefix key) and decode whole keys, so `prefix_iter` over them stays typed.
//! Values: `ObjectRowCodec` (u64be raw ‖ u64be stored). A key that does not decode is `IndexError::Corrupt`.

use std::borrow::Cow;

use heed::{BoxedError, BytesDecode, BytesEncode};

use super::ObjectRow;
use crate::id::ObjectId;

/// 32-byte object/manifest id keys.
pub enum IdCodec {}
impl<'a> BytesEncode<'a> for IdCodec {
    type EItem = ObjectId;
    fn bytes_encode(item: &'a ObjectId) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(&item.0))
    }
}
impl<'a> BytesDecode<'a> for IdCodec {
    type DItem = ObjectId;
    fn bytes_decode(b: &'a [u8]) -> Result<ObjectId, BoxedError> {
        Ok(ObjectId(b.try_into().map_err(|_| format!("id key of {} bytes, expected 32", b.len()))?))
    }
}

/// `namespace \0 name` keys.
pub enum NameKeyCodec {}
impl<'a> BytesEncode<'a> for NameKeyCodec {
    type EItem = (&'a str, &'a str);
    fn bytes_encode((ns, name): &'a (&'a str, &'a str)) -> Result<Cow<'a, [u8]>, BoxedError> {
        let mut k = Vec::with_capacity(ns.len() + 1 + name.len());
        k.extend_from_slice(ns.as_bytes());
        k.push(0);
        k.extend_from_slice(name.as_bytes());
        Ok(Cow::Owned(k))
    }
}
impl<'a> BytesDecode<'a> for NameKeyCodec {
    type DItem = (&'a str, &'a str);
    fn bytes_decode(b: &'a [u8]) -> Result<(&'a str, &'a str), BoxedError> {
        let i = b.iter().position(|&c| c == 0).ok_or("name key without NUL separator")?;
        Ok((std::str::from_utf8(&b[..i])?, std::str::from_utf8(&b[i + 1..])?))
    }
}

/// `prefix key ‖ manifest id` keys (64 bytes).
pub enum PrefixKeyCodec {}
impl<'a> BytesEncode<'a> for PrefixKeyCodec {
    type EItem = ([u8; 32], ObjectId);
    fn bytes_encode((h, m): &'a ([u8; 32], ObjectId)) -> Result<Cow<'a, [u8]>, BoxedError> {
        let mut k = Vec::with_capacity(64);
        k.extend_from_slice(h);
        k.extend_from_slice(&m.0);
        Ok(Cow::Owned(k))
    }
}
impl<'a> BytesDecode<'a> for PrefixKeyCodec {
    type DItem = ([u8; 32], ObjectId);
    fn bytes_decode(b: &'a [u8]) -> Result<([u8; 32], ObjectId), BoxedError> {
        if b.len() != 64 {
            return Err(format!("prefix key of {} bytes, expected 64", b.len()).into());
        }
        Ok((b[..32].try_into().unwrap(), ObjectId(b[32..].try_into().unwrap())))
    }
}

pub enum ObjectRowCodec {}
impl<'a> BytesEncode<'a> for ObjectRowCodec {
    type EItem = ObjectRow;
    fn bytes_encode(r: &'a ObjectRow) -> Result<Cow<'a, [u8]>, BoxedError> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&r.raw_len.to_be_bytes());
        v.extend_from_slice(&r.stored_len.to_be_bytes());
        Ok(Cow::Owned(v))
    }
}
impl<'a> BytesDecode<'a> for ObjectRowCodec {
    type DItem = ObjectRow;
    fn bytes_decode(b: &'a [u8]) -> Result<ObjectRow, BoxedError> {
        if b.len() != 16 {
            return Err(format!("object row of {} bytes, expected 16", b.len()).into());
        }
        Ok(ObjectRow {
            raw_len: u64::from_be_bytes(b[..8].try_into().unwrap()),
            stored_len: u64::from_be_bytes(b[8..].try_into().unwrap()),
        })
    }
}

/// Encodes a namespace as the leading part of its name keys (`namespace \0`); decodes whole name keys.
pub enum NamespaceRange {}
impl<'a> BytesEncode<'a> for NamespaceRange {
    type EItem = str;
    fn bytes_encode(ns: &'a str) -> Result<Cow<'a, [u8]>, BoxedError> {
        NameKeyCodec::bytes_encode(&(ns, "")).map(|k| Cow::Owned(k.into_owned()))
    }
}
impl<'a> BytesDecode<'a> for NamespaceRange {
    type DItem = (&'a str, &'a str);
    fn bytes_decode(b: &'a [u8]) -> Result<(&'a str, &'a str), BoxedError> {
        NameKeyCodec::bytes_decode(b)
    }
}

/// Encodes a 32-byte prefix key as the leading part of its rows; decodes whole prefix keys.
pub enum PrefixRange {}
impl<'a> BytesEncode<'a> for PrefixRange {
    type EItem = [u8; 32];
    fn bytes_encode(h: &'a [u8; 32]) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(&h[..]))
    }
}
impl<'a> BytesDecode<'a> for PrefixRange {
    type DItem = ([u8; 32], ObjectId);
    fn bytes_decode(b: &'a [u8]) -> Result<([u8; 32], ObjectId), BoxedError> {
        PrefixKeyCodec::bytes_decode(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_codecs_encode_the_leading_part_of_keys() {
        let key = NameKeyCodec::bytes_encode(&("ns", "a")).unwrap();
        let range = NamespaceRange::bytes_encode("ns").unwrap();
        assert!(key.starts_with(&range) && range.as_ref() == b"ns\0");
        // "ns" must not match namespace "ns2".
        assert!(!NameKeyCodec::bytes_encode(&("ns2", "a")).unwrap().starts_with(&range));
        let id = ObjectId::of(b"m");
        let item = ([9; 32], id);
        let pk = PrefixKeyCodec::bytes_encode(&item).unwrap();
        assert!(pk.starts_with(&PrefixRange::bytes_encode(&[9; 32]).unwrap()));
        assert_eq!(PrefixRange::bytes_decode(&pk).unwrap(), ([9; 32], id));
        assert!(PrefixKeyCodec::bytes_decode(&pk[..63]).is_err());
        assert!(NameKeyCodec::bytes_decode(b"no-separator").is_err());
    }
}
