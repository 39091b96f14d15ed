//! The Redis Cluster harness: three primaries with a replica each form a cluster that serves
//! every slot, a key's slot moves to the replica that takes over, and a write to the wrong node
//! is answered with `MOVED`.

use leasehold_servers::RedisCluster;

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn a_cluster_forms_serves_every_slot_and_fails_over_to_a_replica() -> TestResult {
    let cluster = RedisCluster::start(3, 1)
        .map_err(|e| format!("the Redis Cluster must start for this test: {e}"))?;
    assert_eq!(cluster.nodes().len(), 6);
    let mut primaries = Vec::new();
    for node in cluster.nodes() {
        if node
            .is_primary()
            .map_err(|e| format!("asking whether node {} is primary: {e}", node.port()))?
        {
            primaries.push(node);
        }
    }
    assert_eq!(primaries.len(), 3);
    for node in cluster.nodes() {
        let info = node
            .command(&["CLUSTER", "INFO"])
            .map_err(|e| format!("CLUSTER INFO: {e}"))?;
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    // Keys with one hash tag share a node; a write elsewhere is redirected.
    let owner = cluster
        .primary_for("{lock}:fence")
        .map_err(|e| format!("the primary for {{lock}}:fence: {e}"))?;
    assert_eq!(
        owner.port(),
        cluster
            .primary_for("{lock}")
            .map_err(|e| format!("the primary for {{lock}}: {e}"))?
            .port()
    );
    owner
        .command(&["SET", "{lock}:fence", "7"])
        .map_err(|e| format!("SET {{lock}}:fence on its primary: {e}"))?;
    let other = primaries
        .iter()
        .find(|n| n.port() != owner.port())
        .ok_or("another primary")?;
    let moved = other
        .command(&["GET", "{lock}:fence"])
        .err()
        .ok_or("GET on another primary: it succeeded")?;
    assert!(moved.to_string().contains("MOVED"), "{moved}");

    // The replica takes over; the key's slot is now served by it, with the data it replicated.
    let replica = cluster
        .replica_of(owner)
        .map_err(|e| format!("the replica of the owner: {e}"))?;
    let replica_port = replica.port();
    // WAIT runs on the primary: it returns once a replica acknowledged the write.
    owner.command(&["WAIT", "1", "1000"]).ok();
    owner
        .pause()
        .map_err(|e| format!("pausing the owner: {e}"))?;
    cluster
        .take_over(replica)
        .map_err(|e| format!("the replica taking over: {e}"))?;
    let now = cluster
        .primary_for("{lock}:fence")
        .map_err(|e| format!("the primary for {{lock}}:fence after the take-over: {e}"))?;
    assert_eq!(now.port(), replica_port);
    assert_eq!(
        now.command(&["GET", "{lock}:fence"])
            .map_err(|e| format!("GET {{lock}}:fence on the new primary: {e}"))?,
        "7"
    );
    owner
        .resume()
        .map_err(|e| format!("resuming the old owner: {e}"))?;
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    Ok(())
}
