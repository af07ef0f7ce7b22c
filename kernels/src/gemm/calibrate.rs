//! The tile shapes chosen at load, into a [`Tuning`]: how many panels a decode step's
//! tile reads side by side ([`Tuning::calibrate_decode_panels`]) and which tile
//! products of 9 to 16 rows take ([`Tuning::calibrate_batch_tile`]), each as the user
//! chose or else measured. Neither changes a result, only its speed. Not here: the
//! bf16 dot-product choice (`bf16`).

use std::time::Instant;

use super::drive::matmul_tiled;
use super::tuning::BATCH_TILES;
use super::{Isa, Packed, Tuning};

/// What [`Tuning::calibrate_decode_panels`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeCalibration {
    /// Panels side by side from now on.
    pub panels: usize,
    /// The fastest of a few one-row products for each choice, in seconds (empty when
    /// the user chose: `SOUS_DECODE_PANELS`).
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

/// What [`Tuning::calibrate_batch_tile`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCalibration {
    /// Rows and panels per tile from now on.
    pub tile: (usize, usize),
    /// The fastest of a few 16-row products for each tile, in seconds (empty when
    /// the user chose: `SOUS_BATCH_TILE`).
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

impl Tuning {
    /// Sets the panels products of up to four rows read side by side: `choice` (1 to 4,
    /// the user's), else the fastest of one-row products of `w` (the largest matrix of
    /// a model, so that it streams from memory as decode does) with 1, 2 and 4 panels.
    /// `None`, changing nothing, where there is nothing to choose: not the AVX-512
    /// kernels, or NVFP4 or Q8_0 weights. Measuring takes about ten products of `w`.
    pub fn calibrate_decode_panels(
        &mut self,
        w: &Packed,
        choice: Option<usize>,
    ) -> Option<DecodeCalibration> {
        let isa = self.isa;
        if isa != Isa::Avx512 || w.quantized() || w.n == 0 {
            return None;
        }
        if let Some(np) = choice.filter(|np| (1..=4).contains(np)) {
            self.decode_panels = np;
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
        self.decode_panels = panels;
        Some(DecodeCalibration { panels, seconds })
    }

    /// Sets the tile of products of 9 to 16 rows: `choice` (the user's, one of
    /// `16x1` and `8x2`), else the fastest of 16-row products of `w` (the model's
    /// largest matrix, read from memory as a batch of decode steps reads it) in each.
    /// `None`, changing nothing, where there is nothing to choose (not the AVX-512
    /// kernels). Measuring takes about eight products of `w`.
    pub fn calibrate_batch_tile(
        &mut self,
        w: &Packed,
        choice: Option<(usize, usize)>,
    ) -> Option<BatchCalibration> {
        let isa = self.isa;
        if isa != Isa::Avx512 || w.n == 0 {
            return None;
        }
        if let Some(tile) = choice.filter(|tile| BATCH_TILES.contains(tile)) {
            self.batch_tile = tile;
            return Some(BatchCalibration {
                tile,
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
        self.batch_tile = BATCH_TILES[choice];
        Some(BatchCalibration {
            tile: BATCH_TILES[choice],
            seconds,
        })
    }
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
