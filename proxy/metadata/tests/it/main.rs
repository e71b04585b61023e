//! The metadata store's integration tests (embedded store, ZooKeeper store), linked into one test
//! binary.

mod embedded_autorecovery_records;
mod embedded_store_persists_and_compares;
mod golden_records;
mod zookeeper_store;
