//! Errors about user input, located as precisely as we can: file, line, field.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
pub struct InputError {
    pub file: Option<PathBuf>,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl InputError {
    pub fn new(message: impl Into<String>) -> Self {
        InputError { file: None, line: None, field: None, message: message.into() }
    }

    pub fn at_line(file: &Path, line: usize, field: Option<&str>, message: impl Into<String>) -> Self {
        InputError {
            file: Some(file.to_path_buf()),
            line: Some(line),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    pub fn in_file(file: &Path, message: impl Into<String>) -> Self {
        InputError { file: Some(file.to_path_buf()), line: None, field: None, message: message.into() }
    }

    pub fn with_field(mut self, field: &str) -> Self {
        self.field = Some(field.to_string());
        self
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{}: ", file.display(), line)?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, "`{field}`: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for InputError {}
