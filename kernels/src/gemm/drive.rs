//! The product drivers: [`Tuning::matmul`] (and [`matmul`], [`matmul_with`]) split a product into tasks
//! (by columns for a few rows, by rows for many), pack the input rows, and run the
//! register tiles pass by pass over `k`. Not here: the tiles' kernels (`tile` and the
//! instruction sets' modules) or the packed weights' layout (`packed`).

use rayon::prelude::*;

use super::packed::panels;
use super::tile::{Panels, Tile, panel_slice, run_length, run_tile, widen};
use super::{Isa, NR, Packed, Tuning};

/// Most depth (values of `kk`) of one pass over the packed weights in a product of many
/// rows; a deeper `k` is split into the fewest equal passes of about this many (rounded
/// up to a multiple of 32: whole blocks of every format). Each pass loads and stores
/// the row tiles' outputs once, and adds to them from the second pass on: one chain per
/// output whatever the depth, so the depth never changes a result.
///
/// Why this deep and not BLIS's L1-sized passes: a tile's packed inputs and a panel's
/// weights are read front to back, which the prefetchers follow from L2, while every
/// pass costs a load and a store of the tile's outputs and a restart of their chains.
/// Measured, one pass beat passes of 256 for nearly every product of SmolLM2's matrices
/// and for deeper ones up to `k` = 8192 with bf16 and f32 weights; NVFP4 weights at 8192,
/// whose pass is widened into a buffer (`widen`) that then outgrows L2, were fastest in
/// passes of 2048 (benchmarks/native.md, "Figures that were in code comments").
pub(super) const KC: usize = 2048;

/// The depth of each pass over `k` values of `kk` for a product of many rows (see
/// [`KC`]): `k` itself up to `KC`, else the equal share of the fewest passes.
pub(super) fn pass_depth(k: usize) -> usize {
    if k <= KC {
        k
    } else {
        k.div_ceil(k.div_ceil(KC)).next_multiple_of(32)
    }
}

/// Most rows a product splits by columns among tasks (every weight read once, by one
/// task); past it, the rows are split (each task then reads every weight, and keeps
/// its own rows' inputs in L2). Up to it the weights cost more than the rows; from 192
/// rows on, the rows' split measured faster (benchmarks/native.md, "Figures that were in code comments").
pub(super) const BY_COLUMNS_MAX: usize = 128;

/// Rows per pass over a column panel: their packed inputs (`MC` rows of one pass's
/// depth, 864 KiB of f32 at SmolLM2's 576) stay in L2 while every panel of a task
/// streams past them. A prompt's rows are split among tasks first (`row_tasks`), so a
/// task holds more than this many only on one thread past 1,536 rows.
const MC: usize = 384;

/// `out = x · wᵀ` with the default choices ([`Tuning::default`]): `x` is `rows × k`,
/// `out` `rows × n`, row-major. The engine calls [`Tuning::matmul`] with its own.
pub fn matmul(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    Tuning::default().matmul(x, rows, w, out);
}

/// [`matmul`] on a given instruction set (one of [`Isa::available`]), with the tiles
/// of [`Tuning::new`].
pub fn matmul_with(isa: Isa, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    Tuning::new(isa).matmul(x, rows, w, out);
}

impl Tuning {
    /// `out = x · wᵀ`: `x` is `rows × k`, `out` `rows × n`, row-major, with these
    /// choices.
    pub fn matmul(&self, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
        let (n, k) = (w.n, w.k);
        assert_eq!(x.len(), rows * k, "x is not rows × k");
        assert_eq!(out.len(), rows * n, "out is not rows × n");
        if rows == 0 || n == 0 {
            return;
        }
        matmul_tiled(self.isa, self.tile(rows, w), x, rows, w, out);
    }
}

