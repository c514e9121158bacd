//! The overview's history: the pending messages and the oldest's age, sampled by the server
//! for the last hour, so that a page opened during an incident shows how it began.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// How far back the chart looks.
pub(crate) const WINDOW: Duration = Duration::from_secs(3_600);

/// One reading of the outbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub(crate) at: SystemTime,
    pub(crate) pending: u64,
    /// The oldest pending message's age (zero when none is pending).
    pub(crate) oldest: Duration,
}

/// The samples of the last hour, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Samples(Mutex<VecDeque<Sample>>);

impl Samples {
    /// Adds `sample`, forgetting those older than the window.
    pub(crate) fn push(&self, sample: Sample) {
        let mut samples = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back(sample);
        while samples
            .front()
            .is_some_and(|first| sample.at.duration_since(first.at).unwrap_or_default() > WINDOW)
        {
            samples.pop_front();
        }
    }

    /// The samples, oldest first.
    pub(crate) fn all(&self) -> Vec<Sample> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn samples_older_than_an_hour_are_forgotten() {
        let samples = Samples::default();
        let at = |seconds| UNIX_EPOCH + Duration::from_secs(seconds);
        for seconds in [0, 1_800, 3_600, 3_601, 5_000] {
            samples.push(Sample {
                at: at(seconds),
                pending: seconds,
                oldest: Duration::ZERO,
            });
        }
        let kept: Vec<u64> = samples.all().iter().map(|sample| sample.pending).collect();
        assert_eq!(kept, [1_800, 3_600, 3_601, 5_000]);
    }
}
