//! Profiled timing: pass durations interpolated from measured tables (Dynamo's
//! `planner_profile_data` NPZ).
//!
//! The NPZ holds `prefill_isl[N]` and `prefill_ttft_ms[N]` (prefill time by new prompt tokens),
//! and `decode_active_kv_tokens[R]`, `decode_context_length[C]`, `decode_itl[R][C]` (decode step
//! time by tokens in the batch's KV and mean context length). Prefill is interpolated linearly in
//! one dimension and decode bilinearly, both extrapolating past the table's edges; prefill is
//! floored at 0 and decode at 1 ms.

use std::io::{Cursor, Read, Write};

/// A parsed profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub prefill_isl: Vec<f64>,
    pub prefill_ttft_ms: Vec<f64>,
    pub decode_active_kv_tokens: Vec<f64>,
    pub decode_context_length: Vec<f64>,
    /// Row-major: `decode_itl[r * C + c]` for active-KV row `r` and context column `c`.
    pub decode_itl: Vec<f64>,
}

/// One array read from an `.npy` member.
#[derive(Debug)]
struct Array {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn parse_npy(name: &str, bytes: &[u8]) -> Result<Array, String> {
    let bad = |what: &str| format!("{name}: {what}");
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not an .npy array"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header"));
            }
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(bad(&format!("unsupported .npy version {v}"))),
    };
    let header = bytes.get(start..start + header_len).ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text"))?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header.find(&format!("'{key}'")).ok_or_else(|| bad(&format!("header lacks '{key}'")))?;
        let rest = &header[at + key.len() + 2..];
        Ok(rest[rest.find(':').ok_or_else(|| bad("malformed header"))? + 1..].trim_start())
    };
    let descr = field("descr")?;
    let descr = descr.get(1..).and_then(|d| d.split('\'').next()).ok_or_else(|| bad("malformed descr"))?;
    let fortran = field("fortran_order")?.starts_with("True");
    let shape_text = field("shape")?;
    let shape_text = &shape_text[1..shape_text.find(')').ok_or_else(|| bad("malformed shape"))?];
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("malformed shape")))
        .collect::<Result<_, _>>()?;
    let count: usize = shape.iter().product();
    let body = &bytes[start + header_len..];
    let width = match &descr[1..] {
        "f8" | "i8" | "u8" => 8,
        "f4" | "i4" | "u4" => 4,
        _ => return Err(bad(&format!("unsupported dtype {descr:?} (expected 4- or 8-byte numbers)"))),
    };
    if descr.starts_with('>') {
        return Err(bad("big-endian arrays are not supported"));
    }
    if body.len() < count * width {
        return Err(bad(&format!("holds {} bytes, shape {shape:?} needs {}", body.len(), count * width)));
    }
    let mut data: Vec<f64> = body[..count * width]
        .chunks_exact(width)
        .map(|b| match &descr[1..] {
            "f8" => f64::from_le_bytes(b.try_into().unwrap()),
            "i8" => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            "u8" => u64::from_le_bytes(b.try_into().unwrap()) as f64,
            "f4" => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            "i4" => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            _ => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        })
        .collect();
    if fortran && shape.len() == 2 {
        let (rows, cols) = (shape[0], shape[1]);
        let column_major = data;
        data = (0..rows * cols).map(|i| column_major[(i % cols) * rows + i / cols]).collect();
    }
    if data.iter().any(|x| !x.is_finite()) {
        return Err(bad("contains a non-finite value"));
    }
    Ok(Array { shape, data })
}

