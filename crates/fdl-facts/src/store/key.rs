//! A build's key: the SHA-256 of its named inputs, serialized one way. The inputs are a
//! flat map of named strings (sorted, so the JSON of the map is canonical), handed down
//! by the build pipeline (`pipeline::key`, floor 4, which reads them from the plan and the
//! backend's probes); the store only hashes, parses and shows them.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The named inputs a key is made of, as `fdl store list` and the manifest show them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyInputs(pub BTreeMap<String, String>);

/// A key: 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Key(String);

impl Key {
    pub fn of(inputs: &KeyInputs) -> Key {
        // A BTreeMap serializes in key order, without whitespace: one text per input set.
        let text = serde_json::to_string(&inputs.0).unwrap_or_default();
        Key(crate::digest::sha256_hex(text.as_bytes()))
    }

    pub fn parse(text: &str) -> Result<Key> {
        if text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Key(text.to_string()))
        } else {
            bail!(
                "'{}' is not a store key: a key is 64 lowercase hex digits, as `fdl store list` shows it",
                crate::text::clean(&text.chars().take(80).collect::<String>())
            )
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 16 digits, as lists show a key.
    pub fn short(&self) -> &str {
        &self.0[..16]
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Key {
    type Error = String;
    fn try_from(s: String) -> Result<Key, String> {
        Key::parse(&s).map_err(|e| e.to_string())
    }
}

impl From<Key> for String {
    fn from(k: Key) -> String {
        k.0
    }
}
