//! Prefix-cache block identities.
//!
//! These are the hashes Dynamo's KV router computes, so events produced by the engine can be
//! indexed by a router that hashes the same prompt independently:
//!
//! * the *local* hash of a full block is XXH3-64 (seed 1337) over its tokens as little-endian
//!   `u32`s;
//! * the *sequence* hash chains them: the first block's sequence hash is its local hash, every
//!   later one is XXH3-64 (seed 1337) over `le_u64(parent) ‖ le_u64(local)`.
//!
//! Only full blocks are hashed; a trailing partial block has no identity.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of both the block hash and the chain hash.
pub const HASH_SEED: u64 = 1337;

/// Local hash of one block of tokens.
pub fn local_block_hash(tokens: &[u32]) -> u64 {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: u32 has no padding and any byte pattern is a valid u8; on a little-endian
        // target the in-memory bytes are exactly the little-endian encoding we must hash.
        let bytes = unsafe { std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens)) };
        xxh3_64_with_seed(bytes, HASH_SEED)
    }
    #[cfg(not(target_endian = "little"))]
    {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, HASH_SEED)
    }
}

/// Sequence hash of a block given its parent's sequence hash (None for the first block).
pub fn chain_hash(parent: Option<u64>, local: u64) -> u64 {
    match parent {
        None => local,
        Some(parent) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&parent.to_le_bytes());
            buf[8..].copy_from_slice(&local.to_le_bytes());
            xxh3_64_with_seed(&buf, HASH_SEED)
        }
    }
}

/// Local and sequence hashes of the full blocks of a token sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockHashes {
    pub local: Vec<u64>,
    pub seq: Vec<u64>,
}

impl BlockHashes {
    pub fn len(&self) -> usize {
        self.seq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    /// Appends one full block given its local hash.
    pub fn push_local(&mut self, local: u64) {
        let seq = chain_hash(self.seq.last().copied(), local);
        self.local.push(local);
        self.seq.push(seq);
    }

    /// Hashes every full block of `tokens`.
    pub fn of_tokens(tokens: &[u32], block_size: usize) -> Self {
        let mut out = BlockHashes::default();
        for block in tokens.chunks_exact(block_size) {
            out.push_local(local_block_hash(block));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Golden values from the engine spec (python `xxhash` with the same formula).
    #[test]
    fn golden_hashes_match_dynamo() {
        let tokens: Vec<u32> = (0..8).collect();
        let h = BlockHashes::of_tokens(&tokens, 4);
        assert_eq!(h.local, vec![9143094415614847814, 12124091508212882195]);
        assert_eq!(h.seq, vec![9143094415614847814, 9510318385840434533]);
        let tokens: Vec<u32> = (0..16).collect();
        assert_eq!(local_block_hash(&tokens), 15310707395893867146);
    }

    #[test]
    fn partial_tail_has_no_hash() {
        let tokens: Vec<u32> = (0..15).collect();
        assert!(BlockHashes::of_tokens(&tokens, 16).is_empty());
        let tokens: Vec<u32> = (0..33).collect();
        assert_eq!(BlockHashes::of_tokens(&tokens, 16).len(), 2);
    }
}
