//! Behind Sentinel, a lease renewal counts, and a stop's answer stands,
//! only while the Sentinels still name the server it ran on as the
//! primary.
//!
//! A primary that stalls past `down-after-milliseconds` (a paused VM, a
//! swapping host, a `SIGSTOP`) is failed over. When it wakes it still takes
//! itself for the primary and answers the clients still connected to it,
//! until a Sentinel demotes it seconds later. A node on it would renew its
//! lease there while the nodes on the promoted replica take its workers for
//! dead, and a job would run on both sides (the chaos suite's
//! `frozen-failover` with Redis's defaults: 12,968 violations in 6 minutes).
//! `min-replicas-to-write` on the servers closes that door from Redis's
//! side; this closes it from the node's, whatever the servers' settings.
//!
//! After each renewal the node asks every Sentinel which server is the
//! primary (`SENTINEL MASTER`, on one long-lived
//! connection per Sentinel). When most of those that answer name another
//! server than the one the renewal ran on, the renewal does not count: the
//! lease runs out and the jobs stop, as when Redis does not answer, and the
//! node reconnects through the Sentinels. A Sentinel names the promoted
//! replica from the moment it has seen it take the role, before any client
//! can be sent there, and the others learn it from its hello messages at
//! once; so a woken primary's renewals stop counting before the promoted
//! side can move a job. When no Sentinel answers in time, the renewal
//! counts, as without Sentinel: the node cannot tell a lost Sentinel from
//! a lost primary, and refusing would stop every job while Redis holds
//! their leases (a node cut off from every Sentinel together with the old
//! primary is the case `min-replicas-to-write` covers).
//!
//! A `stop_job` answer is judged the same way: the woken primary answers
//! from records the promoted side no longer has (the job runs there,
//! moved to another worker), so an answer from a server the Sentinels no
//! longer name is not returned, and the stop is asked again on the one
//! they name.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::{Builder, ReconnectPolicy, Server};
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::time::Instant;

use crate::node::NodeInner;

/// A connection to each Sentinel of the client's configuration, asked
/// after each renewal and each stop answer.
pub(crate) struct PrimaryCheck {
    sentinels: Vec<Client>,
    service: String,
    timeout: Duration,
    /// When the node last forced its client to reconnect on a verdict.
    pub(crate) last_reconnect: std::sync::Mutex<Option<Instant>>,
    /// When the node last warned that no Sentinel answered.
    last_silence_warning: std::sync::Mutex<Option<Instant>>,
    /// Whether the connections were opened.
    started: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PrimaryCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrimaryCheck")
            .field("sentinels", &self.sentinels.len())
            .field("service", &self.service)
            .finish()
    }
}

/// What the Sentinels said of the server a renewal ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Most of the Sentinels that answered name it the primary.
    Primary,
    /// No Sentinel answered in time, or no server was named by most of
    /// those that did.
    Unknown,
    /// Most of the Sentinels that answered name another server.
    Superseded {
        /// The server most of them name.
        named: String,
    },
}

