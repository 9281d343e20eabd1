//! Where the homes are: [`HomeConfig`] (one Redis URL and pool name) and
//! [`MultiHomeConfig`] (the list, from code or from the environment).

use fred::types::config::Config;

/// Environment variable with the homes' Redis URLs, comma-separated.
pub const REDIS_URLS_VAR: &str = "FLOTILLA_REDIS_URLS";
/// Optional environment variable with one pool name per URL, comma-separated.
pub const POOLS_VAR: &str = "FLOTILLA_POOLS";

/// A configuration of homes that cannot be used. Positions are 1-based, as
/// a person counts the entries of a comma-separated list.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No home was given (`FLOTILLA_REDIS_URLS` unset or empty).
    #[error("no home configured: set {0} to comma-separated Redis URLs")]
    NoHomes(&'static str),
    /// The URL and pool lists have different lengths.
    #[error("{urls} Redis URLs but {pools} pool names: give one pool per URL (or none)")]
    LengthMismatch {
        /// Number of URLs.
        urls: usize,
        /// Number of pool names.
        pools: usize,
    },
    /// An entry of a list is empty (`a,,b`).
    #[error("entry {position} of {list} is empty")]
    EmptyEntry {
        /// Which list.
        list: &'static str,
        /// 1-based position.
        position: usize,
    },
    /// A URL could not be parsed. The URL is shown with its password masked.
    #[error("Redis URL {position} ({url}) is invalid: {source}")]
    BadUrl {
        /// 1-based position.
        position: usize,
        /// The URL with any password replaced by `***`.
        url: String,
        /// fred's parse error.
        #[source]
        source: fred::error::Error,
    },
    /// A `rediss://` URL, but this build's Redis client has no TLS support:
    /// connecting would silently fall back to plain text, so it is refused.
    #[error(
        "Redis URL {position} ({url}) asks for TLS but the Redis client was built without a TLS feature (enable the `tls` feature of flotilla-pool)"
    )]
    TlsUnavailable {
        /// 1-based position.
        position: usize,
        /// The URL with any password replaced by `***`.
        url: String,
    },
    /// A pool or home name is invalid.
    #[error("home {position}: invalid {what} {value:?}: {reason}")]
    BadName {
        /// 1-based position.
        position: usize,
        /// "pool name" or "home name".
        what: &'static str,
        /// The offending value (truncated to 64 chars).
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Two homes have the same name.
    #[error("home {position} has the name {name:?} of an earlier home")]
    DuplicateName {
        /// 1-based position of the second one.
        position: usize,
        /// The shared name.
        name: String,
    },
}

/// One home: a Redis deployment and the pool served there.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HomeConfig {
    /// Redis URL (`redis://`, `rediss://` for TLS, credentials inside:
    /// `redis://user:pass@host:6379/0`; cluster and sentinel URLs as fred
    /// reads them).
    pub url: String,
    /// The pool's name on that deployment.
    pub pool: String,
    /// The home's name: prefixes job keys handed to the handler
    /// (`<name>/<key>`), labels logs and metrics. Default: `home<N>`,
    /// N its 1-based position.
    pub name: Option<String>,
}

impl std::fmt::Debug for HomeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HomeConfig")
            .field("url", &redact(&self.url))
            .field("pool", &self.pool)
            .field("name", &self.name)
            .finish()
    }
}

impl HomeConfig {
    /// A home at `url` serving `pool`.
    pub fn new(url: impl Into<String>, pool: impl Into<String>) -> Self {
        HomeConfig {
            url: url.into(),
            pool: pool.into(),
            name: None,
        }
    }

    /// Names the home (default `home<N>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// The homes of a multi-home worker, in order.
///
/// ```
/// use flotilla_pool::multihome::MultiHomeConfig;
///
/// let config = MultiHomeConfig::from_lists(
///     "redis://a:6379, redis://user:secret@b:6380/0",
///     Some("billing,billing-eu"),
///     "billing",
/// ).unwrap();
/// assert_eq!(config.homes().len(), 2);
/// assert_eq!(config.homes()[1].pool, "billing-eu");
/// assert_eq!(config.home_names(), ["home1", "home2"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiHomeConfig {
    homes: Vec<HomeConfig>,
}

