//! Reads the columns of one perf table into plain vectors.
//!
//! The tables are small (at most ~10⁵ rows) and read once per process, so every requested
//! column is decoded whole with the `parquet` crate's typed column readers.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;

use parquet::column::reader::ColumnReader;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::error::PerfError;

/// One decoded column. Nulls become `None`.
#[derive(Clone, Debug)]
pub enum Column {
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    Str(Vec<Option<String>>),
    Bool(Vec<Option<bool>>),
}

/// The requested columns of a table, by name.
#[derive(Debug)]
pub struct Table {
    pub path: String,
    pub rows: usize,
    columns: Vec<(String, Column)>,
}

impl Table {
    /// Reads `wanted` columns of `path`; columns the file lacks are simply absent (use
    /// [`Table::int`] etc. to require them).
    pub fn read(path: &Path, wanted: &[&str]) -> Result<Table, PerfError> {
        let shown = path.display().to_string();
        let err = |e: parquet::errors::ParquetError| PerfError::data(format!("cannot read parquet table {shown}: {e}"));
        let file = File::open(path).map_err(|e| PerfError::data(format!("cannot open {shown}: {e}")))?;
        let reader = SerializedFileReader::new(file).map_err(err)?;
        let meta = reader.metadata();
        let schema = meta.file_metadata().schema_descr();
        let mut columns: Vec<(String, Column)> = Vec::new();
        let mut indices = Vec::new();
        for name in wanted {
            if let Some(i) = (0..schema.num_columns()).find(|&i| schema.column(i).name() == *name) {
                indices.push((i, name.to_string()));
            }
        }
        let mut rows = 0usize;
        for (_, name) in &indices {
            columns.push((name.clone(), Column::Int(Vec::new())));
        }
        let mut first = true;
        for g in 0..meta.num_row_groups() {
            let group = reader.get_row_group(g).map_err(err)?;
            let n = meta.row_group(g).num_rows() as usize;
            rows += n;
            for (slot, (i, name)) in indices.iter().enumerate() {
                let col = group.get_column_reader(*i).map_err(err)?;
                let mut defs: Vec<i16> = Vec::new();
                let max_def = schema.column(*i).max_def_level();
                macro_rules! read_all {
                    ($r:expr, $conv:expr, $variant:ident) => {{
                        let mut r = $r;
                        let mut values = Vec::new();
                        let mut done = 0;
                        while done < n {
                            let (recs, _, _) =
                                r.read_records(n - done, Some(&mut defs), None, &mut values).map_err(err)?;
                            if recs == 0 {
                                break;
                            }
                            done += recs;
                        }
                        if done != n {
                            return Err(PerfError::data(format!(
                                "parquet table {shown}: column {name} has {done} of {n} rows in row group {g}"
                            )));
                        }
                        let mut it = values.into_iter();
                        let mut out = Vec::with_capacity(n);
                        for k in 0..n {
                            if max_def > 0 && defs.get(k).copied().unwrap_or(0) < max_def {
                                out.push(None);
                            } else {
                                out.push(it.next().map($conv));
                            }
                        }
                        if first {
                            columns[slot].1 = Column::$variant(out);
                        } else if let Column::$variant(v) = &mut columns[slot].1 {
                            v.extend(out);
                        }
                    }};
                }
                match col {
                    ColumnReader::Int64ColumnReader(r) => read_all!(r, |v: i64| v, Int),
                    ColumnReader::Int32ColumnReader(r) => read_all!(r, |v: i32| v as i64, Int),
                    ColumnReader::DoubleColumnReader(r) => read_all!(r, |v: f64| v, Float),
                    ColumnReader::FloatColumnReader(r) => read_all!(r, |v: f32| v as f64, Float),
                    ColumnReader::BoolColumnReader(r) => read_all!(r, |v: bool| v, Bool),
                    ColumnReader::ByteArrayColumnReader(r) => read_all!(
                        r,
                        |v: parquet::data_type::ByteArray| String::from_utf8_lossy(v.data()).into_owned(),
                        Str
                    ),
                    _ => {
                        return Err(PerfError::data(format!(
                            "parquet table {shown}: column {name} has an unsupported physical type"
                        )))
                    }
                }
            }
            first = false;
        }
        Ok(Table { path: shown, rows, columns })
    }