impl PrimaryCheck {
    /// `None` unless `client` connects through Sentinels. Each Sentinel
    /// gets a client with `client`'s credentials and TLS settings (fred
    /// authenticates to the Sentinels as to the servers) and no database;
    /// `timeout` bounds each question.
    pub(crate) fn for_client(client: &Client, timeout: Duration) -> Option<PrimaryCheck> {
        let config = client.client_config();
        let ServerConfig::Sentinel {
            hosts,
            service_name,
            ..
        } = &config.server
        else {
            return None;
        };
        let mut sentinels = Vec::with_capacity(hosts.len());
        for host in hosts {
            let mut one = config.clone();
            one.server = ServerConfig::Centralized {
                server: host.clone(),
            };
            one.database = None;
            let mut builder = Builder::from_config(one);
            builder.set_connection_config(client.connection_config().clone());
            let mut perf = client.perf_config();
            perf.default_command_timeout = timeout;
            builder.set_performance_config(perf);
            builder.set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
            match builder.build() {
                Ok(sentinel) => sentinels.push(sentinel),
                Err(e) => tracing::warn!(
                    sentinel = %host,
                    error = %e,
                    "no client for a Sentinel: renewals are checked with the others"
                ),
            }
        }
        Some(PrimaryCheck {
            sentinels,
            service: service_name.clone(),
            timeout,
            last_reconnect: std::sync::Mutex::new(None),
            last_silence_warning: std::sync::Mutex::new(None),
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Opens the connections (each retried in the background until the
    /// check is closed), the first time it is called.
    pub(crate) fn start(&self) {
        if self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        for sentinel in &self.sentinels {
            // The connection task ends with `close` (`QUIT`).
            drop(sentinel.connect());
        }
    }

    /// Closes every connection (none were opened: nothing to do).
    pub(crate) async fn close(&self) {
        if !self.started.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        futures::future::join_all(
            self.sentinels
                .iter()
                .map(|s| tokio::time::timeout(Duration::from_secs(1), s.quit())),
        )
        .await;
    }

    /// Asks every Sentinel at once which server is the primary, and judges
    /// `server` by the answers that came within the timeout.
    pub(crate) async fn verdict(&self, server: &Server) -> Verdict {
        let asked = self.sentinels.iter().map(|sentinel| async move {
            let question = sentinel.custom::<Value, _>(
                CustomCommand::new_static("SENTINEL", ClusterHash::FirstKey, false),
                vec!["MASTER", self.service.as_str()],
            );
            match tokio::time::timeout(self.timeout, question).await {
                Ok(Ok(reply)) => primary_named(reply),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a Sentinel did not say which server is the primary");
                    None
                }
                Err(_) => None,
            }
        });
        // Done once a server has the votes of most of all the Sentinels:
        // no later answer can change the verdict, and a Sentinel that is
        // down does not make every check wait out the timeout.
        let mut asked: futures::stream::FuturesUnordered<_> = asked.collect();
        let mut answers = Vec::with_capacity(self.sentinels.len());
        while let Some(answer) = futures::StreamExt::next(&mut asked).await {
            answers.extend(answer);
            if settled(self.sentinels.len(), &answers) {
                break;
            }
        }
        let verdict = judge(&address(server), answers);
        if verdict == Verdict::Unknown
            && once_per(&self.last_silence_warning, SILENCE_WARNING_EVERY)
        {
            tracing::warn!(
                service = %self.service,
                sentinels = self.sentinels.len(),
                timeout = ?self.timeout,
                "no majority of the Sentinels that answered named a primary in time (or none answered): \
                 renewals and stop answers count unchecked, ends wait for a verdict \
                 (a primary that stalled through its failover would not be told apart)"
            );
        }
        verdict
    }
}

/// Whether something the client did was done on the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// On the server the Sentinels name the primary (or no Sentinel is
    /// configured).
    Primary,
    /// Elsewhere, or where is not known: a superseded server, or the
    /// client moved or was not connected.
    Elsewhere,
    /// No majority of the Sentinels that answered named a primary (none
    /// answered in time, or those that did are failing it over).
    Unjudged,
}

impl Judged {
    /// Whether a renewal or a stop answer counts: what no Sentinel could
    /// judge counts, as without Sentinel (refusing it would stop every job,
    /// or every stop, whenever the Sentinels are unreachable).
    pub(crate) fn counts(self) -> bool {
        self != Judged::Elsewhere
    }
}

/// How sure a caller must be of the server its command ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sureness {
    /// A renewal: one the client sent while it was not connected, or
    /// answered before it dropped, counts on the server it is on (or, not
    /// connected now, unchecked): the next renewal is checked, and not
    /// counting it could let every lease lapse through a reconnect.
    Lenient,
    /// An end or a stop answer, which nothing checks again: a command sent
    /// while the client was not connected may have run on a primary that
    /// stalled through its failover (fred sends what it queued to whatever
    /// server it reaches first), and one answered just before the client
    /// dropped cannot be placed either (chaos soak seed 1472: a failure
    /// for good recorded on the woken primary, reported while its client
    /// reconnected, and the run the promoted side had moved started).
    Known,
}

/// Where a command ran, judged from the server the client was on before
/// it was sent and after its answer came.
#[derive(Debug, PartialEq, Eq)]
enum RanOn<'a> {
    /// On this server: the client was on it before and after.
    Server(&'a Server),
    /// Not known: the client changed servers, or (for [`Sureness::Known`])
    /// was not connected before or after.
    Unsure(&'static str),
    /// The client is not connected now ([`Sureness::Lenient`] only).
    NotConnected,
}

fn ran_on<'a>(before: Option<&Server>, after: Option<&'a Server>, sureness: Sureness) -> RanOn<'a> {
    if before.is_some() && after != before {
        return RanOn::Unsure("the client changed servers while it ran");
    }
    let strict = sureness == Sureness::Known;
    if strict && before.is_none() {
        return RanOn::Unsure(
            "the client was not connected when it was sent: it may have run on another server",
        );
    }
    match after {
        Some(server) => RanOn::Server(server),
        None if strict => RanOn::Unsure(
            "the client is not connected now: the server that answered cannot be told",
        ),
        None => RanOn::NotConnected,
    }
}

