//! Not API: what the `lessons` binary, this workspace's tests, benches and fuzz targets reach
//! inside the library, behind the hidden `__internals` feature. Nothing here is stable; an
//! embedder uses the crate root and the product modules.

/// The wire's routes and bodies.
pub mod contract {
    pub use crate::contract::*;
}
/// The reference's FTS5 prefilter.
pub mod fts {
    pub use crate::fts::*;
}
/// JSON as JavaScript reads and writes it.
pub mod json {
    pub use crate::json::*;
}
/// Every bound of the contract.
pub mod limits {
    pub use crate::limits::*;
}
/// Provenance checks and unions.
pub mod provenance {
    pub use crate::provenance::*;
}
/// The ranking.
pub mod rank {
    pub use crate::rank::*;
}
/// Tokens, the dedup key, the sanitized field, the token estimate.
pub mod text {
    pub use crate::text::*;
}
#[cfg(feature = "server")]
pub use crate::server::metrics::rollup_lines;
/// Where the calling thread's last write to an embedded store spent its time.
pub use crate::store::embedded::phases::{last_write, WritePhases};
pub use crate::time::{day_of, format_day};
/// Days and their formats.
pub mod time {
    pub use crate::time::*;
}
