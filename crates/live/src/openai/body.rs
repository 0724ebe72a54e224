//! Reading a request body in one streaming pass with serde, keeping only what the request needs.
//!
//! The body is never turned into a `serde_json::Value` tree as a whole: a 32 MB body of tiny
//! chat messages is ~1 M small maps as a tree (over a gigabyte). Instead each known field is
//! read by its own visitor: scalars become a small [`Raw`] (arrays and objects in them are
//! skipped, only their kind is kept), token ids go straight into a `Vec<u32>` (no more than the
//! context length is stored), chat messages are kept as values but at most [`MAX_MESSAGES`] of
//! them, and every value kept for the chat template (messages, `tools`,
//! `chat_template_kwargs`) counts against [`MAX_KEPT_VALUES`]. Unknown fields are skipped
//! without allocating (vLLM ignores them too).
//!
//! Type errors are recorded per field and reported later, in the order [`super::request`] checks
//! fields, so which error a bad body gets does not depend on the order of its keys. Only
//! exceeding a limit stops reading at once.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::ApiError;

/// Most chat messages one request may have.
pub const MAX_MESSAGES: usize = 65_536;
/// Most JSON values (each object, array, string, number...) a request may keep for the chat
/// template, all messages, `tools` and `chat_template_kwargs` together.
pub const MAX_KEPT_VALUES: usize = 1 << 19;

/// A field's value, shallowly: arrays and objects are only described.
#[derive(Clone, Debug, PartialEq)]
pub enum Raw {
    Null,
    Bool(bool),
    /// An integer (an unsigned one above `i64::MAX` is clamped to it).
    Int(i64),
    Float(f64),
    Str(String),
    /// An array: whether all its items are strings, and whether one is `"worker_id"`.
    Seq { all_strings: bool, worker_id: bool },
    /// An object (its entries when read with [`Shallow`], else none).
    Map(Vec<(String, Raw)>),
}

impl Raw {
    pub fn is_null(&self) -> bool {
        matches!(self, Raw::Null)
    }

