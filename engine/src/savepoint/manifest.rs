//! The manifest's own checksum: `_metadata.json` carries the CRC-32 of its own bytes in its
//! last field, `manifest_crc32` (8 hex digits), computed over the file as written with that
//! field's value set to `00000000`. A reader recomputes it over the bytes as read, so any
//! change to the file (one flipped bit in a source position, a counter or a file's checksum,
//! or the field itself) is refused, naming the file. Manifests of format version 1 (written
//! before the field existed) have none and are read without it.

use std::path::Path;

use super::{FORMAT_VERSION, OLDEST_FORMAT_VERSION, SavepointError, SavepointMetadata};

/// The value the checksum field holds while the checksum is computed.
const PLACEHOLDER: &str = "00000000";
/// The field as `serde_json`'s pretty printer writes it, up to its value.
const FIELD: &str = "\"manifest_crc32\": \"";

/// Encodes `meta` as the bytes of `_metadata.json` with its own checksum.
///
/// # Errors
/// `serde_json`'s error when the metadata cannot be encoded.
pub fn encode(meta: &SavepointMetadata) -> Result<Vec<u8>, serde_json::Error> {
    let mut m = meta.clone();
    m.manifest_crc32 = Some(PLACEHOLDER.into());
    let mut bytes = serde_json::to_vec_pretty(&m)?;
    let crc = format!("{:08x}", crc32fast::hash(&bytes));
    if let Some(at) = value_at(&bytes, PLACEHOLDER) {
        bytes[at..at + PLACEHOLDER.len()].copy_from_slice(crc.as_bytes());
    }
    Ok(bytes)
}

/// Checks the format version and the checksum of manifest `bytes` (read from `path`) whose
/// decoded form is `meta`, and clears the checksum from `meta`. Version 1 manifests carry none.
///
/// # Errors
/// [`SavepointError::Invalid`] naming `path` for a format version this engine does not read,
/// or when the checksum is missing, malformed or does not match the bytes.
pub fn verify(
    path: &Path,
    bytes: &[u8],
    meta: &mut SavepointMetadata,
) -> Result<(), SavepointError> {
    let bad = |reason: String| SavepointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&meta.format_version) {
        return Err(bad(format!(
            "unknown savepoint format version {} (this engine reads {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})",
            meta.format_version
        )));
    }
    let stated = meta.manifest_crc32.take();
    // Version 1 wrote no checksum; one that carries a checksum is checked whatever version it
    // states (a flipped bit in a later version's number must not turn the check off).
    if meta.format_version < 2 && stated.is_none() {
        return Ok(());
    }
    let Some(stated) = stated else {
        return Err(bad(
            "manifest has no checksum (`manifest_crc32`); it was changed after it was written"
                .into(),
        ));
    };
    // Lower-case only, as written: a flipped case bit is a change too.
    let lower_hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    let expected = u32::from_str_radix(&stated, 16)
        .ok()
        .filter(|_| stated.len() == PLACEHOLDER.len() && stated.chars().all(lower_hex))
        .ok_or_else(|| {
            bad(format!(
                "manifest checksum `{stated}` is not 8 lower-case hex digits"
            ))
        })?;
    let Some(at) = value_at(bytes, &stated) else {
        return Err(bad(
            "manifest checksum field is not where the engine writes it; the file was edited".into(),
        ));
    };
    let mut zeroed = bytes.to_vec();
    zeroed[at..at + PLACEHOLDER.len()].copy_from_slice(PLACEHOLDER.as_bytes());
    let actual = crc32fast::hash(&zeroed);
    if actual != expected {
        return Err(bad(format!(
            "manifest checksum mismatch: CRC-32 {actual:08x}, the manifest says {expected:08x} (the file was changed or damaged after it was written)"
        )));
    }
    Ok(())
}

/// Offset of the checksum field's value `value` in `bytes` (its last occurrence).
fn value_at(bytes: &[u8], value: &str) -> Option<usize> {
    let needle = format!("{FIELD}{value}\"");
    let n = needle.len();
    (0..=bytes.len().checked_sub(n)?)
        .rev()
        .find(|&i| &bytes[i..i + n] == needle.as_bytes())
        .map(|i| i + FIELD.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn meta() -> SavepointMetadata {
        let spec = crate::spec::JobSpec::from_yaml(
            "name: j\noperators:\n  - { name: s, kind: source, rate: { constant: 1 } }\n  - { name: k, kind: sink }\nedges:\n  - { from: s, to: k }\n",
        )
        .unwrap();
        let mut m = SavepointMetadata::for_job(&spec, 1_700_000_000_000);
        m.sources.insert(
            "s".into(),
            crate::savepoint::SourcePosition {
                emitted: 4242,
                ..Default::default()
            },
        );
        m
    }

    fn decode(bytes: &[u8]) -> Result<SavepointMetadata, SavepointError> {
        let path = Path::new("chk-1/_metadata.json");
        let mut m: SavepointMetadata =
            serde_json::from_slice(bytes).map_err(|e| SavepointError::Invalid {
                path: path.into(),
                reason: format!("malformed: {e}"),
            })?;
        verify(path, bytes, &mut m)?;
        Ok(m)
    }

    #[test]
    fn round_trips_and_refuses_every_single_bit_flip() {
        let m = meta();
        let bytes = encode(&m).unwrap();
        assert_eq!(decode(&bytes).unwrap(), m);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                let e = decode(&flipped).expect_err(&format!("byte {i} bit {bit} accepted"));
                assert!(e.to_string().contains("chk-1/_metadata.json"), "{e}");
            }
        }
    }

    #[test]
    fn version_1_manifests_have_no_checksum() {
        let mut m = meta();
        m.format_version = 1;
        let bytes = serde_json::to_vec_pretty(&m).unwrap();
        assert_eq!(decode(&bytes).unwrap(), m);
        m.format_version = 2;
        let bytes = serde_json::to_vec_pretty(&m).unwrap();
        let e = decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("manifest has no checksum"), "{e}");
    }
}
