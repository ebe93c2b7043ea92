//! One `Error` folding the module errors; `kind()` tells the Python boundary which exception to raise.
//!
//! CONTRACT: every failure of the core is one of these variants, each module's typed error kept whole (`From`
//! for each, so `?` works); `Error::io` turns ENOSPC/EDQUOT into `StoreFull`; `kind()` is the one mapping to
//! exception kinds (`py/errors.rs` maps kinds to classes), an `Unavailable` by its `why`.

use std::path::PathBuf;

use crate::format::FormatError;
use crate::index::IndexError;
use crate::manifest::ManifestError;
use crate::objects::ObjectError;
use crate::unavailable::{Unavailable, Why};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    #[error("no state named '{name}'{}", ns_suffix(namespace))]
    NameNotFound { namespace: String, name: String },
    #[error("no manifest {id}; list states with `kvstore ls`")]
    ManifestNotFound { id: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "pinning '{name}' would put the pinned states at {pinned_bytes} bytes, over the store's cap of \
         {max_bytes} bytes; unpin another name (`kvstore unpin NAME`) or raise --max-size"
    )]
    PinOverCap { name: String, pinned_bytes: u64, max_bytes: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Callback(String),
}

fn ns_suffix(ns: &str) -> String {
    if ns.is_empty() {
        String::new()
    } else {
        format!(" in namespace '{ns}'")
    }
}

/// What kind of failure, for mapping to an exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Format,
    Corrupt,
    FingerprintMismatch,
    NameNotFound,
    InvalidName,
    StoreFull,
    /// Where the store keeps objects or names did not answer (down, unreachable, timed out).
    RemoteUnavailable,
    /// A gc (or a save) holds the store's lock.
    GcLocked,
    Other,
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if crate::objects::is_disk_full(&source) {
            Error::Object(ObjectError::Full { path, source })
        } else {
            Error::Io { path, source }
        }
    }

    /// The `Unavailable` inside, if any (from the objects or from the catalog).
    pub fn unavailable(&self) -> Option<&Unavailable> {
        match self {
            Error::Object(ObjectError::Unavailable(e)) | Error::Unavailable(e) => Some(e),
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Format(_) => ErrorKind::Format,
            Error::Object(ObjectError::Corrupt { .. } | ObjectError::Missing { .. }) => ErrorKind::Corrupt,
            Error::Object(ObjectError::Full { .. }) | Error::PinOverCap { .. } => ErrorKind::StoreFull,
            Error::Object(ObjectError::Unavailable(e)) | Error::Unavailable(e) => match e.why {
                Why::Unreachable => ErrorKind::RemoteUnavailable,
                Why::Locked => ErrorKind::GcLocked,
                Why::Refused => ErrorKind::Other,
            },
            Error::Object(_) => ErrorKind::Other,
            Error::Index(IndexError::InvalidName { .. }) => ErrorKind::InvalidName,
            Error::Index(IndexError::MapFull { .. } | IndexError::DiskFull { .. }) => ErrorKind::StoreFull,
            Error::Index(IndexError::Corrupt { .. }) => ErrorKind::Corrupt,
            Error::Index(_) => ErrorKind::Other,
            Error::Manifest(ManifestError::Invalid { .. }) => ErrorKind::Corrupt,
            Error::Manifest(_) => ErrorKind::FingerprintMismatch,
            Error::NameNotFound { .. } | Error::ManifestNotFound { .. } => ErrorKind::NameNotFound,
            Error::Io { .. } | Error::Invalid(_) | Error::Callback(_) => ErrorKind::Other,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