/// [`matmul_with`] in register tiles of `mr` rows and `np` panels.
pub(super) fn matmul_tiled(
    isa: Isa,
    (mr, np): (usize, usize),
    x: &[f32],
    rows: usize,
    w: &Packed,
    out: &mut [f32],
) {
    let (n, k) = (w.n, w.k);
    let total = panels(n);
    if rows > BY_COLUMNS_MAX && n.is_multiple_of(NR) {
        // Many rows are bound by arithmetic: tasks own blocks of rows, pack only their
        // own inputs and write straight into their rows of `out`; each reads every
        // weight once (from L2/L3: a layer's weights are a few MB).
        row_tasks(x, rows, k, mr, out, n).for_each(|(xs, o)| {
            let r = xs.len() / k;
            with_packed_rows(xs, r, k, mr, |a| columns(isa, (mr, np), a, r, w, 0, total, o));
        });
        return;
    }
    let a = pack_rows(x, rows, k, mr);
    by_columns(rows, w, np, out, |first, count, c| {
        columns(isa, (mr, np), &a, rows, w, first, count, c);
    });
}

/// The inputs `x` (`rows × k`) and outputs `out` (`rows × n`) of a product of many rows,
/// split into about four tasks per thread of whole `mr`-row tiles, as even as whole
/// tiles allow: equal chunks rounded up to whole tiles left the last task short, and on
/// two threads one thread a tile or more behind the other (512 rows in tiles of 12:
/// seven tasks of 72 rows and one of 8).
pub(super) fn row_tasks<'a>(
    x: &'a [f32],
    rows: usize,
    k: usize,
    mr: usize,
    out: &'a mut [f32],
    n: usize,
) -> impl ParallelIterator<Item = (&'a [f32], &'a mut [f32])> {
    let tiles = rows.div_ceil(mr);
    let tasks = tiles.min(4 * rayon::current_num_threads()).max(1);
    let mut parts = Vec::with_capacity(tasks);
    let (mut x, mut out) = (x, out);
    let mut done = 0;
    for t in 0..tasks {
        let end = (tiles * (t + 1) / tasks * mr).min(rows);
        let (xs, x_rest) = x.split_at((end - done) * k);
        let (o, out_rest) = out.split_at_mut((end - done) * n);
        parts.push((xs, o));
        (x, out, done) = (x_rest, out_rest, end);
    }
    parts.into_par_iter()
}

/// Few rows, bound by reading the weights: `product(first, count, c)` computes panels
/// `first..first + count` for every row into `c` (`rows × count·16`), in tasks of
/// whole multiples of `np` panels and about 64 KiB of weights each (many small tasks
/// balance best); the results are copied into `out` (`rows × n`).
pub(super) fn by_columns(
    rows: usize,
    w: &Packed,
    np: usize,
    out: &mut [f32],
    product: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let n = w.n;
    let total = panels(n);
    let weight_bytes = (w.bytes() as usize / total).max(1);
    let per_task = (65536 / weight_bytes).max(1).next_multiple_of(np);
    if rows == 1 && n.is_multiple_of(NR) {
        // One row: each task's panels are a contiguous run of `out`.
        out.par_chunks_mut(per_task * NR)
            .enumerate()
            .for_each(|(t, c)| product(t * per_task, c.len() / NR, c));
        return;
    }
    let tasks = total.div_ceil(per_task);
    let results: Vec<Vec<f32>> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let first = t * per_task;
            let count = per_task.min(total - first);
            let mut c = vec![0.0f32; rows * count * NR];
            product(first, count, &mut c);
            c
        })
        .collect();
    for (t, c) in results.iter().enumerate() {
        let first = t * per_task * NR;
        let width = c.len() / rows;
        let valid = width.min(n - first);
        for (dst, src) in out.chunks_exact_mut(n).zip(c.chunks_exact(width)) {
            dst[first..first + valid].copy_from_slice(&src[..valid]);
        }
    }
}

/// Packs `x` (`rows × k`) into blocks of `mr` rows, `[k][width]` each (the last block
/// as wide as the rows left).
fn pack_rows(x: &[f32], rows: usize, k: usize, mr: usize) -> Vec<f32> {
    let mut a = vec![0.0f32; rows * k];
    pack_rows_into(x, k, mr, &mut a);
    a
}

