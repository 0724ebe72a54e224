//! The primitives the request readers ([`super::body`], `messages.rs`, `prompt.rs`) are built
//! from: a field's value read shallowly ([`Raw`], and `Shallow` for a small object whose named
//! entries are kept), a value kept whole for the chat template (`Kept`), the `Limits` a body is
//! read under, and draining what is left of an array or object unread.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::ApiError;

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
    /// An object (its entries when read with `Shallow`, else none).
    Map(Vec<(String, Raw)>),
}

impl Raw {
    pub fn is_null(&self) -> bool {
        matches!(self, Raw::Null)
    }

    /// The entry `key` of an object read with `Shallow`.
    pub fn get(&self, key: &str) -> Option<&Raw> {
        match self {
            Raw::Map(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// The limits one body is read under: the values it may still keep, and the first limit it
/// exceeded.
pub(super) struct Limits {
    /// An exceeded limit: reading stopped.
    fatal: RefCell<Option<ApiError>>,
    /// Values that may still be kept.
    kept: Cell<usize>,
}

impl Limits {
    /// Nothing exceeded yet, [`MAX_KEPT_VALUES`] values to keep.
    pub(super) fn new() -> Limits {
        Limits { fatal: RefCell::new(None), kept: Cell::new(MAX_KEPT_VALUES) }
    }

    /// The limit a reader exceeded, if one did: reading stopped there.
    pub(super) fn exceeded(self) -> Option<ApiError> {
        self.fatal.into_inner()
    }

    /// Records `e` as the limit exceeded (the first one recorded wins) and stops the reader
    /// with its message.
    pub(super) fn fail<E: de::Error>(&self, e: ApiError) -> E {
        let message = e.message.clone();
        self.fatal.borrow_mut().get_or_insert(e);
        E::custom(message)
    }

    /// Counts one more value kept for `param`; past [`MAX_KEPT_VALUES`] that limit is exceeded.
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
