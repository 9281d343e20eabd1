//! Capacity: a maximum of concurrent jobs, split evenly across the healthy
//! homes, with the running jobs counted per home.

use std::collections::HashSet;
use std::sync::Mutex;

/// Splits `total` evenly over the homes marked healthy: each gets
/// `total / n`, the first `total % n` healthy homes (in configuration order)
/// one more; unhealthy homes get 0.
pub(crate) fn split(total: usize, healthy: &[bool]) -> Vec<usize> {
    let n = healthy.iter().filter(|h| **h).count();
    if n == 0 {
        return vec![0; healthy.len()];
    }
    let (base, mut extra) = (total / n, total % n);
    healthy
        .iter()
        .map(|&h| {
            if !h {
                return 0;
            }
            if extra > 0 {
                extra -= 1;
                base + 1
            } else {
                base
            }
        })
        .collect()
}

/// Why a start was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    pub(crate) running: usize,
    pub(crate) allotted: usize,
}

/// The jobs running on one home and the share of capacity it may use.
#[derive(Debug)]
pub(crate) struct HomeSlots {
    inner: Mutex<Slots>,
}

#[derive(Debug)]
struct Slots {
    /// `None`: no limit.
    allotted: Option<usize>,
    running: HashSet<String>,
}

impl HomeSlots {
    pub(crate) fn new(allotted: Option<usize>) -> Self {
        HomeSlots {
            inner: Mutex::new(Slots {
                allotted,
                running: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding this lock leaves consistent data (single
        // inserts and removes): recover instead of poisoning every start.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `key`. A key already counted (a restart of a job
    /// that runs here) takes none.
    pub(crate) fn acquire(&self, key: &str) -> Result<(), Full> {
        let mut s = self.lock();
        if s.running.contains(key) {
            return Ok(());
        }
        if let Some(allotted) = s.allotted
            && s.running.len() >= allotted
        {
            return Err(Full {
                running: s.running.len(),
                allotted,
            });
        }
        s.running.insert(key.to_string());
        Ok(())
    }

    /// Frees the slot of `key` (no-op when it held none).
    pub(crate) fn release(&self, key: &str) {
        self.lock().running.remove(key);
    }

    pub(crate) fn set_allotted(&self, allotted: Option<usize>) {
        self.lock().allotted = allotted;
    }

    pub(crate) fn allotted(&self) -> Option<usize> {
        self.lock().allotted
    }

    pub(crate) fn running(&self) -> usize {
        self.lock().running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_with_remainders_first() {
        assert_eq!(split(5, &[true, true]), [3, 2]);
        assert_eq!(split(10, &[true, true, true]), [4, 3, 3]);
        assert_eq!(split(5, &[false, true]), [0, 5]);
        assert_eq!(split(5, &[true, false, true]), [3, 0, 2]);
        assert_eq!(split(1, &[true, true, true]), [1, 0, 0]);
        assert_eq!(split(5, &[false, false]), [0, 0]);
        for total in 0..50 {
            for mask in 0..16u32 {
                let healthy: Vec<bool> = (0..4).map(|i| mask & (1 << i) != 0).collect();
                let s = split(total, &healthy);
                let sum: usize = s.iter().sum();
                assert_eq!(sum, if mask == 0 { 0 } else { total });
                let shares: Vec<usize> = s
                    .iter()
                    .zip(&healthy)
                    .filter(|(_, h)| **h)
                    .map(|(v, _)| *v)
                    .collect();
                if let (Some(max), Some(min)) = (shares.iter().max(), shares.iter().min()) {
                    assert!(max - min <= 1);
                }
            }
        }
    }

    #[test]
    fn slots_refuse_beyond_allotment_and_count_keys_once() {
        let slots = HomeSlots::new(Some(2));
        assert!(slots.acquire("a").is_ok());
        assert!(slots.acquire("a").is_ok());
        assert!(slots.acquire("b").is_ok());
        assert_eq!(
            slots.acquire("c"),
            Err(Full {
                running: 2,
                allotted: 2
            })
        );
        slots.release("a");
        assert!(slots.acquire("c").is_ok());
        slots.set_allotted(None);
        assert!(slots.acquire("d").is_ok());
        assert_eq!(slots.running(), 3);
    }
}
