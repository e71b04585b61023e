//! `quire bookie decommission`: retire a bookie that is still up. Its replicas are copied to
//! other bookies by autorecovery, then its cookie is deleted; the logic is autorecovery's
//! ([`crate::autorecovery::decommission`]), since its workers do the copying.

use anyhow::Result;

pub use crate::autorecovery::DecommissionArgs;

/// Runs `quire bookie decommission`.
pub fn run(args: DecommissionArgs) -> Result<()> {
    crate::autorecovery::decommission(args)
}
