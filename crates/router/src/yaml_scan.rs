//! A linear scan of YAML text that follows libyaml's tokenizer far enough to know, at every
//! token, how deep the lists and mappings nest (flow brackets and block indentation), where the
//! tags are, and which plain scalars are integers beyond 64 bits. It never fails on bad YAML:
//! the parser reports that; where the scan and libyaml could disagree it errs towards counting
//! more depth, never less.
//!
//! It lives here, the lowest crate that reads YAML, so that every YAML reader (the router
//! policy configuration, the deployment configuration) can cap nesting before it parses.

/// A tag token: its byte range and line (from 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Tag {
    pub start: usize,
    pub end: usize,
    pub line: usize,
}

#[derive(Debug, Default, PartialEq)]
pub struct Found {
    pub tags: Vec<Tag>,
    /// Byte ranges of plain integers that fit neither u64 nor i64.
    pub big_ints: Vec<(usize, usize)>,
    /// The deepest nesting seen.
    pub depth: usize,
}

/// Nesting deeper than the limit, first reached on `line` (from 1).
#[derive(Debug, PartialEq)]
pub struct TooDeep {
    pub line: usize,
}

pub fn scan(text: &str, limit: usize) -> Result<Found, TooDeep> {
    let mut s = Scanner {
        b: text.as_bytes(),
        i: 0,
        line: 1,
        col: 0,
        flow: 0,
        indent: -1,
        indents: Vec::new(),
        key_allowed: true,
        key: None,
        limit,
        found: Found::default(),
    };
    s.run()?;
    Ok(s.found)
}

/// The value of a plain integer scalar beyond 64 bits, as YAML 1.2 (and serde_yaml) reads
/// integers: decimal, `0x`, `0o`, `0b`, an optional sign.
pub fn big_int_value(s: &str) -> Option<f64> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if let Some(d) = rest.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = rest.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = rest.strip_prefix("0b") {
        (2, d)
    } else {
        if rest.len() > 1 && rest.starts_with('0') {
            return None; // leading zeros: a string in YAML 1.2
        }
        (10, rest)
    };
    if digits.is_empty() || !digits.bytes().all(|c| (c as char).is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let fits = magnitude <= i64::MAX as u128 + 1;
        (!fits && magnitude <= i128::MAX as u128 + 1).then(|| -(magnitude as f64))
    } else {
        (magnitude > u64::MAX as u128).then_some(magnitude as f64)
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    /// Line (from 1) and column (in characters, from 0) of `i`.
    line: usize,
    col: usize,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// libyaml's block indentation: the current column and the enclosing ones.
    indent: isize,
    indents: Vec<isize>,
    /// Whether a simple key may start here, and where the pending block-level one started
    /// (line, column, byte).
    key_allowed: bool,
    key: Option<(usize, usize, usize)>,
    limit: usize,
    found: Found,
}