fn npy_bytes(shape: &[usize], data: &[f64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

impl Profile {
    /// Reads an NPZ archive (stored or deflated members).
    pub fn from_npz(bytes: &[u8]) -> Result<Profile, String> {
        let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| format!("not an NPZ archive: {e}"))?;
        let mut get = |name: &str| -> Result<Array, String> {
            let member = format!("{name}.npy");
            let mut f = zip.by_name(&member).map_err(|_| format!("missing array {name:?}"))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).map_err(|e| format!("{member}: {e}"))?;
            parse_npy(&member, &buf)
        };
        let isl = get("prefill_isl")?;
        let ttft = get("prefill_ttft_ms")?;
        let active = get("decode_active_kv_tokens")?;
        let ctx = get("decode_context_length")?;
        let itl = get("decode_itl")?;
        let profile = Profile {
            prefill_isl: isl.data,
            prefill_ttft_ms: ttft.data,
            decode_active_kv_tokens: active.data,
            decode_context_length: ctx.data,
            decode_itl: itl.data,
        };
        if itl.shape.len() != 2
            || itl.shape != [profile.decode_active_kv_tokens.len(), profile.decode_context_length.len()]
        {
            return Err(format!(
                "decode_itl has shape {:?}, expected [{}, {}] (active KV tokens × context lengths)",
                itl.shape,
                profile.decode_active_kv_tokens.len(),
                profile.decode_context_length.len()
            ));
        }
        profile.validate()?;
        Ok(profile)
    }

    fn validate(&self) -> Result<(), String> {
        if self.prefill_isl.len() != self.prefill_ttft_ms.len() {
            return Err(format!(
                "prefill_isl has {} values but prefill_ttft_ms has {}",
                self.prefill_isl.len(),
                self.prefill_ttft_ms.len()
            ));
        }
        for (name, axis) in [
            ("prefill_isl", &self.prefill_isl),
            ("decode_active_kv_tokens", &self.decode_active_kv_tokens),
            ("decode_context_length", &self.decode_context_length),
        ] {
            if axis.len() < 2 {
                return Err(format!("{name} needs at least 2 points to interpolate"));
            }
            if axis.windows(2).any(|w| w[1] <= w[0]) {
                return Err(format!("{name} must be strictly increasing"));
            }
        }
        Ok(())
    }

    /// Writes the profile as an NPZ archive (what `from_npz` reads).
    pub fn to_npz(&self) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let arrays: [(&str, Vec<usize>, &[f64]); 5] = [
            ("prefill_isl", vec![self.prefill_isl.len()], &self.prefill_isl),
            ("prefill_ttft_ms", vec![self.prefill_ttft_ms.len()], &self.prefill_ttft_ms),
            ("decode_active_kv_tokens", vec![self.decode_active_kv_tokens.len()], &self.decode_active_kv_tokens),
            ("decode_context_length", vec![self.decode_context_length.len()], &self.decode_context_length),
            (
                "decode_itl",
                vec![self.decode_active_kv_tokens.len(), self.decode_context_length.len()],
                &self.decode_itl,
            ),
        ];
        for (name, shape, data) in arrays {
            zip.start_file(format!("{name}.npy"), options).expect("in-memory zip");
            zip.write_all(&npy_bytes(&shape, data)).expect("in-memory zip");
        }
        zip.finish().expect("in-memory zip").into_inner()
    }

    /// Prefill time of `new_tokens` prompt tokens.
    pub fn prefill_ms(&self, new_tokens: f64) -> f64 {
        interp1(&self.prefill_isl, &self.prefill_ttft_ms, new_tokens).max(0.0)
    }

    /// Decode step time with `active_kv_tokens` in the batch and a mean context of `context`.
    pub fn decode_ms(&self, active_kv_tokens: f64, context: f64) -> f64 {
        let (xs, ys) = (&self.decode_active_kv_tokens, &self.decode_context_length);
        let (i, tx) = segment(xs, active_kv_tokens);
        let (j, ty) = segment(ys, context);
        let at = |r: usize, c: usize| self.decode_itl[r * ys.len() + c];
        let low = at(i, j) + (at(i, j + 1) - at(i, j)) * ty;
        let high = at(i + 1, j) + (at(i + 1, j + 1) - at(i + 1, j)) * ty;
        (low + (high - low) * tx).max(1.0)
    }
}

/// The segment of a sorted axis used for `x` (the first or last one outside the axis) and the
/// position of `x` along it (below 0 or above 1 when extrapolating).
fn segment(axis: &[f64], x: f64) -> (usize, f64) {
    let last = axis.len() - 2;
    let i = axis.partition_point(|&v| v <= x).saturating_sub(1).min(last);
    (i, (x - axis[i]) / (axis[i + 1] - axis[i]))
}

