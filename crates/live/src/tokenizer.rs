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
            Kind::Hf(tok) => hf_encode(tok, text, special),
            Kind::Approx => {
                let mut e = ApproxEncoder::new(usize::MAX);
                e.feed(text);
                Ok(e.finish().ids)
            }
        }
    }

    /// Token ids of a prompt that must have fewer than `limit` tokens, in memory that does not
    /// grow with a text far over the limit. A text with fewer than `limit` tokens gets exactly
    /// the ids of [`Self::encode`]. Otherwise `count` is at least `limit`: exact with the
    /// approximate tokenizer (which counts every token but keeps only `limit` ids) and with a
    /// model's tokenizer for texts of up to [`WHOLE_TEXT_BYTES`]; beyond that a lower bound,
    /// as counting stops once it passes the limit (see `hf_encode_within`).
    pub fn encode_within(&self, text: &str, special: bool, limit: u32) -> Result<Counted, TokenizeError> {
        match &self.kind {
            Kind::Hf(tok) => hf_encode_within(tok, text, special, limit),
            Kind::Approx => {
                let mut e = ApproxEncoder::new(limit as usize);
                e.feed(text);
                Ok(e.finish())
            }
        }
    }

    /// Whether a chat's prompt is the plain `<|role|>` layout counted by the approximate
    /// tokenizer, which [`ApproxEncoder`] can count one message at a time as the body is read
    /// (the exact ids, without keeping the messages' text).
    pub fn counts_chat_per_message(&self) -> bool {
        matches!(self.kind, Kind::Approx) && self.template.is_none()
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
                let len =
                    messages.iter().map(|m| plain_message(m).iter().map(|p| p.len()).sum::<usize>()).sum::<usize>();
                let mut out = String::with_capacity(len + PLAIN_END.len());
                for m in &messages {
                    out.extend(plain_message(m));
                }
                out.push_str(PLAIN_END);
                Ok(out)
            }
        }
    }
}

/// A chat message in the plain layout used without a chat template: `<|role|>\ncontent\n`.
fn plain_message(m: &Value) -> [&str; 5] {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let content = m.get("content").and_then(Value::as_str).unwrap_or("");
    ["<|", role, "|>\n", content, "\n"]
}

/// What ends a chat in the plain layout.
const PLAIN_END: &str = "<|assistant|>\n";

/// The tokens of a chat in the plain layout under the approximate tokenizer, counted one message
/// at a time: the same ids as rendering the whole chat and encoding it, without its text.
pub struct PlainChat(ApproxEncoder);

impl PlainChat {
    /// Keeps the first `keep` ids (and counts them all).
    pub fn new(keep: usize) -> Self {
        PlainChat(ApproxEncoder::new(keep))
    }

    pub fn message(&mut self, m: &Value) {
        for part in plain_message(m) {
            self.0.feed(part);
        }
    }

    pub fn finish(mut self) -> Counted {
        self.0.feed(PLAIN_END);
        self.0.finish()
    }
}

/// A prompt's tokens: the first ids (all of them when `count` is under the limit the prompt
/// was counted against), how many there are, and whether that count is exact or a lower bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counted {
    pub ids: Vec<u32>,
    pub count: u64,
    pub exact: bool,
}

fn hf_encode(tok: &tokenizers::Tokenizer, text: &str, special: bool) -> Result<Vec<u32>, TokenizeError> {
    tok.encode_fast(text, special).map(|e| e.get_ids().to_vec()).map_err(|e| TokenizeError::Encode(e.to_string()))
}

/// Texts of up to this many bytes are tokenized whole. The `tokenizers` crate's working memory
/// is about 150 bytes per byte of text (each byte's alignment, every pre-token's copy, every
/// token's string), so a 31 MB prompt took 4.8 GB: larger texts are first counted piece by
/// piece.
pub const WHOLE_TEXT_BYTES: usize = 256 * 1024;
/// Size of the pieces a larger text is counted in (about 10 MB of working memory each).
const PIECE_BYTES: usize = 64 * 1024;
/// Tokens one cut between pieces may add to a count. A cut is made before a space that follows
/// a non-space, which is a pre-token boundary for the byte-level BPE tokenizers (GPT-2, Llama 3,
/// Qwen: ` ?\p{L}+` starts a pre-token at the space), Metaspace and whitespace-splitting ones,
/// where it changes nothing; a normalizer that prepends `▁` to every sequence (Llama 2's
/// tokenizer.json) adds one `▁` per piece, one or two tokens.
const SEAM_SLACK: u64 = 4;

