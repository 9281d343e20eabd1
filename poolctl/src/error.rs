//! poolctl's errors and how they map to exit codes.

use std::path::PathBuf;

/// Exit code of a successful run.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code of a failed command (Redis unreachable, not found, ...).
pub(crate) const EXIT_ERROR: u8 = 1;
/// Exit code of a usage error (bad arguments, missing `--yes`).
pub(crate) const EXIT_USAGE: u8 = 2;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    /// The command line cannot be acted on.
    #[error("{0}")]
    Usage(String),
    /// Redis could not be reached.
    #[error("cannot reach Redis at {url}: {reason}")]
    Connect {
        /// The URL, password removed.
        url: String,
        /// Why, in a few words.
        reason: String,
        /// fred's error.
        #[source]
        source: fred::error::Error,
    },
    /// The pool crate failed (Redis errors, refused operations).
    #[error(transparent)]
    Pool(#[from] flotilla_pool::Error),
    /// Something asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A payload file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The terminal could not be driven or output could not be written.
    #[error("terminal error: {0}")]
    Io(#[from] std::io::Error),
}

impl CtlError {
    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CtlError::Usage(_) => EXIT_USAGE,
            _ => EXIT_ERROR,
        }
    }
}

/// Result of a poolctl command.
pub(crate) type CtlResult<T = ()> = Result<T, CtlError>;