fn interp1(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    let (i, t) = segment(xs, x);
    ys[i] + (ys[i + 1] - ys[i]) * t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture from Dynamo's tests.
    fn fixture() -> Profile {
        Profile {
            prefill_isl: vec![128.0, 256.0],
            prefill_ttft_ms: vec![4.0, 8.0],
            decode_active_kv_tokens: vec![1024.0, 2048.0],
            decode_context_length: vec![128.0, 256.0],
            decode_itl: vec![1.0, 1.5, 2.0, 2.5],
        }
    }

    #[test]
    fn interpolation_and_extrapolation() {
        let p = fixture();
        assert_eq!(p.prefill_ms(128.0), 4.0);
        assert_eq!(p.prefill_ms(192.0), 6.0);
        assert_eq!(p.prefill_ms(512.0), 16.0, "extrapolated past the last point");
        assert_eq!(p.prefill_ms(64.0), 2.0, "and before the first");
        assert_eq!(p.prefill_ms(0.0), 0.0, "floored at zero");
        assert_eq!(p.decode_ms(1024.0, 128.0), 1.0);
        assert_eq!(p.decode_ms(1536.0, 192.0), 1.75, "bilinear in the middle");
        assert_eq!(p.decode_ms(2048.0, 256.0), 2.5);
        assert_eq!(p.decode_ms(3072.0, 256.0), 3.5, "extrapolated along active KV");
        assert_eq!(p.decode_ms(0.0, 0.0), 1.0, "floored at one millisecond");
    }

    /// An .npy file as numpy writes it, with the given header version and dtype.
    fn npy(version: u8, descr: &str, fortran: bool, shape: &str, body: &[u8]) -> Vec<u8> {
        let order = if fortran { "True" } else { "False" };
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
        let fixed = if version == 1 { 10 } else { 12 };
        while (fixed + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY".to_vec();
        out.extend([version, 0]);
        if version == 1 {
            out.extend((header.len() as u16).to_le_bytes());
        } else {
            out.extend((header.len() as u32).to_le_bytes());
        }
        out.extend(header.as_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn npy_dtypes_versions_and_fortran_order() {
        // [[1, 2, 3], [4, 5, 6]] stored column by column as 4-byte floats, version-2 header.
        let body: Vec<u8> = [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse_npy("m", &npy(2, "<f4", true, "(2, 3)", &body)).unwrap();
        assert_eq!((a.shape, a.data), (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let body: Vec<u8> = [-7i64, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse_npy("v", &npy(1, "<i8", false, "(2,)", &body)).unwrap();
        assert_eq!((a.shape, a.data), (vec![2], vec![-7.0, 9.0]));
        let body: Vec<u8> = [3u32, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(parse_npy("u", &npy(3, "<u4", false, "(2,)", &body)).unwrap().data, vec![3.0, 4.0]);
        let err = parse_npy("b", &npy(1, ">f8", false, "(1,)", &[0; 8])).unwrap_err();
        assert!(err.contains("big-endian"), "{err}");
        let err = parse_npy("s", &npy(1, "<f8", false, "(3,)", &[0; 16])).unwrap_err();
        assert!(err.contains("needs 24"), "{err}");
    }

    #[test]
    fn npz_round_trip() {
        let p = fixture();
        assert_eq!(Profile::from_npz(&p.to_npz()).unwrap(), p);
    }

    #[test]
    fn malformed_profiles_are_explained() {
        let mut p = fixture();
        p.prefill_ttft_ms.push(9.0);
        let e = Profile::from_npz(&p.to_npz()).unwrap_err();
        assert!(e.contains("prefill_isl has 2 values but prefill_ttft_ms has 3"), "{e}");
        let mut p = fixture();
        p.decode_itl.pop();
        assert!(Profile::from_npz(&p.to_npz()).unwrap_err().contains("decode_itl"));
        let mut p = fixture();
        p.decode_context_length = vec![256.0, 128.0];
        assert!(Profile::from_npz(&p.to_npz()).unwrap_err().contains("strictly increasing"));
        assert!(Profile::from_npz(b"hello").unwrap_err().contains("not an NPZ archive"));
    }
}
