//! The request parser this crate had before [`super::body`]: it reads the whole body into a
//! `serde_json::Value` first. Kept only as the oracle of the differential fuzz test in
//! [`super::fuzz`]: on every body both accept, the streaming parser must agree with it.

use serde_json::{Map, Value};

use super::{ApiError, GenRequest};
use crate::tokenizer::{Messages, Tokenizer};

struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::field(key, format!("'{key}' must be a boolean"))),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(i) => Ok(Some(i)),
                None if v.as_u64().is_some() => Ok(Some(i64::MAX)),
                None => Err(ApiError::field(key, format!("'{key}' must be an integer"))),
            },
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::field(key, format!("'{key}' must be a number"))),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::field(key, format!("'{key}' must be a string"))),
        }
    }

    fn object(&self, key: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields { obj })),
            Some(_) => Err(ApiError::field(key, format!("'{key}' must be an object"))),
        }
    }
}

/// Token ids given directly must be valid `u32`s.
fn token_ids(param: &str, items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(|| {
                ApiError::field(param, format!("'{param}' token ids must be integers in [0, 2^32), got {v}"))
            })
        })
        .collect()
}

fn completion_prompt(v: Option<&Value>, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let one = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(s) => tok.encode(s, true).map_err(|e| ApiError::bad(e.to_string())),
            Value::Array(items) if items.iter().all(Value::is_number) => token_ids("prompt", items),
            _ => Err(ApiError::field(
                "prompt",
                "'prompt' must be a string, a list of token ids, or a list of one of these",
            )),
        }
    };
    let prompt = match v {
        None => return Err(ApiError::field("prompt", "'prompt' is required")),
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(|i| i.is_string() || i.is_array()) => {
            if items.len() > 1 {
                return Err(ApiError::field("prompt", "only one prompt per request is supported"));
            }
            one(&items[0])?
        }
        Some(v) => one(v)?,
    };
    if prompt.is_empty() {
        return Err(ApiError::field("prompt", "the prompt is empty"));
    }
    Ok(prompt)
}