impl MultiHomeConfig {
    /// Checks and takes a list of homes.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad home (1-based).
    pub fn new(homes: Vec<HomeConfig>) -> Result<Self, ConfigError> {
        if homes.is_empty() {
            return Err(ConfigError::NoHomes(REDIS_URLS_VAR));
        }
        let config = MultiHomeConfig { homes };
        let mut seen = std::collections::HashSet::new();
        for (i, home) in config.homes.iter().enumerate() {
            let position = i + 1;
            check_url(position, &home.url)?;
            check_name(position, "pool name", &home.pool)?;
            let name = config.home_name(i);
            check_name(position, "home name", &name)?;
            if name.contains('/') {
                return Err(ConfigError::BadName {
                    position,
                    what: "home name",
                    value: name.chars().take(64).collect(),
                    reason: "must not contain '/'",
                });
            }
            if !seen.insert(name.clone()) {
                return Err(ConfigError::DuplicateName { position, name });
            }
        }
        Ok(config)
    }

    /// Reads `FLOTILLA_REDIS_URLS` (comma-separated Redis URLs) and the
    /// optional `FLOTILLA_POOLS` (comma-separated pool names, one per URL;
    /// when unset every home serves `default_pool`).
    ///
    /// # Errors
    /// [`ConfigError::NoHomes`] when the URL list is unset or empty,
    /// [`ConfigError::LengthMismatch`], and the errors of
    /// [`from_lists`](Self::from_lists).
    pub fn from_env(default_pool: &str) -> Result<Self, ConfigError> {
        let urls = std::env::var(REDIS_URLS_VAR).unwrap_or_default();
        let pools = std::env::var(POOLS_VAR)
            .ok()
            .filter(|p| !p.trim().is_empty());
        Self::from_lists(&urls, pools.as_deref(), default_pool)
    }

    /// Parses comma-separated URLs and optional comma-separated pool names
    /// (the parsing behind [`from_env`](Self::from_env)). Entries are
    /// trimmed.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad entry (1-based).
    pub fn from_lists(
        urls: &str,
        pools: Option<&str>,
        default_pool: &str,
    ) -> Result<Self, ConfigError> {
        if urls.trim().is_empty() {
            return Err(ConfigError::NoHomes(REDIS_URLS_VAR));
        }
        let urls = split_list(REDIS_URLS_VAR, urls)?;
        let pools = match pools {
            Some(list) => split_list(POOLS_VAR, list)?,
            None => vec![default_pool; urls.len()],
        };
        if pools.len() != urls.len() {
            return Err(ConfigError::LengthMismatch {
                urls: urls.len(),
                pools: pools.len(),
            });
        }
        Self::new(
            urls.into_iter()
                .zip(pools)
                .map(|(url, pool)| HomeConfig::new(url, pool))
                .collect(),
        )
    }

    /// The homes, in order.
    pub fn homes(&self) -> &[HomeConfig] {
        &self.homes
    }

    /// The homes' names, in order (defaults filled in).
    pub fn home_names(&self) -> Vec<String> {
        (0..self.homes.len()).map(|i| self.home_name(i)).collect()
    }

    pub(crate) fn home_name(&self, index: usize) -> String {
        self.homes[index]
            .name
            .clone()
            .unwrap_or_else(|| format!("home{}", index + 1))
    }

    /// The fred config of home `index` (checked in `new`).
    pub(crate) fn fred_config(&self, index: usize) -> Result<Config, ConfigError> {
        check_url(index + 1, &self.homes[index].url)
    }
}

/// Splits a comma-separated list, refusing empty entries.
fn split_list<'a>(list: &'static str, raw: &'a str) -> Result<Vec<&'a str>, ConfigError> {
    raw.split(',')
        .enumerate()
        .map(|(i, entry)| {
            let entry = entry.trim();
            if entry.is_empty() {
                Err(ConfigError::EmptyEntry {
                    list,
                    position: i + 1,
                })
            } else {
                Ok(entry)
            }
        })
        .collect()
}

fn check_url(position: usize, url: &str) -> Result<Config, ConfigError> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or_default();
    if !(scheme.starts_with("redis") || scheme.starts_with("valkey")) {
        return Err(ConfigError::BadUrl {
            position,
            url: redact(url),
            source: fred::error::Error::new(
                fred::error::ErrorKind::Config,
                "expected a redis://, rediss://, valkey:// or valkeys:// URL (cluster and sentinel variants too)",
            ),
        });
    }
    let config = Config::from_url(url).map_err(|source| ConfigError::BadUrl {
        position,
        url: redact(url),
        source,
    })?;
    if (scheme.starts_with("rediss") || scheme.starts_with("valkeys")) && !config.uses_tls() {
        return Err(ConfigError::TlsUnavailable {
            position,
            url: redact(url),
        });
    }
    Ok(config)
}

fn check_name(position: usize, what: &'static str, value: &str) -> Result<(), ConfigError> {
    flotilla_rmap::check_name(value).map_err(|reason| ConfigError::BadName {
        position,
        what,
        value: value.chars().take(64).collect(),
        reason,
    })
}

