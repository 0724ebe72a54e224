//! Native VL replay: the vision tower on the SGLang worker (aisimulate 0.13's `vision`).
//!
//! Every prompt starts with its images, `image_tokens` tokens each; an image is named by its
//! first token, so identical images (an identity pool) have identical tokens and hit the radix
//! cache like any prefix. A prefill pass encodes the distinct images whose tokens its chunks
//! compute (a chunk that reaches part of an image needs all of it), except those the embedding
//! cache holds, in one call of the tower; the call's time is added to the pass. The embedding
//! cache holds whole images' embeddings (`image_bytes` each) up to `cache_bytes`, least
//! recently used first out; a pass looks its images up (a hit refreshes), then stores those it
//! encoded.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::config::VisionSettings;
use crate::request::Prompt;

/// SGLang's multimodal embedding cache, keyed by image.
#[derive(Debug)]
pub(super) struct EmbeddingCache {
    /// How many images fit (`cache_bytes / image_bytes`).
    slots: u64,
    /// Image → its last use, and last use → image (oldest first).
    used: FxHashMap<u32, u64>,
    order: BTreeMap<u64, u32>,
    clock: u64,
}

impl EmbeddingCache {
    pub(super) fn new(v: &VisionSettings) -> Self {
        let slots = v.cache_bytes.checked_div(v.image_bytes).unwrap_or(0);
        EmbeddingCache { slots, used: FxHashMap::default(), order: BTreeMap::new(), clock: 0 }
    }

    /// Whether the cache holds `image`, refreshing it if so.
    fn hit(&mut self, image: u32) -> bool {
        let Some(at) = self.used.get_mut(&image) else { return false };
        self.order.remove(at);
        self.clock += 1;
        *at = self.clock;
        self.order.insert(self.clock, image);
        true
    }

    /// Stores an encoded image, evicting the least recently used ones to make room.
    fn store(&mut self, image: u32) {
        if self.slots == 0 || self.hit(image) {
            return;
        }
        while self.used.len() as u64 >= self.slots {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.used.remove(&oldest);
        }
        self.clock += 1;
        self.used.insert(image, self.clock);
        self.order.insert(self.clock, image);
    }
}

/// The images a pass must encode, in the order its chunks reach them.
#[derive(Debug, Default)]
pub(super) struct PassImages {
    needed: Vec<u32>,
}

impl PassImages {
    pub(super) fn clear(&mut self) {
        self.needed.clear();
    }

    /// A chunk computing prompt tokens `start..end` of `prompt`: the images it reaches.
    pub(super) fn chunk(&mut self, v: &VisionSettings, prompt: &Prompt, start: u32, end: u32) {
        let span = v.image_tokens;
        if span == 0 {
            return;
        }
        let images_end = span.saturating_mul(v.images_per_request).min(prompt.len());
        let mut first = start / span;
        while first * span < end.min(images_end) {
            let image = prompt.token(first * span);
            if !self.needed.contains(&image) {
                self.needed.push(image);
            }
            first += 1;
        }
    }

    /// Looks the pass's images up in `cache` and stores the missed ones: how many the tower
    /// encodes.
    pub(super) fn encode(&self, cache: &mut EmbeddingCache) -> u32 {
        let missed: Vec<u32> = self.needed.iter().copied().filter(|&i| !cache.hit(i)).collect();
        for &image in &missed {
            cache.store(image);
        }
        missed.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cache_images: u64) -> VisionSettings {
        VisionSettings { image_tokens: 4, images_per_request: 2, image_bytes: 8, cache_bytes: 8 * cache_images }
    }

    fn prompt(a: u32, b: u32, text: u32) -> Prompt {
        let mut t = vec![a, a + 1, a + 2, a + 3, b, b + 1, b + 2, b + 3];
        t.extend(1000..1000 + text);
        Prompt::Tokens(t.into())
    }

    #[test]
    fn a_chunk_needs_every_image_it_reaches_once() {
        let v = settings(4);
        let p = prompt(10, 20, 5);
        let mut pass = PassImages::default();
        pass.chunk(&v, &p, 0, 3);
        assert_eq!(pass.needed, vec![10]);
        pass.chunk(&v, &p, 3, 5);
        assert_eq!(pass.needed, vec![10, 20], "an image is needed once per pass");
        pass.clear();
        pass.chunk(&v, &p, 8, 13);
        assert!(pass.needed.is_empty(), "text tokens need no image");
        let same = prompt(10, 10, 0);
        pass.chunk(&v, &same, 0, 8);
        assert_eq!(pass.needed, vec![10], "identical images are encoded once");
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_images() {
        let v = settings(2);
        let mut cache = EmbeddingCache::new(&v);
        let mut pass = PassImages::default();
        let mut encode = |images: &[u32]| {
            pass.clear();
            pass.needed.extend_from_slice(images);
            pass.encode(&mut cache)
        };
        assert_eq!(encode(&[1, 2]), 2);
        assert_eq!(encode(&[1]), 0, "held");
        assert_eq!(encode(&[3]), 1, "evicts 2, the least recently used");
        assert_eq!(encode(&[1, 3]), 0);
        assert_eq!(encode(&[2]), 1);
        let mut none = EmbeddingCache::new(&settings(0));
        pass.clear();
        pass.needed.push(1);
        assert_eq!((pass.encode(&mut none), pass.encode(&mut none)), (1, 1), "a zero cache holds nothing");
        let partial = VisionSettings { cache_bytes: 15, ..v };
        assert_eq!(EmbeddingCache::new(&partial).slots, 1, "only whole images fit");
    }
}