    fn get(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn missing(&self, name: &str) -> PerfError {
        PerfError::data(format!("parquet table {} has no column {name:?}", self.path))
    }

    /// An integer column; a null cell is an error naming the row.
    pub fn int(&self, name: &str) -> Result<Vec<i64>, PerfError> {
        match self.get(name) {
            Some(Column::Int(v)) => v
                .iter()
                .enumerate()
                .map(|(i, x)| x.ok_or_else(|| PerfError::data(format!("{}: null {name} in row {i}", self.path))))
                .collect(),
            Some(Column::Float(v)) => v
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Some(f) if f.fract() == 0.0 => Ok(*f as i64),
                    _ => Err(PerfError::data(format!("{}: {name} in row {i} is not an integer", self.path))),
                })
                .collect(),
            Some(_) => Err(PerfError::data(format!("{}: column {name} is not numeric, expected integers", self.path))),
            None => Err(self.missing(name)),
        }
    }

    /// A float column; a null cell is an error naming the row.
    pub fn float(&self, name: &str) -> Result<Vec<f64>, PerfError> {
        match self.get(name) {
            Some(Column::Float(v)) => v
                .iter()
                .enumerate()
                .map(|(i, x)| x.ok_or_else(|| PerfError::data(format!("{}: null {name} in row {i}", self.path))))
                .collect(),
            Some(Column::Int(v)) => v
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.map(|v| v as f64).ok_or_else(|| PerfError::data(format!("{}: null {name} in row {i}", self.path)))
                })
                .collect(),
            Some(_) => Err(PerfError::data(format!("{}: column {name} is not numeric, expected numbers", self.path))),
            None => Err(self.missing(name)),
        }
    }

    /// A text column (nulls kept as `None`), borrowed: tables are read whole and most of a
    /// table's cells are text, so copying them would double the cost of reading.
    pub fn text(&self, name: &str) -> Result<&[Option<String>], PerfError> {
        match self.get(name) {
            Some(Column::Str(v)) => Ok(v),
            Some(_) => Err(PerfError::data(format!("{}: column {name} is not text", self.path))),
            None => Err(self.missing(name)),
        }
    }

    /// A text column if present, else all `None`.
    pub fn text_or_none(&self, name: &str) -> Result<Cow<'_, [Option<String>]>, PerfError> {
        if self.has(name) {
            self.text(name).map(Cow::Borrowed)
        } else {
            Ok(Cow::Owned(vec![None; self.rows]))
        }
    }

    /// An integer column if present (nulls as `None`), else all `None`.
    pub fn int_or_none(&self, name: &str) -> Result<Vec<Option<i64>>, PerfError> {
        match self.get(name) {
            Some(Column::Int(v)) => Ok(v.clone()),
            Some(Column::Float(v)) => Ok(v.iter().map(|x| x.map(|f| f as i64)).collect()),
            Some(_) => Err(PerfError::data(format!("{}: column {name} is not numeric, expected integers", self.path))),
            None => Ok(vec![None; self.rows]),
        }
    }

    /// A Boolean column if present (`None` when the table lacks it); a null cell is an error
    /// naming the row.
    pub fn bool_if_present(&self, name: &str) -> Result<Option<Vec<bool>>, PerfError> {
        match self.get(name) {
            Some(Column::Bool(v)) => v
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.ok_or_else(|| {
                        PerfError::data(format!("{}: null {name} in row {i} (must be true or false)", self.path))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(PerfError::data(format!("{}: column {name} must be Boolean", self.path))),
            None => Ok(None),
        }
    }
}

/// A u32 key from a table cell, or an error naming the table, column and row.
pub fn key_u32(path: &str, col: &str, row: usize, v: i64) -> Result<u32, PerfError> {
    u32::try_from(v).map_err(|_| PerfError::data(format!("{path}: {col} = {v} in row {row} is not a valid key")))
}
