//! Quire stream layer and proxy (being written).

pub mod dlsn;
pub mod error;
pub mod protocol;
pub mod record_set;

pub use dlsn::{Dlsn, ParseDlsnError, ReadPosition};
pub use error::{Error, ErrorCode, Result};
pub use record_set::{ENTRY_SIZE_BYTES_MAX, RECORD_SIZE_BYTES_MAX};
pub mod client;
pub mod types;
pub use client::{ClientConfig, ProxyClient};
pub use types::{ReadBatch, WriteResult};