/// [`pack_rows`] into `a` (`rows × k` values, every one overwritten): for each `kk`, the
/// block's `width` values are written side by side, so the stores are sequential and
/// the loads come from `width` rows at once.
fn pack_rows_into(x: &[f32], k: usize, mr: usize, a: &mut [f32]) {
    for (rows, block) in x.chunks(mr * k).zip(a.chunks_mut(mr * k)) {
        let width = block.len() / k;
        match width {
            12 => pack_block::<12>(rows, k, block),
            16 => pack_block::<16>(rows, k, block),
            8 => pack_block::<8>(rows, k, block),
            6 => pack_block::<6>(rows, k, block),
            4 => pack_block::<4>(rows, k, block),
            _ => {
                for (kk, column) in block.chunks_exact_mut(width).enumerate() {
                    for (m, v) in column.iter_mut().enumerate() {
                        *v = rows[m * k + kk];
                    }
                }
            }
        }
    }
}

/// One block of `W` rows, `rows` (`W × k`) into `block` (`[k][W]`).
#[inline]
fn pack_block<const W: usize>(rows: &[f32], k: usize, block: &mut [f32]) {
    let rows: [&[f32]; W] = std::array::from_fn(|m| &rows[m * k..(m + 1) * k]);
    for (kk, column) in block.chunks_exact_mut(W).enumerate() {
        for m in 0..W {
            column[m] = rows[m][kk];
        }
    }
}

/// Runs `f` on `x` packed by [`pack_rows`], in a buffer this thread keeps for the next
/// product: a prompt chunk's inputs are megabytes, and fresh pages for every product
/// (each faulted in and zeroed by the kernel) cost as much as the packing itself.
fn with_packed_rows<R>(x: &[f32], rows: usize, k: usize, mr: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len = rows * k;
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buffer) => {
            if buffer.len() < len {
                buffer.resize(len, 0.0);
            }
            pack_rows_into(&x[..len], k, mr, &mut buffer[..len]);
            f(&buffer[..len])
        }
        // In use further up this thread's stack (a task stolen while waiting): a
        // buffer of its own.
        Err(_) => f(&pack_rows(x, rows, k, mr)),
    })
}

/// Computes panels `first..first + count` for every row into `c` (`rows × count·16`),
/// in tiles of `mr` rows (the blocks `a` was packed in) and up to `np` panels.
#[allow(clippy::too_many_arguments)]
fn columns(
    isa: Isa,
    (mr, np): (usize, usize),
    a: &[f32],
    rows: usize,
    w: &Packed,
    first: usize,
    count: usize,
    c: &mut [f32],
) {
    let k = w.k;
    let ldc = count * NR;
    // A few rows are bound by reading the weights: one pass over the whole depth reads
    // each panel front to back, which the prefetchers follow best.
    let depth = if rows <= mr { k } else { pass_depth(k) };
    // Stored weights widened to f32 once per pass, for every row tile of the pass to
    // read (see `widen`); empty until a pass has two tiles or more.
    let mut wide = Vec::new();
    for k0 in (0..k).step_by(depth) {
        let kc = depth.min(k - k0);
        for i0 in (0..rows).step_by(MC) {
            let i1 = (i0 + MC).min(rows);
            let mut p = 0;
            while p < count {
                let np = np.min(count - p).min(run_length(w, first + p));
                let mut panels = panel_slice(w, first + p, k0);
                if (i1 - i0) > mr && widen(isa, panels, np, kc, &mut wide) {
                    panels = Panels::F32 {
                        data: &wide,
                        stride: kc * NR,
                    };
                }
                let mut m = i0;
                while m < i1 {
                    let width = mr.min(rows - m);
                    // Block `m / mr` of the packed rows, from `kk = k0`.
                    let block = &a[m * k + k0 * width..];
                    let mut tile = Tile {
                        a: block,
                        mr: width,
                        kc,
                        panels,
                        np,
                        c: &mut c[m * ldc + p * NR..],
                        ldc,
                        accumulate: k0 > 0,
                    };
                    run_tile(isa, &mut tile);
                    m += width;
                }
                p += np;
            }
        }
    }
}