/// [`Tokenizer::encode_within`] for a model's tokenizer. A text of up to [`WHOLE_TEXT_BYTES`]
/// is encoded whole. A larger one is counted [`PIECE_BYTES`] at a time (so memory stays a
/// fixed amount above the text itself) and refused as soon as the pieces' count, less
/// [`SEAM_SLACK`] per cut, reaches `limit`: the whole text cannot then have fewer tokens. If the
/// count stays under that bound to the end, the text is encoded whole after all, so a prompt
/// within the limit always gets exactly the ids (and count) of the whole text; that only
/// happens for texts of few, long tokens, whose size the context limit bounds.
fn hf_encode_within(
    tok: &tokenizers::Tokenizer,
    text: &str,
    special: bool,
    limit: u32,
) -> Result<Counted, TokenizeError> {
    if text.len() > WHOLE_TEXT_BYTES {
        let (mut counted, mut pieces, mut rest) = (0u64, 0u64, text);
        while !rest.is_empty() {
            let (piece, tail) = rest.split_at(piece_end(rest, PIECE_BYTES));
            let n =
                tok.encode_fast(piece, special && pieces == 0).map_err(|e| TokenizeError::Encode(e.to_string()))?.len()
                    as u64;
            counted += n;
            pieces += 1;
            rest = tail;
            let at_least = counted.saturating_sub(SEAM_SLACK * pieces);
            if at_least >= limit as u64 {
                return Ok(Counted { ids: Vec::new(), count: at_least, exact: false });
            }
        }
    }
    let ids = hf_encode(tok, text, special)?;
    Ok(Counted { count: ids.len() as u64, ids, exact: true })
}

/// Where the first piece of `text` (at most `max` bytes) ends: before the last space in its
/// second half that follows a non-whitespace byte; else before the last such ASCII whitespace;
/// else at the last char boundary.
fn piece_end(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let b = text.as_bytes();
    let ws = |c: u8| matches!(c, b' ' | b'\n' | b'\t' | b'\r');
    let lo = (max / 2).max(1);
    let before = |pred: &dyn Fn(u8) -> bool| (lo..=max).rev().find(|&p| pred(b[p]) && !ws(b[p - 1]));
    before(&|c| c == b' ')
        .or_else(|| before(&ws))
        .unwrap_or_else(|| (1..=max).rev().find(|&p| text.is_char_boundary(p)).unwrap_or(max))
}

const FNV_INIT: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, continued over `bytes`: a stable hash for the approximate tokenizer's ids.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The approximate tokenizer, fed text in any number of parts with the same result as the
/// whole: words (leading whitespace included) cost one token per four characters, punctuation
/// one each, a run of whitespace before punctuation or the end one. Ids are a hash of the
/// token's text, so equal text gives equal tokens. It holds no text (each token's hash is
/// computed as its characters arrive) and keeps at most `keep` ids, counting the rest.
pub struct ApproxEncoder {
    ids: Vec<u32>,
    keep: usize,
    count: u64,
    /// Hash of the open token's text so far.
    token: u64,
    /// A token is open (whitespace, or a word's characters).
    open: bool,
    in_word: bool,
    /// Characters of the word in the open token (1 to 4).
    group: u8,
}

impl ApproxEncoder {
    pub fn new(keep: usize) -> Self {
        ApproxEncoder { ids: Vec::new(), keep, count: 0, token: FNV_INIT, open: false, in_word: false, group: 0 }
    }

    fn emit(&mut self, h: u64) {
        if self.ids.len() < self.keep {
            self.ids.push(APPROX_FIRST_ID + (h % APPROX_VOCAB as u64) as u32);
        }
        self.count += 1;
    }

    /// Ends the open token.
    fn flush(&mut self) {
        if self.open {
            self.emit(self.token);
        }
        (self.token, self.open, self.in_word, self.group) = (FNV_INIT, false, false, 0);
    }

