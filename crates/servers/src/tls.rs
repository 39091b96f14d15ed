//! TLS material made at test time: a throwaway CA, a server certificate for `localhost` and
//! `127.0.0.1`, and a client certificate, as PEM files in a temp directory.
//!
//! Made by a library ([rcgen]) in the test process, so no test depends on files checked into
//! the repository (which expire, and whose keys everyone has) or on the `openssl` program.
//! Every call makes a new CA: a certificate from one set is not trusted by another set's CA,
//! which is what a test of an untrusted server needs.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{HarnessError, Result};

/// A CA with one server and one client certificate, written as PEM files (keys in PKCS#8).
///
/// The files live as long as this value. Key files are readable by their owner only; a server
/// that runs as another user (PostgreSQL runs as `postgres`) needs its own copy, see
/// [`TestCerts::copy_server_pair_to`].
#[derive(Debug)]
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// Makes a fresh CA and its server and client certificates. The server certificate names
    /// `localhost` and `127.0.0.1`; the client certificate's common name is `client` (etcd maps
    /// it to a user of that name when client-certificate authentication is on).
    pub fn generate() -> Result<Self> {
        Self::generate_for("client")
    }

    /// As [`TestCerts::generate`], with the client certificate's common name `client_name`.
    pub fn generate_for(client_name: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-tls-")
            .tempdir()
            .map_err(|source| io("make a directory for test certificates", source))?;
        let ca_key = KeyPair::generate().map_err(rcgen_error)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leasehold test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(rcgen_error)?;
        let ca = Issuer::new(ca_params, ca_key);
        write(dir.path(), "ca.pem", &ca_cert.pem(), false)?;

        let leaf = |names: Vec<String>, common: &str, purpose: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().map_err(rcgen_error)?;
            let mut params = CertificateParams::new(names).map_err(rcgen_error)?;
            params.distinguished_name.push(DnType::CommonName, common);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![purpose];
            let cert = params.signed_by(&key, &ca).map_err(rcgen_error)?;
            Ok::<_, HarnessError>((cert.pem(), key.serialize_pem()))
        };
        let (cert, key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        write(dir.path(), "server.pem", &cert, false)?;
        write(dir.path(), "server.key", &key, true)?;
        let (cert, key) = leaf(Vec::new(), client_name, ExtendedKeyUsagePurpose::ClientAuth)?;
        write(dir.path(), "client.pem", &cert, false)?;
        write(dir.path(), "client.key", &key, true)?;
        Ok(TestCerts { dir })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate, to trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server's certificate.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client's certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// Copies the server certificate and key into `dir` as `cert_name` and `key_name`, owned
    /// by `dir`'s owner with the key readable by that owner only (PostgreSQL refuses a key
    /// others can read, and runs as its own user).
    pub fn copy_server_pair_to(&self, dir: &Path, cert_name: &str, key_name: &str) -> Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(dir).map_err(|source| io("read the target dir", source))?;
        for (from, to, mode) in [
            (self.server_cert(), cert_name, 0o644),
            (self.server_key(), key_name, 0o600),
        ] {
            let dest = dir.join(to);
            std::fs::copy(&from, &dest).map_err(|source| io("copy a certificate", source))?;
            std::os::unix::fs::chown(&dest, Some(meta.uid()), Some(meta.gid()))
                .map_err(|source| io("hand a certificate to the server's user", source))?;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(|source| io("restrict a key file", source))?;
        }
        Ok(())
    }
}

fn write(dir: &Path, name: &str, pem: &str, private: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, pem).map_err(|source| io("write a test certificate", source))?;
    let mode = if private { 0o600 } else { 0o644 };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(|source| io("set a test certificate's mode", source))
}

fn io(action: &str, source: std::io::Error) -> HarnessError {
    HarnessError::Io {
        action: action.to_string(),
        source,
    }
}

fn rcgen_error(e: rcgen::Error) -> HarnessError {
    io(
        "make a test certificate",
        std::io::Error::other(e.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn makes_a_ca_and_two_certificates_with_private_keys_kept_private() -> TestResult {
        use std::os::unix::fs::PermissionsExt;
        let certs =
            TestCerts::generate().map_err(|e| format!("generating test certificates: {e}"))?;
        for path in [certs.ca(), certs.server_cert(), certs.client_cert()] {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading the certificate file: {e}"))?;
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{path:?}");
        }
        for path in [certs.server_key(), certs.client_key()] {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("reading the key file: {e}"))?;
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{path:?}");
            let mode = std::fs::metadata(&path)
                .map_err(|e| format!("the key file's metadata: {e}"))?
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{path:?} is readable by others");
        }
        // A second set has a CA of its own.
        let other = TestCerts::generate()
            .map_err(|e| format!("generating other test certificates: {e}"))?;
        assert_ne!(
            std::fs::read(certs.ca()).map_err(|e| format!("reading the CA file: {e}"))?,
            std::fs::read(other.ca()).map_err(|e| format!("reading the other CA file: {e}"))?
        );
        Ok(())
    }
}
