//! Not API: what this package's own tests, benches and fuzz targets reach inside the library.
//! Nothing here is stable; an embedder uses the crate root and the product modules.

/// Every bound of the contract.
pub mod limits {
    pub use crate::limits::*;
}
pub use crate::time::{day_of, format_day};
