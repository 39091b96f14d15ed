//! How an object carries its fence: a one-line header in front of the content.
//!
//! The fence lives in the body, not in the object's metadata, because the store's
//! compare-and-set compares versions, and on S3 the version is the ETag, an MD5 of the body
//! alone: a claim that raised only a metadata fence would leave the ETag as it was, and a
//! writer that had read the object before the claim would still match it. With the fence in
//! the body, every change of fence or content is a new ETag (S3), generation (GCS) or ETag
//! (Azure), and the metadata rules that differ between stores (Azure wants C# identifiers,
//! the local filesystem keeps none) do not matter.

use leasehold_core::{Error, Result};

/// What every gated object starts with, before the fence in decimal and a newline:
/// `leasehold-fence:42\n` then the content.
pub const FENCE_HEADER: &str = "leasehold-fence:";

/// The longest decimal `u64`.
const MAX_DIGITS: usize = 20;

/// The object's body for `content` under `fence`.
pub(crate) fn encode(fence: u64, content: &[u8]) -> Vec<u8> {
    let mut body = format!("{FENCE_HEADER}{fence}\n").into_bytes();
    body.extend_from_slice(content);
    body
}

/// The fence and the content of a gated object's body; an error (not retryable) when the
/// object was not written by the gate, which the gate then leaves alone.
pub(crate) fn decode<'a>(path: &str, body: &'a [u8]) -> Result<(u64, &'a [u8])> {
    let not_gated = |why: &str| Error::Backend {
        backend: "object gate",
        message: format!(
            "object {path} has no fence header ({why}): it was not written by the gate, which \
             does not overwrite it"
        ),
        retryable: false,
        source: None,
    };
    let rest = body
        .strip_prefix(FENCE_HEADER.as_bytes())
        .ok_or_else(|| not_gated("it does not start with `leasehold-fence:`"))?;
    let end = rest
        .iter()
        .take(MAX_DIGITS + 1)
        .position(|&b| b == b'\n')
        .ok_or_else(|| not_gated("no newline after the fence"))?;
    let digits = std::str::from_utf8(&rest[..end]).map_err(|_| not_gated("not a number"))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_gated("not a number"));
    }
    let fence = digits
        .parse::<u64>()
        .map_err(|_| not_gated("not a number"))?;
    Ok((fence, &rest[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    #[test]
    fn a_body_round_trips_and_foreign_bodies_are_refused() -> TestResult {
        let body = encode(42, b"hello\nworld");
        assert_eq!(body, b"leasehold-fence:42\nhello\nworld");
        assert_eq!(
            decode("p", &body).or_fail("decoding an encoded body")?,
            (42, &b"hello\nworld"[..])
        );
        assert_eq!(
            decode("p", &encode(0, b"")).or_fail("decoding an empty body")?,
            (0, &b""[..])
        );
        assert_eq!(
            decode("p", &encode(u64::MAX, b"x")).or_fail("decoding the largest fence")?,
            (u64::MAX, &b"x"[..])
        );
        for foreign in [
            &b""[..],
            b"hello",
            b"leasehold-fence:\n",
            b"leasehold-fence:-1\n",
            b"leasehold-fence:+1\n",
            b"leasehold-fence:12",
            b"leasehold-fence:99999999999999999999\n",
            b"leasehold-fence:123456789012345678901234\n",
        ] {
            let refused = decode("p", foreign).err_or_fail("a foreign object")?;
            assert!(!refused.is_retryable(), "{foreign:?}: {refused}");
        }
        Ok(())
    }
}
