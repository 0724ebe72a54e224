//! Turning a request body into a [`GenRequest`]: every known field is type-checked (a wrong
//! type is a 400 naming the field), unknown fields are ignored as vLLM does, and sampling
//! parameters are accepted without effect (outputs always run to `max_tokens`). The body is read
//! by [`super::body`]; this module checks the fields in a fixed order and builds the prompt.

use serde_json::Value;

use super::body::{self, Body, ChatMessages, PromptIn};
use super::raw::Raw;
use super::ApiError;
use crate::tokenizer::{Counted, Tokenizer};

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub chat: bool,
    pub model: Option<String>,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    /// `nvext.extra_fields` asks for `worker_id`.
    pub want_worker_id: bool,
    /// `nvext.backend_instance_id`: the worker to use.
    pub worker: Option<u64>,
    /// `kv_transfer_params.do_remote_prefill`: the prompt's KV comes from a prefill worker.
    pub remote_prefill: bool,
}

/// Typed access to the fields of a [`Body`], or of one of its small objects (`path` is then
/// the object's name, and errors name `object.key`).
struct Fields<'a> {
    source: Source<'a>,
    path: &'a str,
}

enum Source<'a> {
    Body(&'a Body),
    Object(&'a Raw),
}

impl<'a> Fields<'a> {
    fn of(body: &'a Body) -> Self {
        Fields { source: Source::Body(body), path: "" }
    }

    fn param(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn wrong(&self, key: &str, what: &str) -> ApiError {
        let param = self.param(key);
        ApiError::field(&param, format!("'{param}' must be {what}"))
    }

    fn raw(&self, key: &str) -> Option<&'a Raw> {
        match self.source {
            Source::Body(b) => b.get(key),
            Source::Object(o) => o.get(key).filter(|v| !v.is_null()),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Raw::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(key, "a boolean")),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Raw::Int(i)) => Ok(Some(*i)),
            Some(_) => Err(self.wrong(key, "an integer")),
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Raw::Int(i)) => Ok(Some(*i as f64)),
            Some(Raw::Float(f)) => Ok(Some(*f)),
            Some(_) => Err(self.wrong(key, "a number")),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Raw::Str(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    fn object(&self, key: &'a str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(obj @ Raw::Map(_)) => Ok(Some(Fields { source: Source::Object(obj), path: key })),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }
}

fn completion_prompt(p: Option<PromptIn>, tok: &Tokenizer, max_model_len: u32) -> Result<Counted, ApiError> {
    let counted = match p {
        None => return Err(ApiError::field("prompt", "'prompt' is required")),
        Some(PromptIn::Text(s)) => {
            tok.encode_within(&s, true, max_model_len).map_err(|e| ApiError::bad(e.to_string()))?
        }
        Some(PromptIn::Tokens { ids, count }) => Counted { ids, count, exact: true },
        Some(PromptIn::BadId(v)) => {
            return Err(ApiError::field("prompt", format!("'prompt' token ids must be integers in [0, 2^32), got {v}")))
        }
        Some(PromptIn::Batch) => return Err(ApiError::field("prompt", "only one prompt per request is supported")),
        Some(PromptIn::Invalid) => {
            return Err(ApiError::field(
                "prompt",
                "'prompt' must be a string, a list of token ids, or a list of one of these",
            ))
        }
    };
    if counted.count == 0 {
        return Err(ApiError::field("prompt", "the prompt is empty"));
    }
    Ok(counted)
}

/// Parses a `/v1/completions` (`chat` false) or `/v1/chat/completions` body. `max_model_len`
/// bounds prompt plus output. The body is dropped as soon as it has been read: what is built
/// from it afterwards (the chat template's text, the tokens) does not stack on top of it.
pub fn parse<B: AsRef<[u8]>>(body: B, chat: bool, tok: &Tokenizer, max_model_len: u32) -> Result<GenRequest, ApiError> {
    let b = body::read(body.as_ref(), chat, max_model_len, tok.counts_chat_per_message());
    drop(body);
    let mut b = b?;
    let (prompt_in, messages, tools, kwargs) =
        (b.prompt.take(), b.messages.take(), b.tools.take(), b.chat_template_kwargs.take());
    let f = Fields::of(&b);
    let model = f.string("model")?.map(str::to_string);
    // Accepted, no effect: sampling never changes a simulated output.
    for key in ["temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"] {
        f.number(key)?;
    }
    for key in ["top_k", "seed"] {
        f.int(key)?;
    }
    f.bool("ignore_eos")?;
    match f.raw("stop") {
        None | Some(Raw::Str(_)) | Some(Raw::Seq { all_strings: true, .. }) => {}
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
        match nv.raw("extra_fields") {
            None => {}
            Some(Raw::Seq { worker_id, .. }) => want_worker_id = *worker_id,
            Some(_) => return Err(nv.wrong("extra_fields", "a list of strings")),
        }
        if let Some(id) = nv.int("backend_instance_id")? {
            worker = Some(u64::try_from(id).map_err(|_| nv.wrong("backend_instance_id", "≥ 0"))?);
        }
    }
    let remote_prefill = match f.object("kv_transfer_params")? {
        Some(kv) => kv.bool("do_remote_prefill")?.unwrap_or(false),
        None => false,
    };

    let counted = if chat {
        let messages = messages
            .unwrap_or_else(|| Err(ApiError::field("messages", "'messages' must be a non-empty list of messages")))?;
        let mut vars = serde_json::Map::new();
        match tools {
            None | Some(Value::Null) => {}
            Some(tools @ Value::Array(_)) => {
                vars.insert("tools".into(), tools);
            }
            Some(_) => return Err(ApiError::field("tools", "'tools' must be a list")),
        }
        if let Some(add) = f.bool("add_generation_prompt")? {
            vars.insert("add_generation_prompt".into(), Value::Bool(add));
        }
        match kwargs {
            None | Some(Value::Null) => {}
            Some(Value::Object(kwargs)) => vars.extend(kwargs),
            Some(_) => return Err(ApiError::field("chat_template_kwargs", "'chat_template_kwargs' must be an object")),
        }
        match messages {
            ChatMessages::Counted(counted) => counted,
            ChatMessages::Kept(messages) => {
                let text = tok.render_chat(messages, vars).map_err(|e| ApiError::bad(e.to_string()))?;
                // The template writes any BOS itself, as vLLM assumes.
                tok.encode_within(&text, false, max_model_len).map_err(|e| ApiError::bad(e.to_string()))?
            }
        }
    } else {
        completion_prompt(prompt_in, tok, max_model_len)?
    };
    let p = counted.count;
    if p >= max_model_len as u64 {
        let has = if counted.exact { format!("{p}") } else { format!("at least {p}") };
        return Err(ApiError::field(
            if chat { "messages" } else { "prompt" },
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has {has} input tokens. \
                 Please reduce the length of the input."
            ),
        ));
    }
    let prompt = counted.ids;
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
                let what = if chat { "messages" } else { "prompt" };
                return Err(ApiError::field(
                    key,
                    format!(
                        "This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens \
                         ({p} in the {what}, {m} in the completion). Please reduce the length of the {what} or completion.",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(body: &str, chat: bool) -> Result<GenRequest, ApiError> {
        parse(body.as_bytes(), chat, &Tokenizer::approximate(), 1000)
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let r = parse_str(r#"{"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}"#, false).unwrap();
        assert_eq!((r.prompt, r.max_tokens, r.stream), (vec![1, 2, 3], 5, false));
        assert_eq!(parse_str(r#"{"prompt": [[4, 5]]}"#, false).unwrap().prompt, vec![4, 5]);
        let text = parse_str(r#"{"prompt": "hello world"}"#, false).unwrap();
        assert_eq!(text.prompt.len(), 4, "hell|o| wor|ld");
        assert_eq!(text.max_tokens, 16, "completions default to 16 tokens");
        assert_eq!(parse_str(r#"{"prompt": ["hello world"]}"#, false).unwrap().prompt, text.prompt);
    }

    #[test]
    fn bad_fields_are_named() {
        let err = |body: &str| parse_str(body, false).unwrap_err();
        assert_eq!(err(r#"{"prompt": "x", "max_tokens": "5"}"#).param.as_deref(), Some("max_tokens"));
        assert_eq!(err(r#"{"prompt": "x", "max_tokens": 0}"#).param.as_deref(), Some("max_tokens"));
        assert_eq!(err(r#"{"prompt": "x", "temperature": "hot"}"#).param.as_deref(), Some("temperature"));
        assert_eq!(err(r#"{"prompt": "x", "n": 2}"#).param.as_deref(), Some("n"));
        assert_eq!(err(r#"{"prompt": "x", "stream": "yes"}"#).param.as_deref(), Some("stream"));
        assert_eq!(err(r#"{"prompt": [1, -2]}"#).param.as_deref(), Some("prompt"));
        assert_eq!(err(r#"{"prompt": ["a", "b"]}"#).param.as_deref(), Some("prompt"));
        assert_eq!(err(r#"{"prompt": ""}"#).param.as_deref(), Some("prompt"));
        assert_eq!(err(r#"{"max_tokens": 3}"#).param.as_deref(), Some("prompt"));
        // null is a missing prompt, not invalid JSON (found by the property test).
        assert_eq!(err(r#"{"prompt": null}"#).message, "'prompt' is required");
        assert_eq!(err(r#"{"prompt": "x", "prompt": null}"#).message, "'prompt' is required");
        assert!(err("{not json").message.contains("not valid JSON"));
        assert!(err("[1, 2]").message.contains("JSON object"));
        assert_eq!(err(r#"{"prompt": "x", "min_tokens": 20, "max_tokens": 10}"#).param.as_deref(), Some("min_tokens"));
    }

    #[test]
    fn context_length_bounds_prompt_and_output() {
        let long: Vec<u32> = (0..1000).collect();
        let body = serde_json::json!({"prompt": long}).to_string();
        assert!(parse_str(&body, false).unwrap_err().message.contains("maximum context length is 1000"));
        let e = parse_str(r#"{"prompt": [1, 2], "max_tokens": 999}"#, false).unwrap_err();
        assert!(e.message.contains("you requested 1001 tokens"), "{}", e.message);
        let huge = parse_str(r#"{"prompt": [1, 2], "max_tokens": 18446744073709551615}"#, false).unwrap_err();
        assert_eq!(huge.param.as_deref(), Some("max_tokens"));
        assert_eq!(parse_str(r#"{"prompt": [1, 2], "max_tokens": 998}"#, false).unwrap().max_tokens, 998);
    }

    #[test]
    fn chat_defaults_and_options() {
        let r = parse_str(
            r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 7,
                "nvext": {"extra_fields": ["worker_id"], "backend_instance_id": 1}, "unknown_field": {"x": 1}}"#,
            true,
        )
        .unwrap();
        assert!(r.stream && r.include_usage && r.want_worker_id);
        assert_eq!((r.max_tokens, r.worker), (7, Some(1)));
        let no_max = parse_str(r#"{"messages": [{"role": "user", "content": "hi"}]}"#, true).unwrap();
        assert_eq!(no_max.max_tokens as usize, 1000 - no_max.prompt.len(), "chat defaults to the rest of the context");
        let e = parse_str(r#"{"messages": [{"content": "hi"}]}"#, true).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse_str(r#"{"messages": [{"role": "user", "content": "hi"}], "stream_options": {}}"#, true);
        assert_eq!(e.unwrap_err().param.as_deref(), Some("stream_options"));
    }
}
