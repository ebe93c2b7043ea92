//! `ObjectId`: blake3 of an object's uncompressed bytes; also names manifests.
//!
//! CONTRACT: full lowercase hex (64 characters) on disk, in the index and in JSON (serde serializes it as that
//! string); an 8-hex short form in messages (`Display`). Parsing an id has one home and one failure policy:
//! `FromStr` with a typed [`IdParseError`]. Hex itself is the `hex` crate's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

/// Why a string is not an object id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an object id: {shown} (want 64 hex digits)")]
pub struct IdParseError {
    /// The input, cut to 70 characters.
    pub shown: String,
}

impl ObjectId {
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(*blake3::hash(bytes).as_bytes())
    }
    pub fn hex(&self) -> String {
        hex(&self.0)
    }
    /// First 4 bytes in hex: what messages show.
    pub fn short(&self) -> String {
        hex(&self.0[..4])
    }
}

impl FromStr for ObjectId {
    type Err = IdParseError;
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        let fail = || IdParseError { shown: format!("{:?}", s.chars().take(70).collect::<String>()) };
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| fail())?;
        Ok(ObjectId(out))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.hex())
    }
}

impl Serialize for ObjectId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for ObjectId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Lowercase hex of any bytes (file hashes, fingerprint ids).
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_hex() {
        let id = ObjectId::of(b"abc");
        assert_eq!(id.hex().parse::<ObjectId>(), Ok(id));
        assert_eq!(id.short().len(), 8);
        assert!("zz".parse::<ObjectId>().is_err());
        let e = "g".repeat(64).parse::<ObjectId>().unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
    }

    #[test]
    fn serde_is_the_hex_string() {
        let id = ObjectId::of(b"abc");
        let j = serde_json::to_string(&id).unwrap();
        assert_eq!(j, format!("\"{}\"", id.hex()));
        assert_eq!(serde_json::from_str::<ObjectId>(&j).unwrap(), id);
        assert!(serde_json::from_str::<ObjectId>("\"00\"").is_err());
        assert_eq!(serde_json::from_str::<Option<ObjectId>>("null").unwrap(), None);
    }
}
