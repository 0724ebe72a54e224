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

/// Control characters (escape sequences, NULs, bidirectional overrides) of input text made
/// visible as `\x1b`, `\u{202e}`, ..., so an error echoing a file's bytes or name cannot drive
/// the terminal that shows it.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && unsafe_char(c) => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A number as a user would write it: `1e308` and `1e-9`, not hundreds of digits.
pub fn short_number(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{}: ", escape_controls(&file.to_string_lossy()), line)?,
            (Some(file), None) => write!(f, "{}: ", escape_controls(&file.to_string_lossy()))?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, "`{}`: ", escape_controls(field))?;
        }
        write!(f, "{}", escape_controls(&self.message))
    }
}

impl std::error::Error for InputError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_of_input_are_escaped_in_messages() {
        let e = InputError::at_line(
            std::path::Path::new("e\u{1b}[2J.jsonl"),
            1,
            Some("k\u{7}"),
            "expected a JSON object, found \u{1b}]0;PWNED\u{7}\u{0}\t\u{9b}\u{202e}é",
        );
        assert_eq!(
            e.to_string(),
            "e\\x1b[2J.jsonl:1: `k\\x07`: expected a JSON object, found \\x1b]0;PWNED\\x07\\x00\\t\\u{9b}\\u{202e}é"
        );
    }
}