/// `url` with the password (if any) replaced by `***`, for logs and errors.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None if userinfo.is_empty() => url.to_string(),
        // `redis://password@host` is how some write a password alone.
        None => format!("{scheme}://***@{host}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_pair_up_in_order() {
        let c =
            MultiHomeConfig::from_lists(" redis://a:1 ,redis://b:2", Some("p1, p2"), "x").unwrap();
        let pairs: Vec<_> = c
            .homes()
            .iter()
            .map(|h| (h.url.as_str(), h.pool.as_str()))
            .collect();
        assert_eq!(pairs, [("redis://a:1", "p1"), ("redis://b:2", "p2")]);
    }

    #[test]
    fn pools_default_when_absent() {
        let c = MultiHomeConfig::from_lists("redis://a:1,redis://b:2", None, "jobs").unwrap();
        assert!(c.homes().iter().all(|h| h.pool == "jobs"));
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let e =
            MultiHomeConfig::from_lists("redis://a:1,redis://b:2", Some("p1"), "x").unwrap_err();
        assert!(
            matches!(e, ConfigError::LengthMismatch { urls: 2, pools: 1 }),
            "{e}"
        );
        let e = MultiHomeConfig::from_lists("redis://a:1", Some("p1,p2,p3"), "x").unwrap_err();
        assert!(
            matches!(e, ConfigError::LengthMismatch { urls: 1, pools: 3 }),
            "{e}"
        );
    }

    #[test]
    fn bad_url_names_its_position() {
        let e =
            MultiHomeConfig::from_lists("redis://a:1,redis://b:2,http://c", None, "x").unwrap_err();
        assert!(matches!(e, ConfigError::BadUrl { position: 3, .. }), "{e}");
        assert!(e.to_string().contains("URL 3"), "{e}");
        let e = MultiHomeConfig::from_lists("redis://a:notaport", None, "x").unwrap_err();
        assert!(matches!(e, ConfigError::BadUrl { position: 1, .. }), "{e}");
    }

    #[test]
    fn errors_never_show_passwords() {
        let e =
            MultiHomeConfig::from_lists("redis://a:1,http://u:hunter2@c", None, "x").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("u:***@c") && !text.contains("hunter2"),
            "{text}"
        );
        let c = MultiHomeConfig::from_lists("redis://u:hunter2@a:1", None, "x").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn tls_without_tls_support_is_refused() {
        // Without a TLS feature in fred a rediss:// URL would quietly
        // connect in plain text, so it must be refused; with one, accepted.
        let tls_built_in = Config::from_url("rediss://h:1").unwrap().uses_tls();
        match MultiHomeConfig::from_lists("redis://a:1,rediss://u:p@b:2", None, "x") {
            Ok(_) => assert!(tls_built_in),
            Err(e) => {
                assert!(!tls_built_in);
                assert!(
                    matches!(e, ConfigError::TlsUnavailable { position: 2, .. }),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn sentinel_urls_are_accepted() {
        let c = MultiHomeConfig::from_lists(
            "redis://a:1,redis-sentinel://u:pw@s1:26379?sentinelServiceName=m&node=s2:26379",
            None,
            "x",
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("pw"));
    }

    #[test]
    fn empty_entries_and_lists_are_refused() {
        let e = MultiHomeConfig::from_lists("redis://a:1,,redis://b:2", None, "x").unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::EmptyEntry {
                    position: 2,
                    list: REDIS_URLS_VAR
                }
            ),
            "{e}"
        );
        let e = MultiHomeConfig::from_lists("redis://a:1", Some(" "), "x").unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::EmptyEntry {
                    position: 1,
                    list: POOLS_VAR
                }
            ),
            "{e}"
        );
        let e = MultiHomeConfig::from_lists("  ", None, "x").unwrap_err();
        assert!(matches!(e, ConfigError::NoHomes(_)), "{e}");
    }

    #[test]
    fn bad_pool_names_and_duplicates_are_refused() {
        let e = MultiHomeConfig::from_lists("redis://a:1,redis://b:2", Some("ok,b{ad}"), "x")
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::BadName {
                    position: 2,
                    what: "pool name",
                    ..
                }
            ),
            "{e}"
        );
        let e = MultiHomeConfig::new(vec![
            HomeConfig::new("redis://a:1", "p").name("eu"),
            HomeConfig::new("redis://b:1", "p").name("eu"),
        ])
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::DuplicateName { position: 2, .. }),
            "{e}"
        );
        let e = MultiHomeConfig::new(vec![HomeConfig::new("redis://a:1", "p").name("a/b")])
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::BadName {
                    what: "home name",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn redact_masks_only_the_password() {
        assert_eq!(redact("redis://u:p@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("redis://secret@h:1"), "redis://***@h:1");
    }
}
