//! `RemoteError`: what can go wrong with a bucket (unreachable, refused, a bad location, locked, malformed).
//!
//! CONTRACT: every variant names the store's URL (`url()`) and says what to do next; `client.rs` maps
//! object_store's errors here once, and `From<RemoteError> for Error` (below) hands them to the rest of the
//! core as the backend-neutral `Unavailable`, keeping the message.

use crate::error::Error;
use crate::objects::ObjectError;
use crate::unavailable::{Unavailable, Why};

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("bucket {url} is unreachable ({detail}); reads are served from the local cache where it holds the objects, saves fail until the bucket is back (check AWS_ENDPOINT_URL and the network)")]
    Unavailable { url: String, detail: String },
    #[error("bucket {url}: access denied ({detail}); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")]
    Denied { url: String, detail: String },
    #[error("invalid store location {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// A client setting from the environment (`s3.rs`) out of its range: the location itself is fine.
    #[error("bad setting for bucket store {url:?}: {reason}")]
    BadSetting { url: String, reason: String },
    #[error("{url}: {detail}")]
    Locked { url: String, detail: String },
    #[error("bucket {url}: {detail}")]
    Invalid { url: String, detail: String },
}

impl RemoteError {
    pub fn url(&self) -> &str {
        match self {
            RemoteError::Unavailable { url, .. }
            | RemoteError::Denied { url, .. }
            | RemoteError::BadUrl { url, .. }
            | RemoteError::BadSetting { url, .. }
            | RemoteError::Locked { url, .. }
            | RemoteError::Invalid { url, .. } => url,
        }
    }
}


impl From<RemoteError> for Unavailable {
    fn from(e: RemoteError) -> Unavailable {
        let why = match e {
            RemoteError::Unavailable { .. } => Why::Unreachable,
            RemoteError::Locked { .. } => Why::Locked,
            RemoteError::Denied { .. }
            | RemoteError::BadUrl { .. }
            | RemoteError::BadSetting { .. }
            | RemoteError::Invalid { .. } => Why::Refused,
        };
        Unavailable { why, location: e.url().to_string(), message: e.to_string() }
    }
}

impl From<RemoteError> for ObjectError {
    fn from(e: RemoteError) -> ObjectError {
        ObjectError::Unavailable(e.into())
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Error {
        Error::Unavailable(e.into())
    }
}
