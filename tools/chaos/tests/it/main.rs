//! The chaos runner's integration tests (one test binary; one module per scenario).

mod ci_budget;
mod recovery;
