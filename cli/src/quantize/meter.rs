//! The meter of a quantization: the bytes in and out, handed to the [`Reporter`] as
//! progress: the whole model in source bytes (with the bytes written so far as its
//! note) and the tensor in hand as a part. The work loop calls [`Meter`] between
//! windows; nothing here blocks it.
//!
//! Not here: how it looks (the binary's shell draws it).

use sous_engine::reporter::{self, Reporter, Task};
use sous_engine::size::human;

/// The meter of one quantization.
pub struct Meter {
    model: Box<dyn reporter::Progress>,
    tensor: Option<Box<dyn reporter::Progress>>,
    out: u64,
}

impl Meter {
    /// Starts tracking `total` source bytes.
    pub fn new(reporter: &dyn Reporter, total: u64) -> Meter {
        Meter {
            model: reporter.progress(Task::bytes("quantize", total)),
            tensor: None,
            out: 0,
        }
    }

    /// A new tensor of `len` source bytes is being worked on.
    pub fn tensor(&mut self, name: &str, len: u64) {
        if let Some(previous) = self.tensor.take() {
            previous.finish(None);
        }
        self.tensor = Some(self.model.part(Task::bytes(name, len)));
    }

    /// `bytes_in` more source bytes were processed and `bytes_out` written.
    pub fn advance(&mut self, bytes_in: u64, bytes_out: u64) {
        self.out += bytes_out;
        if let Some(tensor) = &self.tensor {
            tensor.add(bytes_in);
        }
        self.model.note(&format!("{} out", human(self.out)));
        self.model.add(bytes_in);
    }

    /// Ends the display (the caller reports the outcome).
    pub fn finish(&mut self) {
        if let Some(tensor) = self.tensor.take() {
            tensor.finish(None);
        }
        self.model.finish(None);
    }
}
