//! The Sentinel deployment fails over when its primary is killed, and the
//! old primary comes back as a replica ready for the next failover.

use std::time::{Duration, Instant};

use flotilla_testkit::Sentinels;

#[test]
fn sentinel_promotes_the_replica_when_the_primary_is_killed() {
    let mut ha = Sentinels::start().expect(
        "redis-sentinel (or redis-server) must be installed: apt-get install redis-sentinel",
    );
    let url = ha.url();
    assert!(
        url.starts_with("redis-sentinel://127.0.0.1:") && url.contains("&node="),
        "{url}"
    );
    let first = ha.primary_port().expect("a primary");
    let killed_at = Instant::now();
    assert_eq!(ha.kill_primary().unwrap(), first);
    let second = ha
        .wait_for_failover(first, Duration::from_secs(20))
        .unwrap();
    println!("failover took {:?}", killed_at.elapsed());
    assert_ne!(first, second);
    ha.restart_as_replica(first, Duration::from_secs(20))
        .unwrap();
    let killed = ha.kill_primary().unwrap();
    let third = ha
        .wait_for_failover(killed, Duration::from_secs(20))
        .unwrap();
    // Two servers, so one of the two promotions since the restart was the
    // old primary's: usually this last one (`killed` is `second`). Under
    // load the Sentinels may have failed over once more before the kill (a
    // primary slow to answer within `down_after`), promoting the old
    // primary then; it was `killed` and `second` is promoted now.
    let mut since_the_restart = [killed, third];
    since_the_restart.sort_unstable();
    let mut both = [first, second];
    both.sort_unstable();
    assert_eq!(
        since_the_restart, both,
        "the old primary, back as a replica, is promoted next (killed {killed}, promoted {third}; first {first}, second {second})"
    );
}
