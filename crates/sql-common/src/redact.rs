//! Masking secrets in text a driver or a server produced.

use leasehold_core::backend::redact_url;

/// Text from the driver or a server that may quote the URL: every secret in it masked.
pub fn redact_text(text: &str, secrets: &[&str]) -> String {
    let mut out = redact_url(text);
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret, "***");
    }
    out
}
