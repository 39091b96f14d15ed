//! leasehold-etcd: being written (see the issue for this backend).
