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
    let third = {
        let killed = ha.kill_primary().unwrap();
        ha.wait_for_failover(killed, Duration::from_secs(20))
            .unwrap()
    };
    assert_eq!(
        third, first,
        "the old primary, back as a replica, is promoted next"
    );
}
