//! The S3 client of a bucket store, configured from the standard AWS environment variables.
//!
//! CONTRACT: `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`; none: AWS itself), `AWS_REGION` (or
//! `AWS_DEFAULT_REGION`; default us-east-1), `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`);
//! no credentials → unsigned (anonymous) requests and no instance-metadata lookup. Plain HTTP only to a loopback
//! endpoint or with `AWS_ALLOW_HTTP=true`. Timeouts and retries are bounded (connect 2 s, request 30 s —
//! `KVSTORE_S3_TIMEOUT` seconds, 0.1 to 3600, overrides it — 2 retries within 10 s), so a dead endpoint is
//! `RemoteError::Unavailable` in seconds, never a hang. Conditional puts on ETag are enabled. A restore's ranged
//! GETs ask for at least `KVSTORE_S3_RANGE_MIB` (0.0625 to 1024, default 8; `client::RANGE_BYTES`), and a restore
//! is written as its objects arrive unless `KVSTORE_S3_STREAM` says otherwise (`auto`, the default: unless the
//! endpoint is a loopback host; `on`; `off`). A bad value of any is refused before anything is made.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use super::client::{Bucket, RANGE_BYTES};
use super::error::RemoteError;
use super::url::BucketUrl;

/// The S3 client for `url`, configured from the AWS environment variables.
pub fn client(url: &BucketUrl) -> Result<Bucket, RemoteError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let bad = |reason: String| RemoteError::BadUrl { url: url.display(), reason };
    let endpoint = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
    let allow_env = env("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let mut allow_http = false;
    let mut loopback = false;
    if let Some(ep) = &endpoint {
        let (plain, rest) = match (ep.strip_prefix("http://"), ep.strip_prefix("https://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) => return Err(bad(format!("AWS_ENDPOINT_URL {ep} must start with http:// or https://"))),
        };
        loopback = is_loopback(rest);
        if plain && !loopback && !allow_env {
            return Err(bad(format!(
                "AWS_ENDPOINT_URL {ep} is plain HTTP on a non-loopback host; use https, or set AWS_ALLOW_HTTP=true"
            )));
        }
        allow_http = plain;
    }
    // A bad value is refused, naming the variable, rather than silently replaced by the default.
    let number = |key: &str, unit: &str, (lo, hi): (f64, f64), default: f64| match env(key) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if (lo..=hi).contains(&x) => Ok(x),
            _ => Err(RemoteError::BadSetting {
                url: url.display(),
                reason: format!("{key}={v} must be a number of {unit} from {lo} to {hi}"),
            }),
        },
    };
    let timeout = number("KVSTORE_S3_TIMEOUT", "seconds", (0.1, 3600.0), 30.0)?;
    let range_mib = number("KVSTORE_S3_RANGE_MIB", "MiB", (1.0 / 16.0, 1024.0), (RANGE_BYTES >> 20) as f64)?;
    // Streamed where the bucket is served from elsewhere: on loopback its server shares this machine's cores,
    // and the threads that write beside the transfer slowed it (docs/design.md "Cold reads").
    let streamed = match env("KVSTORE_S3_STREAM").as_deref().map(str::trim) {
        None | Some("auto") => !loopback,
        Some("on") => true,
        Some("off") => false,
        Some(v) => {
            return Err(RemoteError::BadSetting {
                url: url.display(),
                reason: format!("KVSTORE_S3_STREAM={v} must be auto, on or off"),
            })
        }
    };
    let options = ClientOptions::new()
        .with_allow_http(allow_http)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs_f64(timeout));
    let retry = RetryConfig {
        backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(2), base: 2.0 },
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
    };
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(&url.bucket)
        .with_region(env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into()))
        .with_client_options(options)
        .with_retry(retry)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    if let Some(ep) = endpoint {
        b = b.with_endpoint(ep);
    }
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(k), Some(s)) => {
            b = b.with_access_key_id(k).with_secret_access_key(s);
            if let Some(t) = env("AWS_SESSION_TOKEN") {
                b = b.with_token(t);
            }
        }
        // Anonymous: no signature (and no instance-metadata lookup, which would stall outside a cloud).
        _ => b = b.with_skip_signature(true),
    }
    let store = b.build().map_err(|e| bad(e.to_string()))?;
    Ok(Bucket::new(Arc::new(store), url)?
        .with_range_bytes((range_mib * (1u64 << 20) as f64) as u64)
        .with_streamed_restores(streamed))
}

/// Whether an endpoint (after its scheme: `host[:port][/path]`) names this machine.
fn is_loopback(authority_and_path: &str) -> bool {
    let authority = authority_and_path.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""), // [::1] or [::1]:port
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_endpoints_are_this_machine() {
        for here in ["127.0.0.1:8333", "127.0.0.1", "localhost:9000/base", "[::1]:9000", "[::1]", "127.1.2.3:80/x"] {
            assert!(is_loopback(here), "{here}");
        }
        for afar in ["s3.amazonaws.com", "10.0.0.5:9000", "[2001:db8::1]:443", "minio.internal:9000/x", "localhost.example"] {
            assert!(!is_loopback(afar), "{afar}");
        }
    }
}
