//! Fuzz target bodies, shared by `fuzz/` (libFuzzer) and the stable test that replays the
//! committed corpus, so both check the same properties.

use crate::gate::rejection_markers;

/// The gate on arbitrary bytes: total, deterministic, markers in report order without repeats.
pub fn gate(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let markers = rejection_markers(&text);
    assert!(
        markers.windows(2).all(|w| w[0] < w[1]),
        "markers out of order: {markers:?}"
    );
    assert_eq!(
        markers,
        rejection_markers(&text),
        "gate is not deterministic"
    );
}
