//! leasehold-zookeeper: being written (see the issue for this backend).
