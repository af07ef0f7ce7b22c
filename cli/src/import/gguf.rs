//! Opening a GGUF file: the magic check, the header (metadata and tensor table, read by
//! candle-core's `gguf_file`), and the checks that every tensor's bytes are really in the
//! file, so a truncated download fails before anything is written.
//!
//! Typed access to metadata values lives here too. GGUF writers disagree on integer
//! widths (llama.cpp writes `u32`, other tools `i32` or `u64`), so [`Gguf::uint`] accepts
//! any non-negative integer. This module knows nothing about architectures or HF names.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};

use super::ImportError;

/// The four bytes every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";

/// An open GGUF file with its header parsed and its tensor table checked against its size.
pub struct Gguf {
    path: PathBuf,
    reader: BufReader<File>,
    content: Content,
    /// Tensor names in the order their data appears in the file.
    order: Vec<String>,
}

impl Gguf {
    /// Opens `path`, reads the header and checks that every tensor lies inside the file.
    pub fn open(path: &Path) -> Result<Gguf, ImportError> {
        let io = |source| ImportError::Read {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut reader = BufReader::new(file);

        let mut magic = [0u8; 4];
        let got = read_up_to(&mut reader, &mut magic).map_err(io)?;
        if got < 4 || &magic != MAGIC {
            return Err(ImportError::NotGguf {
                path: path.to_owned(),
                found: describe_magic(&magic[..got]),
            });
        }
        std::io::Seek::rewind(&mut reader).map_err(io)?;

        let content = Content::read(&mut reader).map_err(|e| ImportError::Malformed {
            path: path.to_owned(),
            reason: header_reason(&without_backtrace(e), len),
        })?;

        // Checked in file order, so a truncation names the first tensor it cuts.
        let mut order: Vec<(u64, String)> = content
            .tensor_infos
            .iter()
            .map(|(name, info)| (info.offset, name.clone()))
            .collect();
        order.sort();
        for (_, name) in &order {
            let info = &content.tensor_infos[name];
            let elems = info.shape.elem_count() as u64;
            let block = info.ggml_dtype.block_size() as u64;
            if !elems.is_multiple_of(block) {
                return Err(ImportError::Malformed {
                    path: path.to_owned(),
                    reason: format!(
                        "tensor `{name}` has {elems} elements, not a multiple of the {:?} block size {block}",
                        info.ggml_dtype
                    ),
                });
            }
            let bytes = elems / block * info.ggml_dtype.type_size() as u64;
            let end = content
                .tensor_data_offset
                .checked_add(info.offset)
                .and_then(|start| start.checked_add(bytes));
            match end {
                Some(end) if end <= len => {}
                _ => {
                    return Err(ImportError::Truncated {
                        path: path.to_owned(),
                        tensor: name.clone(),
                        needed: end.unwrap_or(u64::MAX),
                        len,
                    });
                }
            }
        }
        Ok(Gguf {
            path: path.to_owned(),
            reader,
            content,
            order: order.into_iter().map(|(_, name)| name).collect(),
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> &[String] {
        &self.order
    }

    /// Whether the file holds a tensor of that name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The shape of a tensor, outermost dimension first (as PyTorch writes it), and its
    /// GGML storage type.
    pub fn tensor_info(&self, name: &str) -> Option<(Vec<usize>, GgmlDType)> {
        self.content
            .tensor_infos
            .get(name)
            .map(|info| (info.shape.dims().to_vec(), info.ggml_dtype))
    }

    /// Reads one tensor's quantized blocks.
    pub fn read_tensor(&mut self, name: &str) -> Result<QTensor, ImportError> {
        self.content
            .tensor(&mut self.reader, name, &candle_core::Device::Cpu)
            .map_err(|source| ImportError::Tensor {
                name: name.to_owned(),
                source: without_backtrace(source),
            })
    }

    /// A raw metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// A required string value.
    pub fn string(&self, key: &str) -> Result<&str, ImportError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(self.bad(key, "a string", other)),
        }
    }

    /// An optional string value.
    pub fn opt_string(&self, key: &str) -> Result<Option<&str>, ImportError> {
        self.get(key).map(|_| self.string(key)).transpose()
    }

    /// A required non-negative integer of any width.
    pub fn uint(&self, key: &str) -> Result<u64, ImportError> {
        let value = self.require(key)?;
        as_uint(value).ok_or_else(|| self.bad(key, "a non-negative integer", value))
    }

    /// An optional non-negative integer of any width.
    pub fn opt_uint(&self, key: &str) -> Result<Option<u64>, ImportError> {
        self.get(key).map(|_| self.uint(key)).transpose()
    }

    /// An optional float (f32 or f64; integers are accepted as some writers store `1`).
    pub fn opt_float(&self, key: &str) -> Result<Option<f64>, ImportError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value {
            Value::F32(v) => Ok(Some(f64::from(*v))),
            Value::F64(v) => Ok(Some(*v)),
            other => as_uint(other)
                .map(|v| Some(v as f64))
                .ok_or_else(|| self.bad(key, "a number", other)),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.bad(key, "a boolean", other)),
        }
    }