    pub fn feed(&mut self, text: &str) {
        if self.ids.capacity() == 0 {
            self.ids.reserve((text.len() / 4 + 1).min(self.keep).min(1 << 20));
        }
        let mut utf8 = [0u8; 4];
        for c in text.chars() {
            let bytes = c.encode_utf8(&mut utf8).as_bytes();
            if c.is_alphanumeric() {
                if self.in_word && self.group == 4 {
                    self.emit(self.token);
                    (self.token, self.group) = (FNV_INIT, 0);
                }
                (self.in_word, self.open) = (true, true);
                self.token = fnv(self.token, bytes);
                self.group += 1;
            } else if c.is_whitespace() {
                // Whitespace ends a word and rides with the next one.
                if self.in_word {
                    self.flush();
                }
                self.open = true;
                self.token = fnv(self.token, bytes);
            } else {
                // Punctuation stands alone (after any open token).
                self.flush();
                self.emit(fnv(FNV_INIT, bytes));
            }
        }
    }

    pub fn finish(mut self) -> Counted {
        self.flush();
        Counted { ids: self.ids, count: self.count, exact: true }
    }
}

/// The approximate tokenizer as it was written before [`ApproxEncoder`], kept as the oracle of
/// its tests: splits text into words (leading whitespace included) and punctuation; a word
/// costs one token per four characters.
#[cfg(test)]
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