/// How often, at most, a node warns that no majority of the Sentinels
/// named a primary (or none answered).
const SILENCE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Whether `every` has passed since `last` (then set to now).
pub(crate) fn once_per(last: &std::sync::Mutex<Option<Instant>>, every: Duration) -> bool {
    let mut last = last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_some_and(|at| at.elapsed() < every) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// `host:port` as the Sentinels write it.
pub(crate) fn address(server: &Server) -> String {
    format!("{}:{}", server.host, server.port)
}

/// The `host:port` a `SENTINEL MASTER` reply names the primary (`None`
/// for an error or nil reply: the Sentinel does not monitor the service).
/// A Sentinel that takes that server for down (`s_down`, `o_down`) or is
/// failing it over has no opinion: right after a failover the Sentinels
/// that have not heard of it yet still name the old primary, which they
/// take for down, and counting them sent every node back to it.
fn primary_named(reply: Value) -> Option<String> {
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(fields) => fields
            .chunks_exact(2)
            .filter_map(|kv| Some((kv[0].as_string()?, kv[1].as_string()?)))
            .collect(),
        Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_string()?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let flags = field("flags").unwrap_or("");
    if flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "failover_in_progress"))
    {
        return None;
    }
    Some(format!("{}:{}", field("ip")?, field("port")?))
}

/// Whether one server is named in `answers` by more than half of all
/// `sentinels`: it is then the majority of any answers still to come.
fn settled(sentinels: usize, answers: &[String]) -> bool {
    answers
        .iter()
        .any(|a| answers.iter().filter(|b| *b == a).count() * 2 > sentinels)
}

/// The verdict on `ours` from the Sentinels' answers: a server named by
/// more than half of them wins; without one, nothing is concluded.
fn judge(ours: &str, answers: impl IntoIterator<Item = String>) -> Verdict {
    let answers: Vec<String> = answers.into_iter().collect();
    if answers.is_empty() {
        return Verdict::Unknown;
    }
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for a in &answers {
        *counts.entry(a.as_str()).or_default() += 1;
    }
    match counts.into_iter().find(|(_, n)| *n * 2 > answers.len()) {
        Some((named, _)) if named == ours => Verdict::Primary,
        Some((named, _)) => Verdict::Superseded {
            named: named.to_string(),
        },
        None => Verdict::Unknown,
    }
}

impl NodeInner {
    /// The server this node's commands go to now (`None` while its client
    /// is not connected): taken before a renewal, for
    /// [`NodeInner::renewal_counts`].
    pub(crate) fn commands_server(&self) -> Option<Server> {
        self.primary_check.as_ref()?;
        self.store.client.active_connections().into_iter().next()
    }

    /// Whether a renewal that succeeded on `server` (taken before it was
    /// sent) counts: always without Sentinel; behind Sentinel, unless the
    /// Sentinels name another primary, or the client moved to another
    /// server meanwhile (the renewal may have run on either). A superseded
    /// server makes the client reconnect, through the Sentinels.
    pub(crate) async fn renewal_counts(self: &Arc<Self>, before: Option<&Server>) -> bool {
        self.served_by_primary(before, Sureness::Lenient, "renewal not counted")
            .await
            .counts()
    }

    /// Whether the answer to a stop, asked while the commands went to
    /// `before`, stands: always without Sentinel; behind Sentinel, unless
    /// the Sentinels name another primary than the server that answered
    /// (a primary that stalled through its failover answers from records
    /// the promoted side no longer has: the job may run there, moved to
    /// another worker, chaos soak seed 1450), or the client or the reply
    /// reader moved to another server meanwhile. The caller then asks
    /// again, on the server the Sentinels name. A client-only node opens
    /// its connections to the Sentinels at its first stop.
    pub(crate) async fn stop_answer_stands(self: &Arc<Self>, before: Option<&Server>) -> bool {
        if self.primary_check.is_none() {
            return true;
        }
        if !self
            .served_by_primary(before, Sureness::Known, "stop answer not trusted")
            .await
            .counts()
        {
            return false;
        }
        let commands = self.store.client.active_connections().into_iter().next();
        let replies = self.reader.server();
        if commands.is_some() && replies.is_some() && replies != commands {
            tracing::info!(
                node = %self.id,
                commands = ?commands.as_ref().map(address),
                replies = ?replies.as_ref().map(address),
                "stop answer not trusted: replies are read from another server than the \
                 commands go to; the reader reconnects"
            );
            self.move_reader_soon();
            return false;
        }
        true
    }

