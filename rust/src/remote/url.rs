//! `s3://BUCKET/PREFIX` → (bucket, prefix). The one parser of store locations that name a bucket.
//!
//! CONTRACT: `is_remote(s)` tells a bucket location from a local path (an `s3://` scheme, nothing else);
//! `parse` accepts `s3://bucket` and `s3://bucket/some/prefix` (trailing slashes dropped), checks the bucket
//! name against S3's rules (3..=63 chars of `a-z 0-9 . -`, starting and ending with a letter or digit) and
//! the prefix's segments (no empty, `.` or `..` segment, no control characters), and refuses everything
//! else with `RemoteError::BadUrl` saying what is wrong.

use super::error::RemoteError;

pub const SCHEME: &str = "s3://";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketUrl {
    pub bucket: String,
    /// "" or segments joined by '/', without leading or trailing '/'.
    pub prefix: String,
}

impl BucketUrl {
    /// The canonical form, `s3://bucket` or `s3://bucket/prefix`.
    pub fn display(&self) -> String {
        if self.prefix.is_empty() {
            format!("{SCHEME}{}", self.bucket)
        } else {
            format!("{SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Whether a store location names a bucket (else it is a local path).
pub fn is_remote(location: &str) -> bool {
    location.len() >= SCHEME.len() && location[..SCHEME.len()].eq_ignore_ascii_case(SCHEME)
}

pub fn parse(location: &str) -> Result<BucketUrl, RemoteError> {
    let bad = |reason: &str| RemoteError::BadUrl { url: location.to_string(), reason: reason.to_string() };
    if !is_remote(location) {
        return Err(bad("a bucket location starts with s3://"));
    }
    let rest = &location[SCHEME.len()..];
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket name (write s3://BUCKET/PREFIX)"));
    }
    if bucket.len() < 3 || bucket.len() > 63 {
        return Err(bad("a bucket name is 3 to 63 characters long"));
    }
    if !bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
        return Err(bad("a bucket name has only lowercase letters, digits, '.' and '-'"));
    }
    let edge_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge_ok(bucket.as_bytes()[0]) || !edge_ok(bucket.as_bytes()[bucket.len() - 1]) {
        return Err(bad("a bucket name starts and ends with a letter or digit"));
    }
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty() {
        for seg in prefix.split('/') {
            if seg.is_empty() || seg == "." || seg == ".." {
                return Err(bad("the prefix has an empty, '.' or '..' segment"));
            }
            if seg.chars().any(|c| c.is_control()) {
                return Err(bad("the prefix contains a control character"));
            }
        }
    }
    Ok(BucketUrl { bucket: bucket.to_string(), prefix: prefix.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!(parse("s3://kvs").unwrap(), BucketUrl { bucket: "kvs".into(), prefix: "".into() });
        let u = parse("s3://my-bucket/team/a/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("my-bucket", "team/a"));
        assert_eq!(u.display(), "s3://my-bucket/team/a");
        assert!(is_remote("S3://x") && !is_remote("/tmp/s3://x") && !is_remote("s3:/x"));
        for (bad, why) in [
            ("/tmp/x", "starts with s3://"),
            ("s3://", "no bucket"),
            ("s3://ab", "3 to 63"),
            ("s3://Bucket", "lowercase"),
            ("s3://-abc", "starts and ends"),
            ("s3://abc//x", "empty"),
            ("s3://abc/../x", "'..'"),
            ("s3://abc/a\nb", "control"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
