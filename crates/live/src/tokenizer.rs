//! Counting, rendering and decoding text: a model's own tokenizer and chat template when the
//! server is given a model directory, a built-in approximate tokenizer otherwise.
//!
//! Generated tokens are drawn from the *ordinary* vocabulary: ids that are not added or special
//! tokens and that decode on their own to non-empty valid text. Every response therefore decodes
//! to text, and streaming can send each token's precomputed piece (its text after another
//! token, so that SentencePiece word boundaries survive) without decoding per token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::error::{ModelError, TokenizeError};

/// A chat message as the template sees it (content already flattened to text).
pub type Messages = Vec<Value>;

pub struct Tokenizer {
    kind: Kind,
    /// Ordinary ids (sorted), the pool generated tokens come from.
    vocabulary: Arc<[u32]>,
    /// Text of each id (empty for ids outside the ordinary vocabulary).
    pieces: Vec<Box<str>>,
    template: Option<ChatTemplate>,
}

enum Kind {
    Hf(Box<tokenizers::Tokenizer>),
    Approx,
}

struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos: String,
    eos: String,
}

/// The built-in tokenizer's id range for generated tokens.
const APPROX_FIRST_ID: u32 = 1000;
const APPROX_VOCAB: u32 = 31_000;

impl Tokenizer {
    /// The deterministic approximate tokenizer: about one token per four characters of a word.
    pub fn approximate() -> Self {
        const CONSONANTS: &[u8] = b"bcdfghjklmnprstvwz";
        const VOWELS: &[u8] = b"aeiou";
        let mut pieces = vec![Box::<str>::from(""); (APPROX_FIRST_ID + APPROX_VOCAB) as usize];
        for id in APPROX_FIRST_ID..APPROX_FIRST_ID + APPROX_VOCAB {
            // A pronounceable pseudo-word of one to three syllables, led by a space.
            let mut x = id - APPROX_FIRST_ID;
            let syllables = 1 + x % 3;
            x /= 3;
            let mut s = String::from(" ");
            for _ in 0..syllables {
                s.push(CONSONANTS[(x % CONSONANTS.len() as u32) as usize] as char);
                x /= CONSONANTS.len() as u32;
                s.push(VOWELS[(x % VOWELS.len() as u32) as usize] as char);
                x /= VOWELS.len() as u32;
            }
            pieces[id as usize] = s.into();
        }
        Tokenizer {
            kind: Kind::Approx,
            vocabulary: (APPROX_FIRST_ID..APPROX_FIRST_ID + APPROX_VOCAB).collect(),
            pieces,
            template: None,
        }
    }

    /// Loads `dir/tokenizer.json` and the chat template (`dir/chat_template.jinja`, or
    /// `chat_template` in `dir/tokenizer_config.json`). Only local files are read.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("tokenizer.json");
        let tok = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer { path: path.clone(), message: e.to_string() })?;
        let added = tok.get_added_tokens_decoder();
        let size = tok.get_vocab_size(true) as u32;
        let mut pieces = vec![Box::<str>::from(""); size as usize];
        let mut vocabulary = Vec::new();
        for id in 0..size {
            if added.contains_key(&id) || tok.id_to_token(id).is_none() {
                continue;
            }
            let Ok(text) = tok.decode(&[id], false) else { continue };
            if text.is_empty()
                || text.contains('\u{FFFD}')
                || text.chars().any(|c| c.is_control() && !c.is_whitespace())
            {
                continue;
            }
            pieces[id as usize] = text.into();
            vocabulary.push(id);
        }
        if vocabulary.is_empty() {
            return Err(ModelError::NoVocabulary(path));
        }
        // A token's text depends on what precedes it: SentencePiece-style (Metaspace) decoders
        // drop the leading space of a sequence's first token, WordPiece joins words with spaces.
        // Generated tokens always follow other text, so each piece is taken in context: what
        // the token adds after an ordinary anchor token.
        let anchor = vocabulary[0];
        let anchor_text = pieces[anchor as usize].to_string();
        for &id in &vocabulary {
            if let Ok(both) = tok.decode(&[anchor, id], false) {
                if let Some(added) = both.strip_prefix(anchor_text.as_str()).filter(|t| !t.is_empty()) {
                    pieces[id as usize] = added.into();
                }
            }
        }
        let template = ChatTemplate::load(dir)?;
        Ok(Tokenizer { kind: Kind::Hf(Box::new(tok)), vocabulary: vocabulary.into(), pieces, template })
    }

    pub fn is_approximate(&self) -> bool {
        matches!(self.kind, Kind::Approx)
    }

    pub fn vocabulary(&self) -> Arc<[u32]> {
        self.vocabulary.clone()
    }

    /// Token ids of `text`; `special` adds the tokenizer's special tokens (BOS), as vLLM does
    /// for completion prompts.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizeError> {
        match &self.kind {
            Kind::Hf(tok) => tok
                .encode_fast(text, special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizeError::Encode(e.to_string())),
            Kind::Approx => Ok(approx_encode(text)),
        }
    }

    /// Text of one generated token.
    pub fn piece(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.pieces.get(id as usize) {
            Some(p) if !p.is_empty() => std::borrow::Cow::Borrowed(p),
            // Thinking boundaries and other ids outside the ordinary vocabulary.
            _ => match &self.kind {
                Kind::Hf(tok) => std::borrow::Cow::Owned(tok.decode(&[id], false).unwrap_or_default()),
                Kind::Approx => std::borrow::Cow::Owned(format!("<|{id}|>")),
            },
        }
    }

    /// Text of a whole output: its pieces one after the other, exactly what a stream of the same
    /// tokens sends.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.piece(i)).collect()
    }

    /// The prompt text of a chat: the model's template, or a plain `<|role|>` layout when there
    /// is none. `vars` are what the request adds to the template's variables, as vLLM passes
    /// them: `tools`, `add_generation_prompt` and the entries of `chat_template_kwargs` (Qwen3's
    /// `enable_thinking`, say).
    pub fn render_chat(
        &self,
        messages: Messages,
        vars: serde_json::Map<String, Value>,
    ) -> Result<String, TokenizeError> {
        match &self.template {
            Some(t) => t.render(messages, vars),
            None => {
                let mut out = String::new();
                for m in &messages {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
                    let content = m.get("content").and_then(Value::as_str).unwrap_or("");
                    out.push_str(&format!("<|{role}|>\n{content}\n"));
                }
                out.push_str("<|assistant|>\n");
                Ok(out)
            }
        }
    }
}