    /// Whether what Redis showed of the jobs this node's workers passed on
    /// (`handoffs_ended.lua`, asked while the commands went to `before`)
    /// may be kept: always without Sentinel; behind Sentinel, only an
    /// answer from the server the Sentinels name the primary. A primary
    /// that stalled through its failover shows ends under its own tokens
    /// (a stop's tombstone from its clock), which the promoted side never
    /// issued: made to stand there after the reconnect, such an end
    /// outranked, and took the record of, a run the promoted side had
    /// moved on meanwhile (chaos soak seed 1556).
    pub(crate) async fn handoff_ends_hold(self: &Arc<Self>, before: Option<&Server>) -> bool {
        let judged = self
            .served_by_primary(before, Sureness::Known, "ends of jobs passed on not kept")
            .await;
        judged == Judged::Primary
    }

    /// Where the end of a run, recorded while the commands went to
    /// `before`, stands: always on the primary without Sentinel; behind
    /// Sentinel, [`Judged::Elsewhere`] when the Sentinels name another
    /// primary than the server that recorded it (see
    /// [`NodeInner::stop_answer_stands`]), or the client moved meanwhile,
    /// or was not connected when the end was sent or when it was answered
    /// (it may have run on either server); [`Judged::Unjudged`] when no
    /// majority of the Sentinels that answered named a primary.
    pub(crate) async fn end_judged(self: &Arc<Self>, before: Option<&Server>) -> Judged {
        self.served_by_primary(before, Sureness::Known, "end of a run not trusted")
            .await
    }

    /// Whether what the client did on `before` (taken before it was sent;
    /// `None`: not connected then) was done on the primary: the client is
    /// still on that server and the Sentinels do not name another one (no
    /// answer or no majority concludes nothing: [`Judged::Unjudged`]).
    /// `sureness` says what a client that was not connected before or after
    /// counts as (see [`ran_on`]). `not_counted` begins the log line when
    /// it was not.
    async fn served_by_primary(
        self: &Arc<Self>,
        before: Option<&Server>,
        sureness: Sureness,
        not_counted: &str,
    ) -> Judged {
        let Some(check) = &self.primary_check else {
            return Judged::Primary;
        };
        check.start();
        let current = || self.store.client.active_connections().into_iter().next();
        let after = current();
        let server = match ran_on(before, after.as_ref(), sureness) {
            RanOn::Server(server) => server.clone(),
            RanOn::Unsure(why) => {
                tracing::info!(
                    node = %self.id,
                    before = ?before.map(address),
                    after = ?after.as_ref().map(address),
                    "{not_counted}: {why}"
                );
                return Judged::Elsewhere;
            }
            // Not connected now: the next renewal is checked.
            RanOn::NotConnected => return Judged::Primary,
        };
        let verdict = check.verdict(&server).await;
        if current().as_ref() != Some(&server) {
            tracing::info!(
                node = %self.id,
                server = %address(&server),
                "{not_counted}: the client changed servers while the Sentinels were asked"
            );
            return Judged::Elsewhere;
        }
        match verdict {
            Verdict::Primary => Judged::Primary,
            Verdict::Unknown => Judged::Unjudged,
            Verdict::Superseded { named } => {
                // Tokens taken on that server are not comparable with the
                // promoted side's: the re-assertions that follow the
                // reconnect yield to the runs found there.
                self.store.diverged_for(self.options.worker_ttl * 2);
                tracing::warn!(
                    node = %self.id,
                    server = %address(&server),
                    primary = %named,
                    "{not_counted}: the Sentinels name another server the primary \
                     (this one stalled through its failover?); reconnecting"
                );
                if once_per(&check.last_reconnect, self.options.worker_ttl) {
                    self.reconnect_to_primary();
                }
                Judged::Elsewhere
            }
        }
    }

    /// Behind Sentinel, a `READONLY` refusal of a renewal says the client
    /// is on a replica: a primary demoted after its failover keeps its
    /// clients' connections, and one that came back as a replica may take
    /// new ones before the Sentinels reconfigure it. Nothing else would
    /// move the client (the check above follows renewals that succeed), so
    /// it reconnects through the Sentinels, at most once per TTL.
    pub(crate) fn after_refused_renewal(&self, error: &crate::error::Error) {
        let Some(check) = &self.primary_check else {
            return;
        };
        let crate::error::Error::WritesRefused(refusal) = error else {
            return;
        };
        if refusal.details().starts_with("READONLY")
            && once_per(&check.last_reconnect, self.options.worker_ttl)
        {
            tracing::warn!(
                node = %self.id,
                "the server answers as a replica (READONLY): reconnecting through the Sentinels"
            );
            self.reconnect_to_primary();
        }
    }

