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

use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

pub use super::messages::ChatMessages;
use super::messages::MessagesSeed;
use super::prompt::MaybePromptSeed;
pub use super::prompt::PromptIn;
use super::raw::{Kept, Limits, Raw, Shallow};
use super::ApiError;

/// Most chat messages one request may have.
pub use super::messages::MAX_MESSAGES;
pub use super::raw::MAX_KEPT_VALUES;

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
    let limits = Limits::new();
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
    if let Some(e) = limits.exceeded() {
        return Err(e);
    }
    result.map_err(not_json)
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