/// Splits text into words (leading whitespace included) and punctuation; a word costs one token
/// per four characters. Ids are a hash of the piece, so equal text gives equal tokens.
fn approx_encode(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 4 + 1);
    let mut piece = String::new();
    // Leading whitespace rides with the first chunk of the word, as in BPE vocabularies.
    let flush = |piece: &mut String, out: &mut Vec<u32>| {
        let chars: Vec<char> = piece.chars().collect();
        let lead = chars.iter().take_while(|c| c.is_whitespace()).count();
        let body = &chars[lead..];
        if body.is_empty() {
            out.push(APPROX_FIRST_ID + (xxhash_rust_like(piece.as_bytes()) % APPROX_VOCAB as u64) as u32);
        }
        for (i, chunk) in body.chunks(4).enumerate() {
            let mut s: String = if i == 0 { chars[..lead].iter().collect() } else { String::new() };
            s.extend(chunk.iter());
            out.push(APPROX_FIRST_ID + (xxhash_rust_like(s.as_bytes()) % APPROX_VOCAB as u64) as u32);
        }
        piece.clear();
    };
    let mut in_word = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            in_word = true;
            piece.push(c);
        } else if c.is_whitespace() {
            if in_word {
                flush(&mut piece, &mut out);
                in_word = false;
            }
            piece.push(c);
        } else {
            // Punctuation stands alone (after any pending word).
            if in_word || !piece.is_empty() {
                flush(&mut piece, &mut out);
                in_word = false;
            }
            piece.push(c);
            flush(&mut piece, &mut out);
        }
    }
    if !piece.is_empty() {
        flush(&mut piece, &mut out);
    }
    out
}

/// FNV-1a: a stable hash for the approximate tokenizer's ids.
fn xxhash_rust_like(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl ChatTemplate {
    fn load(dir: &Path) -> Result<Option<Self>, ModelError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<Value> = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(
                serde_json::from_str(&text).map_err(|source| ModelError::Json { path: config_path.clone(), source })?,
            ),
            Err(_) => None,
        };
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.exists() {
            Some(std::fs::read_to_string(&jinja_path).map_err(|source| ModelError::Read { path: jinja_path, source })?)
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: use "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(str::to_string),
                Some(_) => return Err(ModelError::TemplateType(config_path)),
            }
        };
        let Some(source) = source else { return Ok(None) };
        let special = |key: &str| -> String {
            match config.as_ref().and_then(|c| c.get(key)) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
                _ => String::new(),
            }
        };
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Hugging Face renders templates with these Jinja settings.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |_fmt: String| -> String { "01 Jan 2025".to_string() });
        env.add_template_owned("chat", source)
            .map_err(|source| ModelError::TemplateCompile { dir: dir.to_path_buf(), source })?;
        Ok(Some(ChatTemplate { env, bos: special("bos_token"), eos: special("eos_token") }))
    }

    fn render(&self, messages: Messages, vars: serde_json::Map<String, Value>) -> Result<String, TokenizeError> {
        let tmpl = self.env.get_template("chat").map_err(TokenizeError::Render)?;
        let mut context = serde_json::Map::new();
        context.insert("add_generation_prompt".into(), Value::Bool(true));
        context.insert("bos_token".into(), Value::from(self.bos.as_str()));
        context.insert("eos_token".into(), Value::from(self.eos.as_str()));
        context.extend(vars);
        context.insert("messages".into(), Value::Array(messages));
        tmpl.render(Value::Object(context)).map_err(TokenizeError::Render)
    }
}

