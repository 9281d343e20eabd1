//! Connecting to Redis: fail fast, never print a password.

use std::path::Path;
use std::time::Duration;

use fred::prelude::*;

use crate::error::{CtlError, CtlResult};

/// How long to wait for the TCP connection and the handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `url` once (no reconnect loop: a CLI should fail fast).
///
/// # Errors
/// [`CtlError::Usage`] for a URL that cannot be parsed or asks for TLS
/// that the client cannot give, [`CtlError::Connect`] when Redis does not
/// answer.
pub(crate) async fn connect(url: &str, tls_ca: Option<&Path>) -> CtlResult<Client> {
    let shown = redact(url);
    let config = config(url, tls_ca)?;
    let client = Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = CONNECT_TIMEOUT;
            c.internal_command_timeout = CONNECT_TIMEOUT;
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
        .build()
        .map_err(|e| CtlError::Usage(format!("invalid --redis URL {shown}: {e}")))?;
    match tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(1), client.init()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(source)) => Err(CtlError::Connect {
            url: shown,
            reason: reason(&source),
            source,
        }),
        Err(_) => Err(CtlError::Connect {
            url: shown,
            reason: "connection timed out".into(),
            source: fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                "connection timed out",
            ),
        }),
    }
}

/// A client for a long-running process (`serve`): it reconnects forever
/// (every 500 ms) instead of failing, and a command waiting on a lost
/// connection fails after [`LASTING_COMMAND_TIMEOUT`]. Not connected yet:
/// the caller starts the connection task with `Client::connect`.
///
/// # Errors
/// [`CtlError::Usage`] for a URL that cannot be parsed or asks for TLS
/// that the client cannot give.
pub(crate) fn lasting_client(url: &str, tls_ca: Option<&Path>) -> CtlResult<Client> {
    let shown = redact(url);
    let mut config = config(url, tls_ca)?;
    config.fail_fast = false;
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(ReconnectPolicy::new_constant(0, 500))
        .with_connection_config(|c| {
            c.connection_timeout = CONNECT_TIMEOUT;
            c.internal_command_timeout = CONNECT_TIMEOUT;
        })
        .with_performance_config(|p| p.default_command_timeout = LASTING_COMMAND_TIMEOUT);
    builder
        .build()
        .map_err(|e| CtlError::Usage(format!("invalid --redis URL {shown}: {e}")))
}

/// How long one command of a [`lasting_client`] may take, reconnection
/// included.
pub(crate) const LASTING_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);

/// The client configuration of `url`, with the CA of `tls_ca` trusted.
fn config(url: &str, tls_ca: Option<&Path>) -> CtlResult<Config> {
    let shown = redact(url);
    let mut config = Config::from_url(url)
        .map_err(|e| CtlError::Usage(format!("invalid --redis URL {shown}: {e}")))?;
    // Without a TLS feature fred would quietly connect in plain text.
    let scheme = url.split("://").next().unwrap_or_default();
    if (scheme.starts_with("rediss") || scheme.starts_with("valkeys")) && !config.uses_tls() {
        return Err(CtlError::Usage(format!(
            "{shown} asks for TLS, which this build of poolctl does not support"
        )));
    }
    if let Some(ca) = tls_ca {
        if !config.uses_tls() {
            return Err(CtlError::Usage(format!(
                "--tls-ca is for rediss:// URLs, not {shown}"
            )));
        }
        config.tls = Some(trusting(ca)?.into());
    }
    Ok(config)
}

/// A TLS connector that trusts the CA certificates in the PEM file `ca`.
fn trusting(ca: &Path) -> CtlResult<fred::types::config::TlsConnector> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let bad = |reason: String| CtlError::Usage(format!("--tls-ca {}: {reason}", ca.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
        roots
            .add(cert.map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config.into())
}

/// A short reason for a failed connection: the OS message of an I/O error
/// (fred's text for it is a debug dump), else fred's text.
fn reason(e: &fred::error::Error) -> String {
    let details = e.details();
    if let Some(start) = details.find("message: \"") {
        let rest = &details[start + 10..];
        if let Some(end) = rest.find('"') {
            return rest[..end].to_string();
        }
    }
    e.to_string()
}

/// `url` with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_shown() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://alice:s3cret@h:1/0"),
            "redis://alice:***@h:1/0"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
    }
}