    /// A required array.
    pub fn array(&self, key: &str) -> Result<&[Value], ImportError> {
        match self.require(key)? {
            Value::Array(items) => Ok(items),
            other => Err(self.bad(key, "an array", other)),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>, ImportError> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.bad(key, "an array of strings", other)),
            })
            .collect()
    }

    fn require(&self, key: &str) -> Result<&Value, ImportError> {
        self.get(key).ok_or_else(|| ImportError::MissingKey {
            path: self.path.clone(),
            key: key.to_owned(),
        })
    }

    fn bad(&self, key: &str, expected: &str, found: &Value) -> ImportError {
        ImportError::BadValue {
            path: self.path.clone(),
            key: key.to_owned(),
            expected: expected.to_owned(),
            found: short_debug(found),
        }
    }
}

/// Any non-negative integer value, whatever its width.
pub fn as_uint(value: &Value) -> Option<u64> {
    match *value {
        Value::U8(v) => Some(u64::from(v)),
        Value::U16(v) => Some(u64::from(v)),
        Value::U32(v) => Some(u64::from(v)),
        Value::U64(v) => Some(v),
        Value::I8(v) => u64::try_from(v).ok(),
        Value::I16(v) => u64::try_from(v).ok(),
        Value::I32(v) => u64::try_from(v).ok(),
        Value::I64(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

/// A metadata value for an error message, cut short (token arrays hold 100k entries).
fn short_debug(value: &Value) -> String {
    let text = match value {
        Value::Array(items) => format!("an array of {} values", items.len()),
        other => format!("{other:?}"),
    };
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

/// Reads until `buf` is full or the file ends; returns how many bytes were read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// What the first bytes of a non-GGUF file look like, for the error message.
fn describe_magic(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "an empty file".to_owned();
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = bytes
        .iter()
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
        .collect();
    let known = match bytes {
        [b'P', b'K', ..] => " (a zip archive: a wheel? extract the .gguf file from it first)",
        [b'{', ..] | [b'<', ..] => " (a text file: an HTML error page or a JSON file?)",
        [b'v', b'e', b'r', b's'] => " (a Git LFS pointer: the file itself was never downloaded)",
        _ => "",
    };
    format!("bytes {} \"{text}\"{known}", hex.join(" "))
}

/// candle attaches a backtrace to its errors when `RUST_BACKTRACE` is set, and prints
/// it as part of the message; a user-facing message wants only the error.
pub fn without_backtrace(err: candle_core::Error) -> candle_core::Error {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        other => other,
    }
}

/// Why candle could not read the header, in the user's words. candle reports an
/// unexpected end of file as an I/O `UnexpectedEof`, or as sizes that exceed what
/// remains of the file; both mean truncation here.
fn header_reason(err: &candle_core::Error, len: u64) -> String {
    let text = err.to_string();
    if text.contains("failed to fill whole buffer") || text.contains("remaining") {
        format!("the header ends early: the file is truncated ({len} bytes)")
    } else if let Some(id) = text.strip_prefix("unknown dtype for tensor ") {
        format!(
            "a tensor uses GGML type {id}, which sous cannot dequantize (supported: F32, F16, BF16, \
             Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)"
        )
    } else {
        format!("cannot read the header: {text}")
    }
}