    /// Makes the client and the reader reconnect, in the background, each
    /// to the server the Sentinels name now.
    fn reconnect_to_primary(&self) {
        let client = self.store.client.clone();
        let reader = self.reader.clone();
        let timeout = self.options.redis_timeout;
        self.tasks.spawn(async move {
            match tokio::time::timeout(timeout, client.force_reconnection()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "reconnecting failed"),
                Err(_) => tracing::warn!("reconnecting timed out"),
            }
            match tokio::time::timeout(timeout, reader.reconnect()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "the reader's reconnection failed"),
                Err(_) => tracing::warn!("the reader's reconnection timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(port: u16) -> Server {
        Server::new("127.0.0.1", port)
    }

    /// An end or a stop answer counts only where the client was, and is,
    /// known to be: not when it was sent before the client reconnected,
    /// nor when the client dropped before it was judged (a renewal still
    /// counts then: the next one is checked).
    #[test]
    fn only_a_command_known_to_have_run_on_one_server_is_placed() {
        let (a, b) = (server(6379), server(6380));
        assert_eq!(
            ran_on(Some(&a), Some(&a), Sureness::Known),
            RanOn::Server(&a)
        );
        assert_eq!(
            ran_on(Some(&a), Some(&a), Sureness::Lenient),
            RanOn::Server(&a)
        );
        for sureness in [Sureness::Known, Sureness::Lenient] {
            assert!(matches!(
                ran_on(Some(&a), Some(&b), sureness),
                RanOn::Unsure(_)
            ));
            assert!(matches!(ran_on(Some(&a), None, sureness), RanOn::Unsure(_)));
        }
        assert!(matches!(
            ran_on(None, Some(&b), Sureness::Known),
            RanOn::Unsure(_)
        ));
        assert!(matches!(
            ran_on(None, None, Sureness::Known),
            RanOn::Unsure(_)
        ));
        assert_eq!(ran_on(None, Some(&b), Sureness::Lenient), RanOn::Server(&b));
        assert_eq!(ran_on(None, None, Sureness::Lenient), RanOn::NotConnected);
    }

    fn answers(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn most_sentinels_naming_another_server_supersede_ours() {
        let v = judge("10.0.0.1:6379", answers(&["10.0.0.2:6379"; 3]));
        assert_eq!(
            v,
            Verdict::Superseded {
                named: "10.0.0.2:6379".into()
            }
        );
        let v = judge(
            "10.0.0.1:6379",
            answers(&["10.0.0.2:6379", "10.0.0.2:6379", "10.0.0.1:6379"]),
        );
        assert!(matches!(v, Verdict::Superseded { .. }));
    }

    #[test]
    fn one_stale_sentinel_among_more_does_not_supersede() {
        let v = judge(
            "10.0.0.1:6379",
            answers(&[
                "10.0.0.2:6379",
                "10.0.0.1:6379",
                "10.0.0.1:6379",
                "10.0.0.1:6379",
            ]),
        );
        assert_eq!(v, Verdict::Primary);
    }

    #[test]
    fn most_of_all_sentinels_naming_one_server_settles_the_question() {
        assert!(!settled(3, &answers(&["a:1"])));
        assert!(settled(3, &answers(&["a:1", "a:1"])));
        assert!(!settled(3, &answers(&["a:1", "b:2"])));
        assert!(!settled(4, &answers(&["a:1", "a:1"])));
        assert!(settled(4, &answers(&["b:2", "a:1", "a:1", "a:1"])));
        assert!(!settled(3, &[]));
    }

    #[test]
    fn no_answer_or_no_majority_concludes_nothing() {
        assert_eq!(judge("a:1", Vec::new()), Verdict::Unknown);
        assert_eq!(judge("a:1", answers(&["a:1", "b:1"])), Verdict::Unknown);
    }

    #[test]
    fn a_reply_names_host_and_port_unless_that_server_is_down() {
        let reply = |flags: &str| {
            Value::Array(
                [
                    "name",
                    "flotilla",
                    "ip",
                    "127.0.0.1",
                    "port",
                    "6380",
                    "flags",
                    flags,
                ]
                .into_iter()
                .map(Value::from)
                .collect(),
            )
        };
        assert_eq!(
            primary_named(reply("master")).as_deref(),
            Some("127.0.0.1:6380")
        );
        assert_eq!(primary_named(reply("s_down,master")), None);
        assert_eq!(primary_named(reply("s_down,o_down,master")), None);
        assert_eq!(primary_named(reply("master,failover_in_progress")), None);
        assert_eq!(primary_named(Value::Null), None);
    }
}
