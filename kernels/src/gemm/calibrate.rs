//! The tile shapes measured at load: how many panels a decode step's tile reads side
//! by side ([`calibrate_decode_panels`]) and which tile products of 9 to 16 rows take
//! ([`calibrate_batch_tile`]). Neither changes a result, only its speed. Not here: the
//! bf16 dot-product choice (`bf16`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::drive::matmul_tiled;
use super::{Isa, Packed};

/// Panels that products of up to four rows of f32 or bf16 weights read side by side
/// with AVX-512 (NVFP4 always takes four; see [`Isa::tile`]); 1 until
/// [`calibrate_decode_panels`] measures otherwise. The choice never changes a result:
/// every output is the same chain of fused multiply-adds whichever panels share a tile.
static DECODE_PANELS: AtomicUsize = AtomicUsize::new(1);

/// See [`DECODE_PANELS`].
pub fn decode_panels() -> usize {
    DECODE_PANELS.load(Ordering::Relaxed)
}

/// What [`calibrate_decode_panels`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeCalibration {
    /// Panels side by side from now on.
    pub panels: usize,
    /// The fastest of a few one-row products for each choice, in seconds (empty when
    /// `SOUS_DECODE_PANELS` chose).
    pub seconds: Vec<(usize, f64)>,
}

impl std::fmt::Display for DecodeCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} panel(s) side by side in one-row products", self.panels)?;
        if self.seconds.is_empty() {
            return write!(f, " (SOUS_DECODE_PANELS)");
        }
        let times: Vec<String> = self
            .seconds
            .iter()
            .map(|(np, s)| format!("{np}: {:.2} ms", s * 1e3))
            .collect();
        write!(f, " (measured: {})", times.join(", "))
    }
}

/// Measures one-row products of `w` (the largest matrix of a model, so that it streams
/// from memory as decode does) with 1, 2 and 4 panels side by side and keeps the
/// fastest for every later product of up to four rows; `SOUS_DECODE_PANELS` (1 to 4)
/// chooses without measuring. `None` where there is nothing to choose: not the AVX-512
/// kernels, or NVFP4 weights. Takes about ten products of `w`.
pub fn calibrate_decode_panels(w: &Packed) -> Option<DecodeCalibration> {
    let isa = Isa::current();
    if isa != Isa::Avx512 || w.quantized() || w.n == 0 {
        return None;
    }
    if let Some(np) = std::env::var("SOUS_DECODE_PANELS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|np| (1..=4).contains(np))
    {
        DECODE_PANELS.store(np, Ordering::Relaxed);
        return Some(DecodeCalibration {
            panels: np,
            seconds: Vec::new(),
        });
    }
    let x: Vec<f32> = (0..w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; w.n];
    let mut seconds = Vec::with_capacity(3);
    for np in [1, 2, 4] {
        seconds.push((np, fastest_of_three(isa, (12, np), &x, 1, w, &mut out)));
    }
    let panels = seconds
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1, |(np, _)| *np);
    DECODE_PANELS.store(panels, Ordering::Relaxed);
    Some(DecodeCalibration { panels, seconds })
}

/// The register tiles a product of 9 to 16 rows (a batch of decode steps) may take with
/// AVX-512: one block of up to 16 rows, so that every weight is widened once (fastest on
/// a Zen 4), or blocks of 8 rows with two panels side by side (fastest on a
/// Sapphire-Rapids-class Xeon; BENCHMARKS.md, "Figures that were in code comments").
const BATCH_TILES: [(usize, usize); 2] = [(16, 1), (8, 2)];

/// Which of [`BATCH_TILES`] products of 9 to 16 rows take; the first until
/// [`calibrate_batch_tile`] measures otherwise. Results do not depend on it.
static BATCH_TILE: AtomicUsize = AtomicUsize::new(0);

/// See [`BATCH_TILE`]: `(rows, panels)` of the tile.
pub fn batch_tile() -> (usize, usize) {
    BATCH_TILES[BATCH_TILE.load(Ordering::Relaxed)]
}

/// What [`calibrate_batch_tile`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCalibration {
    /// Rows and panels per tile from now on.
    pub tile: (usize, usize),
    /// The fastest of a few 16-row products for each tile, in seconds (empty when
    /// `SOUS_BATCH_TILE` chose).
    pub seconds: Vec<((usize, usize), f64)>,
}

impl std::fmt::Display for BatchCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mr, np) = self.tile;
        write!(f, "tiles of {mr} rows × {np} panel(s) for 9 to 16 rows")?;
        if self.seconds.is_empty() {
            return write!(f, " (SOUS_BATCH_TILE)");
        }
        let times: Vec<String> = self
            .seconds
            .iter()
            .map(|((mr, np), s)| format!("{mr}x{np}: {:.2} ms", s * 1e3))
            .collect();
        write!(f, " (measured: {})", times.join(", "))
    }
}

/// Measures 16-row products of `w` (the model's largest matrix, read from memory as a
/// batch of decode steps reads it) with each of [`BATCH_TILES`] and keeps the fastest
/// for every later product of 9 to 16 rows; `SOUS_BATCH_TILE` (`16x1` or `8x2`) chooses
/// without measuring. `None` where there is nothing to choose (not the AVX-512 kernels).
/// Takes about eight products of `w`.
pub fn calibrate_batch_tile(w: &Packed) -> Option<BatchCalibration> {
    let isa = Isa::current();
    if isa != Isa::Avx512 || w.n == 0 {
        return None;
    }
    let named = std::env::var("SOUS_BATCH_TILE").ok().and_then(|v| {
        BATCH_TILES
            .iter()
            .position(|(mr, np)| v.trim() == format!("{mr}x{np}"))
    });
    if let Some(choice) = named {
        BATCH_TILE.store(choice, Ordering::Relaxed);
        return Some(BatchCalibration {
            tile: BATCH_TILES[choice],
            seconds: Vec::new(),
        });
    }
    let rows = 16;
    let x: Vec<f32> = (0..rows * w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; rows * w.n];
    let mut seconds = Vec::with_capacity(BATCH_TILES.len());
    for tile in BATCH_TILES {
        seconds.push((tile, fastest_of_three(isa, tile, &x, rows, w, &mut out)));
    }
    let choice = (0..BATCH_TILES.len())
        .min_by(|&a, &b| seconds[a].1.total_cmp(&seconds[b].1))
        .unwrap_or(0);
    BATCH_TILE.store(choice, Ordering::Relaxed);
    Some(BatchCalibration {
        tile: BATCH_TILES[choice],
        seconds,
    })
}

/// Seconds of the fastest of three products of `rows` rows of `x` by `w` in `tile`,
/// after one to warm up (what the load-time calibrations compare).
fn fastest_of_three(
    isa: Isa,
    tile: (usize, usize),
    x: &[f32],
    rows: usize,
    w: &Packed,
    out: &mut [f32],
) -> f64 {
    matmul_tiled(isa, tile, x, rows, w, out);
    (0..3)
        .map(|_| {
            let started = Instant::now();
            matmul_tiled(isa, tile, x, rows, w, out);
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
