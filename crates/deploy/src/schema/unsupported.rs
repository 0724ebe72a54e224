//! Keys the reference accepts for what servesim does not model, refused by path.

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

pub(super) fn unsupported(o: &mut Reader, key: &'static str, what: &str) -> Result<(), DeployError> {
    if o.value(key).is_some() {
        return Err(o.err(key, format!("{what} is not supported by servesim yet")));
    }
    Ok(())
}
