//! The live server's errors: setup failures ([`LiveError`]), model files ([`ModelError`]) and
//! turning text into tokens ([`TokenizeError`]). What a client gets back is an
//! [`crate::openai::ApiError`].

use std::path::PathBuf;

/// Why the server could not start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot listen on {addr}{}: {source}", worker.map(|w| format!(" (worker {w})")).unwrap_or_default())]
    Listen {
        addr: String,
        worker: Option<usize>,
        #[source]
        source: std::io::Error,
    },
    #[error("--worker-base-port {base}: worker {worker} has no port")]
    WorkerPort { base: u16, worker: usize },
    #[error("ZMQ port {base}+{rank} is out of range")]
    ZmqPort { base: u16, rank: u32 },
    #[error("ZMQ KV {what}: cannot bind {endpoint}: {source}")]
    ZmqBind {
        what: &'static str,
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    /// KV events beside the recurrent-state cache, which servesim does not model.
    #[error(
        "--zmq-kv-events-port: worker {worker} runs state_cache, whose KV events servesim does not model (its \
         evictions would report the saved states' blocks)"
    )]
    StateCacheEvents { worker: usize },
    #[error("cannot start engine thread {rank}: {source}")]
    Spawn {
        rank: usize,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The shutdown timeout passed with responses still in flight: they were cut.
    #[error("shutdown timeout ({seconds} s) passed; {dropped} connection(s) dropped, their requests aborted")]
    ShutdownTimeout { seconds: f64, dropped: usize },
    /// A second signal cut the responses still in flight.
    #[error("stopped at once by a second signal; {dropped} connection(s) dropped, their requests aborted")]
    StoppedAtOnce { dropped: usize },
}

/// A model directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("--model-path {}: not a local directory (servesim reads tokenizer files locally and downloads nothing)", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error("{}: no ordinary token decodes to text", .0.display())]
    NoVocabulary(PathBuf),
    #[error("{}: chat_template must be a string", .0.display())]
    TemplateType(PathBuf),
    #[error("{}: chat template does not compile: {source}", dir.display())]
    TemplateCompile {
        dir: PathBuf,
        #[source]
        source: minijinja::Error,
    },
}

/// A prompt that cannot be turned into tokens.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer: {0}")]
    Encode(String),
    #[error("chat template: {0}")]
    Render(#[source] minijinja::Error),
}
