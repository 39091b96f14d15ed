//! `leasehold revoke --key K [--url URL]`: end the lease of whoever holds a key now.

use std::time::Duration;

use crate::status::bounded;
use crate::{code, failed};
use leasehold::{redact_url, LockKey, Revoked};

/// Revokes the key's holder and prints what happened: 0 when a lease was ended, 1 when the key
/// was free; an error's status as for `status` (a refused permission is 77).
pub async fn revoke(url: Option<&str>, key: &str) -> u8 {
    let key = match LockKey::new(key) {
        Ok(key) => key,
        Err(e) => return failed(&e, "", code::USAGE),
    };
    let (url, timeout, authority) = match crate::status::open(url).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    // A revoke may read the holder before it ends its lease: two requests, each bounded by the
    // URL's timeout in the backend; this is a backstop.
    let backstop = timeout
        .saturating_mul(3)
        .saturating_add(Duration::from_secs(1));
    let done = bounded(backstop, &url, authority.revoke(&key)).await;
    let _ = authority.close().await;
    let shown = redact_url(&url);
    match done {
        Ok(Revoked::Revoked { fence }) => {
            let _ = crate::print_out(&format!(
                "{key}: revoked the lease with fence {} ({shown}); the next holder's fence is \
                 greater",
                fence.value()
            ));
            0
        }
        Ok(_) => {
            let _ = crate::print_out(&format!("{key}: was free, nothing revoked ({shown})"));
            code::WAS_FREE
        }
        Err(code) => code,
    }
}
