//! What a plugin ConfigMap holds, turned into component bytes: the one `.wasm` (or
//! `.wasm.gz`) key of its `binaryData`, decompressed within bounds, its pinned digest checked.

use std::io::Read;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use super::DIGEST_ANNOTATION;
use crate::plugin::runtime::hex_digest;

/// A ConfigMap holds at most 1 MiB; a decompressed component may be larger, up to this.
pub const MAX_COMPONENT_BYTES: u64 = 16 << 20;

/// Why a ConfigMap could not be turned into component bytes.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// No `binaryData` key ending in `.wasm` or `.wasm.gz`.
    #[error("binaryData holds no key ending in .wasm or .wasm.gz (keys: {0})")]
    NoComponent(String),
    /// More than one candidate key.
    #[error("binaryData holds more than one component ({0}); keep exactly one")]
    Ambiguous(String),
    /// gzip data is corrupt or too large.
    #[error("binaryData.{key}: {reason}")]
    Gzip {
        /// The key.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// The pinned digest does not match.
    #[error("annotation {DIGEST_ANNOTATION} pins {expected} but the component's SHA-256 is {actual}")]
    Digest {
        /// The pinned digest.
        expected: String,
        /// The actual digest.
        actual: String,
    },
}

/// The component bytes of a plugin ConfigMap: decompressed and digest-checked.
pub fn decode(cm: &ConfigMap) -> Result<Vec<u8>, DecodeError> {
    let data = cm.binary_data.clone().unwrap_or_default();
    let candidates: Vec<&String> = data.keys().filter(|k| k.ends_with(".wasm") || k.ends_with(".wasm.gz")).collect();
    let key = match candidates.as_slice() {
        [key] => (*key).clone(),
        [] => return Err(DecodeError::NoComponent(data.keys().cloned().collect::<Vec<_>>().join(", "))),
        many => return Err(DecodeError::Ambiguous(many.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "))),
    };
    let raw = &data[&key].0;
    let bytes = if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .take(MAX_COMPONENT_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| DecodeError::Gzip { key: key.clone(), reason: e.to_string() })?;
        if out.len() as u64 > MAX_COMPONENT_BYTES {
            return Err(DecodeError::Gzip { key, reason: format!("decompresses to more than {MAX_COMPONENT_BYTES} bytes") });
        }
        out
    } else {
        raw.clone()
    };
    if let Some(expected) = cm.annotations().get(DIGEST_ANNOTATION) {
        let actual = hex_digest(&bytes);
        if !expected.trim().eq_ignore_ascii_case(&actual) {
            return Err(DecodeError::Digest { expected: expected.clone(), actual });
        }
    }
    Ok(bytes)
}
