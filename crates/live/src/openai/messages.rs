//! Chat `messages` read in one pass: each an object with a string `role` and its `content`
//! flattened to text, at most [`MAX_MESSAGES`] of them, every value kept counted by the body's
//! [`Limits`]. With a chat template the messages are kept for it; without one (the built-in
//! tokenizer's plain layout) each is counted into the prompt's tokens as soon as it is read and
//! then dropped, so the request never holds the messages' text.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::raw::{drain_map, drain_seq, Kept, Limits, Raw, Shallow};
use super::ApiError;
use crate::tokenizer::{Counted, PlainChat};

/// A chat's messages as read.
#[derive(Debug)]
pub enum ChatMessages {
    /// Kept for the chat template.
    Kept(Vec<Value>),
    /// The prompt's tokens in the plain layout, counted as the messages were read.
    Counted(Counted),
}

/// Most chat messages one request may have.
pub const MAX_MESSAGES: usize = 65_536;

fn messages_error(message: impl Into<String>) -> ApiError {
    ApiError::field("messages", message)
}

const NOT_A_LIST: &str = "'messages' must be a non-empty list of messages";

/// `messages`: each an object with a string `role`, its `content` flattened to text.
pub(super) struct MessagesSeed<'l> {
    pub(super) limits: &'l Limits,
    /// Count the plain layout's tokens as messages arrive, keeping this many ids, instead of
    /// keeping the messages.
    pub(super) count: Option<usize>,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = Result<ChatMessages, ApiError>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = Result<ChatMessages, ApiError>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut kept = Vec::new();
        let mut plain = self.count.map(PlainChat::new);
        let mut n = 0;
        loop {
            if n == MAX_MESSAGES {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                let message = format!("a request may have at most {MAX_MESSAGES} messages");
                return Err(self.limits.fail(messages_error(message)));
            }
            match seq.next_element_seed(MessageSeed { limits: self.limits, index: n })? {
                None => break,
                Some(Ok(m)) => {
                    n += 1;
                    match plain.as_mut() {
                        Some(p) => p.message(&m),
                        None => kept.push(m),
                    }
                }
                Some(Err(e)) => {
                    drain_seq(seq)?;
                    return Ok(Err(e));
                }
            }
        }
        if n == 0 {
            return Ok(Err(messages_error(NOT_A_LIST)));
        }
        Ok(Ok(match plain {
            Some(p) => ChatMessages::Counted(p.finish()),
            None => ChatMessages::Kept(kept),
        }))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        Ok(Err(messages_error(NOT_A_LIST)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err(messages_error(NOT_A_LIST)))
    }
}

struct MessageSeed<'l> {
    limits: &'l Limits,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = Result<Value, ApiError>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = Result<Value, ApiError>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let i = self.index;
        self.limits.keep("messages")?;
        let mut msg = Map::new();
        let (mut role_ok, mut content) = (false, Ok(String::new()));
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "content" => {
                    content = map.next_value_seed(ContentSeed { index: i })?;
                    self.limits.keep("messages")?;
                    msg.insert(key, Value::Null);
                }
                _ => {
                    let v = map.next_value_seed(Kept { limits: self.limits, param: "messages" })?;
                    if key == "role" {
                        role_ok = v.is_string();
                    }
                    msg.insert(key, v);
                }
            }
        }
        if !role_ok {
            return Ok(Err(messages_error(format!("messages[{i}].role must be a string"))));
        }
        match content {
            Ok(text) => {
                msg.insert("content".into(), Value::String(text));
                Ok(Ok(Value::Object(msg)))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Err(messages_error(format!("messages[{}] must be an object", self.index))))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err(messages_error(format!("messages[{}] must be an object", self.index))))
    }
}

/// A message's `content`: text, null (empty), or a list of text parts joined.
struct ContentSeed {
    index: usize,
}

impl<'de> DeserializeSeed<'de> for ContentSeed {
    type Value = Result<String, ApiError>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl ContentSeed {
    fn wrong(&self) -> ApiError {
        messages_error(format!("messages[{}].content must be a string or a list of parts", self.index))
    }
}

impl<'de> Visitor<'de> for ContentSeed {
    type Value = Result<String, ApiError>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("message content")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Ok(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Ok(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Ok(String::new()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(self.wrong()))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(self.wrong()))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(self.wrong()))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(self.wrong()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        Ok(Err(self.wrong()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut text = String::new();
        while let Some(part) = seq.next_element_seed(Shallow { keep: &["type", "text"] })? {
            match (part.get("type"), part.get("text")) {
                (Some(Raw::Str(t)), Some(Raw::Str(s))) if t == "text" => text.push_str(s),
                _ => {
                    drain_seq(seq)?;
                    let i = self.index;
                    return Ok(Err(messages_error(format!("messages[{i}].content: only text parts are supported"))));
                }
            }
        }
        Ok(Ok(text))
    }
}