#[cfg(test)]
fn xxhash_rust_like(bytes: &[u8]) -> u64 {
    fnv(FNV_INIT, bytes)
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

    /// Text of `bytes` bytes or a little more: words, numbers, punctuation, newlines and runs of
    /// spaces, from a fixed generator.
    fn sample_text(bytes: usize) -> String {
        const WORDS: &[&str] =
            &["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokens", "are", "counted", "here"];
        const GLUE: &[&str] = &[" ", " ", " ", " ", ", ", ". ", "\n", "  ", "! ", " 1234 ", "\n\n", " (", ") "];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut out = String::with_capacity(bytes + 16);
        while out.len() < bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
            out.push_str(GLUE[((x >> 20) % GLUE.len() as u64) as usize]);
        }
        out
    }

    /// A byte-level BPE tokenizer (GPT-2 style pre-tokenizer, a BOS post-processor) that knows
    /// the words of [`sample_text`], written to a model directory and loaded as a server does.
    fn byte_level_tokenizer() -> Tokenizer {
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        alphabet.sort();
        let mut vocab: Vec<String> = vec!["<|bos|>".into()];
        vocab.extend(alphabet.iter().map(|c| c.to_string()));
        let mut merges: Vec<String> = Vec::new();
        for word in ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokens", "are", "counted", "here"]
        {
            for spaced in [false, true] {
                let mut chars: Vec<String> = word.chars().map(|c| c.to_string()).collect();
                if spaced {
                    chars.insert(0, "\u{120}".into());
                }
                let mut cur = chars[0].clone();
                for c in &chars[1..] {
                    let merged = format!("{cur}{c}");
                    if !vocab.contains(&merged) {
                        merges.push(format!("{cur} {c}"));
                        vocab.push(merged.clone());
                    }
                    cur = merged;
                }
            }
        }
        let vocab: serde_json::Map<String, Value> =
            vocab.into_iter().enumerate().map(|(i, t)| (t, Value::from(i as u64))).collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let file = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<|bos|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [0], "tokens": ["<|bos|>"]}}},
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges},
        });
        let dir =
            std::env::temp_dir().join(format!("servesim-bpe-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), file.to_string()).unwrap();
        let t = Tokenizer::from_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        t
    }

    #[test]
    fn large_prompts_are_counted_in_pieces_and_within_the_limit_get_the_whole_texts_ids() {
        let t = byte_level_tokenizer();
        let text = sample_text(1 << 20);
        let whole = t.encode(&text, true).unwrap();
        assert_eq!(whole[0], 0, "BOS");
        assert!(whole.len() > 100_000 && whole.len() < text.len() / 2, "{} tokens", whole.len());
        // A cut before a space that follows a non-space is a pre-token boundary of byte-level
        // BPE: the pieces' counts add up to the whole text's exactly (SEAM_SLACK is for others).
        let (mut rest, mut sum, mut pieces) = (text.as_str(), 0, 0);
        while !rest.is_empty() {
            let (piece, tail) = rest.split_at(piece_end(rest, PIECE_BYTES));
            assert!(piece.len() <= PIECE_BYTES && (tail.is_empty() || piece.len() > PIECE_BYTES / 2));
            sum += t.encode(piece, pieces == 0).unwrap().len();
            (rest, pieces) = (tail, pieces + 1);
        }
        assert_eq!(sum, whole.len());
        assert!(pieces >= 16, "{pieces} pieces");
        // Within the limit (by one token): exactly the whole text's ids.
        let n = whole.len() as u64;
        let within = t.encode_within(&text, true, n as u32 + 1).unwrap();
        assert_eq!(within, Counted { ids: whole.clone(), count: n, exact: true });
        // At the limit the bound cannot tell (the slack): counted whole, exactly, and refused by the caller.
        assert_eq!(t.encode_within(&text, true, n as u32).unwrap().count, n);
        // Far over it: refused after the first pieces, with a true lower bound.
        let over = t.encode_within(&text, true, 1000).unwrap();
        assert!(!over.exact && over.ids.is_empty() && (1000..n).contains(&over.count), "{over:?}");
        assert!(over.count < 40_000, "counting stopped after the first piece or two: {}", over.count);
        // Small texts are encoded whole, as before.
        let small = &text[..10_000];
        let c = t.encode_within(small, false, 1_000_000).unwrap();
        assert_eq!((c.ids, c.exact), (t.encode(small, false).unwrap(), true));
        let c = t.encode_within(small, false, 10).unwrap();
        assert!(c.exact && c.count as usize == t.encode(small, false).unwrap().len());
    }

    #[test]
    fn pieces_end_before_a_space_after_a_word_or_at_a_char_boundary() {
        assert_eq!(piece_end("short", 16), 5);
        assert_eq!(piece_end("aaaa bbbb cccc dddd", 12), 9, "before the space of ' cccc'");
        assert_eq!(piece_end("aaaa\nbbbbbbbbbbbbbb", 8), 4, "any whitespace when no space");
        let wide = "日本語".repeat(10);
        let end = piece_end(&wide, 8);
        assert!(wide.is_char_boundary(end) && end <= 8 && end > 0, "{end}");
    }

    #[test]
    fn the_approximate_encoder_counts_text_fed_in_parts_as_the_whole() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let alphabet: Vec<char> = "ab1Zé日 \n\t\u{3000}.,<|>€_-".chars().collect();
        let strategy = (
            proptest::collection::vec(0..alphabet.len(), 0..60),
            proptest::collection::vec(0usize..60, 0..4),
            0usize..30,
        );
        let mut runner = TestRunner::new(Config { cases: 3000, failure_persistence: None, ..Config::default() });
        runner
            .run(&strategy, |(chars, cuts, keep)| {
                let text: String = chars.iter().map(|&i| alphabet[i]).collect();
                let expected = approx_encode(&text);
                let mut e = ApproxEncoder::new(keep);
                let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(chars.len())).collect();
                cuts.sort();
                let mut at = 0;
                let chars: Vec<char> = text.chars().collect();
                for c in cuts.into_iter().chain([chars.len()]) {
                    let part: String = chars[at..c].iter().collect();
                    e.feed(&part);
                    at = c;
                }
                let got = e.finish();
                prop_assert_eq!(got.count, expected.len() as u64);
                prop_assert_eq!(&got.ids[..], &expected[..keep.min(expected.len())]);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn plain_chats_counted_per_message_match_the_rendered_text() {
        let t = Tokenizer::approximate();
        let messages: Vec<Value> = vec![
            serde_json::json!({"role": "system", "content": "Be brief."}),
            serde_json::json!({"role": "user", "content": "  hello,\nworld  "}),
            serde_json::json!({"role": "we ird|>", "content": ""}),
        ];
        let text = t.render_chat(messages.clone(), serde_json::Map::new()).unwrap();
        let whole = t.encode(&text, false).unwrap();
        let mut plain = PlainChat::new(usize::MAX);
        for m in &messages {
            plain.message(m);
        }
        assert_eq!(plain.finish(), Counted { count: whole.len() as u64, ids: whole.clone(), exact: true });
        let mut capped = PlainChat::new(5);
        for m in &messages {
            capped.message(m);
        }
        let capped = capped.finish();
        assert_eq!((&capped.ids[..], capped.count), (&whole[..5], whole.len() as u64));
    }
}
