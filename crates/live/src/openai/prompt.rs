//! A completion `prompt` read in one pass: text, token ids (stored up to the context length,
//! counted beyond), or a list holding one of these.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::raw::drain_map;

/// A completion prompt as given.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptIn {
    Text(String),
    /// Token ids: the first `max_model_len` kept, and how many there were.
    Tokens {
        ids: Vec<u32>,
        count: u64,
    },
    /// An id that is not a valid `u32`.
    BadId(String),
    /// More than one prompt.
    Batch,
    /// Anything else.
    Invalid,
}

/// A completion `prompt`: text, token ids, or a list holding one of these.
pub(super) struct PromptSeed {
    pub(super) max_model_len: u32,
}

impl<'de> DeserializeSeed<'de> for PromptSeed {
    type Value = PromptIn;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PromptIn, D::Error> {
        d.deserialize_any(self)
    }
}

/// A `prompt` that may be null: null is no prompt, as an absent one (not a JSON error).
pub(super) struct MaybePromptSeed {
    pub(super) max_model_len: u32,
}

impl<'de> DeserializeSeed<'de> for MaybePromptSeed {
    type Value = Option<PromptIn>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<PromptIn>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MaybePromptSeed {
    type Value = Option<PromptIn>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<PromptIn>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<PromptIn>, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<PromptIn>, D::Error> {
        PromptSeed { max_model_len: self.max_model_len }.deserialize(d).map(Some)
    }
}

/// One item of a prompt list.
enum PromptItem {
    /// A token id (or the text of one that is out of range).
    Id(Result<u32, String>),
    Text(String),
    /// A nested list: its own reading as a prompt.
    List(PromptIn),
    Other,
}

struct ItemSeed {
    max_model_len: u32,
}

impl<'de> DeserializeSeed<'de> for ItemSeed {
    type Value = PromptItem;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PromptItem, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed {
    type Value = PromptItem;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token id, a string or a list")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<PromptItem, E> {
        Ok(PromptItem::Id(u32::try_from(v).map_err(|_| v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<PromptItem, E> {
        Ok(PromptItem::Id(u32::try_from(v).map_err(|_| v.to_string())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<PromptItem, E> {
        Ok(PromptItem::Id(Err(Value::from(v).to_string())))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptItem, E> {
        Ok(PromptItem::Text(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<PromptItem, E> {
        Ok(PromptItem::Text(v))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<PromptItem, E> {
        Ok(PromptItem::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<PromptItem, E> {
        Ok(PromptItem::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PromptItem, A::Error> {
        drain_map(map)?;
        Ok(PromptItem::Other)
    }
    /// A nested list must hold token ids.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PromptItem, A::Error> {
        Ok(PromptItem::List(match (PromptSeed { max_model_len: self.max_model_len }).visit_seq(seq)? {
            p @ (PromptIn::Tokens { .. } | PromptIn::BadId(_)) => p,
            _ => PromptIn::Invalid,
        }))
    }
}

impl<'de> Visitor<'de> for PromptSeed {
    type Value = PromptIn;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptIn, E> {
        Ok(PromptIn::Text(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<PromptIn, E> {
        Ok(PromptIn::Text(v))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<PromptIn, E> {
        Ok(PromptIn::Invalid)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<PromptIn, E> {
        Ok(PromptIn::Invalid)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<PromptIn, E> {
        Ok(PromptIn::Invalid)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<PromptIn, E> {
        Ok(PromptIn::Invalid)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PromptIn, A::Error> {
        drain_map(map)?;
        Ok(PromptIn::Invalid)
    }

    /// All numbers: token ids. All strings or lists: a batch, of which only one prompt is
    /// supported. A mixture, or anything else: invalid.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptIn, A::Error> {
        let keep = self.max_model_len as usize;
        let (mut ids, mut count, mut bad_id) = (Vec::new(), 0u64, None);
        let (mut numbers, mut prompts, mut other) = (0u64, Vec::new(), false);
        while let Some(item) = seq.next_element_seed(ItemSeed { max_model_len: self.max_model_len })? {
            match item {
                PromptItem::Id(id) => {
                    numbers += 1;
                    match id {
                        Ok(id) if bad_id.is_none() => {
                            if ids.len() < keep {
                                ids.push(id);
                            }
                            count += 1;
                        }
                        Ok(_) => {}
                        Err(text) => {
                            bad_id.get_or_insert(text);
                        }
                    }
                }
                PromptItem::Text(t) => prompts.push(PromptIn::Text(t)),
                PromptItem::List(p) => prompts.push(p),
                PromptItem::Other => other = true,
            }
            // Only the first of a batch is ever used; the rest only count.
            prompts.truncate(2);
        }
        Ok(match (numbers, prompts.len(), other) {
            (_, _, true) => PromptIn::Invalid,
            (0, 0, false) => PromptIn::Tokens { ids, count },
            (_, 0, false) => match bad_id {
                Some(v) => PromptIn::BadId(v),
                None => PromptIn::Tokens { ids, count },
            },
            (0, 1, false) => prompts.pop().expect("one prompt"),
            (0, _, false) => PromptIn::Batch,
            _ => PromptIn::Invalid,
        })
    }
}
