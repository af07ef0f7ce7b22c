//! A STREAM-style probe of the machine's read bandwidth: what bounds single-stream
//! decode on a CPU, where every step reads the weights once (tokens/s ≤ read bandwidth ÷
//! bytes read per token).
//!
//! Each of `threads` threads sums its own contiguous share of one buffer, far larger than
//! the last-level cache, pass after pass; the bandwidth is the buffer's bytes over a
//! pass's time. STREAM (McCalpin, `stream.c`) reports the best of its passes, and so does
//! this, beside their median. The buffer is written once before the passes so that its
//! pages exist, and every pass's sum is returned, so a pass cannot be optimized away and
//! a test can check that every byte was read.
//!
//! Hand-written rather than a crate's: it is a summing loop and a clock, and what it
//! measures must be this process's threads on this buffer, as the engine reads weights.

use std::time::Instant;

/// What a probe measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    /// Bytes read per pass.
    pub bytes: u64,
    /// Threads reading.
    pub threads: usize,
    /// Passes timed.
    pub passes: usize,
    /// The fastest pass, GB/s (10⁹ bytes per second).
    pub best_gb_per_s: f64,
    /// The median pass, GB/s.
    pub median_gb_per_s: f64,
    /// The wrapping sum of every 8-byte word of the buffer, as each pass found it.
    pub sums: Vec<u64>,
}

/// The word at index `i` of the probe's buffer.
pub fn word(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Reads a buffer of `bytes` (rounded down to whole 8-byte words per thread) with
/// `threads` threads, pass after pass until at least `passes` passes and `seconds`
/// seconds are done.
pub fn measure(bytes: usize, threads: usize, passes: usize, seconds: f64) -> Bandwidth {
    let threads = threads.max(1);
    let words = (bytes / 8 / threads).max(1) * threads;
    // In huge pages where the system gives them, as the engine holds its weights
    // (`crate::pages`): in 4 KiB pages every page of a stream costs a TLB miss.
    let mut buffer = crate::pages::Zeroed::<u64>::new(words);
    for (i, w) in buffer.iter_mut().enumerate() {
        *w = word(i);
    }
    let share = words / threads;
    let started = Instant::now();
    let mut times = Vec::new();
    let mut sums = Vec::new();
    while times.len() < passes.max(1) || started.elapsed().as_secs_f64() < seconds {
        let pass = Instant::now();
        let sum = std::thread::scope(|scope| {
            let parts: Vec<_> = buffer
                .chunks(share)
                .map(|part| scope.spawn(move || sum_words(part)))
                .collect();
            parts
                .into_iter()
                .map(|p| p.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        times.push(pass.elapsed().as_secs_f64());
        sums.push(std::hint::black_box(sum));
    }
    let rate = |t: f64| (words * 8) as f64 / t.max(1e-12) / 1e9;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    Bandwidth {
        bytes: (words * 8) as u64,
        threads,
        passes: times.len(),
        best_gb_per_s: rate(sorted[0]),
        median_gb_per_s: rate(sorted[sorted.len() / 2]),
        sums,
    }
}

/// The wrapping sum of `words`, in eight lanes so that the compiler keeps several
/// vector adds in flight (the loads, not the adds, must be the limit).
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            *lane = lane.wrapping_add(w);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |s, &w| s.wrapping_add(w));
    lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
}

/// The size of the last-level cache, from Linux's sysfs (the highest cache level of CPU
/// 0), if it says.
pub fn last_level_cache_bytes() -> Option<u64> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, u64)> = None;
    for entry in std::fs::read_dir(base).ok()?.flatten() {
        let dir = entry.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        let size = size.trim();
        let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
        let Ok(n) = digits.parse::<u64>() else {
            continue;
        };
        let bytes = n * match unit {
            "K" => 1 << 10,
            "M" => 1 << 20,
            "G" => 1 << 30,
            _ => 1,
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, bytes)| bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pass_reads_every_word_of_the_buffer() {
        let words = 3 * (1 << 16);
        let want = (0..words).map(word).fold(0u64, u64::wrapping_add);
        for threads in [1, 3] {
            let b = measure(words * 8, threads, 3, 0.0);
            assert_eq!(b.bytes, (words * 8) as u64);
            assert!(b.passes >= 3);
            assert!(b.sums.iter().all(|&s| s == want), "threads {threads}");
            assert!(b.best_gb_per_s >= b.median_gb_per_s && b.median_gb_per_s > 0.0);
        }
    }
}
