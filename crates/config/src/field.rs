//! [`Field`]: a key's state, absent, explicitly `null`, or a value.

/// A key's state: absent, explicitly `null`, or a value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Field<T> {
    #[default]
    Missing,
    Null,
    Set(T),
}

impl<T> Field<T> {
    /// The value, with `null` and missing both meaning "use the default".
    pub fn or(self, default: T) -> T {
        match self {
            Field::Set(v) => v,
            _ => default,
        }
    }

    /// `Some(v)` if set, `None` if null, `default` if missing.
    pub fn nullable_or(self, default: Option<T>) -> Option<T> {
        match self {
            Field::Missing => default,
            Field::Null => None,
            Field::Set(v) => Some(v),
        }
    }

    pub fn set(self) -> Option<T> {
        match self {
            Field::Set(v) => Some(v),
            _ => None,
        }
    }

    pub fn is_set(&self) -> bool {
        matches!(self, Field::Set(_))
    }
}
