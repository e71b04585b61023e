//! The test kit's own tests (its ZooKeeper server and TCP relay), linked into one test binary.

mod tcp_relay;
mod zookeeper_server;