/// Messages with their content flattened to text (text parts joined; other parts refused).
fn chat_messages(v: Option<&Value>) -> Result<Messages, ApiError> {
    let Some(Value::Array(items)) = v else {
        return Err(ApiError::field("messages", "'messages' must be a non-empty list of messages"));
    };
    if items.is_empty() {
        return Err(ApiError::field("messages", "'messages' must be a non-empty list of messages"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let Value::Object(obj) = m else {
            return Err(ApiError::field("messages", format!("messages[{i}] must be an object")));
        };
        let Some(Value::String(_)) = obj.get("role") else {
            return Err(ApiError::field("messages", format!("messages[{i}].role must be a string")));
        };
        let mut msg = obj.clone();
        let text = match obj.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::field(
                                "messages",
                                format!("messages[{i}].content: only text parts are supported"),
                            ))
                        }
                    }
                }
                text
            }
            Some(_) => {
                return Err(ApiError::field(
                    "messages",
                    format!("messages[{i}].content must be a string or a list of parts"),
                ))
            }
        };
        msg.insert("content".into(), Value::String(text));
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// Parses a `/v1/completions` (`chat` false) or `/v1/chat/completions` body. `max_model_len`
/// bounds prompt plus output.
pub fn parse(body: &[u8], chat: bool, tok: &Tokenizer, max_model_len: u32) -> Result<GenRequest, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(obj) = &value else { return Err(ApiError::bad("the request body must be a JSON object")) };
    let f = Fields { obj };
    let model = f.string("model")?.map(str::to_string);
    // Accepted, no effect: sampling never changes a simulated output.
    for key in ["temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"] {
        f.number(key)?;
    }
    for key in ["top_k", "seed"] {
        f.int(key)?;
    }
    f.bool("ignore_eos")?;
    match f.get("stop") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {}
        Some(_) => return Err(ApiError::field("stop", "'stop' must be a string or a list of strings")),
    }
    if let Some(n) = f.int("n")? {
        if n != 1 {
            return Err(ApiError::field("n", format!("only n=1 is supported, got {n}")));
        }
    }
    if f.int("best_of")?.is_some_and(|b| b != 1) {
        return Err(ApiError::field("best_of", "only best_of=1 is supported"));
    }
    // Log probabilities are not simulated: requests for them are accepted (harnesses send them
    // routinely) and choices carry `"logprobs": null`.
    if chat {
        f.bool("logprobs")?;
        f.int("top_logprobs")?;
    } else {
        f.int("logprobs")?;
        if f.bool("echo")? == Some(true) {
            return Err(ApiError::field("echo", "echo is not supported"));
        }
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(so) => {
            so.bool("continuous_usage_stats")?;
            let u = so.bool("include_usage")?.unwrap_or(false);
            if !stream {
                return Err(ApiError::field("stream_options", "stream_options is only allowed when stream is true"));
            }
            u
        }
        None => false,
    };
    let (mut want_worker_id, mut worker) = (false, None);
    if let Some(nv) = f.object("nvext")? {
        nv.bool("ignore_eos")?;
        if let Some(Value::Array(fields)) = nv.get("extra_fields") {
            want_worker_id = fields.iter().any(|v| v.as_str() == Some("worker_id"));
        } else if nv.get("extra_fields").is_some() {
            return Err(ApiError::field("nvext", "'nvext.extra_fields' must be a list of strings"));
        }
        if let Some(id) = nv.int("backend_instance_id")? {
            worker = Some(
                u64::try_from(id).map_err(|_| ApiError::field("nvext", "'nvext.backend_instance_id' must be ≥ 0"))?,
            );
        }
    }

    let remote_prefill = match f.object("kv_transfer_params")? {
        Some(kv) => kv.bool("do_remote_prefill")?.unwrap_or(false),
        None => false,
    };

    let prompt = if chat {
        let messages = chat_messages(f.get("messages"))?;
        let mut vars = serde_json::Map::new();
        match f.get("tools") {
            None | Some(Value::Null) => {}
            Some(tools @ Value::Array(_)) => {
                vars.insert("tools".into(), tools.clone());
            }
            Some(_) => return Err(ApiError::field("tools", "'tools' must be a list")),
        }
        if let Some(add) = f.bool("add_generation_prompt")? {
            vars.insert("add_generation_prompt".into(), Value::Bool(add));
        }
        match f.get("chat_template_kwargs") {
            None | Some(Value::Null) => {}
            Some(Value::Object(kwargs)) => vars.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Some(_) => return Err(ApiError::field("chat_template_kwargs", "'chat_template_kwargs' must be an object")),
        }
        let text = tok.render_chat(messages, vars).map_err(|e| ApiError::bad(e.to_string()))?;
        // The template writes any BOS itself, as vLLM assumes.
        tok.encode(&text, false).map_err(|e| ApiError::bad(e.to_string()))?
    } else {
        completion_prompt(f.get("prompt"), tok)?
    };
    let p = prompt.len() as u64;
    if p >= max_model_len as u64 {
        return Err(ApiError::field(
            if chat { "messages" } else { "prompt" },
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has {p} input tokens. \
                 Please reduce the length of the input."
            ),
        ));
    }
    let requested = match (f.int("max_completion_tokens")?, f.int("max_tokens")?) {
        (Some(m), _) if chat => Some(("max_completion_tokens", m)),
        (_, Some(m)) => Some(("max_tokens", m)),
        _ => None,
    };
    let max_tokens = match requested {
        Some((key, m)) if m < 1 => return Err(ApiError::field(key, format!("'{key}' must be at least 1, got {m}"))),
        Some((key, m)) => {
            let total = p.saturating_add(m as u64);
            if total > max_model_len as u64 {
                return Err(ApiError::field(
                    key,
                    format!(
                        "This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens \
                         ({p} in the {}, {m} in the completion). Please reduce the length of the {} or completion.",
                        if chat { "messages" } else { "prompt" },
                        if chat { "messages" } else { "prompt" },
                    ),
                ));
            }
            m as u32
        }
        // vLLM's defaults: 16 for completions, the rest of the context for chat.
        None if chat => (max_model_len as u64 - p) as u32,
        None => (16u64).min(max_model_len as u64 - p) as u32,
    };
    if let Some(min) = f.int("min_tokens")? {
        if min < 0 || min > max_tokens as i64 {
            return Err(ApiError::field(
                "min_tokens",
                format!("'min_tokens' must be in [0, max_tokens={max_tokens}], got {min}"),
            ));
        }
    }
    Ok(GenRequest { chat, model, prompt, max_tokens, stream, include_usage, want_worker_id, worker, remote_prefill })
}
