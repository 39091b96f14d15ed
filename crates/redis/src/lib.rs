//! leasehold-redis: being written (see the issue for this backend).
