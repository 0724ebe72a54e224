//! The OpenAI-compatible wire format: reading requests ([`request`], [`body`] over the [`raw`]
//! primitives), writing responses ([`response`]) and the errors clients get ([`ApiError`]).

pub mod body;
mod messages;
mod prompt;
pub mod raw;
pub mod request;
pub mod response;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod legacy;

pub use request::{parse, GenRequest};

/// The kind of an error response: its status code and the `type` clients see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    BadRequest,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    PayloadTooLarge,
    Internal,
    Unavailable,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::RequestTimeout => 408,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::Internal => 500,
            ErrorKind::Unavailable => 503,
        }
    }

    /// The `type` of the error object (vLLM's names, the OpenAI SDK's exception classes).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "BadRequestError",
            ErrorKind::NotFound => "NotFoundError",
            ErrorKind::MethodNotAllowed => "MethodNotAllowedError",
            ErrorKind::RequestTimeout => "RequestTimeoutError",
            ErrorKind::PayloadTooLarge => "RequestEntityTooLarge",
            ErrorKind::Internal => "InternalServerError",
            ErrorKind::Unavailable => "ServiceUnavailableError",
        }
    }
}

/// An error to send back: its kind, a message and the offending parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), param: None }
    }

    pub fn bad(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::BadRequest, message)
    }

    /// A 400 about one parameter (a dotted path for nested fields: `nvext.backend_instance_id`).
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        ApiError { kind: ErrorKind::BadRequest, message: message.into(), param: Some(param.to_string()) }
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    pub fn body(&self) -> response::ErrorBody<'_> {
        response::ErrorBody {
            error: response::ErrorDetail {
                message: &self.message,
                kind: self.kind.name(),
                param: self.param.as_deref(),
                code: self.status(),
            },
        }
    }
}
