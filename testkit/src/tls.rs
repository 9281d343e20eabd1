//! TLS for private servers: a self-signed certificate per server, and the
//! client side that trusts it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use fred::types::config::{TlsConfig, TlsConnector};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::Error;

/// The test CA's certificate in a server's data directory.
pub(crate) const CA_FILE: &str = "tls-ca.pem";
/// The server's certificate (signed by the test CA).
pub(crate) const CERT_FILE: &str = "tls-cert.pem";
/// Private key file in a server's data directory.
pub(crate) const KEY_FILE: &str = "tls-key.pem";

/// TLS port → the data directory holding that server's certificate.
fn registry() -> &'static Mutex<HashMap<u16, PathBuf>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u16, PathBuf>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Makes a test CA and a server certificate it signs for `127.0.0.1` and
/// `localhost`, with the `openssl` command.
pub(crate) fn make_certificate(dir: &Path) -> Result<(), Error> {
    std::fs::write(
        dir.join("tls-server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| {
        Error::Startup(format!(
            "cannot write a test certificate extension file: {e}"
        ))
    })?;
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=flotilla-test-ca",
            "-keyout",
            "tls-ca-key.pem",
            "-out",
            CA_FILE,
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            KEY_FILE,
            "-out",
            "tls-server.csr",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "tls-server.csr",
            "-CA",
            CA_FILE,
            "-CAkey",
            "tls-ca-key.pem",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "tls-server.ext",
            "-out",
            CERT_FILE,
        ],
    ];
    for args in steps {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| {
                Error::Startup(format!(
                    "cannot run openssl to make a test certificate ({e}); install it (Debian: apt-get install -y openssl)"
                ))
            })?;
        if !status.success() {
            return Err(Error::Startup(format!(
                "openssl {} failed: {status}",
                args[0]
            )));
        }
    }
    Ok(())
}

/// Remembers which certificate a TLS port presents.
pub(crate) fn register(port: u16, dir: &Path) {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port, dir.to_path_buf());
}

/// A TLS config trusting the certificate of the private server on `port`,
/// or `None` when no private TLS server listens there.
pub(crate) fn config_for_port(port: u16) -> Result<Option<TlsConfig>, Error> {
    let dir = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&port)
        .cloned();
    let Some(dir) = dir else { return Ok(None) };
    let cert = CertificateDer::from_pem_file(dir.join(CA_FILE))
        .map_err(|e| Error::Startup(format!("cannot read the test certificate: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(cert)
        .map_err(|e| Error::Startup(format!("test certificate refused: {e}")))?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(TlsConnector::from(config).into()))
}