impl Scanner<'_> {
    fn at(&self, k: usize) -> u8 {
        self.b.get(self.i + k).copied().unwrap_or(0)
    }

    fn eof(&self) -> bool {
        self.i >= self.b.len()
    }

    /// The length of the line break at `i + k` (0: none), as libyaml counts breaks.
    fn brk(&self, k: usize) -> usize {
        let j = self.i + k;
        match self.b.get(j..).unwrap_or(&[]) {
            [b'\r', b'\n', ..] => 2,
            [b'\r' | b'\n', ..] => 1,
            [0xC2, 0x85, ..] => 2,
            [0xE2, 0x80, 0xA8 | 0xA9, ..] => 3,
            _ => 0,
        }
    }

    fn blank(&self, k: usize) -> bool {
        matches!(self.at(k), b' ' | b'\t')
    }

    fn blankz(&self, k: usize) -> bool {
        self.i + k >= self.b.len() || self.blank(k) || self.brk(k) > 0
    }

    /// Moves past one character.
    fn bump(&mut self) {
        let n = match self.at(0) {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        self.i = (self.i + n).min(self.b.len());
        self.col += 1;
    }

    /// Moves past the line break at `i`.
    fn newline(&mut self) {
        self.i += self.brk(0).max(1);
        self.i = self.i.min(self.b.len());
        self.line += 1;
        self.col = 0;
    }

    fn skip_to_line_end(&mut self) {
        while !self.eof() && self.brk(0) == 0 {
            self.bump();
        }
    }

    fn document_marker(&self) -> bool {
        self.col == 0
            && (self.b[self.i..].starts_with(b"---") || self.b[self.i..].starts_with(b"..."))
            && self.blankz(3)
    }

    fn check(&mut self) -> Result<(), TooDeep> {
        let depth = self.flow + self.indents.len();
        self.found.depth = self.found.depth.max(depth);
        if depth > self.limit {
            return Err(TooDeep { line: self.line });
        }
        Ok(())
    }

    fn roll(&mut self, col: usize) -> Result<(), TooDeep> {
        if self.flow == 0 && self.indent < col as isize {
            self.indents.push(self.indent);
            self.indent = col as isize;
            self.check()?;
        }
        Ok(())
    }

    fn unroll(&mut self, col: isize) {
        while self.indent > col {
            self.indent = self.indents.pop().unwrap_or(-1);
        }
    }

    fn save_key(&mut self) {
        if self.flow == 0 && self.key_allowed {
            self.key = Some((self.line, self.col, self.i));
        }
    }

    fn run(&mut self) -> Result<(), TooDeep> {
        loop {
            self.skip_to_token();
            if self.eof() {
                return Ok(());
            }
            if let Some((line, _, start)) = self.key {
                if line != self.line || start + 1024 < self.i {
                    self.key = None;
                }
            }
            if self.flow == 0 {
                self.unroll(self.col as isize);
            }
            let c = self.at(0);
            if self.col == 0 && c == b'%' {
                self.skip_to_line_end();
                continue;
            }
            if self.document_marker() {
                self.unroll(-1);
                self.key = None;
                self.key_allowed = false;
                for _ in 0..3 {
                    self.bump();
                }
                continue;
            }
            match c {
                b'[' | b'{' => {
                    self.save_key();
                    self.flow += 1;
                    self.check()?;
                    self.key_allowed = true;
                    self.bump();
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    self.key_allowed = false;
                    self.bump();
                }
                b',' => {
                    self.key_allowed = true;
                    self.bump();
                }
                b'-' if self.blankz(1) => {
                    if self.flow == 0 {
                        self.roll(self.col)?;
                        self.key = None;
                    }
                    self.key_allowed = true;
                    self.bump();
                }
                b'?' if self.flow > 0 || self.blankz(1) => {
                    if self.flow == 0 {
                        self.roll(self.col)?;
                        self.key = None;
                    }
                    self.key_allowed = self.flow == 0;
                    self.bump();
                }
                b':' if self.flow > 0 || self.blankz(1) => {
                    if self.flow > 0 {
                        self.key_allowed = false;
                    } else if let Some((_, col, _)) = self.key.take() {
                        self.roll(col)?;
                        self.key_allowed = false;
                    } else {
                        self.roll(self.col)?;
                        self.key_allowed = true;
                    }
                    self.bump();
                }
                b'*' | b'&' => {
                    self.save_key();
                    self.bump();
                    while self.at(0).is_ascii_alphanumeric() || matches!(self.at(0), b'_' | b'-') {
                        self.bump();
                    }
                    self.key_allowed = false;
                }
                b'!' => {
                    self.save_key();
                    let (start, line) = (self.i, self.line);
                    self.scan_tag();
                    self.found.tags.push(Tag { start, end: self.i, line });
                    self.key_allowed = false;
                }
                b'|' | b'>' if self.flow == 0 => {
                    self.key = None;
                    self.key_allowed = true;
                    self.scan_block_scalar();
                }
                b'\'' | b'"' => {
                    self.save_key();
                    self.scan_quoted(c);
                    self.key_allowed = false;
                }
                _ if self.plain_start() => {
                    self.save_key();
                    self.scan_plain();
                }
                // A character no token starts with: libyaml stops here; so does nothing
                // else, the scan goes on past it.
                _ => self.bump(),
            }
        }
    }

    fn skip_to_token(&mut self) {
        loop {
            while self.at(0) == b' ' || ((self.flow > 0 || !self.key_allowed) && self.at(0) == b'\t') {
                self.bump();
            }
            if self.at(0) == b'#' {
                self.skip_to_line_end();
            }
            if self.brk(0) == 0 {
                return;
            }
            self.newline();
            if self.flow == 0 {
                self.key_allowed = true;
            }
        }
    }

    fn plain_start(&self) -> bool {
        let c = self.at(0);
        let indicator = matches!(
            c,
            b'-' | b'?'
                | b':'
                | b','
                | b'['
                | b']'
                | b'{'
                | b'}'
                | b'#'
                | b'&'
                | b'*'
                | b'!'
                | b'|'
                | b'>'
                | b'\''
                | b'"'
                | b'%'
                | b'@'
                | b'`'
        );
        !(self.blankz(0) || indicator)
            || (c == b'-' && !self.blank(1))
            || (self.flow == 0 && matches!(c, b'?' | b':') && !self.blankz(1))
    }

    fn scan_plain(&mut self) {
        let min_col = self.indent + 1;
        let start = self.i;
        let mut end = self.i;
        let mut lines = 0;
        'scalar: loop {
            if self.document_marker() || self.at(0) == b'#' {
                break;
            }
            while !self.blankz(0) {
                let c = self.at(0);
                if (c == b':' && (self.blankz(1) || (self.flow > 0 && b",?[]{}".contains(&self.at(1)))))
                    || (self.flow > 0 && b",[]{}".contains(&c))
                {
                    break 'scalar;
                }
                self.bump();
                end = self.i;
            }
            if !(self.blank(0) || self.brk(0) > 0) {
                break;
            }
            while self.blank(0) || self.brk(0) > 0 {
                if self.blank(0) {
                    self.bump();
                } else {
                    self.newline();
                    lines += 1;
                }
            }
            if self.flow == 0 && (self.col as isize) < min_col {
                break;
            }
        }
        self.key_allowed = lines > 0;
        if end > start {
            let text = std::str::from_utf8(&self.b[start..end]).unwrap_or("");
            if !text.contains(['\n', '\r']) && big_int_value(text).is_some() {
                self.found.big_ints.push((start, end));
            }
        }
    }

    fn scan_quoted(&mut self, quote: u8) {
        self.bump();
        loop {
            if self.eof() || self.document_marker() {
                return;
            }
            let c = self.at(0);
            if quote == b'\'' && c == b'\'' {
                self.bump();
                if self.at(0) != b'\'' {
                    return;
                }
                self.bump();
                continue;
            }
            if quote == b'"' && c == b'"' {
                self.bump();
                return;
            }
            if quote == b'"' && c == b'\\' {
                self.bump();
                if self.brk(0) > 0 {
                    self.newline();
                } else if !self.eof() {
                    self.bump();
                }
                continue;
            }
            if self.brk(0) > 0 {
                self.newline();
            } else {
                self.bump();
            }
        }
    }

    fn scan_tag(&mut self) {
        self.bump();
        if self.at(0) == b'<' {
            while !self.blankz(0) && self.at(0) != b'>' {
                self.bump();
            }
            if self.at(0) == b'>' {
                self.bump();
            }
            return;
        }
        while self.at(0).is_ascii_alphanumeric() || b"-_;/?:@&=+$.%!~*'()".contains(&self.at(0)) {
            self.bump();
        }
    }

    /// A literal (`|`) or folded (`>`) scalar: its header, then every line indented past
    /// the block it belongs to, as libyaml's `scan_block_scalar` finds them.
    fn scan_block_scalar(&mut self) {
        self.bump();
        let mut increment = 0;
        for _ in 0..2 {
            match self.at(0) {
                b'+' | b'-' => self.bump(),
                d @ b'1'..=b'9' => {
                    increment = (d - b'0') as isize;
                    self.bump();
                }
                _ => break,
            }
        }
        while self.blank(0) {
            self.bump();
        }
        if self.at(0) == b'#' {
            self.skip_to_line_end();
        }
        if self.eof() || self.brk(0) == 0 {
            return;
        }
        self.newline();
        let mut indent = match increment {
            0 => 0,
            n if self.indent >= 0 => self.indent + n,
            n => n,
        };
        self.block_breaks(&mut indent);
        while self.col as isize == indent && !self.eof() {
            self.skip_to_line_end();
            if self.eof() {
                break;
            }
            self.newline();
            self.block_breaks(&mut indent);
        }
    }

    fn block_breaks(&mut self, indent: &mut isize) {
        let mut max = 0;
        loop {
            while (*indent == 0 || (self.col as isize) < *indent) && self.at(0) == b' ' {
                self.bump();
            }
            max = max.max(self.col as isize);
            if self.brk(0) == 0 {
                break;
            }
            self.newline();
        }
        if *indent == 0 {
            *indent = max.max(self.indent + 1).max(1);
        }
    }
}