    /// The entry `key` of an object read with [`Shallow`].
    pub fn get(&self, key: &str) -> Option<&Raw> {
        match self {
            Raw::Map(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// A completion prompt as given.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptIn {
    Text(String),
    /// Token ids: the first `max_model_len` kept, and how many there were.
    Tokens { ids: Vec<u32>, count: u64 },
    /// An id that is not a valid `u32`.
    BadId(String),
    /// More than one prompt.
    Batch,
    /// Anything else.
    Invalid,
}

/// The request's fields as read.
#[derive(Default, Debug)]
pub struct Body {
    /// Scalar and small object fields by name (the last occurrence of a key wins).
    pub fields: Vec<(&'static str, Raw)>,
    pub prompt: Option<PromptIn>,
    pub messages: Option<Result<Vec<Value>, ApiError>>,
    pub tools: Option<Value>,
    pub chat_template_kwargs: Option<Value>,
}

impl Body {
    /// A field, `None` when absent or null.
    pub fn get(&self, key: &str) -> Option<&Raw> {
        self.fields.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v).filter(|v| !v.is_null())
    }
}

/// Fields read as [`Raw`] scalars, for both endpoints.
const SCALARS: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "top_k",
    "seed",
    "ignore_eos",
    "stop",
    "n",
    "best_of",
    "logprobs",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
];
const CHAT_SCALARS: &[&str] = &["top_logprobs", "add_generation_prompt"];
const COMPLETION_SCALARS: &[&str] = &["echo"];
/// Small objects whose named entries are kept.
const OBJECTS: &[(&str, &[&str])] = &[
    ("stream_options", &["continuous_usage_stats", "include_usage"]),
    ("nvext", &["ignore_eos", "extra_fields", "backend_instance_id"]),
    ("kv_transfer_params", &["do_remote_prefill"]),
];

/// Reads `body`. `Err` is a body that is not a JSON object (or not JSON), or one over a limit.
pub fn read(body: &[u8], chat: bool, max_model_len: u32) -> Result<Body, ApiError> {
    let limits = Limits { fatal: RefCell::new(None), kept: Cell::new(MAX_KEPT_VALUES) };
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    let not_json = |e: serde_json::Error| ApiError::bad(format!("the request body is not valid JSON: {e}"));
    if first != Some(&b'{') {
        // Not an object: say whether it is JSON at all.
        serde_json::from_slice::<IgnoredAny>(body).map_err(not_json)?;
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    // Skipped values are not checked for UTF-8 by serde_json: check the whole body first.
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad(format!("the request body is not valid JSON: invalid UTF-8 at byte {}", e.valid_up_to()))
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let result = (&mut de).deserialize_map(BodyVisitor { limits: &limits, chat, max_model_len }).and_then(|b| {
        de.end()?;
        Ok(b)
    });
    if let Some(e) = limits.fatal.into_inner() {
        return Err(e);
    }
    result.map_err(not_json)
}

struct Limits {
    /// An exceeded limit: reading stopped.
    fatal: RefCell<Option<ApiError>>,
    /// Values that may still be kept.
    kept: Cell<usize>,
}

impl Limits {
    fn fail<E: de::Error>(&self, e: ApiError) -> E {
        let message = e.message.clone();
        self.fatal.borrow_mut().get_or_insert(e);
        E::custom(message)
    }

    fn keep<E: de::Error>(&self, param: &str) -> Result<(), E> {
        match self.kept.get() {
            0 => Err(self.fail(ApiError::field(
                param,
                format!("the request keeps more than {MAX_KEPT_VALUES} JSON values for the chat template"),
            ))),
            n => {
                self.kept.set(n - 1);
                Ok(())
            }
        }
    }
}

struct BodyVisitor<'l> {
    limits: &'l Limits,
    chat: bool,
    max_model_len: u32,
}

impl<'de> Visitor<'de> for BodyVisitor<'_> {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut body = Body::default();
        let chat = self.chat;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let key = key.as_ref();
            let scalar = SCALARS
                .iter()
                .chain(if chat { CHAT_SCALARS } else { COMPLETION_SCALARS })
                .find(|k| **k == key);
            if let Some(&k) = scalar {
                body.fields.push((k, map.next_value::<Raw>()?));
            } else if let Some(&(k, keep)) = OBJECTS.iter().find(|(k, _)| *k == key) {
                body.fields.push((k, map.next_value_seed(Shallow { keep })?));
            } else if chat && key == "messages" {
                body.messages = Some(map.next_value_seed(MessagesSeed { limits: self.limits })?);
            } else if chat && (key == "tools" || key == "chat_template_kwargs") {
                let param = if key == "tools" { "tools" } else { "chat_template_kwargs" };
                let v = map.next_value_seed(Kept { limits: self.limits, param })?;
                *(if key == "tools" { &mut body.tools } else { &mut body.chat_template_kwargs }) = Some(v);
            } else if !chat && key == "prompt" {
                body.prompt = Some(map.next_value_seed(PromptSeed { max_model_len: self.max_model_len })?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(body)
    }
}

/// Consumes the rest of an array.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Consumes the rest of an object.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Visits scalars as [`Raw`]; `seq`/`map` say what arrays and objects become.
macro_rules! raw_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
            Ok(Raw::Bool(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
            Ok(Raw::Int(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
            Ok(Raw::Int(i64::try_from(v).unwrap_or(i64::MAX)))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
            Ok(Raw::Float(v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
            Ok(Raw::Str(v.to_string()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
            Ok(Raw::Str(v))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
            Ok(Raw::Null)
        }
        fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
            Ok(Raw::Null)
        }
    };
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    raw_scalars!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let (mut all_strings, mut worker_id) = (true, false);
        while let Some(item) = seq.next_element::<Item>()? {
            match item {
                Item::Str(w) => worker_id |= w,
                Item::Other => all_strings = false,
            }
        }
        Ok(Raw::Seq { all_strings, worker_id })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Raw, A::Error> {
        drain_map(map)?;
        Ok(Raw::Map(Vec::new()))
    }
}

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

/// An array item: a string (and whether it is `"worker_id"`), or anything else.
enum Item {
    Str(bool),
    Other,
}

impl<'de> serde::Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Item, D::Error> {
        match d.deserialize_any(RawVisitor)? {
            Raw::Str(s) => Ok(Item::Str(s == "worker_id")),
            _ => Ok(Item::Other),
        }
    }
}

/// An object whose `keep` entries are read as [`Raw`] (any other value as a plain [`Raw`]).
struct Shallow {
    keep: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for Shallow {
    type Value = Raw;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Shallow {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    raw_scalars!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Raw, A::Error> {
        RawVisitor.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if self.keep.contains(&key.as_ref()) {
                entries.push((key.into_owned(), map.next_value::<Raw>()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Raw::Map(entries))
    }
}

/// Any JSON value, kept whole, counted against [`MAX_KEPT_VALUES`].
struct Kept<'l> {
    limits: &'l Limits,
    param: &'static str,
}

impl<'de> DeserializeSeed<'de> for Kept<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Kept<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::from(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.limits.keep(self.param)?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.limits.keep(self.param)?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Kept { limits: self.limits, param: self.param })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.limits.keep(self.param)?;
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(Kept { limits: self.limits, param: self.param })?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

fn messages_error(message: impl Into<String>) -> ApiError {
    ApiError::field("messages", message)
}

const NOT_A_LIST: &str = "'messages' must be a non-empty list of messages";

/// `messages`: each an object with a string `role`, its `content` flattened to text.
struct MessagesSeed<'l> {
    limits: &'l Limits,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = Result<Vec<Value>, ApiError>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match d.deserialize_any(self)? {
            Ok(m) if m.is_empty() => Ok(Err(messages_error(NOT_A_LIST))),
            other => Ok(other),
        }
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = Result<Vec<Value>, ApiError>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        loop {
            if out.len() == MAX_MESSAGES {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                let message = format!("a request may have at most {MAX_MESSAGES} messages");
                return Err(self.limits.fail(messages_error(message)));
            }
            match seq.next_element_seed(MessageSeed { limits: self.limits, index: out.len() })? {
                None => break,
                Some(Ok(m)) => out.push(m),
                Some(Err(e)) => {
                    drain_seq(seq)?;
                    return Ok(Err(e));
                }
            }
        }
        Ok(Ok(out))
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

/// A completion `prompt`: text, token ids, or a list holding one of these.
struct PromptSeed {
    max_model_len: u32,
}

impl<'de> DeserializeSeed<'de> for PromptSeed {
    type Value = PromptIn;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PromptIn, D::Error> {
        d.deserialize_any(self)
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
