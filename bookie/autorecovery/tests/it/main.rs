//! quire-autorecovery's integration tests: the auditor, the replication worker, decommission
//! and the daemon, on the embedded metadata store with real in-process bookies (one shard,
//! O_DIRECT files under a temporary directory, 127.0.0.1).

mod auditor;
mod common;
mod daemon;
mod decommission;
mod worker;
