//! The Redis Cluster harness: three primaries with a replica each form a cluster that serves
//! every slot, a key's slot moves to the replica that takes over, and a write to the wrong node
//! is answered with `MOVED`.

use leasehold_servers::RedisCluster;

#[test]
fn a_cluster_forms_serves_every_slot_and_fails_over_to_a_replica() {
    let cluster = RedisCluster::start(3, 1).expect("the Redis Cluster must start for this test");
    assert_eq!(cluster.nodes().len(), 6);
    let primaries = cluster
        .nodes()
        .iter()
        .filter(|n| n.is_primary().unwrap())
        .count();
    assert_eq!(primaries, 3);
    for node in cluster.nodes() {
        let info = node.command(&["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    // Keys with one hash tag share a node; a write elsewhere is redirected.
    let owner = cluster.primary_for("{lock}:fence").unwrap();
    assert_eq!(owner.port(), cluster.primary_for("{lock}").unwrap().port());
    owner.command(&["SET", "{lock}:fence", "7"]).unwrap();
    let other = cluster
        .nodes()
        .iter()
        .find(|n| n.is_primary().unwrap() && n.port() != owner.port())
        .unwrap();
    let moved = other.command(&["GET", "{lock}:fence"]).unwrap_err();
    assert!(moved.to_string().contains("MOVED"), "{moved}");

    // The replica takes over; the key's slot is now served by it, with the data it replicated.
    let replica = cluster.replica_of(owner).unwrap();
    let replica_port = replica.port();
    // WAIT runs on the primary: it returns once a replica acknowledged the write.
    owner.command(&["WAIT", "1", "1000"]).ok();
    owner.pause().unwrap();
    cluster.take_over(replica).unwrap();
    let now = cluster.primary_for("{lock}:fence").unwrap();
    assert_eq!(now.port(), replica_port);
    assert_eq!(now.command(&["GET", "{lock}:fence"]).unwrap(), "7");
    owner.resume().unwrap();
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
}
