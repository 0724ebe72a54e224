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

pub use super::messages::ChatMessages;
use super::messages::MessagesSeed;
use super::prompt::MaybePromptSeed;
pub use super::prompt::PromptIn;
use super::ApiError;

/// Most chat messages one request may have.
pub use super::messages::MAX_MESSAGES;
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
    Seq {
        all_strings: bool,
        worker_id: bool,
    },
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

/// The request's fields as read.
#[derive(Default, Debug)]
pub struct Body {
    /// Scalar and small object fields by name (the last occurrence of a key wins).
    pub fields: Vec<(&'static str, Raw)>,
    pub prompt: Option<PromptIn>,
    pub messages: Option<Result<ChatMessages, ApiError>>,
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
/// `count_chat`: count the messages' tokens in the plain layout as they are read
/// ([`ChatMessages::Counted`]) instead of keeping them for a chat template.
pub fn read(body: &[u8], chat: bool, max_model_len: u32, count_chat: bool) -> Result<Body, ApiError> {
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
    let visitor = BodyVisitor { limits: &limits, chat, max_model_len, count_chat };
    let result = (&mut de).deserialize_map(visitor).and_then(|b| {
        de.end()?;
        Ok(b)
    });
    if let Some(e) = limits.fatal.into_inner() {
        return Err(e);
    }
    result.map_err(not_json)
}

pub(super) struct Limits {
    /// An exceeded limit: reading stopped.
    fatal: RefCell<Option<ApiError>>,
    /// Values that may still be kept.
    kept: Cell<usize>,
}

impl Limits {
    pub(super) fn fail<E: de::Error>(&self, e: ApiError) -> E {
        let message = e.message.clone();
        self.fatal.borrow_mut().get_or_insert(e);
        E::custom(message)
    }

    pub(super) fn keep<E: de::Error>(&self, param: &str) -> Result<(), E> {
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
    count_chat: bool,
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
            let scalar =
                SCALARS.iter().chain(if chat { CHAT_SCALARS } else { COMPLETION_SCALARS }).find(|k| **k == key);
            if let Some(&k) = scalar {
                body.fields.push((k, map.next_value::<Raw>()?));
            } else if let Some(&(k, keep)) = OBJECTS.iter().find(|(k, _)| *k == key) {
                body.fields.push((k, map.next_value_seed(Shallow { keep })?));
            } else if chat && key == "messages" {
                let count = self.count_chat.then_some(self.max_model_len as usize);
                body.messages = Some(map.next_value_seed(MessagesSeed { limits: self.limits, count })?);
            } else if chat && (key == "tools" || key == "chat_template_kwargs") {
                let param = if key == "tools" { "tools" } else { "chat_template_kwargs" };
                let v = map.next_value_seed(Kept { limits: self.limits, param })?;
                *(if key == "tools" { &mut body.tools } else { &mut body.chat_template_kwargs }) = Some(v);
            } else if !chat && key == "prompt" {
                body.prompt = map.next_value_seed(MaybePromptSeed { max_model_len: self.max_model_len })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(body)
    }
}

/// Consumes the rest of an array.
pub(super) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Consumes the rest of an object.
pub(super) fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
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
pub(super) struct Shallow {
    pub(super) keep: &'static [&'static str],
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
pub(super) struct Kept<'l> {
    pub(super) limits: &'l Limits,
    pub(super) param: &'static str,
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
