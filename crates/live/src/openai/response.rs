//! Everything the server writes back, as typed structs: completions, stream chunks, usage, the
//! model list and health. Field order is the wire order (vLLM's), so a response is the same
//! bytes it was when these were written by hand.

use serde::Serialize;

/// Serialises as JSON `null` (fields OpenAI clients expect to be present but that are never
/// set here: `logprobs`, `stop_reason`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Null;

impl Serialize for Null {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

/// Every output runs to its token limit.
pub const FINISH_LENGTH: &str = "length";

/// A whole (non-streamed) completion, or one SSE chunk of a stream: the same envelope.
#[derive(Serialize, Debug)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: &'a [Choice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Nvext>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_params: Option<KvTransferParams<'a>>,
}

/// The `object` of a response: `chat` for `/v1/chat/completions`, `chunk` for a stream.
pub fn object(chat: bool, chunk: bool) -> &'static str {
    match (chat, chunk) {
        (true, false) => "chat.completion",
        (true, true) => "chat.completion.chunk",
        (false, _) => "text_completion",
    }
}

#[derive(Serialize, Debug)]
#[serde(untagged)]
pub enum Choice<'a> {
    /// A whole chat answer.
    Message(MessageChoice<'a>),
    /// A piece of a streamed chat answer.
    Delta(DeltaChoice<'a>),
    /// A completion's text, whole or a piece.
    Text(TextChoice<'a>),
}

#[derive(Serialize, Debug)]
pub struct MessageChoice<'a> {
    pub index: u32,
    pub message: Message<'a>,
    pub logprobs: Null,
    pub finish_reason: &'static str,
    pub stop_reason: Null,
}

#[derive(Serialize, Debug)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: &'a str,
    pub tool_calls: [(); 0],
}

#[derive(Serialize, Debug)]
pub struct DeltaChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Null,
    pub finish_reason: Option<&'static str>,
    /// Present (as null) on the last chunk only, as vLLM writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Null>,
}

#[derive(Serialize, Debug, Default)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

#[derive(Serialize, Debug)]
pub struct TextChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Null,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Null,
}

impl<'a> Choice<'a> {
    /// The choice carrying one streamed token's text (`role` opens a chat stream).
    pub fn piece(chat: bool, text: &'a str, role: bool) -> Self {
        if chat {
            let delta = Delta { role: role.then_some("assistant"), content: Some(text) };
            Choice::Delta(DeltaChoice { index: 0, delta, logprobs: Null, finish_reason: None, stop_reason: None })
        } else {
            Choice::Text(TextChoice { index: 0, text, logprobs: Null, finish_reason: None, stop_reason: Null })
        }
    }

    /// The last choice of a stream: no text, the finish reason.
    pub fn last(chat: bool) -> Self {
        if chat {
            Choice::Delta(DeltaChoice {
                index: 0,
                delta: Delta::default(),
                logprobs: Null,
                finish_reason: Some(FINISH_LENGTH),
                stop_reason: Some(Null),
            })
        } else {
            Choice::Text(TextChoice {
                index: 0,
                text: "",
                logprobs: Null,
                finish_reason: Some(FINISH_LENGTH),
                stop_reason: Null,
            })
        }
    }

    /// The only choice of a non-streamed answer.
    pub fn whole(chat: bool, text: &'a str) -> Self {
        if chat {
            let message = Message { role: "assistant", content: text, tool_calls: [] };
            Choice::Message(MessageChoice {
                index: 0,
                message,
                logprobs: Null,
                finish_reason: FINISH_LENGTH,
                stop_reason: Null,
            })
        } else {
            Choice::Text(TextChoice {
                index: 0,
                text,
                logprobs: Null,
                finish_reason: Some(FINISH_LENGTH),
                stop_reason: Null,
            })
        }
    }
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Usage {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

/// `nvext` of a response that asked for `extra_fields: ["worker_id"]`.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvext {
    pub worker_id: WorkerIds,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerIds {
    pub prefill_worker_id: Option<u32>,
    pub decode_worker_id: u32,
}

/// What a prefill-only server tells the client to pass on to a decode server.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct KvTransferParams<'a> {
    pub do_remote_prefill: bool,
    pub do_remote_decode: bool,
    pub remote_engine_id: String,
    pub remote_host: &'a str,
    pub remote_port: u16,
    pub remote_block_ids: Vec<u32>,
    pub tp_size: u32,
}

/// `GET /v1/models`.
#[derive(Serialize, Debug)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: [ModelCard<'a>; 1],
}

#[derive(Serialize, Debug)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: &'a str,
    pub parent: Null,
    pub max_model_len: u32,
    pub permission: [(); 0],
}

/// `GET /health` and `GET /live`.
#[derive(Serialize, Debug)]
pub struct Health {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The body of every error response.
#[derive(Serialize, Debug)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Serialize, Debug)]
pub struct ErrorDetail<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn chunks_keep_the_wire_layout() {
        let c = |choices: &[Choice]| {
            json(&Completion {
                id: "cmpl-1",
                object: object(true, true),
                created: 7,
                model: "m",
                choices,
                usage: None,
                nvext: None,
                kv_transfer_params: None,
            })
        };
        assert_eq!(
            c(&[Choice::piece(true, "", true)]),
            r#"{"id":"cmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#
        );
        assert_eq!(
            c(&[Choice::last(true)]),
            r#"{"id":"cmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}]}"#
        );
        assert_eq!(
            json(&Choice::piece(false, " a\"b", false)),
            r#"{"index":0,"text":" a\"b","logprobs":null,"finish_reason":null,"stop_reason":null}"#
        );
        assert_eq!(
            json(&Choice::whole(true, "hi")),
            r#"{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}"#
        );
        assert_eq!(
            json(&Usage::new(3, 2, 1)),
            r#"{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}"#
        );
    }
}