/// What a model directory's `config.json` says about serving it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelFacts {
    /// KV cache bytes per token (K and V of every layer), if the config describes attention.
    pub kv_bytes_per_token: Option<u64>,
    /// `max_position_embeddings`.
    pub max_position_embeddings: Option<u32>,
}

/// Reads `dir/config.json`: `num_hidden_layers × 2 × num_key_value_heads × head_dim × dtype
/// bytes` (head_dim from the config when given, else hidden_size / num_attention_heads).
pub fn model_facts(dir: &Path) -> Result<ModelFacts, ModelError> {
    let path: PathBuf = dir.join("config.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ModelFacts::default()),
        Err(source) => return Err(ModelError::Read { path, source }),
    };
    let root: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json { path, source })?;
    // Multimodal configs keep the language model's fields in `text_config`.
    let cfg = match root.get("text_config") {
        Some(t) if t.is_object() && root.get("num_hidden_layers").is_none() => t,
        _ => &root,
    };
    let int = |keys: &[&str]| keys.iter().find_map(|k| cfg.get(*k).and_then(Value::as_u64));
    let layers = int(&["num_hidden_layers", "n_layer", "num_layers"]);
    let heads = int(&["num_attention_heads", "n_head"]);
    let kv_heads = int(&["num_key_value_heads", "num_kv_heads"]).or(heads);
    let head_dim = int(&["head_dim"]).or_else(|| Some(int(&["hidden_size", "n_embd"])? / heads.filter(|&h| h > 0)?));
    let dtype = cfg
        .get("torch_dtype")
        .or_else(|| cfg.get("dtype"))
        .or_else(|| root.get("torch_dtype"))
        .and_then(Value::as_str)
        .unwrap_or("float16");
    let dtype_bytes = match dtype.trim_start_matches("torch.") {
        "float32" => 4,
        d if d.starts_with("float8") => 1,
        _ => 2,
    };
    let kv_bytes_per_token = match (layers, kv_heads, head_dim) {
        (Some(l), Some(k), Some(d)) if l > 0 && k > 0 && d > 0 => Some(l * 2 * k * d * dtype_bytes),
        _ => None,
    };
    let max_position_embeddings =
        int(&["max_position_embeddings", "n_positions", "max_seq_len"]).map(|v| v.min(u32::MAX as u64) as u32);
    Ok(ModelFacts { kv_bytes_per_token, max_position_embeddings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approximate_tokenizer_is_deterministic_and_roughly_four_chars_per_token() {
        let t = Tokenizer::approximate();
        let a = t.encode("Hello, world! The quick brown fox.", false).unwrap();
        assert_eq!(a, t.encode("Hello, world! The quick brown fox.", false).unwrap());
        // "Hello" 2 tokens; "," 1; " world" 2; "!" 1; " The" 1; " quick" 2; " brown" 2; " fox" 1;
        // "." 1.
        assert_eq!(a.len(), 13);
        let long = "lorem ipsum dolor sit amet ".repeat(100);
        let n = t.encode(&long, false).unwrap().len();
        assert_eq!(n, 801, "8 tokens per 27 characters, and the trailing space");
        assert!(a.iter().all(|id| t.vocabulary().binary_search(id).is_ok()));
    }

    #[test]
    fn approximate_pieces_are_words() {
        let t = Tokenizer::approximate();
        for &id in t.vocabulary().iter().step_by(997) {
            let p = t.piece(id);
            assert!(p.starts_with(' ') && p.len() >= 3 && p[1..].chars().all(|c| c.is_ascii_lowercase()), "{p:?}");
        }
        assert_eq!(t.decode(&[1000, 1001]), format!("{}{}", t.piece(1000), t.piece(1001)));
    }

    #[test]
    fn model_facts_follow_the_config() {
        let dir = std::env::temp_dir().join(format!("servesim-facts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "torch_dtype": "bfloat16", "max_position_embeddings": 131072}"#,
        )
        .unwrap();
        let f = model_facts(&dir).unwrap();
        assert_eq!(f.kv_bytes_per_token, Some(131_072), "Llama-3.1-8B");
        assert_eq!(f.max_position_embeddings, Some(131_072));
        std::fs::write(
            dir.join("config.json"),
            r#"{"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                "hidden_size": 1024, "head_dim": 128, "torch_dtype": "bfloat16"}"#,
        )
        .unwrap();
        assert_eq!(model_facts(&dir).unwrap().kv_bytes_per_token, Some(114_688), "Qwen3-0.6B with its real head_dim");
        std::fs::write(dir.join("config.json"), "{not json").unwrap();
        assert!(model_facts(&dir).unwrap_err().to_string().contains("config.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
